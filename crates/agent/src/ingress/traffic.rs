//! Per-host traffic counts from Caddy's access log. Caddy writes one JSON
//! line per request to the agent's unix socket, already filtered down to
//! host, status and duration; the agent reads only those three fields and
//! counts only hosts of its route table, so an arbitrary Host header never
//! becomes a series.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use cloudweb_protocol::HostTraffic;
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::UnixListener;

/// Requests slower than this count as slow.
const SLOW_SECONDS: f64 = 1.0;

#[derive(Debug, Deserialize)]
struct AccessLine {
    request: AccessRequest,
    status: u16,
    /// Seconds.
    duration: f64,
}

#[derive(Debug, Deserialize)]
struct AccessRequest {
    host: String,
}

#[derive(Default)]
pub struct TrafficCounter {
    hosts: Mutex<HashMap<String, HostTraffic>>,
}

/// The host without a port, lowercased.
fn bare_host(host: &str) -> String {
    let host = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or(v6)
    } else {
        host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map(|(h, _)| h).unwrap_or(host)
    };
    host.to_ascii_lowercase()
}

impl TrafficCounter {
    pub fn record(&self, host: &str, status: u16, seconds: f64) {
        let host = bare_host(host);
        if host.is_empty() || host.len() > 253 {
            return;
        }
        let mut hosts = self.hosts.lock().expect("traffic lock");
        // Bound memory against floods of made-up hosts between samples.
        if !hosts.contains_key(&host) && hosts.len() >= 10_000 {
            return;
        }
        let entry = hosts.entry(host.clone()).or_insert_with(|| HostTraffic { host, ..Default::default() });
        entry.requests += 1;
        match status {
            200..=299 => entry.r2xx += 1,
            300..=399 => entry.r3xx += 1,
            400..=499 => entry.r4xx += 1,
            500..=599 => entry.r5xx += 1,
            _ => {}
        }
        let seconds = if seconds.is_finite() && seconds >= 0.0 { seconds } else { 0.0 };
        entry.dur_sum_ms += seconds * 1000.0;
        if seconds > SLOW_SECONDS {
            entry.slow += 1;
        }
    }

    /// Counts since the last sample, for the hosts in `known`, most requests
    /// first, at most `limit`; returns them and how many were left out.
    pub fn take_sample(&self, known: &HashSet<String>, limit: usize) -> (Vec<HostTraffic>, u32) {
        let counted = std::mem::take(&mut *self.hosts.lock().expect("traffic lock"));
        let mut sample: Vec<HostTraffic> = counted.into_values().filter(|t| known.contains(&t.host)).collect();
        sample.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.host.cmp(&b.host)));
        let omitted = sample.len().saturating_sub(limit) as u32;
        sample.truncate(limit);
        (sample, omitted)
    }

    pub fn record_line(&self, line: &str) {
        if let Ok(entry) = serde_json::from_str::<AccessLine>(line) {
            self.record(&entry.request.host, entry.status, entry.duration);
        }
    }
}

/// Accepts Caddy's log connections on `socket` and counts every line.
pub async fn listen(socket: &Path, counter: std::sync::Arc<TrafficCounter>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    loop {
        let (stream, _) = listener.accept().await?;
        let counter = counter.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                counter.record_line(&line);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_class_for_known_hosts_only() {
        let counter = TrafficCounter::default();
        counter.record_line(r#"{"request":{"host":"web.test:8443"},"status":200,"duration":0.004}"#);
        counter.record_line(r#"{"request":{"host":"WEB.test"},"status":301,"duration":0.001}"#);
        counter.record_line(r#"{"request":{"host":"web.test"},"status":404,"duration":1.5}"#);
        counter.record_line(r#"{"request":{"host":"web.test"},"status":502,"duration":0.0}"#);
        counter.record_line(r#"{"request":{"host":"evil.example"},"status":200,"duration":0.0}"#);
        counter.record_line("not json");
        let known: HashSet<String> = ["web.test".to_string()].into();
        let (sample, omitted) = counter.take_sample(&known, 200);
        assert_eq!(omitted, 0);
        assert_eq!(sample.len(), 1);
        let web = &sample[0];
        assert_eq!((web.requests, web.r2xx, web.r3xx, web.r4xx, web.r5xx, web.slow), (4, 1, 1, 1, 1, 1));
        assert!((web.dur_sum_ms - 1505.0).abs() < 1e-6);
        assert!(counter.take_sample(&known, 200).0.is_empty(), "samples are deltas");
    }

    #[test]
    fn keeps_the_busiest_hosts() {
        let counter = TrafficCounter::default();
        let mut known = HashSet::new();
        for i in 0..5 {
            let host = format!("h{i}.test");
            for _ in 0..=i {
                counter.record(&host, 200, 0.0);
            }
            known.insert(host);
        }
        let (sample, omitted) = counter.take_sample(&known, 3);
        assert_eq!(omitted, 2);
        assert_eq!(sample.iter().map(|t| t.host.as_str()).collect::<Vec<_>>(), ["h4.test", "h3.test", "h2.test"]);
    }
}
