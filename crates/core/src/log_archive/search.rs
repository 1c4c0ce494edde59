//! Searching stored runtime logs: a time range (`since`, `until`: an RFC
//! 3339 time or a duration ago, `2h`), words from the full-text index
//! (`q`), a regular expression over each line (`grep`), an instance, a
//! stream and a deployment. Results come newest first, a page at a time;
//! the cursor of the next page is the position of the last line looked at.
//!
//! A regular expression is checked line by line on what the other filters
//! select, so one request looks at most [`SCAN_BUDGET`] lines: a page may
//! come back short with a cursor, and the next request goes on from there.

use cloudweb_store::{LogFilter, LogRow, LogStore, StoreError};
use regex::Regex;

use crate::error::ApiError;

/// Most lines one page holds.
pub const MAX_PAGE: usize = 1_000;
/// Most lines one request reads from the store while a regular expression
/// picks among them.
pub const SCAN_BUDGET: usize = 200_000;
/// Lines read from the store at a time during such a scan.
const SCAN_CHUNK: usize = 2_000;
/// Most words in `q`, and the longest word.
const MAX_WORDS: usize = 16;
const MAX_WORD: usize = 100;
/// The longest regular expression, and the most memory it may compile to.
const MAX_PATTERN: usize = 500;
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// A checked search.
#[derive(Debug, Clone, Default)]
pub struct Search {
    pub since_ns: Option<i64>,
    pub until_ns: Option<i64>,
    pub words: Vec<String>,
    pub grep: Option<Regex>,
    pub instance: Option<u32>,
    pub stream: Option<String>,
    pub deployment: Option<String>,
    pub before: Option<(i64, i64)>,
    pub limit: usize,
}

/// One page of results, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub lines: Vec<LogRow>,
    /// Where the next page starts, when there may be one.
    pub next: Option<String>,
}

/// The raw query, as the API and the dashboard take it.
#[derive(Debug, Clone, Default)]
pub struct RawSearch<'a> {
    pub since: Option<&'a str>,
    pub until: Option<&'a str>,
    pub q: Option<&'a str>,
    pub grep: Option<&'a str>,
    pub instance: Option<&'a str>,
    pub stream: Option<&'a str>,
    pub deployment: Option<&'a str>,
    pub cursor: Option<&'a str>,
    pub limit: Option<&'a str>,
}

impl RawSearch<'_> {
    /// Whether any search parameter is there (otherwise a request asks for
    /// the tail).
    pub fn is_search(&self) -> bool {
        self.since.is_some() || self.until.is_some() || self.q.is_some() || self.grep.is_some() || self.instance.is_some() || self.stream.is_some() || self.cursor.is_some() || self.limit.is_some()
    }

    /// Checks every parameter; times are taken relative to `now_ns`.
    pub fn check(&self, now_ns: i64, default_limit: usize) -> Result<Search, ApiError> {
        let bad = |message: String| ApiError::BadRequest(message);
        let since_ns = self.since.map(|t| time_bound("since", t, now_ns)).transpose()?;
        let until_ns = self.until.map(|t| time_bound("until", t, now_ns)).transpose()?;
        if let (Some(since), Some(until)) = (since_ns, until_ns) {
            if since >= until {
                return Err(bad("since must be before until".into()));
            }
        }
        let words = match self.q {
            None => Vec::new(),
            Some(q) => {
                // Words are what the index holds: letters and digits.
                let words: Vec<String> = q.split_whitespace().filter(|w| w.chars().any(char::is_alphanumeric)).map(str::to_string).collect();
                if words.len() > MAX_WORDS || words.iter().any(|w| w.len() > MAX_WORD) {
                    return Err(bad(format!("q holds at most {MAX_WORDS} words of at most {MAX_WORD} bytes")));
                }
                if words.is_empty() && !q.trim().is_empty() {
                    return Err(bad("q must hold a word (letters or digits)".into()));
                }
                words
            }
        };
        let grep = match self.grep.filter(|g| !g.is_empty()) {
            None => None,
            Some(pattern) if pattern.len() > MAX_PATTERN => return Err(bad(format!("grep is longer than {MAX_PATTERN} bytes"))),
            Some(pattern) => Some(
                regex::RegexBuilder::new(pattern)
                    .size_limit(PATTERN_SIZE_LIMIT)
                    .build()
                    .map_err(|err| bad(format!("grep is not a regular expression: {}", cloudweb_protocol::misc::one_line(&err.to_string(), 200))))?,
            ),
        };
        let instance = match self.instance {
            None => None,
            Some(text) => match text.parse::<u32>() {
                Ok(n) if (1..=100).contains(&n) => Some(n),
                _ => return Err(bad("instance must be 1 to 100".into())),
            },
        };
        let stream = match self.stream {
            None => None,
            Some(s @ ("stdout" | "stderr" | "agent")) => Some(s.to_string()),
            Some(_) => return Err(bad("stream must be stdout, stderr or agent".into())),
        };
        if let Some(deployment) = self.deployment {
            cloudweb_protocol::validate::token("deployment", deployment, 64)?;
        }
        let before = self.cursor.map(parse_cursor).transpose()?;
        let limit = match self.limit {
            None => default_limit,
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => return Err(bad(format!("limit must be 1 to {MAX_PAGE}"))),
            },
        };
        Ok(Search { since_ns, until_ns, words, grep, instance, stream, deployment: self.deployment.map(str::to_string), before, limit })
    }
}

