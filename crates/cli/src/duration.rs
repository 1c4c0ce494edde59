//! Durations on the command line (`90s`, `30m`, `1h`, `2h30m`, `1d`): read
//! into whole seconds for the API, and written back the same way.

/// Whole seconds from `1d2h30m15s`-style text: one or more numbers, each
/// with its unit (`d`, `h`, `m`, `s`), largest unit first, each unit once.
/// A bare number is refused: `--timeout 10` could mean seconds or minutes,
/// and a guess there runs a job six times longer than meant.
pub fn parse(text: &str) -> Result<u32, String> {
    const UNITS: [(char, u64); 4] = [('d', 86_400), ('h', 3_600), ('m', 60), ('s', 1)];
    let help = "expected a number with a unit, largest first: 90s, 30m, 1h, 2h30m, 1d";
    let text = text.trim();
    if text.is_empty() {
        return Err(format!("empty duration; {help}"));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{text:?} has no unit; {help}"));
    }
    let mut total: u64 = 0;
    // Index into UNITS past the last unit used: each next one is smaller.
    let mut next_unit = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("{text:?} is not a duration; {help}"));
        }
        // Eleven digits of any unit already overflow u32 seconds.
        if digits > 10 {
            return Err(format!("{text:?} is too long a duration"));
        }
        let number: u64 = rest[..digits].parse().expect("ASCII digits");
        let Some(unit) = rest[digits..].chars().next() else {
            return Err(format!("{text:?}: {} has no unit; {help}", &rest[..digits]));
        };
        let Some(position) = UNITS.iter().position(|(u, _)| *u == unit.to_ascii_lowercase()) else {
            return Err(format!("{text:?}: unknown unit {unit:?}; {help}"));
        };
        if position < next_unit {
            return Err(format!("{text:?}: units must go from largest to smallest, each once; {help}"));
        }
        next_unit = position + 1;
        total += number * UNITS[position].1;
        rest = &rest[digits + unit.len_utf8()..];
    }
    u32::try_from(total).map_err(|_| format!("{text:?} is too long a duration"))
}

/// A run's time limit: 1 second to a day (the API's bounds).
pub fn timeout(text: &str) -> Result<u32, String> {
    let seconds = parse(text)?;
    let max = cloudweb_protocol::tasks::MAX_TIMEOUT_SECONDS;
    if seconds == 0 || seconds > max {
        return Err(format!("{text:?} is out of range: a timeout is 1s to {}", format(max)));
    }
    Ok(seconds)
}

/// How late a missed tick may still run: 1 minute to 7 days (the control
/// plane's bounds, checked here too so a typo exits 2 before a request).
pub fn starting_deadline(text: &str) -> Result<u32, String> {
    use cloudweb_protocol::tasks::{MAX_STARTING_DEADLINE_SECONDS as MAX, MIN_STARTING_DEADLINE_SECONDS as MIN};
    let seconds = parse(text)?;
    if !(MIN..=MAX).contains(&seconds) {
        return Err(format!("{text:?} is out of range: a starting deadline is {} to {}", format(MIN), format(MAX)));
    }
    Ok(seconds)
}

/// Seconds as `parse` reads them: `2h30m`, `90s` as `1m30s`, `0s`.
pub fn format(seconds: u32) -> String {
    if seconds == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    let mut rest = seconds;
    for (unit, size) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

/// Milliseconds for a table: `850ms`, `12.3s`, `4m05s`, `2h10m`.
pub fn millis(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_units_largest_first() {
        assert_eq!(parse("90s"), Ok(90));
        assert_eq!(parse("30m"), Ok(1800));
        assert_eq!(parse("1h"), Ok(3600));
        assert_eq!(parse("2h30m"), Ok(9000));
        assert_eq!(parse("1d2h3m4s"), Ok(93_784));
        assert_eq!(parse(" 1H "), Ok(3600));
        assert_eq!(parse("0s"), Ok(0));
        for bad in ["", "10", "1.5h", "h", "1x", "30m1h", "1h1h", "1h 30m", "-1m", "99999999999s", "50000d"] {
            let err = parse(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad:?}");
        }
        assert!(parse("10").unwrap_err().contains("no unit"));
        assert!(parse("30m1h").unwrap_err().contains("largest to smallest"));
    }

    #[test]
    fn timeouts_are_a_second_to_a_day() {
        assert_eq!(timeout("24h"), Ok(86_400));
        assert_eq!(timeout("1s"), Ok(1));
        assert!(timeout("0s").unwrap_err().contains("1s to 1d"));
        assert!(timeout("1d1s").is_err());
        assert_eq!(starting_deadline("7d"), Ok(604_800));
        assert!(starting_deadline("0s").is_err() && starting_deadline("59s").is_err() && starting_deadline("7d1s").is_err());
        assert_eq!(starting_deadline("1m"), Ok(60));
    }

    #[test]
    fn durations_write_as_they_read() {
        for seconds in [0, 1, 59, 60, 90, 3600, 9000, 86_400, 93_784] {
            assert_eq!(parse(&format(seconds)), Ok(seconds), "{seconds}");
        }
        assert_eq!(format(9000), "2h30m");
        assert_eq!(format(90), "1m30s");
        assert_eq!(millis(850), "850ms");
        assert_eq!(millis(12_340), "12.3s");
        assert_eq!(millis(245_000), "4m05s");
        assert_eq!(millis(7_800_000), "2h10m");
    }
}
