//! The term a task writes for: set around a leader's loops (see
//! `leader_lease.rs`), checked by every write transaction it opens.

/// A leader's term: writes are refused once `holder` no longer holds
/// the lease with `token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub holder: String,
    pub token: i64,
}

tokio::task_local! {
    static TERM: Term;
}

/// Runs `future` with its write transactions fenced by `term`.
pub async fn scope<F: std::future::Future>(term: Term, future: F) -> F::Output {
    TERM.scope(term, future).await
}

/// The term of the running task, if it writes for one.
pub fn current() -> Option<Term> {
    TERM.try_with(Clone::clone).ok()
}
