//! Wall-clock instants as nanoseconds since the Unix epoch, so that times
//! from different processes on one machine (this benchmark, the agent's log
//! lines, the control plane's records, the Docker Engine's events) can be
//! subtracted from each other.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since 1970-01-01T00:00:00Z.
pub type Nanos = i128;

pub fn now() -> Nanos {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_nanos() as Nanos,
        Err(before) => -(before.duration().as_nanos() as Nanos),
    }
}

/// Milliseconds from `from` to `to` (negative when `to` is earlier).
pub fn millis_between(from: Nanos, to: Nanos) -> f64 {
    (to - from) as f64 / 1e6
}

/// Parses RFC 3339 date-time text (`2026-11-29T10:00:00.123456789Z`, or
/// with a `+hh:mm` / `-hh:mm` offset), as the agent and the control plane
/// write it.
pub fn parse_rfc3339(text: &str) -> Option<Nanos> {
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok().map(|t| t.unix_timestamp_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Option<Nanos>) {
        assert_eq!(parse_rfc3339(text), expected, "{text}");
    }

    #[test]
    fn parses_what_the_agent_and_the_control_plane_write() {
        check("1970-01-01T00:00:00Z", Some(0));
        check("2024-02-29T12:34:56.789Z", Some(1_709_210_096_789_000_000));
        check("1999-12-31T23:59:59Z", Some(946_684_799_000_000_000));
        check("2026-11-29T10:00:00+02:00", Some(1_795_939_200_000_000_000));
        check("2026-11-29T08:00:00.000000001Z", Some(1_795_939_200_000_000_001));
        check("2026-11-29T08:00:00.5-00:30", Some(1_795_941_000_500_000_000));
    }

    #[test]
    fn refuses_anything_else() {
        for text in ["", "2026-11-29", "2026-11-29T08:00:00", "2026-13-01T00:00:00Z", "2026-11-29T08:00:00.Z", "2026-11-29T08:00:00+0200", "2026-11-29T08:00:00Zjunk", "20a6-11-29T08:00:00Z"] {
            check(text, None);
        }
    }

    #[test]
    fn agrees_with_the_system_clock() {
        let before = now();
        let text = time::OffsetDateTime::from_unix_timestamp_nanos(before).unwrap().format(&time::format_description::well_known::Rfc3339).unwrap();
        assert_eq!(parse_rfc3339(&text), Some(before));
    }
}
