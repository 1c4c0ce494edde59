//! A run's output lines on their way into reports: numbered from 1 in the
//! order the container printed them (stdout and stderr together), cut to
//! [`MAX_LINE_BYTES`] on a character boundary, and held in a bounded queue
//! until a report has carried them.
//!
//! The queue keeps at most [`MAX_PENDING`] lines, the number the control
//! plane keeps of a run: when reports cannot keep up (a flood of output,
//! the control plane unreachable) the oldest waiting lines go, which the
//! control plane would have dropped at the run's end anyway, and their
//! numbers stay unused (a gap in `seq` says lines were lost).

use std::collections::VecDeque;

use cloudweb_protocol::tasks::{MAX_LINE_BYTES, MAX_REPORT_LINES, MAX_REPORT_TEXT_BYTES, MAX_RUN_LINES};
use cloudweb_protocol::TaskLine;

/// Lines waiting for a report, at most.
pub const MAX_PENDING: usize = MAX_RUN_LINES;

/// Longest `at` the protocol takes.
const MAX_AT_BYTES: usize = 64;

#[derive(Debug)]
pub struct Lines {
    next_seq: u64,
    pending: VecDeque<TaskLine>,
    cap: usize,
    dropped: u64,
}

impl Default for Lines {
    fn default() -> Self {
        Lines::with_cap(MAX_PENDING)
    }
}

impl Lines {
    pub fn with_cap(cap: usize) -> Lines {
        Lines { next_seq: 1, pending: VecDeque::new(), cap: cap.max(1), dropped: 0 }
    }

    /// Numbers one line (already redacted) and queues it, cut to
    /// [`MAX_LINE_BYTES`]; `at` is the Engine's timestamp of it.
    pub fn push(&mut self, stderr: bool, at: &str, text: String) {
        let line = TaskLine { seq: self.next_seq, at: stamp(at), stderr, line: cut(text) };
        self.next_seq += 1;
        self.pending.push_back(line);
        self.trim();
    }

    /// Up to `max` of the oldest waiting lines for a report, no more than
    /// [`MAX_REPORT_TEXT_BYTES`] of text together.
    pub fn take(&mut self, max: usize) -> Vec<TaskLine> {
        let count = self.fitting(max);
        self.pending.drain(..count).collect()
    }

    /// How many of the oldest waiting lines one report carries.
    fn fitting(&self, max: usize) -> usize {
        let mut bytes = 0;
        let mut count = 0;
        for line in self.pending.iter().take(max) {
            bytes += line.line.len();
            if bytes > MAX_REPORT_TEXT_BYTES {
                break;
            }
            count += 1;
        }
        count
    }

    /// Whether every waiting line fits in one report.
    pub fn fits_one_report(&self) -> bool {
        self.fitting(MAX_REPORT_LINES) == self.pending.len()
    }

    /// Keeps only the newest waiting lines that fit in one report (the
    /// final one, when no more can go before it).
    pub fn keep_fitting(&mut self) {
        while !self.fits_one_report() {
            self.pending.pop_front();
            self.dropped += 1;
        }
    }

    /// Lines of a report that did not go out, back in front of the queue
    /// (they are older than what waits); the oldest go when it is full.
    pub fn put_back(&mut self, batch: Vec<TaskLine>) {
        for line in batch.into_iter().rev() {
            self.pending.push_front(line);
        }
        self.trim();
    }

    /// Keeps only the newest `count` waiting lines.
    pub fn keep_last(&mut self, count: usize) {
        while self.pending.len() > count {
            self.pending.pop_front();
            self.dropped += 1;
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Lines numbered and then dropped unsent.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// How many lines were numbered so far.
    pub fn numbered(&self) -> u64 {
        self.next_seq - 1
    }

    fn trim(&mut self) {
        let cap = self.cap;
        self.keep_last(cap);
    }
}

/// A line cut to [`MAX_LINE_BYTES`] on a character boundary, its NUL bytes
/// replaced (PostgreSQL's text cannot hold them).
pub fn cut(mut text: String) -> String {
    if text.contains('\0') {
        text = text.replace('\0', "\u{fffd}");
    }
    cloudweb_protocol::misc::truncate_on_char(&mut text, MAX_LINE_BYTES);
    text
}

/// The Engine's timestamp when it is one the protocol takes, else now.
fn stamp(at: &str) -> String {
    if !at.is_empty() && at.len() <= MAX_AT_BYTES && !at.chars().any(char::is_control) {
        at.to_string()
    } else {
        crate::timestamp::now_rfc3339()
    }
}
