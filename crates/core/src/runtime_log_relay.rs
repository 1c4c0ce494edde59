//! Runtime log lines passed from the replica that receives them (the
//! leader: only it serves agents) to the other replicas, so that a user
//! reading or following an app's logs through a follower sees the same
//! lines, with the same line numbers (a `Last-Event-ID` from one replica
//! means the same on another). They travel as `NOTIFY` payloads (see
//! [`crate::event_relay`]), which PostgreSQL caps at 8,000 bytes: a batch
//! is cut into pieces that fit, and a single line too long for one piece
//! reaches the other replicas cut, with a note (the replica that received
//! it keeps it whole). A follower has the lines that arrived while it
//! ran: history from before its start is on the leader only, like
//! everything the rings hold, which a restart empties.

pub use crate::runtime_logs::Relayed;
use crate::runtime_logs::RuntimeLine;

/// Room for the JSON of one piece: PostgreSQL's 8,000 bytes, less the
/// payload's first lines (origin and hub) and a margin.
pub const MAX_PIECE: usize = 7_400;

const CUT_NOTE: &str = " …[cut: too long to pass to the other control-plane replicas]";

fn encoded(app: &str, lines: &[RuntimeLine]) -> String {
    serde_json::to_string(&Relayed::Lines { app: app.to_string(), lines: lines.to_vec() }).unwrap_or_default()
}

/// The JSON pieces that carry `relayed`, each at most [`MAX_PIECE`] bytes,
/// the lines in their order.
pub fn pieces(relayed: &Relayed) -> Vec<String> {
    let whole = serde_json::to_string(relayed).unwrap_or_default();
    if whole.len() <= MAX_PIECE {
        return vec![whole];
    }
    let Relayed::Lines { app, lines } = relayed else {
        // A name is far shorter than a piece.
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut current: Vec<RuntimeLine> = Vec::new();
    for line in lines {
        current.push(line.clone());
        if encoded(app, &current).len() <= MAX_PIECE {
            continue;
        }
        current.pop();
        if !current.is_empty() {
            out.push(encoded(app, &current));
            current.clear();
        }
        // Alone and still too long: cut the text until it fits.
        let mut line = line.clone();
        loop {
            let over = encoded(app, std::slice::from_ref(&line)).len().saturating_sub(MAX_PIECE);
            if over == 0 {
                current.push(line);
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
    }
    if !current.is_empty() {
        out.push(encoded(app, &current));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, len: usize) -> RuntimeLine {
        RuntimeLine {
            seq,
            ts: format!("2026-12-04T10:00:00.{seq:09}Z"),
            stream: "stdout".into(),
            line: "é".repeat(len / 2),
            deployment_id: "dep_1".into(),
            instance: 1,
            node_id: "n-1".into(),
            container: "cw-web-1".into(),
        }
    }

    fn lines_of(pieces: &[String]) -> Vec<RuntimeLine> {
        pieces
            .iter()
            .flat_map(|p| match serde_json::from_str::<Relayed>(p).unwrap() {
                Relayed::Lines { app, lines } => {
                    assert_eq!(app, "web");
                    lines
                }
                Relayed::Forget(_) => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_small_batch_is_one_piece_and_round_trips() {
        let relayed = Relayed::Lines { app: "web".into(), lines: vec![line(1, 20), line(2, 20)] };
        let one = pieces(&relayed);
        assert_eq!(one.len(), 1);
        assert_eq!(serde_json::from_str::<Relayed>(&one[0]).unwrap(), relayed);
        let forget = Relayed::Forget("web".into());
        assert_eq!(serde_json::from_str::<Relayed>(&pieces(&forget)[0]).unwrap(), forget);
    }

    #[test]
    fn a_large_batch_is_cut_into_pieces_that_fit_keeping_every_line_and_number_in_order() {
        let lines: Vec<RuntimeLine> = (1..=200).map(|n| line(n, 300)).collect();
        let cut = pieces(&Relayed::Lines { app: "web".into(), lines: lines.clone() });
        assert!(cut.len() > 5, "{}", cut.len());
        assert!(cut.iter().all(|p| p.len() <= MAX_PIECE));
        assert_eq!(lines_of(&cut), lines);
    }

    #[test]
    fn a_line_longer_than_a_piece_is_cut_with_a_note() {
        let long = line(2, 16 * 1024);
        let cut = pieces(&Relayed::Lines { app: "web".into(), lines: vec![line(1, 10), long.clone(), line(3, 10)] });
        let lines = lines_of(&cut);
        assert!(cut.iter().all(|p| p.len() <= MAX_PIECE));
        assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(lines[1].line.ends_with(CUT_NOTE) && long.line.starts_with(lines[1].line.trim_end_matches(CUT_NOTE)));
    }
}
