//! The Engine's log stream as whole lines. With timestamps on, the Engine
//! writes each line as `<RFC 3339 time> <text>\n`, but cuts its stream
//! into frames of its own size: a long line (a megabyte of JSON, a stack
//! trace on one line) spans frames, and only its first frame starts with
//! the time. Frames are joined here, per stream, into lines; a line longer
//! than [`cloudweb_protocol::misc::MAX_LOG_LINE`] keeps its beginning and
//! ends with `…[cut: N bytes]` (N its whole length), and bytes that are not
//! UTF-8 become U+FFFD.

use std::collections::VecDeque;

use bollard::container::LogOutput;
use futures_util::{Stream, StreamExt};

use super::RuntimeError;
use cloudweb_protocol::misc::MAX_LOG_LINE;

/// One line of a container's output: (`stdout`|`stderr`, Engine timestamp
/// in RFC 3339 with nanoseconds, text).
pub type OutputLine = (&'static str, String, String);

/// Bytes of a line held while its end has not come (the time, the text
/// that is kept, and room for a character cut in two).
const HELD: usize = MAX_LOG_LINE + 128;

/// A line being assembled from frames.
#[derive(Default)]
struct Partial {
    bytes: Vec<u8>,
    /// Bytes of the line past what is held.
    past: usize,
}

impl Partial {
    fn push(&mut self, piece: &[u8]) {
        let room = HELD.saturating_sub(self.bytes.len());
        let kept = piece.len().min(room);
        self.bytes.extend_from_slice(&piece[..kept]);
        self.past += piece.len() - kept;
    }

    /// The whole line: (time, text), its text cut with a marker when it
    /// was longer than a log line may be.
    fn finish(&mut self) -> Option<(String, String)> {
        let bytes = std::mem::take(&mut self.bytes);
        let past = std::mem::take(&mut self.past);
        let line = String::from_utf8_lossy(&bytes);
        let line = line.strip_suffix('\r').unwrap_or(&line);
        let (ts, text) = line.split_once(' ').unwrap_or((line, ""));
        if ts.is_empty() {
            return None;
        }
        let whole = text.len() + past;
        let mut text = text.to_string();
        if whole > MAX_LOG_LINE {
            let marker = format!("…[cut: {whole} bytes]");
            cloudweb_protocol::misc::truncate_on_char(&mut text, MAX_LOG_LINE - marker.len());
            text.push_str(&marker);
        }
        Some((ts.to_string(), text))
    }
}

/// `bytes` without the Engine's `<RFC 3339 time> ` at its start, if it
/// has one.
fn without_time(bytes: &[u8]) -> &[u8] {
    let Some(space) = bytes.iter().take(40).position(|b| *b == b' ') else { return bytes };
    let looks_like_time = std::str::from_utf8(&bytes[..space])
        .ok()
        .filter(|t| t.len() >= 20 && t.as_bytes()[0].is_ascii_digit())
        .is_some_and(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).is_ok());
    if looks_like_time {
        &bytes[space + 1..]
    } else {
        bytes
    }
}

/// Joins frames into lines, for stdout and stderr apart.
#[derive(Default)]
pub struct Assembler {
    stdout: Partial,
    stderr: Partial,
}

impl Assembler {
    /// The lines a frame completes.
    pub fn frame(&mut self, output: LogOutput) -> Vec<OutputLine> {
        let (name, partial, bytes) = match output {
            LogOutput::StdErr { message } => ("stderr", &mut self.stderr, message),
            LogOutput::StdOut { message } | LogOutput::Console { message } => ("stdout", &mut self.stdout, message),
            LogOutput::StdIn { .. } => return Vec::new(),
        };
        let mut lines = Vec::new();
        let mut rest: &[u8] = &bytes;
        // The Engine keeps a long line as messages of 16 KiB and writes
        // each with its own time: the time of a continuation goes.
        if !partial.bytes.is_empty() {
            rest = without_time(rest);
        }
        while let Some(at) = rest.iter().position(|b| *b == b'\n') {
            partial.push(&rest[..at]);
            if let Some((ts, text)) = partial.finish() {
                lines.push((name, ts, text));
            }
            rest = &rest[at + 1..];
        }
        partial.push(rest);
        lines
    }

