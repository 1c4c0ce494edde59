//! `cloudweb teams` (teams, members, the current team), `cloudweb audit`
//! (the audit log, and `verify` of its hash chain) and `cloudweb
//! deploy-tokens` (an app's tokens for CI systems).

use clap::{Args, Subcommand};
use cloudweb_api_types::teams::{
    AuditList, AuditVerification, CreatedDeployToken, DeployTokenList, MemberList, MemberView, NewDeployToken, NewTeam, SetClusterRole, SetMember,
    TeamList, TeamMapping, TeamMappings, TeamView,
};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, cell, table};
use crate::{config, Failure};

#[derive(Subcommand)]
pub enum TeamsCommand {
    /// Your teams and your role in each; `*` marks the current one.
    List,
    /// Make a team (cluster admins); its first owner is you or --owner.
    Create {
        name: String,
        /// The first owner's user name.
        #[arg(long)]
        owner: Option<String>,
    },
    /// Make TEAM the current team: new apps, services and backup
    /// destinations go to it (sent as X-Cloudweb-Team).
    Switch { team: String },
    /// A team's members and their roles.
    Members { team: String },
    /// Add a member, or change their role: viewer, deployer, admin, owner.
    Add {
        team: String,
        user: String,
        #[arg(long, default_value = "viewer")]
        role: String,
    },
    /// Remove a member (a team always keeps an owner).
    Remove { team: String, user: String },
    /// Delete a team that owns nothing.
    Delete { team: String },
    /// Give a user a cluster role (cluster-admin, cluster-viewer) or,
    /// with --none, take it away.
    ClusterRole {
        user: String,
        #[arg(required_unless_present = "none")]
        role: Option<String>,
        #[arg(long)]
        none: bool,
    },
    /// The login mappings: which git host groups grant which team roles
    /// (cluster admins).
    Mappings,
    /// Map a git host's group to a team role, or change the role of an
    /// existing mapping: PROVIDER is gitlab (a group path), github (an
    /// organization, or org/team-slug) or gitea (an organization).
    Map {
        provider: String,
        group: String,
        team: String,
        #[arg(long, default_value = "viewer")]
        role: String,
    },
    /// Remove a mapping; memberships it granted go at once (a team's
    /// last owner stays).
    Unmap { provider: String, group: String, team: String },
}

