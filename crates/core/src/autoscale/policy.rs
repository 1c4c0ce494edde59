//! The autoscaler's arithmetic, apart from any I/O so that it can be run
//! over hours of synthetic load in a test.
//!
//! Each look gives a **recommendation**: `ceil(current × value / target)`
//! clamped to `[min, max]`, or the current count while the value is
//! within [`TOLERANCE`] of the target. The **decision** follows the
//! recommendations of a window, not the last one alone: it goes up only
//! to the lowest count recommended throughout the up window, and down
//! only to the highest recommended throughout the down window (which must
//! be fully observed: a freshly started autoscaler does not scale down on
//! a few looks). A load that swings around the target therefore leaves
//! the count where it is, and the count never leaves `[min, max]`.

use std::collections::VecDeque;

/// A value within 10 % of the target recommends no change.
pub const TOLERANCE: f64 = 0.10;

/// The count one look recommends.
pub fn recommend(current: u32, value: f64, target: f64, min: u32, max: u32) -> u32 {
    let current = current.max(1);
    let wanted = if target <= 0.0 || !value.is_finite() || ((value / target) - 1.0).abs() <= TOLERANCE {
        current
    } else {
        let exact = f64::from(current) * value / target;
        // A hair above a whole number is that number (float noise).
        (exact - 1e-9).ceil().max(1.0).min(f64::from(u32::MAX)) as u32
    };
    wanted.clamp(min, max)
}

/// The bounds and windows a decision keeps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub min: u32,
    pub max: u32,
    pub up_window_ms: i64,
    pub down_window_ms: i64,
}

/// The recommendations of the last windows, oldest first.
#[derive(Debug, Default, Clone)]
pub struct Stabilizer {
    seen: VecDeque<(i64, u32)>,
    /// When the first look was made (the down window must be covered).
    since: Option<i64>,
}

impl Stabilizer {
    /// Adds the recommendation of a look at `now_ms` and says the count to
    /// move to, if it moves: `current` is the count now.
    pub fn decide(&mut self, now_ms: i64, recommendation: u32, current: u32, bounds: &Bounds) -> Option<u32> {
        let Bounds { min, max, up_window_ms, down_window_ms } = *bounds;
        self.seen.push_back((now_ms, recommendation));
        let since = *self.since.get_or_insert(now_ms);
        let keep = up_window_ms.max(down_window_ms);
        while self.seen.front().is_some_and(|(at, _)| *at < now_ms - keep) {
            self.seen.pop_front();
        }
        // Outside the bounds (they changed): back inside at once.
        if current < min {
            return Some(min);
        }
        if current > max {
            return Some(max);
        }
        let within = |window: i64| self.seen.iter().filter(move |(at, _)| *at >= now_ms - window).map(|(_, n)| *n);
        let up = within(up_window_ms).min().unwrap_or(current);
        if up > current {
            return Some(up.min(max));
        }
        let covered = now_ms - since >= down_window_ms;
        let down = within(down_window_ms).max().unwrap_or(current);
        if covered && down < current {
            return Some(down.max(min));
        }
        None
    }

