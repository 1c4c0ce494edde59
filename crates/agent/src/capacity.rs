//! The node's capacity for heartbeats: cores, memory from /proc/meminfo,
//! disk from statfs of the data dir.

use std::path::Path;

use cloudweb_protocol::Heartbeat;

pub fn measure(data_dir: &Path) -> Heartbeat {
    Heartbeat {
        cpu_cores: std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
        mem_bytes: meminfo_field("MemTotal:").unwrap_or(0),
        disk_bytes: disk_total(data_dir).unwrap_or(0),
        health: None,
        metrics: None,
        ingress: None,
        mesh_endpoint: None,
    }
}

/// A field of /proc/meminfo in bytes.
pub fn meminfo_field(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, field)
}

fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

fn disk_total(dir: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(stat.blocks() as u64 * stat.fragment_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo() {
        let text = "MemTotal:       16384 kB\nMemAvailable:    8192 kB\n";
        assert_eq!(parse_meminfo(text, "MemTotal:"), Some(16384 * 1024));
        assert_eq!(parse_meminfo(text, "MemAvailable:"), Some(8192 * 1024));
        assert_eq!(parse_meminfo(text, "SwapTotal:"), None);
    }

    #[test]
    fn measures_this_machine() {
        let hb = measure(Path::new("/"));
        assert!(hb.cpu_cores >= 1 && hb.mem_bytes > 0 && hb.disk_bytes > 0);
    }
}