pub async fn run(api: &Api, command: TeamsCommand, json: bool) -> Result<(), Failure> {
    match command {
        TeamsCommand::List => {
            let list: TeamList = api.get("/api/teams").await?;
            let current = config::load()?.and_then(|c| c.team);
            if json {
                render::json(&list);
                return Ok(());
            }
            let rows = list
                .teams
                .iter()
                .map(|t| {
                    let mark = if current.as_deref().is_some_and(|c| c == t.name || c == t.id) { "*" } else { "" };
                    vec![mark.to_string(), cell(&t.name), cell(t.role.as_deref().unwrap_or("-")), cell(&t.created_at)]
                })
                .collect::<Vec<_>>();
            table(&["", "TEAM", "ROLE", "CREATED"], &rows);
        }
        TeamsCommand::Create { name, owner } => {
            let team: TeamView = api.call(Method::POST, "/api/teams", Some(&NewTeam { name, owner })).await?;
            if json {
                render::json(&team);
            } else {
                println!("team {} created", cell(&team.name));
            }
        }
        TeamsCommand::Switch { team } => {
            let view: TeamView = api.get(&format!("/api/teams/{}", segment(&team))).await?;
            let Some(mut stored) = config::load()? else {
                return Err(Failure::Action("not logged in: run `cloudweb login` first".into()));
            };
            stored.team = Some(view.name.clone());
            config::save(&stored)?;
            println!("current team: {} ({})", cell(&view.name), cell(view.role.as_deref().unwrap_or("-")));
        }
        TeamsCommand::Members { team } => {
            let list: MemberList = api.get(&format!("/api/teams/{}/members", segment(&team))).await?;
            if json {
                render::json(&list);
                return Ok(());
            }
            let rows = list.members.iter().map(|m| vec![cell(&m.user), cell(&m.role), cell(&m.source), cell(&m.added_at)]).collect::<Vec<_>>();
            table(&["USER", "ROLE", "SOURCE", "ADDED"], &rows);
        }
        TeamsCommand::Add { team, user, role } => {
            let path = format!("/api/teams/{}/members/{}", segment(&team), segment(&user));
            let member: MemberView = api.call(Method::PUT, &path, Some(&SetMember { role })).await?;
            if json {
                render::json(&member);
            } else {
                println!("{} is {} of {}", cell(&member.user), cell(&member.role), cell(&team));
            }
        }
        TeamsCommand::Remove { team, user } => {
            api.delete(&format!("/api/teams/{}/members/{}", segment(&team), segment(&user))).await?;
            println!("{} removed from {}", cell(&user), cell(&team));
        }
        TeamsCommand::Delete { team } => {
            api.delete(&format!("/api/teams/{}", segment(&team))).await?;
            println!("team {} deleted", cell(&team));
        }
        TeamsCommand::ClusterRole { user, role, none } => {
            let body = SetClusterRole { cluster_role: if none { None } else { role } };
            api.call_no_answer(Method::PUT, &format!("/api/users/{}/cluster-role", segment(&user)), Some(&body)).await?;
            println!("cluster role of {} set", cell(&user));
        }
        TeamsCommand::Mappings => {
            let list: TeamMappings = api.get("/api/team-mappings").await?;
            if json {
                render::json(&list);
                return Ok(());
            }
            let rows = list.mappings.iter().map(|m| vec![cell(&m.provider), cell(&m.group), cell(&m.team), cell(&m.role)]).collect::<Vec<_>>();
            table(&["PROVIDER", "GROUP", "TEAM", "ROLE"], &rows);
        }
        TeamsCommand::Map { provider, group, team, role } => {
            let saved = edit_mappings(api, |list| {
                list.mappings.retain(|m| !same_mapping(m, &provider, &group, &team));
                list.mappings.push(TeamMapping { provider: provider.clone(), group: group.clone(), team: team.clone(), role: role.clone() });
                Ok(())
            })
            .await?;
            println!("{} mappings", saved.mappings.len());
        }
        TeamsCommand::Unmap { provider, group, team } => {
            let saved = edit_mappings(api, |list| {
                let before = list.mappings.len();
                list.mappings.retain(|m| !same_mapping(m, &provider, &group, &team));
                if list.mappings.len() == before {
                    return Err(Failure::Action(format!("no mapping of {provider} group {group} to team {team}")));
                }
                Ok(())
            })
            .await?;
            println!("{} mappings", saved.mappings.len());
        }
    }
    Ok(())
}

/// How many times a mapping edit is made again on a list another edit
/// changed in between.
const MAPPING_EDIT_TRIES: usize = 5;

/// Reads the mappings, applies `edit`, and saves them at the revision read;
/// when another edit saved in between (409), reads and applies again, a
/// few times at most. The saved list.
async fn edit_mappings(api: &Api, edit: impl Fn(&mut TeamMappings) -> Result<(), Failure>) -> Result<TeamMappings, Failure> {
    let mut tries = 0;
    loop {
        tries += 1;
        let mut list: TeamMappings = api.get("/api/team-mappings").await?;
        edit(&mut list)?;
        match api.try_call(Method::PUT, "/api/team-mappings", Some(&list)).await {
            Err(refused) if refused.status == Some(409) && tries < MAPPING_EDIT_TRIES => continue,
            saved => return saved.map_err(|refused| refused.failure),
        }
    }
}

/// Whether `mapping` maps `group` at `provider` to `team` (names ignore case).
fn same_mapping(mapping: &TeamMapping, provider: &str, group: &str, team: &str) -> bool {
    mapping.provider == provider && mapping.group.eq_ignore_ascii_case(group) && mapping.team.eq_ignore_ascii_case(team)
}

#[derive(Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: Option<AuditCommand>,
    /// From when: an age (30m, 24h, 7d) or RFC 3339.
    #[arg(long, default_value = "24h")]
    since: String,
    /// A user's name (their tokens' entries too) or an actor as entries
    /// name it (deploy-token:ID, admin-token).
    #[arg(long)]
    actor: Option<String>,
    /// Entries whose action contains this (deploy, DELETE, login).
    #[arg(long)]
    action: Option<String>,
    /// One team's entries.
    #[arg(long)]
    team: Option<String>,
    /// At most this many entries.
    #[arg(long, default_value_t = 500)]
    limit: u32,
}

