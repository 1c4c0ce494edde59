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
    let bytes = text.as_bytes();
    if bytes.len() < 20 || bytes[4] != b'-' || bytes[7] != b'-' || !matches!(bytes[10], b'T' | b't' | b' ') || bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let number = |range: std::ops::Range<usize>| text.get(range).and_then(digits);
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut fraction_nanos: i128 = 0;
    if let Some(after_dot) = rest.strip_prefix('.') {
        let digits = after_dot.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let value: i128 = after_dot[..digits].parse().ok()?;
        fraction_nanos = value * 10i128.pow(9 - digits as u32);
        rest = &after_dot[digits..];
    }
    let offset_seconds: i64 = match rest {
        "Z" | "z" => 0,
        offset if offset.len() == 6 && offset.as_bytes()[3] == b':' => {
            let sign = match offset.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let hours = offset.get(1..3).and_then(digits)?;
            let minutes = offset.get(4..6).and_then(digits)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            sign * (hours * 3600 + minutes * 60)
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_seconds;
    Some(i128::from(seconds) * 1_000_000_000 + fraction_nanos)
}

/// The value of a non-empty run of ASCII digits.
fn digits(text: &str) -> Option<i64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok())?
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
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
        for text in ["", "2026-11-29", "2026-11-29T08:00:00", "2026-13-01T00:00:00Z", "2026-11-29T08:00:00.Z", "2026-11-29T08:00:00.1234567890Z", "2026-11-29T08:00:00+0200", "2026-11-29T08:00:00Zjunk", "20a6-11-29T08:00:00Z"] {
            check(text, None);
        }
    }

    #[test]
    fn agrees_with_the_system_clock() {
        let before = now();
        let text = time_text(before);
        assert_eq!(parse_rfc3339(&text), Some(before - before.rem_euclid(1_000_000_000)));
    }

    /// Whole-second UTC text of `nanos`, computed the other way round.
    fn time_text(nanos: Nanos) -> String {
        let seconds = (nanos.div_euclid(1_000_000_000)) as i64;
        let (days, second_of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
        let mut year = 1970;
        let mut remaining = days;
        loop {
            let length = if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 { 366 } else { 365 };
            if remaining < length {
                break;
            }
            remaining -= length;
            year += 1;
        }
        let mut month = 1;
        while days_from_civil(year, month + 1, 1) - days_from_civil(year, 1, 1) <= remaining && month < 12 {
            month += 1;
        }
        let day = remaining - (days_from_civil(year, month, 1) - days_from_civil(year, 1, 1)) + 1;
        format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", second_of_day / 3600, second_of_day % 3600 / 60, second_of_day % 60)
    }
}
