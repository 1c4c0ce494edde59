//! Schedules of backups and scheduled jobs: the five fields of cron
//! (`minute hour day-of-month month day-of-week`), in UTC or (scheduled
//! jobs) in an IANA time zone, with `*`, numbers, ranges `a-b`, steps
//! `*/n` and `a-b/n`, and lists `a,b`; day of week 0 to 7 (0 and 7 are
//! Sunday); `@hourly`, `@daily`, `@weekly` and `@monthly`. As in cron, when
//! both day fields are restricted a day matching either runs.

use time::{Duration, OffsetDateTime, PrimitiveDateTime};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    days_restricted: bool,
    weekdays_restricted: bool,
}

fn field(text: &str, min: u32, max: u32, name: &str) -> Result<(u64, bool), String> {
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| format!("{name}: step {step:?} is not a number"))?;
                if step == 0 {
                    return Err(format!("{name}: a step of 0"));
                }
                (range, step)
            }
            None => (part, 1),
        };
        let (from, to) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let a: u32 = a.parse().map_err(|_| format!("{name}: {a:?} is not a number"))?;
            let b: u32 = b.parse().map_err(|_| format!("{name}: {b:?} is not a number"))?;
            (a, b)
        } else {
            let a: u32 = range.parse().map_err(|_| format!("{name}: {range:?} is not a number"))?;
            (a, if part.contains('/') { max } else { a })
        };
        if from < min || to > max || from > to {
            return Err(format!("{name}: {part:?} is outside {min}-{max}"));
        }
        let mut value = from;
        while value <= to {
            bits |= 1 << value;
            value += step;
        }
    }
    Ok((bits, text != "*"))
}

impl Schedule {
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        if text.len() > 128 {
            return Err("a schedule is at most 128 characters".into());
        }
        let expanded = match text {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = parts[..] else {
            return Err("a schedule has five fields: minute hour day-of-month month day-of-week (UTC)".into());
        };
        let (minutes, _) = field(minute, 0, 59, "minute")?;
        let (hours, _) = field(hour, 0, 23, "hour")?;
        let (days, days_restricted) = field(day, 1, 31, "day of month")?;
        let (months, _) = field(month, 1, 12, "month")?;
        let (mut weekdays, weekdays_restricted) = field(weekday, 0, 7, "day of week")?;
        if weekdays & (1 << 7) != 0 {
            weekdays |= 1;
        }
        Ok(Schedule {
            minutes,
            hours: hours as u32,
            days: days as u32,
            months: months as u16,
            weekdays: (weekdays & 0x7f) as u8,
            days_restricted,
            weekdays_restricted,
        })
    }

    fn day_matches(&self, at: PrimitiveDateTime) -> bool {
        let day = self.days & (1 << at.day()) != 0;
        let weekday = self.weekdays & (1 << at.weekday().number_days_from_sunday()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => day || weekday,
            (true, false) => day,
            (false, true) => weekday,
            (false, false) => true,
        }
    }

