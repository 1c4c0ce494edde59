//! CPU time and memory of another process, from /proc.

pub struct Sample {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

pub fn sample(pid: u32) -> Option<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??.max(1) as f64;
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|k| k * 1024)
    };
    Some(Sample { cpu_seconds: (utime + stime) / ticks, rss_bytes: kib("VmRSS:")?, peak_rss_bytes: kib("VmHWM:")? })
}

pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// CPU seconds of `root` and of its direct children (PostgreSQL's server
/// and its backends), as far as they run now.
pub fn tree_cpu_seconds(root: u32) -> f64 {
    let mut total = sample(root).map(|s| s.cpu_seconds).unwrap_or(0.0);
    let Ok(entries) = std::fs::read_dir("/proc") else { return total };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let parent = stat.rfind(')').and_then(|i| stat[i + 2..].split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(root) {
            total += sample(pid).map(|s| s.cpu_seconds).unwrap_or(0.0);
        }
    }
    total
}
