//! The mesh interface itself, on one of two backends (see `backend.rs`):
//! a kernel WireGuard link configured over netlink (`kernel.rs`), or a
//! `wireguard-go -f <interface>` child that dies with the agent, configured
//! over its UAPI socket. Either way the node's mesh address and link state
//! are set through `ip` (argument vectors only), the device is read as a
//! `uapi::Device` and changed with a UAPI `set` body, so convergence and
//! status do not depend on the backend.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::backend::{self, Backend, Choice};
pub use super::device_error::DeviceError;
use super::kernel;
use super::key::KeyPair;
use super::uapi;

/// How long an `ip` call or the device's start may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running device. Dropping it removes the interface: the userspace one
/// by killing wireguard-go, the kernel one by deleting the link.
pub struct Device {
    pub interface: String,
    inner: Inner,
}

enum Inner {
    Userspace(Child),
    /// The link, and the interval its existence is checked at (kept here,
    /// so a `select!` that drops `exited` does not restart the wait).
    Kernel(KernelLink, tokio::time::Interval),
}

/// A kernel link this agent created; deleted when dropped, as the
/// userspace interface goes with its wireguard-go.
struct KernelLink(String);

impl Drop for KernelLink {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "delete", "dev", &self.0])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Where the device comes from: the backend choice, and the userspace
/// binary for when it is (or may be) userspace.
#[derive(Debug, Clone)]
pub struct DeviceSpec<'a> {
    pub choice: Choice,
    pub wireguard_go: &'a Path,
    pub interface: &'a str,
    pub key: &'a KeyPair,
    pub listen_port: u16,
    pub mesh_address: Ipv4Addr,
}

impl Device {
    /// Brings the interface up on the backend `spec.choice` gives; with
    /// `auto`, also the reason the kernel was not used, when it was not.
    pub async fn start(spec: &DeviceSpec<'_>) -> Result<(Device, Option<String>), DeviceError> {
        backend::choose(spec.choice, || Device::start_kernel(spec), || Device::start_userspace(spec)).await
    }

    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Userspace(_) => Backend::Userspace,
            Inner::Kernel(..) => Backend::Kernel,
        }
    }

    /// Creates the kernel link (deleting a leftover interface of that name
    /// first), sets the key, listen port and address over netlink, then
    /// link up.
    async fn start_kernel(spec: &DeviceSpec<'_>) -> Result<Device, DeviceError> {
        let interface = spec.interface;
        remove_leftover(interface).await?;
        ip(&["link", "add", "dev", interface, "type", "wireguard"]).await?;
        // From here on the link is ours: dropping this removes it again.
        let link = KernelLink(interface.to_string());
        kernel::configure(interface, spec.key.private_hex(), spec.listen_port, spec.mesh_address).await?;
        ip(&["link", "set", "dev", interface, "up"]).await?;
        let check = tokio::time::interval(Duration::from_secs(5));
        Ok(Device { interface: interface.to_string(), inner: Inner::Kernel(link, check) })
    }

    /// Starts wireguard-go for `interface` (deleting a leftover interface
    /// of that name first), sets the key and listen port, then the address
    /// `mesh_address/16` and link up.
    async fn start_userspace(spec: &DeviceSpec<'_>) -> Result<Device, DeviceError> {
        let DeviceSpec { wireguard_go, interface, key, listen_port, mesh_address, .. } = *spec;
        remove_leftover(interface).await?;
        let socket = uapi::socket_path(interface);
        let _ = std::fs::remove_file(&socket);
        let mut command = Command::new(wireguard_go);
        command
            .arg("-f")
            .arg(interface)
            .env("LOG_LEVEL", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let parent = std::process::id();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                // The device must not outlive the agent, even on SIGKILL.
                // The signal follows the thread that forked, which is a
                // runtime worker: they live as long as the process.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    // The agent died between fork and prctl.
                    return Err(std::io::Error::other("the agent exited"));
                }
                Ok(())
            });
        }
        let mut child = command
            .spawn()
            .map_err(|source| DeviceError::Spawn { program: wireguard_go.display().to_string(), source })?;
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().map_err(|source| DeviceError::Spawn { program: "wireguard-go".into(), source })? {
                return Err(DeviceError::EarlyExit(status.to_string()));
            }
            if socket.exists() && uapi::get(interface).await.is_ok() {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(DeviceError::NoSocket(socket));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let device = Device { interface: interface.to_string(), inner: Inner::Userspace(child) };
        uapi::set(interface, &format!("private_key={}\nlisten_port={listen_port}\n", key.private_hex())).await?;
        ip(&["address", "replace", &format!("{mesh_address}/16"), "dev", interface]).await?;
        ip(&["link", "set", "dev", interface, "up"]).await?;
        Ok(device)
    }

    /// Resolves when the device is gone (it should not be while the agent
    /// runs): wireguard-go exited, or the kernel link was deleted (checked
    /// every 5 s).
    pub async fn exited(&mut self) -> String {
        match &mut self.inner {
            Inner::Userspace(child) => match child.wait().await {
                Ok(status) => format!("wireguard-go exited ({status})"),
                Err(err) => format!("wireguard-go: {err}"),
            },
            Inner::Kernel(link, check) => loop {
                check.tick().await;
                match link_exists(&link.0).await {
                    Ok(false) => return "the kernel link was deleted".into(),
                    Ok(true) => {}
                    Err(err) => tracing::warn!(interface = %link.0, "mesh: checking the link: {err}"),
                }
            },
        }
    }

    /// The device's peers and counters.
    pub async fn get(&self) -> Result<uapi::Device, DeviceError> {
        Ok(match self.inner {
            Inner::Userspace(_) => uapi::get(&self.interface).await?,
            Inner::Kernel(..) => kernel::get(&self.interface).await?,
        })
    }

    /// Applies a UAPI `set` body (the lines after `set=1`).
    pub async fn set(&self, body: &str) -> Result<(), DeviceError> {
        match self.inner {
            Inner::Userspace(_) => uapi::set(&self.interface, body).await?,
            Inner::Kernel(..) => kernel::set(&self.interface, body).await?,
        }
        Ok(())
    }
}

