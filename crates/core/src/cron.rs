//! Backup schedules: the five fields of cron (`minute hour day-of-month
//! month day-of-week`), in UTC, with `*`, numbers, ranges `a-b`, steps
//! `*/n` and `a-b/n`, and lists `a,b`; day of week 0 to 7 (0 and 7 are
//! Sunday); `@hourly`, `@daily`, `@weekly` and `@monthly`. As in cron, when
//! both day fields are restricted a day matching either runs.

use time::{Duration, OffsetDateTime};

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

    fn day_matches(&self, at: OffsetDateTime) -> bool {
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
    /// schedule fires, in ms; `None` when none comes within 5 years (a
    /// 31st of February).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let start = OffsetDateTime::from_unix_timestamp(after_ms.div_euclid(1000)).ok()?;
        let mut at = start.replace_second(0).ok()?.replace_nanosecond(0).ok()? + Duration::minutes(1);
        let end = start + Duration::days(5 * 366);
        while at < end {
            if self.months & (1 << u8::from(at.month())) == 0 {
                let (year, month) = if at.month() == time::Month::December { (at.year() + 1, time::Month::January) } else { (at.year(), at.month().next()) };
                at = time::Date::from_calendar_date(year, month, 1).ok()?.midnight().assume_utc();
                continue;
            }
            if !self.day_matches(at) {
                at = (at.date() + Duration::days(1)).midnight().assume_utc();
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
            return Some(at.unix_timestamp() * 1000);
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