    /// Forgets the looks (the settings changed).
    pub fn reset(&mut self) {
        self.seen.clear();
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recommendation_follows_the_ratio_within_the_bounds() {
        assert_eq!(recommend(2, 140.0, 70.0, 1, 10), 4);
        assert_eq!(recommend(4, 35.0, 70.0, 1, 10), 2);
        assert_eq!(recommend(3, 75.0, 70.0, 1, 10), 3, "within 10 %: no change");
        assert_eq!(recommend(2, 700.0, 70.0, 1, 6), 6, "never above max");
        assert_eq!(recommend(5, 0.0, 70.0, 2, 6), 2, "never below min");
        assert_eq!(recommend(2, 105.0, 70.0, 1, 10), 3);
        assert_eq!(recommend(3, f64::NAN, 70.0, 1, 10), 3);
    }

    #[test]
    fn up_waits_for_its_window_and_down_for_a_fully_observed_one() {
        let mut s = Stabilizer::default();
        let (up, down) = (30_000, 120_000);
        assert_eq!(s.decide(0, 1, 1, &Bounds { min: 1, max: 5, up_window_ms: up, down_window_ms: down }), None);
        // High from 10 s on: up once the whole up window recommends 3.
        assert_eq!(s.decide(10_000, 3, 1, &Bounds { min: 1, max: 5, up_window_ms: up, down_window_ms: down }), None, "the window still holds a 1");
        assert_eq!(s.decide(20_000, 3, 1, &Bounds { min: 1, max: 5, up_window_ms: up, down_window_ms: down }), None);
        assert_eq!(s.decide(40_000, 3, 1, &Bounds { min: 1, max: 5, up_window_ms: up, down_window_ms: down }), Some(3));
        // Low from 50 s on: down only once a whole down window asked for less.
        let mut at = 50_000;
        while at < 160_000 {
            assert_eq!(s.decide(at, 1, 3, &Bounds { min: 1, max: 5, up_window_ms: up, down_window_ms: down }), None, "at {at}");
            at += 10_000;
        }
        assert_eq!(s.decide(170_000, 1, 3, &Bounds { min: 1, max: 5, up_window_ms: up, down_window_ms: down }), Some(1));
    }

    #[test]
    fn a_fresh_autoscaler_does_not_scale_down_and_bounds_win_at_once() {
        let mut s = Stabilizer::default();
        assert_eq!(s.decide(0, 1, 4, &Bounds { min: 1, max: 5, up_window_ms: 0, down_window_ms: 60_000 }), None);
        assert_eq!(s.decide(30_000, 1, 4, &Bounds { min: 1, max: 5, up_window_ms: 0, down_window_ms: 60_000 }), None);
        assert_eq!(s.decide(60_000, 1, 4, &Bounds { min: 1, max: 5, up_window_ms: 0, down_window_ms: 60_000 }), Some(1));
        let mut s = Stabilizer::default();
        assert_eq!(s.decide(0, 2, 1, &Bounds { min: 2, max: 5, up_window_ms: 600_000, down_window_ms: 600_000 }), Some(2), "below min");
        assert_eq!(s.decide(0, 5, 7, &Bounds { min: 2, max: 5, up_window_ms: 600_000, down_window_ms: 600_000 }), Some(5), "above max");
    }

    /// A synthetic load that swings around the target for six hours, with
    /// the looks every 15 s and the default windows: the count settles and
    /// never flaps, and stays within the bounds; a load that then doubles
    /// for good brings it up.
    #[test]
    fn an_oscillating_load_never_flaps() {
        let (min, max, target) = (2, 8, 70.0);
        let mut s = Stabilizer::default();
        let mut count = 3u32;
        let mut changes = Vec::new();
        // The total work the app has: 3 instances at 70 % each, ± 35 %
        // in waves of 4 minutes, plus a little noise.
        let total = |t: f64| 210.0 * (1.0 + 0.35 * (t / 240.0 * std::f64::consts::TAU).sin() + 0.05 * (t / 37.0).cos());
        for look in 0..(6 * 3600 / 15) {
            let t = f64::from(look) * 15.0;
            let per_instance = total(t) / f64::from(count);
            let recommendation = recommend(count, per_instance, target, min, max);
            if let Some(to) = s.decide(look as i64 * 15_000, recommendation, count, &Bounds { min, max, up_window_ms: 60_000, down_window_ms: 300_000 }) {
                assert!((min..=max).contains(&to));
                changes.push((t, count, to));
                count = to;
            }
        }
        // It may settle once (up to cover the peaks), then holds.
        assert!(changes.len() <= 1, "{changes:?}");
        let settled = count;
        for look in 0..240 {
            let t = 6.0 * 3600.0 + f64::from(look) * 15.0;
            let per_instance = 2.0 * total(t) / f64::from(count);
            let recommendation = recommend(count, per_instance, target, min, max);
            if let Some(to) = s.decide((6 * 3600 + look as i64 * 15) * 1000, recommendation, count, &Bounds { min, max, up_window_ms: 60_000, down_window_ms: 300_000 }) {
                assert!(to > count, "the doubled load only scales up");
                count = to;
            }
        }
        assert!(count > settled, "{settled} → {count}");
        assert!(count <= max);
    }
}
