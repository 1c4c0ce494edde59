//! Runtime log lines passed from the replica that receives them (the
//! leader: only it serves agents) to the other replicas, so that a user
//! reading or following an app's logs through a follower sees the same
//! lines. They travel as `NOTIFY` payloads (see [`crate::event_relay`]),
//! which PostgreSQL caps at 8,000 bytes: an upload is cut into pieces
//! that fit, and a single line too long for one piece reaches the other
//! replicas cut, with a note (the replica that received it keeps it
//! whole). A follower has the lines that arrived while it ran: history
//! from before its start is on the leader only, like everything the rings
//! hold, which a restart empties.

use cloudweb_protocol::LogLine;
use serde::{Deserialize, Serialize};

/// What is passed on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relayed {
    /// A container's new lines.
    Upload(Upload),
    /// An app (or service) deleted: its lines go.
    Forget(String),
}

/// An upload as it was stored (see [`crate::runtime_logs::Incoming`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Upload {
    pub app: String,
    pub deployment_id: String,
    pub instance: u32,
    pub node_id: String,
    pub container: String,
    pub dropped: u64,
    pub lines: Vec<LogLine>,
    pub now_ms: i64,
}

/// Room for the JSON of one piece: PostgreSQL's 8,000 bytes, less the
/// payload's first lines (origin and hub) and a margin.
pub const MAX_PIECE: usize = 7_400;

const CUT_NOTE: &str = " …[cut: too long to pass to the other control-plane replicas]";

/// The JSON pieces that carry `relayed`, each at most [`MAX_PIECE`] bytes.
pub fn pieces(relayed: &Relayed) -> Vec<String> {
    let whole = serde_json::to_string(relayed).unwrap_or_default();
    if whole.len() <= MAX_PIECE {
        return vec![whole];
    }
    let Relayed::Upload(upload) = relayed else {
        // A name is far shorter than a piece.
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut current = Upload { lines: Vec::new(), ..upload.clone() };
    for line in &upload.lines {
        let mut line = line.clone();
        current.lines.push(line.clone());
        if encoded(&current).len() <= MAX_PIECE {
            continue;
        }
        current.lines.pop();
        if !current.lines.is_empty() {
            out.push(encoded(&current));
            // The note about lost lines went with the first piece.
            current = Upload { lines: Vec::new(), dropped: 0, ..current };
        }
        // Alone and still too long: cut the text until it fits.
        loop {
            current.lines = vec![line.clone()];
            let over = encoded(&current).len().saturating_sub(MAX_PIECE);
            if over == 0 {
                break;
            }
            let keep = line.line.len().saturating_sub(over + CUT_NOTE.len() + 16);
            let mut text = line.line.clone();
            cloudweb_protocol::misc::truncate_on_char(&mut text, keep);
            if text.is_empty() {
                break;
            }
            text.push_str(CUT_NOTE);
            line.line = text;
        }
        if encoded(&current).len() > MAX_PIECE {
            current.lines.clear();
        }
    }
    if !current.lines.is_empty() || current.dropped > 0 {
        out.push(encoded(&current));
    }
    out
}

fn encoded(upload: &Upload) -> String {
    serde_json::to_string(&Relayed::Upload(upload.clone())).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(lines: Vec<LogLine>) -> Upload {
        Upload { app: "web".into(), deployment_id: "dep_1".into(), instance: 1, node_id: "n-1".into(), container: "cw-web-1".into(), dropped: 3, lines, now_ms: 5 }
    }

    fn line(n: usize, len: usize) -> LogLine {
        LogLine { ts: format!("2026-12-04T10:00:00.{n:09}Z"), stream: "stdout".into(), line: "é".repeat(len / 2) }
    }

    #[test]
    fn a_small_upload_is_one_piece_and_round_trips() {
        let relayed = Relayed::Upload(upload(vec![line(1, 20), line(2, 20)]));
        let one = pieces(&relayed);
        assert_eq!(one.len(), 1);
        assert_eq!(serde_json::from_str::<Relayed>(&one[0]).unwrap(), relayed);
        let forget = Relayed::Forget("web".into());
        assert_eq!(serde_json::from_str::<Relayed>(&pieces(&forget)[0]).unwrap(), forget);
    }

    #[test]
    fn a_large_upload_is_cut_into_pieces_that_fit_keeping_every_line_in_order() {
        let lines: Vec<LogLine> = (0..200).map(|n| line(n, 300)).collect();
        let cut = pieces(&Relayed::Upload(upload(lines.clone())));
        assert!(cut.len() > 5, "{}", cut.len());
        let mut back = Vec::new();
        for (i, piece) in cut.iter().enumerate() {
            assert!(piece.len() <= MAX_PIECE, "{}", piece.len());
            let Relayed::Upload(part) = serde_json::from_str::<Relayed>(piece).unwrap() else { panic!() };
            assert_eq!(part.dropped, if i == 0 { 3 } else { 0 }, "the lost-lines note once");
            back.extend(part.lines);
        }
        assert_eq!(back, lines);
    }

    #[test]
    fn a_line_longer_than_a_piece_is_cut_with_a_note() {
        let long = line(1, 16 * 1024);
        let cut = pieces(&Relayed::Upload(upload(vec![line(0, 10), long.clone(), line(2, 10)])));
        let lines: Vec<LogLine> = cut
            .iter()
            .flat_map(|p| match serde_json::from_str::<Relayed>(p).unwrap() {
                Relayed::Upload(u) => u.lines,
                Relayed::Forget(_) => Vec::new(),
            })
            .collect();
        assert!(cut.iter().all(|p| p.len() <= MAX_PIECE));
        assert_eq!(lines.len(), 3);
        assert!(lines[1].line.ends_with(CUT_NOTE) && long.line.starts_with(lines[1].line.trim_end_matches(CUT_NOTE)));
    }
}
