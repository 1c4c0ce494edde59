//! The wire contract between `cloudweb-agent` and `cloudweb-server`.
//!
//! Every JSON body, header name and SSE event name that crosses the agent
//! listener is defined here and nowhere else, so the two binaries cannot drift
//! apart. The crate does no I/O: it holds types, the protocol-version decision
//! (including the 426 body) and the input checks both sides share.

pub mod backups;
pub mod certificates;
pub mod commands;
pub mod deploy;
pub mod heartbeat;
pub mod join;
pub mod logs;
pub mod misc;
pub mod probes;
pub mod renew;
pub mod repo_ca;
pub mod services;
pub mod sessions;
pub mod ssh;
pub mod tasks;
pub mod validate;
pub mod version;
pub mod volume_moves;
pub mod volumes;

pub use backups::{
    BackupCancelPayload, BackupJobPayload, BackupJobReport, BackupSource, Expected, JobState, Replace, Repository, RestorePayload, Retention, VerifyPayload,
};
pub use certificates::{CertificateSet, HostCertificate, TlsAlpnChallenge, TlsAlpnChallenges};
pub use commands::{Command, CommandKind, CommandList, StopPayload};
pub use deploy::{
    BuildSettings, DeployPayload, GitCredentials, HealthCheck, Limits, Liveness, ProbeCheck,
    Readiness, Source, Spa, SshAccess, Strategy,
};
pub use heartbeat::{
    ContainerUsage, Health, Heartbeat, HostTraffic, IngressStatus, MeshHealth, Metrics, NodeUsage, RegistryHealth,
};
pub use join::{JoinRequest, JoinResponse, Peer, PeerList};
pub use logs::{ContainerLogs, LogUpload, LogUploadResponse, RefusedContainer};
pub use renew::{RenewRequest, RenewResponse};
pub use misc::{error_codes, ErrorBody, LeaveConflict, LeaveResponse, LogLine, RegistryConfig, Report, Route, RouteTable};
pub use validate::ValidationError;
pub use tasks::{TaskCancelPayload, TaskLine, TaskRunPayload, TaskRunReport, TaskState};
pub use sessions::{SessionFrame, SessionOpenPayload, SessionTarget};
pub use services::{ServiceExec, ServiceKind, ServiceLogUpload, ServiceLogs, ServicePayload, ServiceRemovePayload, ServiceStatus};
pub use volume_moves::{Frame, MoveReport, MoveReportState, VolumeMoveStep, VolumeReceivePayload, VolumeSendPayload};
pub use volumes::{VolumeDeletePayload, VolumeMount};
pub use version::{negotiate, Negotiation, SupportedRange, Upgrade, UpgradeRequired};

/// Paths of the agent listener, relative to the control plane's public URL.
pub mod paths {
    pub const JOIN: &str = "/agent/v1/join";
    pub const HEARTBEAT: &str = "/agent/v1/heartbeat";
    pub const PEERS: &str = "/agent/v1/peers";
    pub const COMMANDS: &str = "/agent/v1/commands";
    pub const LEAVE: &str = "/agent/v1/leave";
    pub const REPORT: &str = "/agent/v1/report";
    pub const ROUTES: &str = "/agent/v1/routes";
    pub const REGISTRY: &str = "/agent/v1/registry";
    pub const STREAM: &str = "/agent/v1/stream";
    pub const LOGS: &str = "/agent/v1/logs";
    /// Output lines of the node's managed services' containers.
    pub const SERVICE_LOGS: &str = "/agent/v1/service-logs";
    /// The ACME certificates an ingress node serves.
    pub const CERTIFICATES: &str = "/agent/v1/certificates";
    /// `GET /agent/v1/acme-challenge/{token}`: the key authorization of a
    /// pending HTTP-01 challenge.
    pub const ACME_CHALLENGE: &str = "/agent/v1/acme-challenge";
    /// The pending TLS-ALPN-01 challenges an ingress node answers.
    pub const ACME_TLS_ALPN: &str = "/agent/v1/acme-tls-alpn";