    /// What is left once the stream ended (a last line without its end).
    pub fn end(&mut self) -> Vec<OutputLine> {
        let mut lines = Vec::new();
        for (name, partial) in [("stdout", &mut self.stdout), ("stderr", &mut self.stderr)] {
            if !partial.bytes.is_empty() {
                if let Some((ts, text)) = partial.finish() {
                    lines.push((name, ts, text));
                }
            }
        }
        lines
    }
}

/// The Engine's log stream as lines.
pub fn lines(
    frames: impl Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send + 'static,
) -> impl Stream<Item = Result<OutputLine, RuntimeError>> + Send + 'static {
    struct State<S> {
        frames: std::pin::Pin<Box<S>>,
        assembler: Assembler,
        ready: VecDeque<Result<OutputLine, RuntimeError>>,
        ended: bool,
    }
    let state = State { frames: Box::pin(frames), assembler: Assembler::default(), ready: VecDeque::new(), ended: false };
    futures_util::stream::unfold(state, |mut state| async move {
        loop {
            if let Some(next) = state.ready.pop_front() {
                return Some((next, state));
            }
            if state.ended {
                return None;
            }
            match state.frames.next().await {
                Some(Ok(frame)) => state.ready.extend(state.assembler.frame(frame).into_iter().map(Ok)),
                Some(Err(err)) => {
                    state.ready.extend(state.assembler.end().into_iter().map(Ok));
                    state.ready.push_back(Err(RuntimeError::from(err)));
                    state.ended = true;
                }
                None => {
                    state.ready.extend(state.assembler.end().into_iter().map(Ok));
                    state.ended = true;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(bytes: &[u8]) -> LogOutput {
        LogOutput::StdOut { message: bytes.to_vec().into() }
    }

    #[test]
    fn lines_spanning_frames_are_joined_and_long_ones_cut_with_a_marker() {
        let mut assembler = Assembler::default();
        let ts = "2026-12-06T05:00:00.000000001Z";
        // Two lines in one frame, then a line over three frames.
        let lines = assembler.frame(out(format!("{ts} one\n{ts} two\n{ts} thr").as_bytes()));
        assert_eq!(lines, [("stdout", ts.to_string(), "one".to_string()), ("stdout", ts.to_string(), "two".to_string())]);
        assert!(assembler.frame(out(b"ee and")).is_empty());
        assert_eq!(without_time(b"2026-12-06T05:00:00.5Z rest"), b"rest");
        assert_eq!(without_time(b"2026 is a year"), b"2026 is a year");
        assert_eq!(assembler.frame(out(b" more\n")), [("stdout", ts.to_string(), "three and more".to_string())]);
        // A megabyte over many frames: its beginning and a marker.
        // As the Engine sends it: each 16 KiB piece with its own time.
        for _ in 0..64 {
            let mut piece = format!("{ts} ").into_bytes();
            piece.extend_from_slice(&[b'x'; 16 * 1024]);
            assert!(assembler.frame(out(&piece)).is_empty());
        }
        let long = assembler.frame(out(b"\n"));
        assert_eq!(long.len(), 1);
        assert_eq!(long[0].1, ts);
        assert!(long[0].2.len() <= MAX_LOG_LINE && long[0].2.starts_with("xxxx"));
        assert!(long[0].2.ends_with("…[cut: 1048576 bytes]"), "{}", &long[0].2[long[0].2.len() - 30..]);
        // Not UTF-8; stderr apart from stdout; a last line without its end.
        let bad = assembler.frame(out(format!("{ts} bad \u{1}").as_bytes().iter().copied().chain([0xff, 0xfe, b'\n']).collect::<Vec<_>>().as_slice()));
        assert_eq!(bad[0].2, "bad \u{1}\u{fffd}\u{fffd}");
        assert!(assembler.frame(LogOutput::StdErr { message: format!("{ts} half").into_bytes().into() }).is_empty());
        assert_eq!(assembler.end(), [("stderr", ts.to_string(), "half".to_string())]);
    }
}
