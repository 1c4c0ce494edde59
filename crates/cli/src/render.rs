//! Output: aligned tables for people, JSON for scripts, and text made safe
//! for a terminal (what the server relays, such as app output, may hold
//! escape sequences).

use std::io::Write;

use serde_json::Value;

/// Control characters (escape sequences, carriage returns) written as
/// `\u{..}` so remote text cannot drive the terminal; tabs stay.
pub fn clean(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// A JSON value as a table cell: strings as they are, null as `-`.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".to_string(),
        Value::String(s) => clean(s),
        Value::Array(items) if items.is_empty() => "-".to_string(),
        Value::Array(items) => items.iter().map(cell).collect::<Vec<_>>().join(","),
        other => clean(&other.to_string()),
    }
}

/// Prints rows under a header, columns padded to their widest cell.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut text = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        text.trim_end().to_string()
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(out, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

/// Pretty JSON on stdout.
pub fn json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).expect("JSON serializes"));
}

/// Bytes in KiB/MiB/GiB, one decimal.
pub fn bytes(value: &Value) -> String {
    let Some(n) = value.as_f64() else { return "-".to_string() };
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut n = n;
    let mut unit = 0;
    while n >= 1024.0 && unit < UNITS.len() - 1 {
        n /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n:.0} {}", UNITS[0])
    } else {
        format!("{n:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_text_cannot_drive_the_terminal() {
        assert_eq!(clean("a\u{1b}[2Jb\rc\td"), "a\\u{1b}[2Jb\\u{d}c\td");
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&serde_json::json!(["a", "b"])), "a,b");
        assert_eq!(bytes(&serde_json::json!(1536)), "1.5 KiB");
        assert_eq!(bytes(&serde_json::json!(12)), "12 B");
    }
}
