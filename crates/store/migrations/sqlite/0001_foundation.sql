-- Nodes, join tokens, admin tokens, the per-node command queue and the
-- deployment reports agents send. Timestamps are Unix milliseconds (UTC).

CREATE TABLE admin_tokens (
    token_sha256 TEXT PRIMARY KEY,
    created_at   BIGINT NOT NULL
);

CREATE TABLE join_tokens (
    token_sha256 TEXT PRIMARY KEY,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    used_at      BIGINT,
    used_by_node TEXT
);

CREATE TABLE nodes (
    id                   TEXT PRIMARY KEY,
    name                 TEXT NOT NULL UNIQUE,
    hostname             TEXT NOT NULL,
    ingress              BOOLEAN NOT NULL,
    mesh_index           BIGINT NOT NULL UNIQUE,
    wireguard_public_key TEXT,
    endpoint             TEXT,
    cert_sha256          TEXT NOT NULL,
    draining             BOOLEAN NOT NULL DEFAULT FALSE,
    joined_at            BIGINT NOT NULL,
    agent_version        TEXT,
    protocol             BIGINT,
    last_heartbeat_at    BIGINT,
    cpu_cores            BIGINT,
    mem_bytes            BIGINT,
    disk_bytes           BIGINT,
    health_json          TEXT,
    health_at            BIGINT,
    metrics_json         TEXT,
    metrics_at           BIGINT
);

CREATE TABLE commands (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    acked_at   BIGINT,
    ack_count  BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX commands_pending ON commands (node_id, acked_at, seq);

CREATE TABLE deployment_reports (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id TEXT NOT NULL,
    node_id       TEXT NOT NULL,
    state         TEXT,
    message       TEXT,
    image         TEXT,
    created_at    BIGINT NOT NULL
);

CREATE TABLE deployment_logs (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id TEXT NOT NULL,
    node_id       TEXT NOT NULL,
    ts            TEXT NOT NULL,
    stream        TEXT NOT NULL,
    line          TEXT NOT NULL
);
CREATE INDEX deployment_logs_by_deployment ON deployment_logs (deployment_id, seq);
