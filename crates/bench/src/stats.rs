//! Percentiles over recorded latencies.

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
}
