//! The probe flags of `apps create` and `apps set`: a liveness and a
//! readiness probe, each its timing (`--liveness 10,2,3`), optionally what
//! it asks (`--liveness-check tcp:5432`) and a grace period after the
//! container starts (`--liveness-grace 30`). The check and the grace go
//! with the probe's timing: a probe is set as a whole.

use clap::Args;
use cloudweb_api_types::apps::{Liveness, Readiness};
use cloudweb_protocol::ProbeCheck;

#[derive(Args)]
pub struct ProbeArgs {
    /// Probe every running instance every INTERVAL seconds and restart one
    /// that fails THRESHOLD probes in a row (no passing answer within
    /// TIMEOUT seconds): INTERVAL[,TIMEOUT[,THRESHOLD]], defaults 2 and 3.
    /// It asks the health path over HTTP unless --liveness-check says
    /// otherwise. Example: --liveness 10,2,3
    #[arg(long, value_name = "INTERVAL[,TIMEOUT[,THRESHOLD]]", value_parser = parse_liveness)]
    liveness: Option<Liveness>,
    /// What the liveness probe asks: http:PATH (any answer below 500
    /// passes), http:PATH=STATUS (only STATUS passes), tcp:PORT (a
    /// connection to the container's PORT), or exec:COMMAND ARGS… (run in
    /// the container, words split on spaces, or exec:["a","b c"] as JSON;
    /// exit 0 passes).
    #[arg(long, value_name = "CHECK", requires = "liveness", value_parser = parse_check)]
    liveness_check: Option<ProbeCheck>,
    /// Seconds after the container (re)starts before the liveness probe
    /// runs (0 to 3600).
    #[arg(long, value_name = "SECONDS", requires = "liveness", value_parser = clap::value_parser!(u32).range(0..=3600))]
    liveness_grace: Option<u32>,
    /// Probe every running instance every INTERVAL seconds and keep one out
    /// of the ingress's upstreams once it fails FAILURES probes in a row
    /// (a status of 400 or more, or no answer within TIMEOUT seconds), back
    /// after SUCCESSES passes in a row:
    /// INTERVAL[,TIMEOUT[,FAILURES[,SUCCESSES]]], defaults 1, 3 and 1.
    /// Example: --readiness 5,1,3,1
    #[arg(long, value_name = "INTERVAL[,TIMEOUT[,FAILURES[,SUCCESSES]]]", value_parser = parse_readiness)]
    readiness: Option<Readiness>,
    /// What the readiness probe asks: http:PATH (200 to 399 passes),
    /// http:PATH=STATUS, tcp:PORT or exec:COMMAND ARGS… (as
    /// --liveness-check).
    #[arg(long, value_name = "CHECK", requires = "readiness", value_parser = parse_check)]
    readiness_check: Option<ProbeCheck>,
    /// Seconds after the container (re)starts before the readiness probe
    /// runs (0 to 3600).
    #[arg(long, value_name = "SECONDS", requires = "readiness", value_parser = clap::value_parser!(u32).range(0..=3600))]
    readiness_grace: Option<u32>,
}

impl ProbeArgs {
    /// The probes given, whole.
    pub fn probes(self) -> (Option<Liveness>, Option<Readiness>) {
        let liveness = self.liveness.map(|mut l| {
            l.check = self.liveness_check;
            l.grace_seconds = self.liveness_grace.unwrap_or(0);
            l
        });
        let readiness = self.readiness.map(|mut r| {
            r.check = self.readiness_check;
            r.grace_seconds = self.readiness_grace.unwrap_or(0);
            r
        });
        (liveness, readiness)
    }
}

