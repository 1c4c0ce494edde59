//! A benchmark's target and its verdict, in the one format every command
//! prints and `cloudweb-bench all` reads back:
//!
//! `target <what> <cmp> <limit>: met (measured <value>)`, or `NOT met`.
//!
//! A target whose figure was not measured (a size not reached, a line the
//! log never showed) is NOT met: a figure nobody saw is not a pass.

use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    Below,
    AtMost,
    AtLeast,
    Above,
}

impl Cmp {
    fn symbol(self) -> &'static str {
        match self {
            Cmp::Below => "<",
            Cmp::AtMost => "<=",
            Cmp::AtLeast => ">=",
            Cmp::Above => ">",
        }
    }

    fn holds(self, measured: f64, limit: f64) -> bool {
        match self {
            Cmp::Below => measured < limit,
            Cmp::AtMost => measured <= limit,
            Cmp::AtLeast => measured >= limit,
            Cmp::Above => measured > limit,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// What is judged, e.g. "heartbeat latency p99".
    pub what: String,
    pub cmp: Cmp,
    pub limit: f64,
    pub unit: &'static str,
    /// `None` when the figure was not measured.
    pub measured: Option<f64>,
    /// Said after the measured value (why nothing was measured, say).
    pub note: Option<String>,
}

impl Target {
    pub fn new(what: impl Into<String>, cmp: Cmp, limit: f64, unit: &'static str, measured: Option<f64>) -> Target {
        Target { what: what.into(), cmp, limit, unit, measured, note: None }
    }

    /// `what` must stay below `limit`.
    pub fn below(what: impl Into<String>, limit: f64, unit: &'static str, measured: Option<f64>) -> Target {
        Target::new(what, Cmp::Below, limit, unit, measured)
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Target {
        self.note = Some(note.into());
        self
    }

    pub fn met(&self) -> bool {
        self.measured.is_some_and(|m| m.is_finite() && self.cmp.holds(m, self.limit))
    }

    /// The one line: `target <what> <cmp> <limit>: met|NOT met (measured …)`.
    pub fn verdict(&self) -> String {
        let mut line = format!(
            "target {} {} {}: {} (measured {}",
            self.what,
            self.cmp.symbol(),
            quantity(self.limit, self.unit),
            if self.met() { "met" } else { "NOT met" },
            self.measured.map_or_else(|| "nothing".to_string(), |m| quantity(m, self.unit))
        );
        if let Some(note) = &self.note {
            let _ = write!(line, "; {note}");
        }
        line.push(')');
        line
    }
}

/// Prints each target's verdict line.
pub fn print(targets: &[Target]) {
    for target in targets {
        println!("{}", target.verdict());
    }
}

/// A value with its unit: at most two decimals, trailing zeros dropped;
/// a unit starting with '/' or '%' (a rate, a share) follows without a space.
fn quantity(value: f64, unit: &str) -> String {
    let digits = if value.abs() >= 100.0 { 0 } else { 2 };
    let mut number = format!("{value:.digits$}");
    if number.contains('.') {
        number = number.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    match unit {
        "" => number,
        u if u.starts_with(['/', '%']) => format!("{number}{u}"),
        u => format!("{number} {u}"),
    }
}

/// A verdict line read back: the target (what, comparison and limit),
/// whether it was met, and what was measured.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub target: String,
    pub met: bool,
    pub measured: String,
}

/// Reads a line [`Target::verdict`] printed; `None` for any other line.
pub fn parse(line: &str) -> Option<Verdict> {
    let rest = line.trim_end().strip_prefix("target ")?;
    for (marker, met) in [(": met (measured ", true), (": NOT met (measured ", false)] {
        if let Some(at) = rest.rfind(marker) {
            let measured = rest[at + marker.len()..].strip_suffix(')')?;
            return Some(Verdict { target: rest[..at].to_string(), met, measured: measured.to_string() });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_read_back() {
        let met = Target::below("heartbeat latency p99", 50.0, "ms", Some(9.04));
        assert_eq!(met.verdict(), "target heartbeat latency p99 < 50 ms: met (measured 9.04 ms)");
        let missed = Target::new("placements", Cmp::Above, 10_000.0, "/s", Some(9_000.4));
        assert_eq!(missed.verdict(), "target placements > 10000/s: NOT met (measured 9000/s)");
        let none = Target::new("ratio", Cmp::AtLeast, 0.5, "", None).with_note("not reached");
        assert_eq!(none.verdict(), "target ratio >= 0.5: NOT met (measured nothing; not reached)");
        for target in [met, missed, none] {
            let read = parse(&target.verdict()).unwrap();
            assert_eq!(read.met, target.met());
            assert!(target.verdict().contains(&read.target));
        }
        assert_eq!(parse("target: p99 under 10 ms"), None);
        assert_eq!(parse("heartbeats: 10 agents"), None);
    }

    #[test]
    fn limits_are_judged_by_their_comparison() {
        let at = |cmp, measured| Target::new("x", cmp, 10.0, "", Some(measured)).met();
        assert!(at(Cmp::Below, 9.9) && !at(Cmp::Below, 10.0));
        assert!(at(Cmp::AtMost, 10.0) && !at(Cmp::AtMost, 10.1));
        assert!(at(Cmp::AtLeast, 10.0) && !at(Cmp::AtLeast, 9.9));
        assert!(at(Cmp::Above, 10.1) && !at(Cmp::Above, 10.0));
        assert!(!at(Cmp::Below, f64::NAN));
    }
}
