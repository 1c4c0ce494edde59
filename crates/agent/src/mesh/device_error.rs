//! The mesh device's error, in a module of its own below both `device`
//! (which starts and drives the device) and `backend` (which chooses the
//! backend from the outcome of trying the kernel), so that neither imports
//! the other for it. `device` re-exports it as `device::DeviceError`.

use std::path::PathBuf;

use super::kernel::KernelError;
use super::uapi::UapiError;

/// Why the mesh device could not be started, read or changed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("cannot run {program}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("`ip {args}` failed: {output}")]
    Ip { args: String, output: String },
    #[error("`ip {0}` did not finish within 10 s")]
    IpTimeout(String),
    #[error("wireguard-go exited before its socket appeared ({0})")]
    EarlyExit(String),
    #[error("wireguard-go did not create {0} within 10 s")]
    NoSocket(PathBuf),
    #[error("interface {0} still exists after deleting it")]
    Stale(String),
    #[error(transparent)]
    Uapi(#[from] UapiError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}
