//! Output: aligned tables for people, JSON for scripts, and text made safe
//! for a terminal (what the server relays, such as app output, may hold
//! escape sequences).

use std::io::Write;

use serde::Serialize;
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

/// A field of an API body as a table cell: text made safe, an absent
/// value or an empty list as `-`, a list joined with `,`.
pub trait Cell {
    fn cell(&self) -> String;
}

impl Cell for str {
    fn cell(&self) -> String {
        clean(self)
    }
}

impl Cell for String {
    fn cell(&self) -> String {
        clean(self)
    }
}

macro_rules! number_cells {
    ($($t:ty),*) => {$(
        impl Cell for $t {
            fn cell(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
number_cells!(i64, u64, u32, u16);

impl<T: Cell> Cell for Option<T> {
    fn cell(&self) -> String {
        self.as_ref().map_or_else(|| "-".to_string(), Cell::cell)
    }
}

impl<T: Cell> Cell for [T] {
    fn cell(&self) -> String {
        if self.is_empty() {
            return "-".to_string();
        }
        self.iter().map(Cell::cell).collect::<Vec<_>>().join(",")
    }
}

impl<T: Cell> Cell for Vec<T> {
    fn cell(&self) -> String {
        self.as_slice().cell()
    }
}

/// `value` as a table cell (see [`Cell`]).
pub fn cell(value: &(impl Cell + ?Sized)) -> String {
    value.cell()
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

/// `value` as JSON with its object keys in order, as the API's JSON has
/// always been printed (whatever order the type declares its fields in).
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Value {
    serde_json::to_value(value).expect("API bodies serialize")
}

/// Pretty JSON on stdout, keys sorted.
pub fn json<T: Serialize + ?Sized>(value: &T) {
    println!("{}", serde_json::to_string_pretty(&to_json(value)).expect("JSON serializes"));
}

/// Bytes in KiB/MiB/GiB, one decimal.
pub fn bytes(value: Option<u64>) -> String {
    let Some(n) = value.map(|n| n as f64) else { return "-".to_string() };
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
        assert_eq!(cell(&None::<String>), "-");
        assert_eq!(cell(&vec!["a".to_string(), "b\u{1b}".to_string()]), "a,b\\u{1b}");
        assert_eq!(cell(&Vec::<String>::new()), "-");
        assert_eq!(cell(&Some(8080i64)), "8080");
        assert_eq!(bytes(Some(1536)), "1.5 KiB");
        assert_eq!(bytes(Some(12)), "12 B");
        assert_eq!(bytes(None), "-");
        // Keys come out sorted, as the API's JSON always printed.
        #[derive(serde::Serialize)]
        struct Shape {
            zebra: u8,
            apple: u8,
        }
        assert_eq!(serde_json::to_string(&to_json(&Shape { zebra: 1, apple: 2 })).unwrap(), r#"{"apple":2,"zebra":1}"#);
    }
}