#[derive(Subcommand)]
pub enum AuditCommand {
    /// Walk the log's hash chain: exit 1 when an entry was changed or
    /// deleted, with where.
    Verify,
}

pub async fn audit(api: &Api, args: AuditArgs, json: bool) -> Result<(), Failure> {
    if let Some(AuditCommand::Verify) = args.command {
        let check: AuditVerification = api.call(Method::POST, "/api/audit/verify", None::<&()>).await?;
        if json {
            render::json(&check);
        } else if check.intact {
            println!("the audit log is intact ({} entries)", check.entries);
        }
        if !check.intact {
            return Err(Failure::Action(format!(
                "the audit log is broken at entry {}: {} ({} entries before it are intact)",
                check.broken_at.unwrap_or_default(),
                check.reason.unwrap_or_default(),
                check.entries
            )));
        }
        return Ok(());
    }
    let mut query = vec![("since", args.since), ("limit", args.limit.to_string())];
    for (key, value) in [("actor", args.actor), ("action", args.action), ("team", args.team)] {
        if let Some(value) = value {
            query.push((key, value));
        }
    }
    let query: String = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(query).finish();
    let list: AuditList = api.get(&format!("/api/audit?{query}")).await?;
    if json {
        // JSON lines: one entry each, for export.
        for entry in &list.entries {
            println!("{}", serde_json::to_string(entry).expect("entries serialize"));
        }
        return Ok(());
    }
    let rows = list
        .entries
        .iter()
        .map(|e| {
            let who = e.actor_name.clone().unwrap_or_else(|| e.actor.clone());
            vec![cell(&e.at), cell(&who), cell(e.team.as_deref().unwrap_or("-")), cell(&e.action), cell(e.target.as_deref().unwrap_or("-")), cell(&e.result)]
        })
        .collect::<Vec<_>>();
    table(&["AT", "WHO", "TEAM", "ACTION", "TARGET", "RESULT"], &rows);
    Ok(())
}

#[derive(Subcommand)]
pub enum DeployTokensCommand {
    /// An app's deploy tokens (never the secret).
    List { app: String },
    /// Make a deploy token: it deploys and reads APP only. Printed once.
    Create {
        app: String,
        name: String,
        /// When it stops working (RFC 3339).
        #[arg(long, value_name = "WHEN")]
        expires: Option<String>,
    },
    /// Revoke one; it stops working at once.
    Revoke { app: String, id: String },
}

pub async fn deploy_tokens(api: &Api, command: DeployTokensCommand, json: bool) -> Result<(), Failure> {
    match command {
        DeployTokensCommand::List { app } => {
            let list: DeployTokenList = api.get(&format!("/api/apps/{}/deploy-tokens", segment(&app))).await?;
            if json {
                render::json(&list);
                return Ok(());
            }
            let rows = list
                .tokens
                .iter()
                .map(|t| vec![cell(&t.id), cell(&t.name), cell(&t.prefix), cell(t.last_used_at.as_deref().unwrap_or("-")), cell(t.revoked_at.as_deref().unwrap_or("-"))])
                .collect::<Vec<_>>();
            table(&["ID", "NAME", "PREFIX", "LAST USED", "REVOKED"], &rows);
        }
        DeployTokensCommand::Create { app, name, expires } => {
            let body = NewDeployToken { name, expires_at: expires };
            let made: CreatedDeployToken = api.call(Method::POST, &format!("/api/apps/{}/deploy-tokens", segment(&app)), Some(&body)).await?;
            if json {
                render::json(&made);
            } else {
                println!("{}", made.token);
                eprintln!("deploy token {} for {}: shown only now", made.view.id, made.view.app);
            }
        }
        DeployTokensCommand::Revoke { app, id } => {
            api.delete(&format!("/api/apps/{}/deploy-tokens/{}", segment(&app), segment(&id))).await?;
            println!("deploy token {} revoked", cell(&id));
        }
    }
    Ok(())
}
