//! Line charts drawn as SVG on the server, from stored history. A sample
//! that is missing (not stored, or a value the agent could not measure) is
//! a gap in the line, never a zero: the line breaks wherever two stored
//! samples are further apart than their resolution allows, and the gap is
//! shaded so it shows even when it is a few pixels wide.
//!
//! The SVG has a viewBox and no size: the stylesheet makes it as wide as
//! its box. Invisible columns carry a `<title>` with the values at that
//! time, so the pointer shows them (the script also copies them into the
//! readout under the chart).

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
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Plain,
    /// Things counted (requests, restarts): whole numbers on the axis.
    Count,
    Percent,
    Bytes,
}

/// The words a chart shows, in the page's language.
pub struct Words<'a> {
    /// Shown when nothing was stored, and on a gap.
    pub no_data: &'a str,
    /// The axis start when it is the first sample, not the range's start;
    /// `{time}` is replaced.
    pub since: &'a str,
}

const WIDTH: f64 = 480.0;
const HEIGHT: f64 = 200.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 8.0;
const BOTTOM: f64 = 22.0;
const TOP: f64 = 10.0;
/// Hover columns across the plot, at most.
const COLUMNS: usize = 96;
/// The narrowest a gap is drawn, in viewBox units.
const MIN_GAP: f64 = 4.0;
/// The shortest window drawn when it starts at the first sample.
const MIN_WINDOW_MS: i64 = 60_000;

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

/// Where the x axis starts: the range's start, or the first sample when
/// more than half the range has none (a new cluster), so the data is not
/// squeezed into the rightmost pixels. `true` when it is the first sample.
pub fn window_start(pieces: &[Vec<Vec<(i64, f64)>>], from_ms: i64, to_ms: i64) -> (i64, bool) {
    let first = pieces.iter().filter_map(|p| p.first().and_then(|p| p.first())).map(|p| p.0).min();
    match first {
        Some(first) if first - from_ms > (to_ms - from_ms) / 2 => (first.min(to_ms - MIN_WINDOW_MS).max(from_ms), true),
        _ => (from_ms, false),
    }
}