    /// The first minute strictly after `after_ms` (ms since the epoch) the
    /// schedule fires, read in UTC, in ms; `None` when none comes within 5
    /// years (a 31st of February).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let start = OffsetDateTime::from_unix_timestamp(after_ms.div_euclid(1000)).ok()?;
        let next = self.next_civil(PrimitiveDateTime::new(start.date(), start.time()))?;
        Some(next.assume_utc().unix_timestamp() * 1000)
    }

    /// The first wall-clock minute strictly after `after` that matches.
    pub fn next_civil(&self, after: PrimitiveDateTime) -> Option<PrimitiveDateTime> {
        let mut at = after.replace_second(0).ok()?.replace_nanosecond(0).ok()? + Duration::minutes(1);
        let end = after + Duration::days(5 * 366);
        while at < end {
            if self.months & (1 << u8::from(at.month())) == 0 {
                let (year, month) = if at.month() == time::Month::December { (at.year() + 1, time::Month::January) } else { (at.year(), at.month().next()) };
                at = time::Date::from_calendar_date(year, month, 1).ok()?.midnight();
                continue;
            }
            if !self.day_matches(at) {
                at = (at.date() + Duration::days(1)).midnight();
                continue;
            }
            if self.hours & (1 << at.hour()) == 0 {
                at = at.replace_minute(0).ok()? + Duration::hours(1);
                continue;
            }
            if self.minutes & (1 << at.minute()) == 0 {
                at += Duration::minutes(1);
                continue;
            }
            return Some(at);
        }
        None
    }

    /// The first tick strictly after `after_ms` with the schedule read as
    /// wall-clock time in `zone`. A tick that does not exist there (the
    /// hour skipped when clocks go forward) fires at the first minute
    /// after the gap; a tick that exists twice (the hour repeated when
    /// they go back) fires once, at its first occurrence.
    pub fn next_in_zone(&self, zone: &jiff::tz::TimeZone, after_ms: i64) -> Option<i64> {
        let after = jiff::Timestamp::from_millisecond(after_ms).ok()?;
        let local = zone.to_datetime(after);
        let mut civil = PrimitiveDateTime::new(
            time::Date::from_calendar_date(i32::from(local.year()), time::Month::try_from(local.month() as u8).ok()?, local.day() as u8).ok()?,
            time::Time::from_hms(local.hour() as u8, local.minute() as u8, local.second() as u8).ok()?,
        );
        // Bounded: the times of a repeated hour already passed are skipped
        // here, at most one hour of minutes.
        for _ in 0..2_000 {
            civil = self.next_civil(civil)?;
            let at = resolve(zone, civil)?;
            if at > after_ms {
                return Some(at);
            }
        }
        None
    }

    /// The shortest gap between two runs, roughly (for "older than twice
    /// its schedule"): the gap after `from_ms` between the next two runs.
    pub fn interval_ms(&self, from_ms: i64) -> Option<i64> {
        let first = self.next_after(from_ms)?;
        let second = self.next_after(first)?;
        Some(second - first)
    }
}

/// The instant (ms) of wall-clock time `civil` in `zone`: the earlier of
/// two, and for a time inside a gap, the end of the gap.
fn resolve(zone: &jiff::tz::TimeZone, civil: PrimitiveDateTime) -> Option<i64> {
    let mut civil = civil;
    // A gap is at most a few hours (most are one): walk out of it.
    for _ in 0..(26 * 60) {
        let local = jiff::civil::DateTime::new(
            i16::try_from(civil.year()).ok()?,
            u8::from(civil.month()) as i8,
            civil.day() as i8,
            civil.hour() as i8,
            civil.minute() as i8,
            0,
            0,
        )
        .ok()?;
        let ambiguous = zone.to_ambiguous_timestamp(local);
        if !matches!(ambiguous.offset(), jiff::tz::AmbiguousOffset::Gap { .. }) {
            return ambiguous.earlier().ok().map(|t| t.as_millisecond());
        }
        civil += Duration::minutes(1);
    }
    None
}

/// A time zone by its IANA name (`UTC`, `Europe/Madrid`).
pub fn zone(name: &str) -> Result<jiff::tz::TimeZone, String> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'+')) {
        return Err(format!("{name:?} is not a time zone name (such as UTC or Europe/Madrid)"));
    }
    jiff::tz::TimeZone::get(name).map_err(|_| format!("unknown time zone {name:?} (an IANA name such as UTC or Europe/Madrid)"))
}

/// The default schedule of a target: daily, at a minute of a night hour
/// (01:00 to 05:59 UTC) derived from its name, so targets do not all start
/// at once and a target keeps its time.
pub fn default_schedule(target: &str) -> String {
    let h = spread(target);
    format!("{} {} * * *", h % 60, 1 + (h / 60) % 5)
}

/// The default verification schedule: weekly, on Sunday, two hours after
/// the backup's default time.
pub fn default_verify_schedule(target: &str) -> String {
    let h = spread(target);
    format!("{} {} * * 0", h % 60, 3 + (h / 60) % 5)
}

