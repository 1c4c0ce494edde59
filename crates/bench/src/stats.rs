//! Percentiles over recorded latencies, and the spread of a few repeated
//! measurements.

use std::time::Duration;

pub struct Summary {
    pub count: usize,
    pub p50: Duration,
    pub p90: Duration,
    pub p99: Duration,
    pub max: Duration,
}

pub fn summarize(mut micros: Vec<u32>) -> Summary {
    micros.sort_unstable();
    let at = |q: f64| -> Duration {
        if micros.is_empty() {
            return Duration::ZERO;
        }
        let index = ((micros.len() as f64 * q).ceil() as usize).clamp(1, micros.len()) - 1;
        Duration::from_micros(u64::from(micros[index]))
    };
    Summary { count: micros.len(), p50: at(0.50), p90: at(0.90), p99: at(0.99), max: at(1.0) }
}

/// Median, minimum and maximum of a few measurements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// `None` when there is nothing to summarize. The median of an even number
/// of values is the mean of the middle two.
pub fn spread(values: &[f64]) -> Option<Spread> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 { sorted[middle] } else { (sorted[middle - 1] + sorted[middle]) / 2.0 };
    Some(Spread { median, min: sorted[0], max: sorted[sorted.len() - 1] })
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s = summarize((1..=100).collect());
        assert_eq!(s.p50, Duration::from_micros(50));
        assert_eq!(s.p99, Duration::from_micros(99));
        assert_eq!(s.max, Duration::from_micros(100));
        assert_eq!(summarize(vec![]).count, 0);
    }

    #[test]
    fn spreads() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some(Spread { median: 2.0, min: 1.0, max: 3.0 }));
        assert_eq!(spread(&[4.0, 1.0, 2.0, 3.0]), Some(Spread { median: 2.5, min: 1.0, max: 4.0 }));
        assert_eq!(spread(&[5.0, f64::NAN]), Some(Spread { median: 5.0, min: 5.0, max: 5.0 }));
        assert_eq!(spread(&[]), None);
    }
}
