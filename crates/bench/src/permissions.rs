//! `cloudweb-bench permissions`: what the permission step adds to a user
//! API request, measured where it runs: working out the caller's access
//! (its memberships) and checking a route's need (the team that owns the
//! path's app), on a real state database (SQLite, in this process) with
//! many teams and apps. The audit write a change adds is timed too (a
//! figure: reads write nothing, and heartbeats never pass through it).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use cloudweb_server::access::{self, Need, TeamRole};
use cloudweb_server::auth::{Principal, TokenScope, Via};
use cloudweb_server::clock::SystemClock;
use cloudweb_server::config::Config;
use cloudweb_server::store::Owned;

use crate::target::Target;

#[derive(clap::Args)]
pub struct Args {
    /// Teams in the database.
    #[arg(long, default_value_t = 50)]
    teams: usize,
    /// Apps in the database, spread over the teams.
    #[arg(long, default_value_t = 2_000)]
    apps: usize,
    /// Checks timed.
    #[arg(long, default_value_t = 5_000)]
    samples: usize,
}

/// The 99th percentile of nanosecond samples, in milliseconds.
fn p99_ms(mut nanos: Vec<u64>) -> (f64, f64) {
    nanos.sort_unstable();
    let at = |q: f64| nanos[((nanos.len() as f64 * q).ceil() as usize).clamp(1, nanos.len()) - 1] as f64 / 1e6;
    (at(0.50), at(0.99))
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.teams == 0 || args.apps < args.teams || args.samples == 0 {
        bail!("--teams, --apps (at least one per team) and --samples must be positive");
    }
    let dir = tempfile::tempdir()?;
    let opened = cloudweb_server::open_state(Config::local(dir.path().to_path_buf()), Arc::new(SystemClock)).await?;
    let state = opened.state;
    let root = access::teams::user(&state, "root").await.ok();
    let root = match root {
        Some(user) => user,
        None => cloudweb_server::auth::users::create(&state.store, 1, "root", Some("a long enough password"), Some(access::ClusterRole::Admin)).await?,
    };
    let mut teams = Vec::new();
    for t in 0..args.teams {
        teams.push(access::teams::create(&state, &format!("team-{t}"), &root).await?);
    }
    for a in 0..args.apps {
        let team = &teams[a % teams.len()];
        state.store.insert_app(&cloudweb_e2e::rows::app(&format!("app-{a}"), &team.id), &format!("app-{a}.test")).await?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    // A user in three teams, calling with a personal token held to a role.
    let user = cloudweb_server::auth::users::create(&state.store, 1, "dev", Some("a long enough password"), None).await?;
    for team in teams.iter().take(3) {
        access::teams::set_member(&state, team, &user, TeamRole::Deployer, "manual").await?;
    }
    let user = state.store.user_by_id(&user.id).await?.expect("just made");
    let principal = Principal::User { user, via: Via::Token { id: "tok_bench".into(), scope: TokenScope::default() } };
    let need = Need::Team(TeamRole::Deployer, Owned::App, "name");
    // Warm: a user making requests (the access cache holds their
    // memberships and the apps' teams). Cold: every check reads the
    // database, as the first request of a user in two seconds does.
    let mut figures = Vec::new();
    // The user's apps seen once (untimed): warm means in the cache.
    for a in 0..args.apps {
        let params = vec![("name".to_string(), format!("app-{a}"))];
        let access = access::access_of(&state, &principal).await?;
        let _ = access::check(&state, &access, need, &params, None).await;
    }
    for cold in [false, true] {
        let mut nanos = Vec::with_capacity(args.samples);
        for i in 0..args.samples {
            // An app of one of the user's teams (apps are dealt round-robin).
            let app = format!("app-{}", (i * teams.len() + i % 3) % args.apps);
            let params = vec![("name".to_string(), app)];
            if cold {
                state.access_cache.forget_all();
            }
            let started = Instant::now();
            let access = access::access_of(&state, &principal).await?;
            let checked = access::check(&state, &access, need, &params, None).await;
            nanos.push(started.elapsed().as_nanos() as u64);
            if checked.is_err() {
                bail!("the check refused a member: {checked:?}");
            }
        }
        figures.push(p99_ms(nanos));
    }
    let [(check_p50, check_p99), (cold_p50, cold_p99)] = [figures[0], figures[1]];
    let mut writes = Vec::with_capacity(args.samples / 5);
    for i in 0..(args.samples / 5).max(1) {
        let entry = access::audit::Entry {
            request_id: format!("req_{i}"),
            phase: "request",
            actor: "user:usr_bench".into(),
            action: "POST /api/apps/{name}/deploy".into(),
            result: "started".into(),
            ..Default::default()
        };
        let started = Instant::now();
        access::audit::before(&state, entry).await?;
        writes.push(started.elapsed().as_nanos() as u64);
    }
    let (write_p50, write_p99) = p99_ms(writes);
    println!("{} teams, {} apps, a member of 3 teams with a personal token, {} checks", args.teams, args.apps, args.samples);
    println!("permission step (access + team check): p50 {check_p50:.3} ms, p99 {check_p99:.3} ms");
    println!("the same, nothing cached (cold):       p50 {cold_p50:.3} ms, p99 {cold_p99:.3} ms");
    println!("audit entry written before a change:   p50 {write_p50:.3} ms, p99 {write_p99:.3} ms (changes only)");
    Ok(vec![Target::below("permission step p99 per request".to_string(), 0.1, "ms", Some(check_p99))])
}