    /// `GET /agent/v1/acme-challenge/{token}`.
    pub fn acme_challenge(token: &str) -> String {
        format!("{ACME_CHALLENGE}/{token}")
    }
    pub const RENEW: &str = "/agent/v1/renew";
    /// `POST /agent/v1/volume-moves/{move_id}`: a node's report on a move.
    pub const VOLUME_MOVES: &str = "/agent/v1/volume-moves";
    /// `POST {BACKUP_JOBS}/{job_id}`: what became of a backup, verify or
    /// restore job.
    pub const BACKUP_JOBS: &str = "/agent/v1/backup-jobs";
    /// `POST {TASK_RUNS}/{run_id}`: what became of a task run.
    pub const TASK_RUNS: &str = "/agent/v1/task-runs";

    /// `POST {SESSIONS}/{session_id}/attach`: an agent's dial-back for a
    /// session (an HTTP/1.1 upgrade to [`crate::sessions::UPGRADE`]).
    pub const SESSIONS: &str = "/agent/v1/sessions";

    /// `POST /agent/v1/sessions/{session_id}/attach`.
    pub fn session_attach(session_id: &str) -> String {
        format!("{SESSIONS}/{session_id}/attach")
    }

    /// `POST /agent/v1/task-runs/{run_id}`.
    pub fn task_run(run_id: &str) -> String {
        format!("{TASK_RUNS}/{run_id}")
    }

    /// `POST /agent/v1/volume-moves/{move_id}`.
    pub fn volume_move(move_id: &str) -> String {
        format!("{VOLUME_MOVES}/{move_id}")
    }

    /// `POST /agent/v1/backup-jobs/{job_id}`.
    pub fn backup_job(job_id: &str) -> String {
        format!("{BACKUP_JOBS}/{job_id}")
    }

    /// `POST /agent/v1/commands/{id}/ack`.
    pub fn ack(command_id: &str) -> String {
        format!("{COMMANDS}/{command_id}/ack")
    }
}

/// Names of the events on `GET /agent/v1/stream`. An event only says that
/// something changed; the agent then fetches the matching resource.
pub mod events {
    pub const COMMANDS: &str = "commands";
    pub const ROUTES: &str = "routes";
    pub const PEERS: &str = "peers";
    /// The set of ACME certificates changed (issued, renewed or removed),
    /// or the pending TLS-ALPN-01 challenges did.
    pub const CERTIFICATES: &str = "certificates";
}

/// Optional capabilities an agent lists in `health.features`.
pub mod features {
    pub const STATIC_SITES: &str = "static-sites";
    pub const TRAFFIC_METRICS: &str = "traffic-metrics";
    /// The node runs the mesh with userspace WireGuard (wireguard-go).
    pub const MESH_USERSPACE: &str = "mesh-userspace";
    /// The node runs the mesh with kernel WireGuard (netlink).
    pub const MESH_KERNEL: &str = "mesh-kernel";
    /// The node forwards between mesh peers when its peer list says
    /// `relay` (0.1.0 agents ignore the flag, so the control plane picks
    /// relays among nodes that announce this).
    pub const MESH_RELAY: &str = "mesh-relay";
    /// The agent mounts the `volumes` of a deploy command and handles
    /// `volume_delete`; apps with volumes are placed only on such nodes.
    pub const VOLUMES: &str = "volumes";
    /// The agent runs managed services (`service_run`, `service_remove`)
    /// and reports them in `health.services`.
    pub const SERVICES: &str = "services";
    /// The agent sends and receives volumes over the mesh
    /// (`volume_receive`, `volume_send` and the other move commands).
    pub const VOLUME_MOVES: &str = "volume-moves";
    /// The agent runs a `service_run`'s `set_password` (so a rotated
    /// password reaches the database) and uploads its services' output
    /// (`POST /agent/v1/service-logs`).
    pub const SERVICE_OPS: &str = "service-ops";
    /// The agent runs restic for `backup_run`, `backup_verify`,
    /// `backup_restore` and `backup_cancel` and reports to
    /// `POST /agent/v1/backup-jobs/{id}`.
    pub const BACKUPS: &str = "backups";
    /// The agent runs one-off task containers (`task_run`, `task_cancel`)
    /// and reports to `POST /agent/v1/task-runs/{id}`.
    pub const TASKS: &str = "tasks";
    /// The agent dials back for `session_open` (exec and port-forward
    /// sessions).
    pub const SESSIONS: &str = "sessions";
    /// The agent runs probes with a `check` (another HTTP path or status,
    /// TCP, exec) and a `grace_seconds`, and reports an instance's
    /// crash loop (`Report::crash_loop`) and a broken liveness probe
    /// (`Report::probe_problem`).
    pub const PROBE_CHECKS: &str = "probe-checks";
}
