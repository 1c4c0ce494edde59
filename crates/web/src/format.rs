//! How figures read on a page: sizes, percentages, times.

use time::OffsetDateTime;

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `HH:MM` (UTC) of a Unix-millisecond time, for chart axes.
pub fn clock(ms: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!("{:02}-{:02} {:02}:{:02}", u8::from(at.month()), at.day(), at.hour(), at.minute())
}

/// `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn datetime(ms: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    format!("{}-{:02}-{:02} {:02}:{:02}:{:02} UTC", at.year(), u8::from(at.month()), at.day(), at.hour(), at.minute(), at.second())
}

/// How long something took: "850 ms", "12.3 s", "4 min 05 s", "2 h 10 min".
pub fn duration_ms(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{} min {:02} s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{} h {:02} min", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// "12 s", "3 min", "2 h", "4 d": how long ago.
pub fn age(ms: i64) -> String {
    let s = (ms / 1000).max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_ages_read_plainly() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(age(5_000), "5 s");
        assert_eq!(age(600_000), "10 min");
        assert_eq!(age(3 * 86_400_000), "3 d");
        assert_eq!(datetime(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(duration_ms(850), "850 ms");
        assert_eq!(duration_ms(12_340), "12.3 s");
        assert_eq!(duration_ms(245_000), "4 min 05 s");
        assert_eq!(duration_ms(7_800_000), "2 h 10 min");
    }
}