impl Search {
    /// Whether a live line passes the search: the same filters, with the
    /// words matched as the index matches them (whole words of letters and
    /// digits, case-insensitive).
    pub fn admits(&self, ts_ns: Option<i64>, instance: u32, stream: &str, deployment: &str, text: &str) -> bool {
        if let Some(ts) = ts_ns {
            if self.since_ns.is_some_and(|since| ts < since) || self.until_ns.is_some_and(|until| ts >= until) {
                return false;
            }
        }
        if self.instance.is_some_and(|n| n != instance)
            || self.stream.as_deref().is_some_and(|s| s != stream)
            || self.deployment.as_deref().is_some_and(|d| d != deployment)
        {
            return false;
        }
        if !self.words.is_empty() {
            let tokens: std::collections::HashSet<String> =
                text.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_lowercase).collect();
            let wanted = self.words.iter().flat_map(|w| w.split(|c: char| !c.is_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_lowercase).collect::<Vec<_>>());
            if !wanted.into_iter().all(|w| tokens.contains(&w)) {
                return false;
            }
        }
        self.grep.as_ref().is_none_or(|grep| grep.is_match(text))
    }
}

/// `since`/`until`: an RFC 3339 time, or a duration ago (`90s`, `30m`,
/// `2h`, `7d`).
pub fn time_bound(name: &str, text: &str, now_ns: i64) -> Result<i64, ApiError> {
    if let Some(ns) = super::parse_ts_ns(text) {
        return Ok(ns);
    }
    let unit = text.chars().last().unwrap_or(' ');
    let seconds = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => 0,
    };
    let amount = text[..text.len() - unit.len_utf8().min(text.len())].parse::<i64>().ok().filter(|n| (0..=3650 * 86_400).contains(n));
    match amount {
        Some(n) if seconds > 0 => Ok(now_ns.saturating_sub(n.saturating_mul(seconds).saturating_mul(1_000_000_000))),
        _ => Err(ApiError::BadRequest(format!("{name} must be an RFC 3339 time or a duration ago such as 30s, 15m, 2h or 7d"))),
    }
}

/// The cursor text: `<ts_ns>.<id>` of the last line looked at.
pub fn cursor_text((ts_ns, id): (i64, i64)) -> String {
    format!("{ts_ns}.{id}")
}

fn parse_cursor(text: &str) -> Result<(i64, i64), ApiError> {
    let parsed = text.split_once('.').and_then(|(ts, id)| Some((ts.parse::<i64>().ok()?, id.parse::<i64>().ok()?)));
    parsed.ok_or_else(|| ApiError::BadRequest("cursor is not one this server gave".into()))
}