/// `http:PATH[=STATUS]`, `tcp:PORT` or `exec:COMMAND ARGS…`
/// (`exec:[…]` as a JSON array of strings).
pub fn parse_check(text: &str) -> Result<ProbeCheck, String> {
    let (kind, rest) = text
        .split_once(':')
        .ok_or("expected http:PATH[=STATUS], tcp:PORT or exec:COMMAND")?;
    let check = match kind {
        "http" => {
            let (path, status) = match rest.rsplit_once('=') {
                Some((path, status)) => (
                    path,
                    Some(
                        status
                            .parse::<u16>()
                            .map_err(|_| format!("{status:?} is not an HTTP status"))?,
                    ),
                ),
                None => (rest, None),
            };
            ProbeCheck::Http {
                path: path.to_string(),
                status,
            }
        }
        "tcp" => ProbeCheck::Tcp {
            port: rest
                .parse()
                .map_err(|_| format!("{rest:?} is not a port"))?,
        },
        "exec" => {
            let rest = rest.trim();
            let command: Vec<String> = if rest.starts_with('[') {
                serde_json::from_str(rest)
                    .map_err(|e| format!("exec:[…] must be a JSON array of strings: {e}"))?
            } else {
                rest.split_whitespace().map(str::to_string).collect()
            };
            ProbeCheck::Exec { command }
        }
        other => {
            return Err(format!(
                "unknown check {other:?}: expected http, tcp or exec"
            ))
        }
    };
    check.validate("check").map_err(|e| e.to_string())?;
    Ok(check)
}

/// Up to `N` comma-separated whole numbers (`None` where the text ends
/// before them); `shape` names the form in the error.
fn numbers<const N: usize>(text: &str, shape: &str) -> Result<[Option<u32>; N], String> {
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.len() > N {
        return Err(format!("expected {shape}"));
    }
    let mut out = [None; N];
    for (slot, part) in out.iter_mut().zip(&parts) {
        *slot = Some(part.parse().map_err(|_| format!("{part:?} is not a whole number"))?);
    }
    Ok(out)
}

/// `INTERVAL[,TIMEOUT[,FAILURES[,SUCCESSES]]]` (seconds; timeout at most
/// the interval).
pub fn parse_readiness(text: &str) -> Result<Readiness, String> {
    let [interval, timeout, failures, successes] = numbers::<4>(text, "INTERVAL[,TIMEOUT[,FAILURES[,SUCCESSES]]]")?;
    let readiness = Readiness {
        interval_seconds: interval.unwrap_or(0),
        timeout_seconds: timeout.unwrap_or(1),
        failure_threshold: failures.unwrap_or(3),
        success_threshold: successes.unwrap_or(1),
        check: None,
        grace_seconds: 0,
    };
    readiness.validate().map_err(|e| e.to_string())?;
    Ok(readiness)
}

/// `INTERVAL[,TIMEOUT[,THRESHOLD]]` in seconds (timeout at most the
/// interval).
pub fn parse_liveness(text: &str) -> Result<Liveness, String> {
    let [interval, timeout, threshold] = numbers::<3>(text, "INTERVAL[,TIMEOUT[,THRESHOLD]]")?;
    let interval_seconds = interval.unwrap_or(0);
    let liveness = Liveness {
        interval_seconds,
        timeout_seconds: timeout.unwrap_or(2.min(interval_seconds.max(1))),
        failure_threshold: threshold.unwrap_or(3),
        check: None,
        grace_seconds: 0,
    };
    liveness.validate().map_err(|e| e.to_string())?;
    Ok(liveness)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_check("http:/up").unwrap(),
            ProbeCheck::Http {
                path: "/up".into(),
                status: None
            }
        );
        assert_eq!(
            parse_check("http:/up?a=b=204").unwrap(),
            ProbeCheck::Http {
                path: "/up?a=b".into(),
                status: Some(204)
            }
        );
        assert_eq!(
            parse_check("tcp:5432").unwrap(),
            ProbeCheck::Tcp { port: 5432 }
        );
        assert_eq!(
            parse_check("exec:pg_isready -U app").unwrap(),
            ProbeCheck::Exec {
                command: vec!["pg_isready".into(), "-U".into(), "app".into()]
            }
        );
        assert_eq!(
            parse_check(r#"exec:["sh","-c","test -f /tmp/ok"]"#).unwrap(),
            ProbeCheck::Exec {
                command: vec!["sh".into(), "-c".into(), "test -f /tmp/ok".into()]
            }
        );
        for bad in [
            "",
            "http",
            "http:up",
            "http:/=99",
            "tcp:0",
            "tcp:x",
            "exec:",
            "exec:[1]",
            "udp:53",
        ] {
            assert!(parse_check(bad).is_err(), "{bad}");
        }
    }
}
