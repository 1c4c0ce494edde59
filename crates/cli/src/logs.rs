//! `cloudweb logs`: what an app's instances print: the tail, a search of
//! the stored lines (`--since`, `--until`, `--grep`, `--search`,
//! `--instance`, `--stream`), or followed (`-f`, with the same filters on
//! the new lines).

use clap::Args;
use cloudweb_api_types::traffic::{RuntimeLine, RuntimeLogs};

use crate::client::{segment, Api};
use crate::render;
use crate::{follow, Failure};

/// Pages one search may ask for (each looks at a bounded number of lines
/// on the server).
const MAX_PAGES: usize = 200;

#[derive(Debug, Args)]
pub struct LogsArgs {
    pub app: String,
    /// Keep printing new lines as they come (with the search's filters).
    #[arg(long, short = 'f', conflicts_with = "until")]
    pub follow: bool,
    /// How many lines: the newest ones, or the newest that match a search
    /// (0 to 2000).
    #[arg(long, short = 'n', default_value_t = 100, value_parser = clap::value_parser!(u16).range(0..=2000))]
    pub lines: u16,
    /// Only this deployment's lines.
    #[arg(long)]
    pub deployment: Option<String>,
    /// Search: lines at or after this time (RFC 3339) or this long ago
    /// (30s, 15m, 2h, 7d).
    #[arg(long)]
    pub since: Option<String>,
    /// Search: lines before this time (the same forms).
    #[arg(long)]
    pub until: Option<String>,
    /// Search: lines matching this regular expression (`ERROR|panic`;
    /// `(?i)` for any case).
    #[arg(long)]
    pub grep: Option<String>,
    /// Search: lines holding every one of these words (whole words, any
    /// case; the full-text index).
    #[arg(long = "search", value_name = "WORDS")]
    pub words: Option<String>,
    /// Search: only this instance's lines (1-based).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub instance: Option<u32>,
    /// Search: only stdout, stderr, or agent (the platform's notes).
    #[arg(long, value_parser = ["stdout", "stderr", "agent"])]
    pub stream: Option<String>,
}

impl LogsArgs {
    fn filters(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        let text = [("since", &self.since), ("until", &self.until), ("grep", &self.grep), ("q", &self.words), ("stream", &self.stream)];
        for (key, value) in text {
            if let Some(value) = value {
                pairs.push((key, value.clone()));
            }
        }
        if let Some(instance) = self.instance {
            pairs.push(("instance", instance.to_string()));
        }
        pairs
    }
}

fn path(app: &str, pairs: &[(&str, String)]) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str()))).finish();
    format!("/api/apps/{}/logs?{query}", segment(app))
}

pub async fn run(api: &Api, args: LogsArgs, json: bool) -> Result<(), Failure> {
    let filters = args.filters();
    let mut pairs = filters.clone();
    if let Some(deployment) = &args.deployment {
        pairs.push(("deployment", deployment.clone()));
    }
    if args.follow {
        pairs.push(("lines", args.lines.to_string()));
        pairs.push(("follow", "1".into()));
        return follow::app_logs(api, &path(&args.app, &pairs), json).await;
    }
    let lines = if filters.is_empty() {
        pairs.push(("lines", args.lines.to_string()));
        let answer: RuntimeLogs = api.get(&path(&args.app, &pairs)).await?;
        answer.lines
    } else {
        search(api, &args.app, pairs, usize::from(args.lines)).await?
    };
    if json {
        render::json(&lines);
    } else {
        for line in &lines {
            println!("{}", follow::runtime_line(line));
        }
    }
    Ok(())
}

/// The newest `wanted` lines of a search, oldest first: pages are asked
/// for until there are enough or no more.
async fn search(api: &Api, app: &str, pairs: Vec<(&'static str, String)>, wanted: usize) -> Result<Vec<RuntimeLine>, Failure> {
    let mut found: Vec<RuntimeLine> = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MAX_PAGES {
        if found.len() >= wanted {
            break;
        }
        let mut page = pairs.clone();
        page.push(("limit", (wanted - found.len()).clamp(1, 1000).to_string()));
        if let Some(cursor) = &cursor {
            page.push(("cursor", cursor.clone()));
        }
        let answer: RuntimeLogs = api.get(&path(app, &page)).await?;
        found.extend(answer.lines);
        match answer.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    found.truncate(wanted);
    found.reverse();
    Ok(found)
}
