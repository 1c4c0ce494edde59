//! Which WireGuard implementation carries the mesh: kernel WireGuard when
//! the kernel has it, userspace wireguard-go otherwise. The decision is a
//! function of the mode and of the outcome of trying the kernel, so it is
//! tested without either being present.

use std::future::Future;

use super::device_error::DeviceError;

/// What `--mesh-mode` asks for, once the mesh is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Kernel WireGuard, or fail.
    Kernel,
    /// wireguard-go, or fail.
    Userspace,
    /// Kernel WireGuard, falling back to wireguard-go with a logged reason.
    Auto,
}

/// What actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Kernel,
    Userspace,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Kernel => "kernel",
            Backend::Userspace => "userspace",
        }
    }

    /// The `health.features` entry that tells the control plane.
    pub fn feature(self) -> &'static str {
        match self {
            Backend::Kernel => cloudweb_protocol::features::MESH_KERNEL,
            Backend::Userspace => cloudweb_protocol::features::MESH_USERSPACE,
        }
    }
}

/// Why the kernel path could not be used, in words for the log.
pub fn kernel_unavailable_reason(err: &DeviceError) -> String {
    let text = err.to_string();
    if text.contains("Unknown device type") || text.contains("Operation not supported") {
        format!("this kernel has no WireGuard module ({text})")
    } else {
        text
    }
}

/// Starts the device the mode asks for. `kernel` and `userspace` start
/// one backend each; with `Auto` a kernel failure is not an error: the
/// userspace device is started and the reason comes back with it.
pub async fn choose<D, K, KF, U, UF>(choice: Choice, kernel: K, userspace: U) -> Result<(D, Option<String>), DeviceError>
where
    K: FnOnce() -> KF,
    KF: Future<Output = Result<D, DeviceError>>,
    U: FnOnce() -> UF,
    UF: Future<Output = Result<D, DeviceError>>,
{
    match choice {
        Choice::Kernel => Ok((kernel().await?, None)),
        Choice::Userspace => Ok((userspace().await?, None)),
        Choice::Auto => match kernel().await {
            Ok(device) => Ok((device, None)),
            Err(err) => {
                let reason = kernel_unavailable_reason(&err);
                tracing::warn!("mesh: kernel WireGuard is not usable: {reason}; falling back to userspace wireguard-go");
                Ok((userspace().await?, Some(reason)))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    async fn must_not_start() -> Result<Backend, DeviceError> {
        panic!("this backend must not be tried")
    }

    fn missing_module() -> DeviceError {
        // What `ip link add cw0 type wireguard` prints without the module.
        DeviceError::Ip { args: "link add dev cw0 type wireguard".into(), output: "Error: Unknown device type.".into() }
    }

    #[tokio::test]
    async fn auto_falls_back_to_userspace_when_the_module_is_missing_and_says_why() {
        let tried = Cell::new(Vec::new());
        let log = |what: &'static str| {
            let mut v = tried.take();
            v.push(what);
            tried.set(v);
        };
        let (device, reason) = choose(
            Choice::Auto,
            || async {
                log("kernel");
                Err::<Backend, _>(missing_module())
            },
            || async {
                log("userspace");
                Ok(Backend::Userspace)
            },
        )
        .await
        .unwrap();
        assert_eq!(device, Backend::Userspace);
        assert_eq!(tried.take(), ["kernel", "userspace"]);
        let reason = reason.expect("a fallback has a reason");
        assert!(reason.starts_with("this kernel has no WireGuard module"), "{reason}");
        assert!(reason.contains("Unknown device type"), "{reason}");
    }

    #[tokio::test]
    async fn auto_takes_the_kernel_when_it_works_and_never_starts_wireguard_go() {
        let (device, reason) = choose(Choice::Auto, || async { Ok(Backend::Kernel) }, must_not_start).await.unwrap();
        assert_eq!((device, reason), (Backend::Kernel, None));
    }

    #[tokio::test]
    async fn explicit_modes_do_not_fall_back() {
        let err = choose(Choice::Kernel, || async { Err::<Backend, _>(missing_module()) }, || async { Ok(Backend::Userspace) })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("Unknown device type"));
        let (device, reason) = choose(Choice::Userspace, must_not_start, || async { Ok(Backend::Userspace) }).await.unwrap();
        assert_eq!((device, reason), (Backend::Userspace, None));
        // Auto with neither available fails with the userspace error.
        let err = choose(
            Choice::Auto,
            || async { Err::<Backend, _>(missing_module()) },
            || async { Err(DeviceError::EarlyExit("exit status: 1".into())) },
        )
        .await
        .unwrap_err();
        assert!(matches!(err, DeviceError::EarlyExit(_)));
    }

    #[test]
    fn other_kernel_failures_keep_their_own_words() {
        let err = DeviceError::Ip { args: "link add dev cw0 type wireguard".into(), output: "RTNETLINK answers: Operation not permitted".into() };
        assert_eq!(kernel_unavailable_reason(&err), err.to_string());
    }
}
