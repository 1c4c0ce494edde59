//! Step points, for the deterministic simulation in `crates/sim`.
//!
//! Every store method that writes passes a step point right after its
//! commit. In the control plane no task carries a [`Stepper`], and a step
//! point costs one task-local lookup. The simulator runs each simulated
//! activity (a user's request, an agent's report, a reconciler pass) as a
//! task that carries one: at each step point the task stops until the
//! simulator's seeded scheduler lets it go on, so the order of every commit
//! across tasks is chosen by the seed and replays from it. When the
//! simulator kills the control plane it lets no waiting task go on and
//! drops them all: what they committed stays, what they would have done
//! next never happens, as with `kill -9`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

/// A stepped task reached a step point; it goes on when `go` is sent.
#[derive(Debug)]
pub struct Arrival {
    pub task: u64,
    pub go: oneshot::Sender<()>,
}

/// What a stepped task carries: its number and where to announce arrivals.
#[derive(Debug, Clone)]
pub struct Stepper {
    pub task: u64,
    pub arrivals: mpsc::UnboundedSender<Arrival>,
    /// Where the ids of new records come from, so that a seed names the
    /// same deployments in every replay.
    pub ids: Arc<AtomicU64>,
}

tokio::task_local! {
    static STEPPER: Stepper;
}

/// Runs `work` as a stepped task.
pub async fn stepped<F: Future>(stepper: Stepper, work: F) -> F::Output {
    STEPPER.scope(stepper, work).await
}

/// Waits for the simulator's go when the current task is stepped; returns
/// at once otherwise. A task whose go never comes (the simulated process
/// was killed) waits here until it is dropped.
pub async fn step_point() {
    let Ok(stepper) = STEPPER.try_with(Clone::clone) else { return };
    let (go, wait) = oneshot::channel();
    if stepper.arrivals.send(Arrival { task: stepper.task, go }).is_err() || wait.await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The next id number, in a stepped task; `None` elsewhere (ids are then
/// random).
pub fn next_id() -> Option<u64> {
    STEPPER.try_with(|s| s.ids.fetch_add(1, Ordering::Relaxed)).ok()
}
