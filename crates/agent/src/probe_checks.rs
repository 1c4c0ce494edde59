//! One probe, whatever it asks: the app's health path (or another path,
//! or an exact status) over HTTP on the instance's published port, a TCP
//! connection to a port of the container, or a command run in the
//! container. Liveness and readiness probes share it; only what passes an
//! HTTP answer differs between them.
//!
//! An exec probe refused because the container is between two runs
//! (Docker is restarting it) gives no verdict ([`Outcome::Skip`]).
//!
//! A probe that cannot run as set (its command is not in the image) is
//! [`Outcome::Broken`], not a failure of the app: the supervisor reports
//! it once and restarts nothing for it.

use std::net::SocketAddr;
use std::time::Duration;

use cloudweb_protocol::ProbeCheck;

use crate::runtime::{DockerRuntime, Probed};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// The app failed the probe: why.
    Fail(String),
    /// The probe cannot run as set: why.
    Broken(String),
    /// No verdict: the container stopped between the look and the probe
    /// (Docker is restarting it); neither a pass nor a failure.
    Skip,
}

impl Outcome {
    /// Pass → Ok; anything else → its reason.
    pub fn into_result(self) -> Result<(), String> {
        match self {
            Outcome::Pass | Outcome::Skip => Ok(()),
            Outcome::Fail(reason) | Outcome::Broken(reason) => Err(reason),
        }
    }
}

/// Where and how to probe, from the probe's settings.
pub struct Probe<'a> {
    pub check: Option<&'a ProbeCheck>,
    pub timeout_seconds: u32,
    /// Whether an HTTP answer passes when the check names no status.
    pub passes: fn(u16) -> bool,
}

/// Runs `probe` once against `probed`. `host` is where published ports
/// are reached.
pub async fn run(
    runtime: &DockerRuntime,
    http: &reqwest::Client,
    host: &str,
    probed: &Probed,
    probe: Probe<'_>,
) -> Outcome {
    let timeout = Duration::from_secs(u64::from(probe.timeout_seconds));
    match probe.check {
        None => {
            http_probe(
                http,
                host,
                probed,
                &probed.path,
                timeout,
                probe.timeout_seconds,
                |s| (probe.passes)(s),
            )
            .await
        }
        Some(check @ ProbeCheck::Http { path, .. }) => {
            http_probe(
                http,
                host,
                probed,
                path,
                timeout,
                probe.timeout_seconds,
                |s| check.http_passes(s, probe.passes),
            )
            .await
        }
        Some(ProbeCheck::Tcp { port }) => {
            tcp_probe(probed, *port, timeout, probe.timeout_seconds).await
        }
        Some(ProbeCheck::Exec { command }) => {
            exec_probe(runtime, probed, command, timeout, probe.timeout_seconds).await
        }
    }
}

async fn http_probe(
    http: &reqwest::Client,
    host: &str,
    probed: &Probed,
    path: &str,
    timeout: Duration,
    seconds: u32,
    passes: impl Fn(u16) -> bool,
) -> Outcome {
    let Some(port) = probed.host_port else {
        return Outcome::Fail("no published port".into());
    };
    let url = format!("http://{host}:{port}{path}");
    match tokio::time::timeout(timeout, http.get(&url).send()).await {
        Err(_) => Outcome::Fail(format!("no answer on {path} within {seconds} s")),
        Ok(Err(err)) => Outcome::Fail(format!(
            "{path} failed: {}",
            if err.is_connect() {
                "connection refused".to_string()
            } else {
                err.to_string()
            }
        )),
        Ok(Ok(response)) if passes(response.status().as_u16()) => Outcome::Pass,
        Ok(Ok(response)) => Outcome::Fail(format!(
            "{path} answered HTTP {}",
            response.status().as_u16()
        )),
    }
}

async fn tcp_probe(probed: &Probed, port: u16, timeout: Duration, seconds: u32) -> Outcome {
    let Some(address) = probed.addresses.first() else {
        return Outcome::Fail("the container has no address".into());
    };
    let target = SocketAddr::new(*address, port);
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(target)).await {
        Err(_) => Outcome::Fail(format!("TCP port {port}: no connection within {seconds} s")),
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            Outcome::Fail(format!("TCP port {port}: connection refused"))
        }
        Ok(Err(err)) => Outcome::Fail(format!("TCP port {port}: {err}")),
        Ok(Ok(_)) => Outcome::Pass,
    }
}