fn spread(text: &str) -> u64 {
    // FNV-1a: stable across releases, unlike the std hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> i64 {
        let format = time::format_description::well_known::Rfc3339;
        OffsetDateTime::parse(text, &format).unwrap().unix_timestamp() * 1000
    }

    #[test]
    fn finds_the_next_run() {
        let daily = Schedule::parse("17 3 * * *").unwrap();
        assert_eq!(daily.next_after(ms("2026-12-02T01:00:00Z")), Some(ms("2026-12-02T03:17:00Z")));
        assert_eq!(daily.next_after(ms("2026-12-02T03:17:00Z")), Some(ms("2026-12-03T03:17:00Z")));
        let every = Schedule::parse("*/15 * * * *").unwrap();
        assert_eq!(every.next_after(ms("2026-12-02T01:07:30Z")), Some(ms("2026-12-02T01:15:00Z")));
        let sunday = Schedule::parse("0 4 * * 7").unwrap();
        // 2026-12-06 is a Sunday.
        assert_eq!(sunday.next_after(ms("2026-12-02T00:00:00Z")), Some(ms("2026-12-06T04:00:00Z")));
        let new_year = Schedule::parse("0 0 1 1 *").unwrap();
        assert_eq!(new_year.next_after(ms("2026-12-02T00:00:00Z")), Some(ms("2027-01-01T00:00:00Z")));
        let either = Schedule::parse("0 0 13 * 5").unwrap();
        // Friday 2026-12-04 comes before the 13th.
        assert_eq!(either.next_after(ms("2026-12-02T00:00:00Z")), Some(ms("2026-12-04T00:00:00Z")));
        assert_eq!(Schedule::parse("0 0 31 2 *").unwrap().next_after(ms("2026-12-02T00:00:00Z")), None);
        assert_eq!(Schedule::parse("@hourly").unwrap().interval_ms(0), Some(3_600_000));
    }

    #[test]
    fn reads_the_schedule_in_a_time_zone_across_daylight_saving_changes() {
        let madrid = zone("Europe/Madrid").unwrap();
        let daily = Schedule::parse("30 3 * * *").unwrap();
        // Winter: UTC+1.
        assert_eq!(daily.next_in_zone(&madrid, ms("2026-12-02T00:00:00Z")), Some(ms("2026-12-02T02:30:00Z")));
        // Summer: UTC+2.
        assert_eq!(daily.next_in_zone(&madrid, ms("2026-07-01T00:00:00Z")), Some(ms("2026-07-01T01:30:00Z")));
        // 2026-03-29: 02:00 jumps to 03:00; 02:30 does not exist and runs
        // at the end of the gap, 03:00 local (01:00 UTC), once.
        let skipped = Schedule::parse("30 2 * * *").unwrap();
        let first = skipped.next_in_zone(&madrid, ms("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(first, ms("2026-03-29T01:00:00Z"));
        assert_eq!(skipped.next_in_zone(&madrid, first), Some(ms("2026-03-30T00:30:00Z")));
        // 2026-10-25: 03:00 goes back to 02:00; 02:30 exists twice and
        // runs at the first one only.
        let twice = skipped.next_in_zone(&madrid, ms("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(twice, ms("2026-10-25T00:30:00Z"));
        assert_eq!(skipped.next_in_zone(&madrid, twice), Some(ms("2026-10-26T01:30:00Z")));
        // Every five minutes through the repeated hour: each wall-clock
        // minute once, strictly increasing.
        let every = Schedule::parse("*/5 * * * *").unwrap();
        let mut at = ms("2026-10-24T23:50:00Z");
        let mut ticks = Vec::new();
        while at < ms("2026-10-25T02:10:00Z") {
            let next = every.next_in_zone(&madrid, at).unwrap();
            assert!(next > at);
            ticks.push(next);
            at = next;
        }
        // 01:55 local, 02:00 to 02:55 once (12), then 03:00, 03:05 and
        // 03:10 (02:10 UTC): the second pass of 02:xx (01:00 to 01:59 UTC)
        // has no tick.
        assert_eq!(ticks.len(), 16, "{ticks:?}");
        assert_eq!(ticks[12], ms("2026-10-25T00:55:00Z"));
        assert_eq!(ticks[13], ms("2026-10-25T02:00:00Z"));
        let utc = zone("UTC").unwrap();
        assert_eq!(daily.next_in_zone(&utc, ms("2026-12-02T00:00:00Z")), daily.next_after(ms("2026-12-02T00:00:00Z")));
        assert!(zone("Mars/Olympus").is_err());
        assert!(zone("../etc/passwd").is_err());
        assert!(zone("").is_err());
    }

    #[test]
    fn refuses_what_cron_would_not_run() {
        for bad in ["", "* * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *", "* * * * 8", "*/0 * * * *", "a * * * *", "5-1 * * * *"] {
            assert!(Schedule::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_schedules_are_at_night_and_stable() {
        for target in ["service/db", "volume/uploads", "service/cache"] {
            let text = default_schedule(target);
            assert_eq!(text, default_schedule(target));
            let hour: u32 = text.split(' ').nth(1).unwrap().parse().unwrap();
            assert!((1..=5).contains(&hour), "{text}");
            Schedule::parse(&text).unwrap();
            Schedule::parse(&default_verify_schedule(target)).unwrap();
        }
    }
}
