//! Line charts drawn as SVG on the server, from stored history. A sample
//! that is missing (not stored, or a value the agent could not measure) is
//! a gap in the line, never a zero: the line breaks wherever two stored
//! samples are further apart than their resolution allows.

use std::fmt::Write;

use maud::{html, Markup, PreEscaped};

/// One series: a name for the legend and `(at_ms, value)` points in time
/// order, `None` where the sample exists but the value was not measured.
pub struct Series {
    pub name: String,
    pub points: Vec<(i64, Option<f64>)>,
    /// The longest distance between two samples that still draws a line.
    pub max_step_ms: i64,
}

/// How a value is written on the axis.
#[derive(Clone, Copy)]
pub enum Unit {
    Plain,
    Percent,
    Bytes,
}

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 160.0;
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 20.0;
const TOP: f64 = 8.0;

/// The polyline pieces of a series: each is a run of consecutive present
/// points no further apart than `max_step_ms`.
pub fn segments(series: &Series) -> Vec<Vec<(i64, f64)>> {
    let mut out: Vec<Vec<(i64, f64)>> = Vec::new();
    let mut current: Vec<(i64, f64)> = Vec::new();
    for &(at, value) in &series.points {
        match value.filter(|v| v.is_finite()) {
            Some(value) => {
                if let Some(&(last_at, _)) = current.last() {
                    if at - last_at > series.max_step_ms {
                        out.push(std::mem::take(&mut current));
                    }
                }
                current.push((at, value));
            }
            None => {
                if !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

fn label(value: f64, unit: Unit) -> String {
    match unit {
        Unit::Percent => format!("{value:.0}%"),
        Unit::Bytes => super::format::bytes(value.max(0.0) as u64),
        Unit::Plain if value.abs() >= 100.0 || value == value.trunc() => format!("{value:.0}"),
        Unit::Plain => format!("{value:.2}"),
    }
}

/// An SVG chart of `series` between `from_ms` and `to_ms`. `title` labels
/// it for screen readers; `no_data` is shown when nothing was stored.
pub fn render(title: &str, no_data: &str, series: &[Series], from_ms: i64, to_ms: i64, unit: Unit) -> Markup {
    let pieces: Vec<Vec<Vec<(i64, f64)>>> = series.iter().map(segments).collect();
    let max = pieces.iter().flatten().flatten().map(|p| p.1).fold(0.0_f64, f64::max);
    let max = match unit {
        // Percentages always show their whole scale.
        Unit::Percent => 100.0,
        _ if max <= 0.0 => 1.0,
        _ => max * 1.1,
    };
    let span = (to_ms - from_ms).max(1) as f64;
    let x = |at: i64| LEFT + (at - from_ms) as f64 / span * (WIDTH - LEFT - 4.0);
    let y = |v: f64| TOP + (1.0 - v / max) * (HEIGHT - TOP - BOTTOM);
    let empty = pieces.iter().all(|p| p.is_empty());
    let mut paths = String::new();
    for (index, series_pieces) in pieces.iter().enumerate() {
        for piece in series_pieces {
            let mut d = String::new();
            for (i, &(at, value)) in piece.iter().enumerate() {
                let _ = write!(d, "{}{:.1},{:.1}", if i == 0 { "M" } else { " L" }, x(at), y(value));
            }
            // A lone sample is a dot, so it stays visible.
            if piece.len() == 1 {
                let _ = write!(paths, r#"<circle class="s{index}" cx="{:.1}" cy="{:.1}" r="2"/>"#, x(piece[0].0), y(piece[0].1));
            } else {
                let _ = write!(paths, r#"<path class="s{index}" d="{d}"/>"#);
            }
        }
    }
    html! {
        figure.chart {
            figcaption { (title) }
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) data-points=(pieces.iter().flatten().map(Vec::len).sum::<usize>()) data-segments=(pieces.iter().map(Vec::len).sum::<usize>()) {
                line.axis x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) {}
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(HEIGHT - BOTTOM) {}
                text.tick x=(LEFT - 4.0) y=(TOP + 8.0) text-anchor="end" { (label(max, unit)) }
                text.tick x=(LEFT - 4.0) y=(HEIGHT - BOTTOM) text-anchor="end" { (label(0.0, unit)) }
                text.tick x=(LEFT) y=(HEIGHT - 4.0) { (super::format::clock(from_ms)) }
                text.tick x=(WIDTH - 4.0) y=(HEIGHT - 4.0) text-anchor="end" { (super::format::clock(to_ms)) }
                @if empty {
                    text.nodata x=(WIDTH / 2.0) y=(HEIGHT / 2.0) text-anchor="middle" { (no_data) }
                }
                // Built above from numbers only, so nothing here needs escaping.
                (PreEscaped(paths))
            }
            @if series.len() > 1 {
                ul.legend {
                    @for (index, s) in series.iter().enumerate() {
                        li { span class=(format!("key s{index}")) {} (s.name) }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &[(i64, Option<f64>)]) -> Series {
        Series { name: "cpu".into(), points: points.to_vec(), max_step_ms: 45_000 }
    }

    #[test]
    fn a_missing_sample_breaks_the_line_instead_of_dropping_to_zero() {
        // 30 s samples with one missing (at 90 s) and one unmeasured.
        let s = series(&[(0, Some(10.0)), (30_000, Some(20.0)), (60_000, Some(30.0)), (120_000, Some(40.0)), (150_000, None), (180_000, Some(5.0))]);
        let pieces = segments(&s);
        assert_eq!(pieces, vec![vec![(0, 10.0), (30_000, 20.0), (60_000, 30.0)], vec![(120_000, 40.0)], vec![(180_000, 5.0)]]);
        let svg = render("CPU", "no data", &[s], 0, 180_000, Unit::Percent).into_string();
        assert!(svg.contains(r#"data-segments="3""#), "{svg}");
        assert!(svg.contains(r#"data-points="5""#), "{svg}");
        // No point is drawn at the zero line for the missing samples.
        let zero_y = format!(",{:.1}", HEIGHT - BOTTOM);
        assert!(!svg.contains(&zero_y), "a gap was drawn as zero: {svg}");
    }

    #[test]
    fn no_samples_say_no_data_and_titles_are_escaped() {
        let svg = render("<script>x</script>", "no data", &[series(&[])], 0, 1000, Unit::Plain).into_string();
        assert!(svg.contains("no data"));
        assert!(svg.contains("&lt;script&gt;") && !svg.contains("<script>"), "{svg}");
    }
}