async fn exec_probe(
    runtime: &DockerRuntime,
    probed: &Probed,
    command: &[String],
    timeout: Duration,
    seconds: u32,
) -> Outcome {
    let program = command.first().map(String::as_str).unwrap_or("");
    // Dropped when over its time: the command is killed then.
    let outcome = match runtime.exec_output(&probed.id, command, &[], timeout).await {
        Ok((Some(0), _)) => return Outcome::Pass,
        Ok((None, _)) => Outcome::Fail(format!("{program}: no exit within {seconds} s")),
        Ok((Some(code), output)) => judge_exit(program, code, &output),
        Err(err) => {
            let text = err.to_string();
            if between_runs(&text) {
                Outcome::Skip
            } else if cannot_start(&text) {
                Outcome::Broken(format!(
                    "the probe's command {program:?} cannot run in the container: {}",
                    last_line(&text)
                ))
            } else {
                Outcome::Fail(format!("{program}: {text}"))
            }
        }
    };
    // A container that stopped while the command ran (Docker restarting
    // it) gave no verdict either.
    if outcome != Outcome::Skip && runtime.session_container(&probed.id).await.is_err() {
        return Outcome::Skip;
    }
    outcome
}

/// A command's exit: 126/127 with the runtime's "not found" or "permission
/// denied" is a probe that cannot run; any other code is the app's answer.
fn judge_exit(program: &str, code: i64, output: &str) -> Outcome {
    // The runtime could not enter the container: it was stopping.
    if code == 126 && output.contains("error executing setns process") {
        return Outcome::Skip;
    }
    if matches!(code, 126 | 127) && cannot_start(output) {
        return Outcome::Broken(format!(
            "the probe's command {program:?} cannot run in the container: {}",
            last_line(output)
        ));
    }
    let said = last_line(output);
    if said.is_empty() {
        Outcome::Fail(format!("{program} exited with code {code}"))
    } else {
        Outcome::Fail(format!("{program} exited with code {code}: {said}"))
    }
}

/// The Engine refused the exec because the container is not running now
/// (409: restarting, stopped, paused).
fn between_runs(text: &str) -> bool {
    text.contains("409") && ["is restarting", "is not running", "is paused"].iter().any(|m| text.contains(m))
}

fn cannot_start(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "executable file not found",
        "no such file or directory",
        "permission denied",
        "not found",
    ]
    .iter()
    .any(|m| text.contains(m))
}

fn last_line(text: &str) -> String {
    let line = text
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    cloudweb_protocol::misc::one_line(line, 300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_command_is_a_broken_probe_and_an_exit_is_a_failure() {
        let runc = "OCI runtime exec failed: exec failed: unable to start container process: exec: \"pg_isready\": executable file not found in $PATH: unknown\n";
        assert!(
            matches!(judge_exit("pg_isready", 126, runc), Outcome::Broken(reason) if reason.contains("executable file not found"))
        );
        assert!(matches!(
            judge_exit("sh", 127, "sh: nosuch: not found\n"),
            Outcome::Broken(_)
        ));
        assert_eq!(
            judge_exit("check", 1, "db down\n\n"),
            Outcome::Fail("check exited with code 1: db down".into())
        );
        assert_eq!(
            judge_exit("check", 127, ""),
            Outcome::Fail("check exited with code 127".into())
        );
    }

    #[test]
    fn a_container_between_runs_gives_no_verdict() {
        let restarting = "docker engine error: Docker responded with status code 409: Container f100 is restarting, wait until the container is running";
        assert!(between_runs(restarting));
        assert!(!between_runs("no such container"));
        let stopping = "OCI runtime exec failed: exec failed: unable to start container process: error executing setns process: exit status 1: unknown";
        assert_eq!(judge_exit("no-such-probe", 126, stopping), Outcome::Skip);
    }
}