/// Reads a device this process did not start (`mesh status`): through its
/// UAPI socket when there is one (wireguard-go), over netlink otherwise.
pub async fn read(interface: &str) -> Result<uapi::Device, DeviceError> {
    if uapi::socket_path(interface).exists() {
        return Ok(uapi::get(interface).await?);
    }
    Ok(kernel::get(interface).await?)
}

/// A leftover interface (a crashed earlier run, or `wg-quick`) would make
/// either backend fail; it bears our name, so it is ours to remove.
async fn remove_leftover(interface: &str) -> Result<(), DeviceError> {
    if link_exists(interface).await? {
        tracing::warn!(interface, "removing a leftover mesh interface");
        ip(&["link", "delete", "dev", interface]).await?;
        if link_exists(interface).await? {
            return Err(DeviceError::Stale(interface.to_string()));
        }
    }
    Ok(())
}

/// The first IPv4 address on `interface`, from `ip -4 -o address show`.
pub async fn first_ipv4(interface: &str) -> Result<Option<Ipv4Addr>, DeviceError> {
    let output = ip(&["-4", "-o", "address", "show", "dev", interface]).await?;
    Ok(parse_first_ipv4(&output))
}

fn parse_first_ipv4(output: &str) -> Option<Ipv4Addr> {
    output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        words.find(|w| *w == "inet")?;
        words.next()?.split('/').next()?.parse().ok()
    })
}

async fn link_exists(interface: &str) -> Result<bool, DeviceError> {
    match ip(&["link", "show", "dev", interface]).await {
        Ok(_) => Ok(true),
        Err(DeviceError::Ip { output, .. }) if output.contains("does not exist") => Ok(false),
        Err(err) => Err(err),
    }
}

/// Runs `ip` with `args`; its output on failure.
async fn ip(args: &[&str]) -> Result<String, DeviceError> {
    let joined = args.join(" ");
    let run = Command::new("ip").args(args).stdin(Stdio::null()).kill_on_drop(true).output();
    let output = tokio::time::timeout(STEP_TIMEOUT, run)
        .await
        .map_err(|_| DeviceError::IpTimeout(joined.clone()))?
        .map_err(|source| DeviceError::Spawn { program: "ip".into(), source })?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if output.status.success() {
        Ok(text)
    } else {
        Err(DeviceError::Ip { args: joined, output: text.trim().to_string() })
    }
}

/// An interface name Linux accepts and that is safe as an argument and as
/// a socket file name: 1 to 15 characters of `[A-Za-z0-9_.-]`, not
/// starting with '-' or '.'.
pub fn valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && !name.starts_with(['-', '.'])
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_ipv4_of_ip_output() {
        let output = "2: eth0    inet 192.0.2.7/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever\n\
                      2: eth0    inet 198.51.100.1/32 scope global eth0\n";
        assert_eq!(parse_first_ipv4(output), Some(Ipv4Addr::new(192, 0, 2, 7)));
        assert_eq!(parse_first_ipv4(""), None);
        assert_eq!(parse_first_ipv4("2: eth0    inet bogus/24\n"), None);
    }

    #[test]
    fn interface_names() {
        for good in ["cw0", "cw-test_1", "a", "abcdefghijklmno"] {
            assert!(valid_interface_name(good), "{good}");
        }
        for bad in ["", "-cw", ".cw", "..", "a/b", "abcdefghijklmnop", "cw 0", "cw0\n"] {
            assert!(!valid_interface_name(bad), "{bad:?}");
        }
    }
}