/// Runs a search on the store of `app`.
pub async fn run(store: &LogStore, app: &str, search: &Search) -> Result<Page, StoreError> {
    let filter = |before, limit: usize| LogFilter {
        app,
        since_ns: search.since_ns,
        until_ns: search.until_ns,
        words: search.words.clone(),
        instance: search.instance,
        stream: search.stream.as_deref(),
        deployment: search.deployment.as_deref(),
        before,
        limit: i64::try_from(limit).unwrap_or(i64::MAX),
    };
    let Some(grep) = &search.grep else {
        let mut lines = store.search(&filter(search.before, search.limit + 1)).await?;
        let more = lines.len() > search.limit;
        lines.truncate(search.limit);
        let next = if more { lines.last().map(|l| cursor_text((l.ts_ns, l.id))) } else { None };
        return Ok(Page { lines, next });
    };
    let mut lines = Vec::new();
    let mut before = search.before;
    let mut scanned = 0;
    loop {
        let chunk = store.search(&filter(before, SCAN_CHUNK)).await?;
        let exhausted = chunk.len() < SCAN_CHUNK;
        for row in chunk {
            scanned += 1;
            before = Some((row.ts_ns, row.id));
            if grep.is_match(&row.line) {
                lines.push(row);
                if lines.len() == search.limit {
                    return Ok(Page { lines, next: before.map(cursor_text) });
                }
            }
        }
        if exhausted {
            return Ok(Page { lines, next: None });
        }
        if scanned >= SCAN_BUDGET {
            return Ok(Page { lines, next: before.map(cursor_text) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000 * 1_000_000_000;

    #[test]
    fn parameters_are_checked() {
        let raw = RawSearch { since: Some("2h"), until: Some("30m"), q: Some("ERROR  timeout"), grep: Some("ERROR|panic"), instance: Some("2"), stream: Some("stderr"), ..RawSearch::default() };
        let search = raw.check(NOW, 100).unwrap();
        assert_eq!(search.since_ns, Some(NOW - 7200 * 1_000_000_000));
        assert_eq!(search.until_ns, Some(NOW - 1800 * 1_000_000_000));
        assert_eq!(search.words, ["ERROR", "timeout"]);
        assert!(search.grep.unwrap().is_match("a panic here"));
        assert_eq!((search.instance, search.stream.as_deref(), search.limit), (Some(2), Some("stderr"), 100));
        assert!(raw.is_search());
        assert!(!RawSearch::default().is_search());
        let rfc = RawSearch { since: Some("2026-12-01T00:00:00Z"), ..RawSearch::default() }.check(NOW, 1).unwrap();
        assert_eq!(rfc.since_ns, super::super::parse_ts_ns("2026-12-01T00:00:00Z"));
        for bad in [
            RawSearch { since: Some("2 hours"), ..RawSearch::default() },
            RawSearch { since: Some("h"), ..RawSearch::default() },
            RawSearch { since: Some("-5m"), ..RawSearch::default() },
            RawSearch { since: Some("1h"), until: Some("2h"), ..RawSearch::default() },
            RawSearch { grep: Some("(unclosed"), ..RawSearch::default() },
            RawSearch { grep: Some("a{100000}{100000}"), ..RawSearch::default() },
            RawSearch { q: Some("| ()"), ..RawSearch::default() },
            RawSearch { instance: Some("0"), ..RawSearch::default() },
            RawSearch { stream: Some("stdin"), ..RawSearch::default() },
            RawSearch { cursor: Some("abc"), ..RawSearch::default() },
            RawSearch { limit: Some("0"), ..RawSearch::default() },
            RawSearch { limit: Some("5000"), ..RawSearch::default() },
            RawSearch { deployment: Some("../x"), ..RawSearch::default() },
        ] {
            assert!(bad.check(NOW, 100).is_err(), "{bad:?}");
        }
        assert_eq!(parse_cursor(&cursor_text((5, 7))).unwrap(), (5, 7));
    }

    #[test]
    fn live_lines_pass_the_same_filters() {
        let search = RawSearch { q: Some("error db"), grep: Some("took [0-9]+ms"), stream: Some("stderr"), since: Some("1h"), ..RawSearch::default() }
            .check(NOW, 10)
            .unwrap();
        let ok = "ERROR: DB query took 31ms";
        assert!(search.admits(Some(NOW), 1, "stderr", "dep", ok));
        assert!(search.admits(None, 1, "stderr", "dep", ok), "no time: not filtered by it");
        assert!(!search.admits(Some(NOW - 7200 * 1_000_000_000), 1, "stderr", "dep", ok), "too old");
        assert!(!search.admits(Some(NOW), 1, "stdout", "dep", ok), "another stream");
        assert!(!search.admits(Some(NOW), 1, "stderr", "dep", "ERRORS: DB query took 31ms"), "whole words only");
        assert!(!search.admits(Some(NOW), 1, "stderr", "dep", "error db took long"), "the pattern too");
    }
}
