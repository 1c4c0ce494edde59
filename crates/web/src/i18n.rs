//! The dashboard's words: one catalogue per language, keyed by a short
//! identifier. Every string a page shows comes from here (or from the
//! data it displays), so a translation is a change to one file.

use std::collections::HashMap;
use std::sync::OnceLock;

/// A language the dashboard speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    En,
    Es,
}

impl Lang {
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Es => "es",
        }
    }

    pub fn parse(code: &str) -> Option<Lang> {
        match code.trim().to_ascii_lowercase().as_str() {
            "en" => Some(Lang::En),
            "es" => Some(Lang::Es),
            _ => None,
        }
    }

    /// The best match for an `Accept-Language` header: the first listed
    /// language (by quality, then order) we speak; English otherwise.
    pub fn from_accept_language(header: &str) -> Lang {
        let mut choices: Vec<(f32, usize, Lang)> = header
            .split(',')
            .enumerate()
            .filter_map(|(order, part)| {
                let mut pieces = part.split(';');
                let tag = pieces.next()?.trim();
                let quality = pieces
                    .find_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.parse::<f32>().ok()))
                    .unwrap_or(1.0);
                let primary = tag.split('-').next()?;
                Lang::parse(primary).map(|lang| (quality, order, lang))
            })
            .filter(|(quality, _, _)| *quality > 0.0)
            .collect();
        choices.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal).then(a.1.cmp(&b.1)));
        choices.first().map(|c| c.2).unwrap_or(Lang::En)
    }

    /// The word for `key`. A key missing from the catalogue shows as
    /// itself (the catalogue test keeps that from shipping).
    pub fn t(self, key: &'static str) -> &'static str {
        static TABLES: OnceLock<[HashMap<&'static str, &'static str>; 2]> = OnceLock::new();
        let tables = TABLES.get_or_init(|| [EN.iter().copied().collect(), ES.iter().copied().collect()]);
        let table = match self {
            Lang::En => &tables[0],
            Lang::Es => &tables[1],
        };
        table.get(key).copied().unwrap_or(key)
    }
}

mod en;
mod es;
pub use en::EN;
pub use es::ES;

#[cfg(test)]
mod tests;
