//! The deployment state machine. Every change of a deployment's state goes
//! through [`DeploymentState::can_transition`]; an illegal one is an error,
//! never a silent no-op.

use std::fmt;

/// The error of a deployment the user cancelled.
pub const CANCELLED: &str = "cancelled by the user";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeploymentState {
    Queued,
    Building,
    Deploying,
    Running,
    Failed,
    Superseded,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a deployment cannot go from {from} to {to}")]
pub struct IllegalTransition {
    pub from: DeploymentState,
    pub to: DeploymentState,
}

impl DeploymentState {
    pub const ALL: [DeploymentState; 6] = [
        DeploymentState::Queued,
        DeploymentState::Building,
        DeploymentState::Deploying,
        DeploymentState::Running,
        DeploymentState::Failed,
        DeploymentState::Superseded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DeploymentState::Queued => "queued",
            DeploymentState::Building => "building",
            DeploymentState::Deploying => "deploying",
            DeploymentState::Running => "running",
            DeploymentState::Failed => "failed",
            DeploymentState::Superseded => "superseded",
        }
    }

    pub fn parse(text: &str) -> Option<DeploymentState> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Finished for good: nothing moves it any more.
    pub fn is_terminal(self) -> bool {
        matches!(self, DeploymentState::Failed | DeploymentState::Superseded)
    }

    /// `queued → building → deploying → running`, with `queued → deploying`
    /// for deployments that reuse a built image (rollback, reschedule); any
    /// unfinished state may fail; a running deployment is superseded (by a
    /// newer one that runs), or fails when it has lost every instance (its
    /// node left the cluster); an unfinished one is superseded by a newer
    /// request, and so never runs.
    pub fn can_transition(self, to: DeploymentState) -> bool {
        use DeploymentState::*;
        matches!(
            (self, to),
            (Queued, Building)
                | (Queued, Deploying)
                | (Building, Deploying)
                | (Deploying, Running)
                | (Queued | Building | Deploying | Running, Failed)
                | (Queued | Building | Deploying | Running, Superseded)
        )
    }

    /// Where `self` comes before `to` on the way to running: a report of
    /// `to` after `self` is a retry that came late, not a change.
    pub fn is_behind(self, to: DeploymentState) -> bool {
        fn rank(state: DeploymentState) -> u8 {
            match state {
                DeploymentState::Queued => 0,
                DeploymentState::Building => 1,
                DeploymentState::Deploying => 2,
                DeploymentState::Running => 3,
                DeploymentState::Failed | DeploymentState::Superseded => 4,
            }
        }
        rank(to) < rank(self)
    }

    pub fn transition(self, to: DeploymentState) -> Result<DeploymentState, IllegalTransition> {
        if self.can_transition(to) {
            Ok(to)
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }
}

impl fmt::Display for DeploymentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::DeploymentState::*;
    use super::*;

    #[test]
    fn the_happy_paths_are_legal() {
        for path in [&[Queued, Building, Deploying, Running, Superseded][..], &[Queued, Deploying, Running]] {
            for pair in path.windows(2) {
                assert!(pair[0].can_transition(pair[1]), "{} -> {}", pair[0], pair[1]);
            }
        }
    }

    #[test]
    fn everything_else_is_illegal() {
        let legal = [
            (Queued, Building),
            (Queued, Deploying),
            (Building, Deploying),
            (Deploying, Running),
            (Queued, Failed),
            (Building, Failed),
            (Deploying, Failed),
            (Running, Failed),
            (Queued, Superseded),
            (Building, Superseded),
            (Deploying, Superseded),
            (Running, Superseded),
        ];
        for from in DeploymentState::ALL {
            for to in DeploymentState::ALL {
                assert_eq!(from.can_transition(to), legal.contains(&(from, to)), "{from} -> {to}");
            }
        }
        assert_eq!(Failed.transition(Running), Err(IllegalTransition { from: Failed, to: Running }));
        assert!(Failed.transition(Superseded).is_err(), "a failed deployment stays failed");
        assert!(Superseded.is_terminal() && Failed.is_terminal() && !Running.is_terminal());
    }

    #[test]
    fn names_round_trip() {
        for state in DeploymentState::ALL {
            assert_eq!(DeploymentState::parse(state.as_str()), Some(state));
        }
        assert_eq!(DeploymentState::parse("done"), None);
    }
}
