//! The roles of teams and of the cluster, in order from least to most
//! (what each allows is [`crate::access`]'s business). A leaf: accounts
//! name roles (a token's cap, a user's cluster role) without depending on
//! the checks.

use serde::{Deserialize, Serialize};

/// A role in one team.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TeamRole {
    Viewer,
    Deployer,
    Admin,
    Owner,
}

impl TeamRole {
    pub const ALL: [TeamRole; 4] = [TeamRole::Viewer, TeamRole::Deployer, TeamRole::Admin, TeamRole::Owner];

    pub fn as_str(self) -> &'static str {
        match self {
            TeamRole::Viewer => "viewer",
            TeamRole::Deployer => "deployer",
            TeamRole::Admin => "admin",
            TeamRole::Owner => "owner",
        }
    }

    pub fn parse(text: &str) -> Option<TeamRole> {
        TeamRole::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

/// A role over the whole cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ClusterRole {
    #[serde(rename = "cluster-viewer")]
    Viewer,
    #[serde(rename = "cluster-admin")]
    Admin,
}

impl ClusterRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterRole::Viewer => "cluster-viewer",
            ClusterRole::Admin => "cluster-admin",
        }
    }

    pub fn parse(text: &str) -> Option<ClusterRole> {
        [ClusterRole::Viewer, ClusterRole::Admin].into_iter().find(|r| r.as_str() == text)
    }

    /// What it gives in every team.
    pub fn team_role(self) -> TeamRole {
        match self {
            ClusterRole::Viewer => TeamRole::Viewer,
            ClusterRole::Admin => TeamRole::Owner,
        }
    }
}

/// A token's cap: a team role or a cluster role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Team(TeamRole),
    Cluster(ClusterRole),
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        TeamRole::parse(text).map(Role::Team).or_else(|| ClusterRole::parse(text).map(Role::Cluster))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Team(role) => role.as_str(),
            Role::Cluster(role) => role.as_str(),
        }
    }
}