/// The stretches with no line, over all series, merged: between two pieces
/// of a series, and from a series' last sample to `to_ms` when it stopped
/// early. Before a series' first sample is not a gap: it did not exist.
pub fn gaps(series: &[Series], pieces: &[Vec<Vec<(i64, f64)>>], to_ms: i64) -> Vec<(i64, i64)> {
    let mut all: Vec<(i64, i64)> = Vec::new();
    for (s, pieces) in series.iter().zip(pieces) {
        for pair in pieces.windows(2) {
            all.push((pair[0].last().map_or(0, |p| p.0), pair[1][0].0));
        }
        if let Some(&(last, _)) = pieces.last().and_then(|p| p.last()) {
            if to_ms - last > s.max_step_ms {
                all.push((last, to_ms));
            }
        }
    }
    all.sort_unstable();
    let mut merged: Vec<(i64, i64)> = Vec::new();
    for (a, b) in all {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged
}

fn nice(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    let f = raw / magnitude;
    magnitude * if f <= 1.0 { 1.0 } else if f <= 2.0 { 2.0 } else if f <= 5.0 { 5.0 } else { 10.0 }
}

/// The y axis ticks from 0 to the top of the scale (the last tick), about
/// four steps of a round size: whole numbers for counts, powers of two
/// for bytes, quarters for percentages.
pub fn ticks(max: f64, unit: Unit) -> Vec<f64> {
    if unit == Unit::Percent {
        return vec![0.0, 25.0, 50.0, 75.0, 100.0];
    }
    let max = if max > 0.0 && max.is_finite() { max } else { 1.0 };
    let raw = max / 4.0;
    let step = match unit {
        // A power of two, so the labels read 256 MiB, 1 GiB, 4 GiB.
        Unit::Bytes => 2f64.powf(raw.max(1.0).log2().ceil()),
        Unit::Count => nice(raw).round().max(1.0),
        _ => nice(raw),
    };
    let steps = (max / step - 1e-9).ceil().max(1.0) as usize;
    (0..=steps).map(|i| i as f64 * step).collect()
}

/// A tick's label. `step` is the distance between ticks, for how many
/// decimals a plain value needs.
fn tick_label(value: f64, step: f64, unit: Unit) -> String {
    match unit {
        Unit::Percent => format!("{value:.0}%"),
        Unit::Bytes => super::format::bytes(value.max(0.0) as u64).replace(".0 ", " "),
        Unit::Count => format!("{value:.0}"),
        Unit::Plain => {
            let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
            format!("{value:.decimals$}")
        }
    }
}

/// A value as the pointer readout shows it.
fn value_text(value: f64, unit: Unit) -> String {
    match unit {
        Unit::Percent => format!("{value:.1}%"),
        Unit::Bytes => super::format::bytes(value.max(0.0) as u64),
        _ if value == value.trunc() => format!("{value:.0}"),
        _ if value.abs() >= 100.0 => format!("{value:.1}"),
        _ => format!("{value:.2}"),
    }
}

/// The present point of `points` nearest `at`, if within `reach`.
fn nearest(points: &[(i64, f64)], at: i64, reach: i64) -> Option<(i64, f64)> {
    let i = points.partition_point(|p| p.0 < at);
    [i.checked_sub(1), Some(i)]
        .into_iter()
        .flatten()
        .filter_map(|i| points.get(i).copied())
        .filter(|p| (p.0 - at).abs() <= reach)
        .min_by_key(|p| (p.0 - at).abs())
}

/// An SVG chart of `series` between `from_ms` and `to_ms`. `title` labels
/// it for screen readers.
pub fn render(title: &str, words: &Words, series: &[Series], from_ms: i64, to_ms: i64, unit: Unit) -> Markup {
    let pieces: Vec<Vec<Vec<(i64, f64)>>> = series.iter().map(segments).collect();
    let max = pieces.iter().flatten().flatten().map(|p| p.1).fold(0.0_f64, f64::max);
    let ticks = ticks(max, unit);
    let step = ticks.get(1).copied().unwrap_or(1.0);
    let top = ticks.last().copied().unwrap_or(1.0).max(f64::MIN_POSITIVE);
    let (from_ms, since_first) = window_start(&pieces, from_ms, to_ms);
    let span_ms = (to_ms - from_ms).max(1);
    let span = span_ms as f64;
    let plot = WIDTH - LEFT - RIGHT;
    let x = |at: i64| LEFT + (at - from_ms) as f64 / span * plot;
    let y = |v: f64| TOP + (1.0 - v / top) * (HEIGHT - TOP - BOTTOM);
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
                let _ = write!(paths, r#"<circle class="s{index}" cx="{:.1}" cy="{:.1}" r="2.5"/>"#, x(piece[0].0), y(piece[0].1));
            } else {
                let _ = write!(paths, r#"<path class="s{index}" d="{d}"/>"#);
            }
        }
    }
    let gaps = gaps(series, &pieces, to_ms);
    // The values at each column's time, for the pointer.
    let flat: Vec<Vec<(i64, f64)>> = pieces.iter().map(|p| p.concat()).collect();
    let column_ms = (span_ms / COLUMNS as i64).max(1);
    let columns: Vec<(f64, f64, String, bool)> = if empty {
        Vec::new()
    } else {
        (0..COLUMNS)
            .map(|i| {
                let t0 = from_ms + span_ms * i as i64 / COLUMNS as i64;
                let t1 = from_ms + span_ms * (i as i64 + 1) / COLUMNS as i64;
                let center = (t0 + t1) / 2;
                let mut at = None;
                let mut parts = Vec::new();
                for (s, points) in series.iter().zip(&flat) {
                    let reach = (column_ms / 2).max(s.max_step_ms / 5);
                    let found = nearest(points, center, reach);
                    if let Some((when, value)) = found {
                        at.get_or_insert(when);
                        let value = value_text(value, unit);
                        parts.push(if series.len() > 1 { format!("{} {value}", s.name) } else { value });
                    }
                }
                let found = !parts.is_empty();
                let text = match at {
                    Some(at) => format!("{} · {}", super::format::datetime(at), parts.join(" · ")),
                    None => format!("{} · {}", super::format::datetime(center), words.no_data),
                };
                (x(t0), x(t1) - x(t0), text, found)
            })
            .collect()
    };
    let latest = columns.iter().rev().find(|c| c.3).map(|c| c.2.clone()).unwrap_or_default();
    let start_label = if since_first { words.since.replace("{time}", &super::format::clock(from_ms)) } else { super::format::clock(from_ms) };
    html! {
        figure.chart {
            figcaption { (title) }
            svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) role="img" aria-label=(title) data-points=(pieces.iter().flatten().map(Vec::len).sum::<usize>()) data-segments=(pieces.iter().map(Vec::len).sum::<usize>()) data-gaps=(gaps.len()) data-from=(from_ms) {
                @for tick in &ticks {
                    line.rule x1=(LEFT) y1=(format!("{:.1}", y(*tick))) x2=(WIDTH - RIGHT) y2=(format!("{:.1}", y(*tick))) {}
                    text.tick x=(LEFT - 5.0) y=(format!("{:.1}", y(*tick) + 4.0)) text-anchor="end" { (tick_label(*tick, step, unit)) }
                }
                line.axis x1=(LEFT) y1=(HEIGHT - BOTTOM) x2=(WIDTH - RIGHT) y2=(HEIGHT - BOTTOM) {}
                line.axis x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(HEIGHT - BOTTOM) {}
                text.tick.start x=(LEFT) y=(HEIGHT - 5.0) { (start_label) }
                text.tick x=(WIDTH - RIGHT) y=(HEIGHT - 5.0) text-anchor="end" { (super::format::clock(to_ms)) }
                @for (a, b) in &gaps {
                    @let (x0, x1) = (x(*a), x(*b));
                    @let width = (x1 - x0).max(MIN_GAP);
                    rect.gap x=(format!("{:.1}", (x0 + x1 - width) / 2.0)) y=(TOP) width=(format!("{width:.1}")) height=(HEIGHT - TOP - BOTTOM) {
                        title { (words.no_data) ": " (super::format::datetime(*a)) " – " (super::format::datetime(*b)) }
                    }
                }
                @if empty {
                    text.nodata x=(LEFT + plot / 2.0) y=(HEIGHT / 2.0) text-anchor="middle" { (words.no_data) }
                }
                // Built above from numbers only, so nothing here needs escaping.
                (PreEscaped(paths))
                @for (x0, width, text, _) in &columns {
                    rect.hover x=(format!("{x0:.1}")) y=(TOP) width=(format!("{width:.1}")) height=(HEIGHT - TOP - BOTTOM) { title { (text) } }
                }
            }
            @if !empty { p.readout { (latest) } }
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

    const WORDS: Words = Words { no_data: "no data", since: "since {time}" };

    fn series(points: &[(i64, Option<f64>)]) -> Series {
        Series { name: "cpu".into(), points: points.to_vec(), max_step_ms: 45_000 }
    }

    fn tick_labels(svg: &str) -> Vec<String> {
        svg.split(r#"text-anchor="end">"#).skip(1).map(|rest| rest.split('<').next().unwrap_or("").to_string()).collect()
    }

    #[test]
    fn a_missing_sample_breaks_the_line_instead_of_dropping_to_zero() {
        // 30 s samples with one missing (at 90 s) and one unmeasured.
        let s = series(&[(0, Some(10.0)), (30_000, Some(20.0)), (60_000, Some(30.0)), (120_000, Some(40.0)), (150_000, None), (180_000, Some(5.0))]);
        let pieces = segments(&s);
        assert_eq!(pieces, vec![vec![(0, 10.0), (30_000, 20.0), (60_000, 30.0)], vec![(120_000, 40.0)], vec![(180_000, 5.0)]]);
        let svg = render("CPU", &WORDS, &[s], 0, 180_000, Unit::Percent).into_string();
        assert!(svg.contains(r#"data-segments="3""#), "{svg}");
        assert!(svg.contains(r#"data-points="5""#), "{svg}");
        // No point is drawn at the zero line for the missing samples.
        let zero_y = format!(",{:.1}", HEIGHT - BOTTOM);
        assert!(!svg.contains(&zero_y), "a gap was drawn as zero: {svg}");
    }

    #[test]
    fn no_samples_say_no_data_and_titles_are_escaped() {
        let svg = render("<script>x</script>", &WORDS, &[series(&[])], 0, 1000, Unit::Plain).into_string();
        assert!(svg.contains("no data"));
        assert!(svg.contains("&lt;script&gt;") && !svg.contains("<script>"), "{svg}");
    }

    #[test]
    fn counts_get_whole_number_ticks() {
        // At most 2 requests in a sample: the axis reads 0, 1, 2, never "2.20".
        assert_eq!(ticks(2.0, Unit::Count), vec![0.0, 1.0, 2.0]);
        assert_eq!(ticks(0.0, Unit::Count), vec![0.0, 1.0]);
        assert!(ticks(37.0, Unit::Count).iter().all(|t| *t == t.trunc()));
        assert_eq!(ticks(37.0, Unit::Count).last(), Some(&40.0));
        let s = Series { name: "2xx".into(), points: vec![(0, Some(1.0)), (15_000, Some(2.0))], max_step_ms: 40_000 };
        let svg = render("Requests", &WORDS, &[s], 0, 15_000, Unit::Count).into_string();
        let labels = tick_labels(&svg);
        assert!(labels.contains(&"2".to_string()) && labels.iter().all(|l| !l.contains('.')), "{labels:?}");
        // Plain values keep the decimals their step needs; bytes are round.
        assert_eq!(ticks(0.9, Unit::Plain), vec![0.0, 0.5, 1.0]);
        assert_eq!(tick_label(0.2, 0.2, Unit::Plain), "0.2");
        assert_eq!(tick_label(512.0 * 1024.0 * 1024.0, 256.0 * 1024.0 * 1024.0, Unit::Bytes), "512 MiB");
        assert_eq!(ticks(3.5 * 1073741824.0, Unit::Bytes).last(), Some(&(4.0 * 1073741824.0)));
    }

    #[test]
    fn a_mostly_empty_window_starts_at_the_first_sample() {
        // A new cluster: the first sample 55 minutes into a 1 h window.
        let hour = 3_600_000;
        let s = Series { name: "cpu".into(), points: vec![(55 * 60_000, Some(5.0)), (55 * 60_000 + 15_000, Some(6.0))], max_step_ms: 40_000 };
        let svg = render("CPU", &WORDS, &[s], 0, hour, Unit::Percent).into_string();
        assert!(svg.contains(&format!(r#"data-from="{}""#, 55 * 60_000)), "{svg}");
        assert!(svg.contains(&format!("since {}", super::super::format::clock(55 * 60_000))), "{svg}");
        // The 15 s between the two samples is now wide, not 2 px.
        let pieces = vec![segments(&Series { name: String::new(), points: vec![(55 * 60_000, Some(1.0))], max_step_ms: 1 })];
        assert_eq!(window_start(&pieces, 0, hour), (55 * 60_000, true));
        // A sample in the first half: the range is drawn whole.
        let pieces = vec![vec![vec![(10 * 60_000, 1.0)]]];
        assert_eq!(window_start(&pieces, 0, hour), (0, false));
        // A sample a moment ago: still at least a minute wide.
        let pieces = vec![vec![vec![(hour - 1000, 1.0)]]];
        assert_eq!(window_start(&pieces, 0, hour), (hour - MIN_WINDOW_MS, true));
    }

    #[test]
    fn gaps_are_marked_and_the_pointer_reads_values() {
        // A 15 s sampler that lost one sample (at 45 s) and stopped after 90 s.
        let s = Series { name: "cpu".into(), points: vec![(0, Some(1.0)), (15_000, Some(2.0)), (30_000, Some(3.0)), (60_000, Some(4.0)), (75_000, Some(5.0)), (90_000, Some(6.0))], max_step_ms: 20_000 };
        let pieces = vec![segments(&s)];
        assert_eq!(gaps(std::slice::from_ref(&s), &pieces, 300_000), vec![(30_000, 60_000), (90_000, 300_000)]);
        let svg = render("CPU", &WORDS, &[s], 0, 300_000, Unit::Percent).into_string();
        assert!(svg.contains(r#"data-gaps="2""#), "{svg}");
        assert_eq!(svg.matches(r#"<rect class="gap""#).count(), 2, "{svg}");
        assert!(svg.contains("<title>no data: "), "{svg}");
        // Even a gap of a few pixels is drawn at least MIN_GAP wide.
        for width in svg.split(r#"<rect class="gap""#).skip(1).map(|r| r.split("width=\"").nth(1).and_then(|w| w.split('"').next()).and_then(|w| w.parse::<f64>().ok()).unwrap_or(0.0)) {
            assert!(width >= MIN_GAP, "{svg}");
        }
        assert_eq!(svg.matches(r#"<rect class="hover""#).count(), COLUMNS, "{svg}");
        assert!(svg.contains("1970-01-01 00:00:00 UTC · 1.0%"), "{svg}");
        // The readout starts at the latest value.
        assert!(svg.contains(r#"<p class="readout">1970-01-01 00:01:30 UTC · 6.0%</p>"#), "{svg}");
        // Series names in the readout are escaped.
        let named = Series { name: "<b>".into(), points: vec![(0, Some(1.0))], max_step_ms: 20_000 };
        let other = Series { name: "b".into(), points: vec![(0, Some(2.0))], max_step_ms: 20_000 };
        let svg = render("x", &WORDS, &[named, other], 0, 20_000, Unit::Count).into_string();
        assert!(svg.contains("&lt;b&gt; 1 · b 2") && !svg.contains("<b>"), "{svg}");
    }
}
