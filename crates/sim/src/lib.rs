//! A deterministic simulation of the control plane, in the manner of
//! FoundationDB's simulation testing: the real store (SQLite) and the real
//! deployment code (`create`, `on_report`, `reconcile`), driven by
//! simulated users and agents, with the control plane killed and reopened
//! on the same database at arbitrary commits. One seed decides everything
//! (what is requested, which task goes on at each commit, where a report
//! or an ack is lost, where the kill lands), so a failure replays from its
//! seed: `cloudweb-bench simulate --seed N`.
//!
//! How the interleaving is controlled: every stepped task stops at each
//! store commit (`cloudweb_server::store::steps`), and only one task runs
//! between two commits; the scheduler picks which with the seed. Invariants
//! are checked at every commit point and again once the cluster settles.
//!
//! Owns: the scheduler, the simulated world, the invariants. Never: a
//! model of the control plane's logic (it calls the real code), a socket,
//! a clock of its own beyond the control plane's `Clock` seam.

pub mod agent;
pub mod check;
mod driver;
pub mod rng;

pub use driver::{run, survey, Options, Outcome, SimFailure, Survey};
