use super::*;

fn access(grants: &[(&str, TeamRole)], every_team: Option<TeamRole>, apps: Option<&[&str]>) -> Access {
    Access {
        actor: "user:usr_a".into(),
        user_id: Some("usr_a".into()),
        cluster: None,
        every_team,
        grants: grants.iter().map(|(team, role)| Grant { team_id: team.to_string(), team_name: team.to_string(), role: *role }).collect(),
        apps: apps.map(|apps| apps.iter().map(|a| a.to_string()).collect()),
    }
}

#[test]
fn roles_are_ordered_and_parse_back() {
    assert!(TeamRole::Viewer < TeamRole::Deployer && TeamRole::Deployer < TeamRole::Admin && TeamRole::Admin < TeamRole::Owner);
    assert!(ClusterRole::Viewer < ClusterRole::Admin);
    for role in TeamRole::ALL {
        assert_eq!(TeamRole::parse(role.as_str()), Some(role));
        assert_eq!(Role::parse(role.as_str()), Some(Role::Team(role)));
    }
    assert_eq!(Role::parse("cluster-admin"), Some(Role::Cluster(ClusterRole::Admin)));
    assert_eq!(Role::parse("Admin"), None);
    assert_eq!(Role::parse("root"), None);
}

#[test]
fn a_member_reaches_only_its_teams_and_a_cluster_role_reaches_all() {
    let alice = access(&[("team_a", TeamRole::Deployer)], None, None);
    assert_eq!(alice.role_in("team_a"), Some(TeamRole::Deployer));
    assert_eq!(alice.role_in("team_b"), None);
    assert!(alice.sees("team_a", Some("web")) && !alice.sees("team_b", Some("web")));
    assert!(!alice.sees_all());

    let viewer_everywhere = access(&[("team_a", TeamRole::Owner)], Some(TeamRole::Viewer), None);
    assert_eq!(viewer_everywhere.role_in("team_a"), Some(TeamRole::Owner), "the higher of the two");
    assert_eq!(viewer_everywhere.role_in("team_z"), Some(TeamRole::Viewer));
    assert!(viewer_everywhere.sees_all());
    assert_eq!(Access::admin().role_in("anything"), Some(TeamRole::Owner));
}

#[test]
fn a_token_held_to_apps_sees_those_apps_only() {
    let ci = access(&[("team_a", TeamRole::Deployer)], None, Some(&["web"]));
    assert!(ci.sees("team_a", Some("web")));
    assert!(!ci.sees("team_a", Some("api")));
    assert!(!ci.sees("team_a", None), "nor the team's services or volumes");
    assert!(!ci.sees_all());
}

#[test]
fn every_need_describes_itself() {
    assert_eq!(Need::Cluster(ClusterRole::Admin).describe(), "cluster-admin");
    assert_eq!(Need::Team(TeamRole::Deployer, Owned::App, "name").describe(), "deployer of the app's team");
    assert_eq!(Need::Create(TeamRole::Admin).describe(), "admin of the request's team");
}
