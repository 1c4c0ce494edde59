//! The cloud-web node agent as a library. It only ever talks to the control
//! plane over mTLS (after a join that pins the cluster CA by fingerprint),
//! and drives this node's Docker Engine.

pub mod backups;
pub mod build;
pub mod capacity;
pub mod client;
pub mod commands;
pub mod control_planes;
pub mod crash_loops;
pub mod deploy;
pub mod files;
pub mod health;
pub mod identity;
pub mod ingress;
pub mod liveness;
pub mod join;
pub mod logs;
pub mod mesh;
pub mod probe_checks;
pub mod prune;
pub mod readiness;
pub mod redact;
pub mod renew;
pub mod run;
pub mod runtime;
pub mod service_logs;
pub mod services;
pub mod sessions;
pub mod shutdown;
pub mod tasks;
pub mod timestamp;
pub mod usage;
pub mod volume_moves;
pub mod volumes;

/// This agent's version, sent in `X-Cloudweb-Agent-Version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where `PATH` finds an executable named `program`, the way a shell would
/// (the first directory holding an executable file of that name). Used for
/// every external program the agent looks up (Caddy, `pack`).
pub fn find_on_path(program: &std::path::Path) -> Option<std::path::PathBuf> {
    find_in(&std::env::var_os("PATH")?, program)
}

fn find_in(path: &std::ffi::OsStr, program: &std::path::Path) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|candidate| std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn finds_executables_on_path_only() {
        let dir = tempfile::tempdir().unwrap();
        let tool = dir.path().join("cw-tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("cw-plain"), "not executable").unwrap();
        std::fs::create_dir(dir.path().join("cw-dir")).unwrap();
        let path = std::env::join_paths([std::path::Path::new("/nonexistent"), dir.path()]).unwrap();
        assert_eq!(super::find_in(&path, "cw-tool".as_ref()), Some(tool));
        for absent in ["cw-plain", "cw-dir", "cw-none"] {
            assert_eq!(super::find_in(&path, absent.as_ref()), None, "{absent}");
        }
    }
}
