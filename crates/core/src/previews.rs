//! Preview environments: an app with previews on gets, for each pull or
//! merge request against its branch, an app of its own,
//! `<app>-pr-<number>`, made from its settings, serving
//! `pr-<number>.<app>.<base domain>` and running the request's head.
//!
//! - Opened or pushed to: the preview app is made (or its branch moved)
//!   and the head commit deployed; a push of the commit it already runs or
//!   builds starts nothing.
//! - From a fork: nothing is built until a user approves that head
//!   (`approve`); a new push from the fork needs a new approval. A fork's
//!   preview gets no variable of the app and no clone credentials: it is
//!   someone else's code.
//! - Otherwise it gets the app's variables except the production-only
//!   ones, and clones as the app does.
//! - With `database` set, each database service the app is linked to gets
//!   a twin for the preview (empty, or restored from its newest backup),
//!   linked under the same variable.
//! - Closed or merged: the preview app goes (its builds cancelled, its
//!   instances stopped, its routes and record removed; its databases'
//!   containers removed, their volumes kept until deleted by name). One with no push
//!   for the app's TTL goes too ([`sweeper`]), and when a new one would
//!   pass the app's maximum, the one pushed to longest ago goes first.
//!
//! Which provider the request came from is the caller's business
//! (`cloudweb_http::git`); this module sees a [`ChangeRequest`].

use std::sync::Arc;
use std::time::Duration;

use crate::deploy::{self, Origin};
use crate::deployment_state::DeploymentState;
use crate::error::ApiError;
use crate::store::{AppGitLinkRow, AppRow, DeploymentRow, PreviewRow, PreviewSettingsRow};
use crate::AppState;

pub const DEFAULT_MAX: i64 = 5;
pub const MOST_MAX: i64 = 20;
pub const DEFAULT_TTL_S: i64 = 7 * 86_400;
pub const LEAST_TTL_S: i64 = 3600;
pub const MOST_TTL_S: i64 = 90 * 86_400;

/// What a preview gets for each database service its app is linked to.
pub const DATABASE_MODES: [&str; 3] = ["none", "empty", "latest-backup"];

pub const AWAITING_APPROVAL: &str = "awaiting-approval";
pub const ACTIVE: &str = "active";

/// What happened to a pull or merge request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Opened, reopened, or pushed to.
    Updated,
    /// Closed or merged.
    Closed,
}

/// A pull or merge request, as the provider's event describes it.
#[derive(Debug, Clone)]
pub struct ChangeRequest {
    pub number: i64,
    pub action: Action,
    /// The branch it would merge into.
    pub base_ref: String,
    pub head_ref: String,
    pub head_sha: String,
    /// Where the head can be cloned from (the fork's URL for a fork).
    pub head_clone_url: String,
    pub from_fork: bool,
}

/// What an event did.
#[derive(Debug)]
pub enum Outcome {
    Ignored(String),
    /// From a fork: waiting for a user's approval.
    AwaitingApproval,
    Deployed(DeploymentRow),
    /// The preview already runs or builds this commit.
    Already(String),
    /// Its new databases are starting: it deploys once they answer.
    Starting,
    Removed,
}

/// The app's preview settings (off when never set).
pub async fn settings(state: &AppState, app: &str) -> Result<PreviewSettingsRow, ApiError> {
    Ok(state.store.preview_settings(app).await?.unwrap_or(PreviewSettingsRow {
        app: app.to_string(),
        enabled: false,
        max_previews: DEFAULT_MAX,
        ttl_s: DEFAULT_TTL_S,
        database: "none".into(),
        env_sealed: None,
        instances: None,
        cpu: None,
        memory_bytes: None,
        updated_at: 0,
    }))
}

/// A change of an app's preview settings: what is `None` keeps its value;
/// a resource given as `Some(None)` goes back to the app's.
#[derive(Debug, Default)]
pub struct SettingsChange<'a> {
    pub enabled: bool,
    pub max: Option<i64>,
    pub ttl_s: Option<i64>,
    pub database: Option<&'a str>,
    pub instances: Option<Option<u32>>,
    pub cpu: Option<Option<f64>>,
    pub memory: Option<Option<u64>>,
}

/// Validates and stores an app's preview settings.
pub async fn apply_settings(state: &AppState, app: &str, change: SettingsChange<'_>) -> Result<PreviewSettingsRow, ApiError> {
    let SettingsChange { enabled, max, ttl_s, database, instances, cpu, memory } = change;
    if state.store.preview_by_app(app).await?.is_some() {
        return Err(ApiError::BadRequest(format!("{app} is a preview: previews have no previews")));
    }
    let mut row = settings(state, app).await?;
    if let Some(max) = max {
        if !(1..=MOST_MAX).contains(&max) {
            return Err(ApiError::BadRequest(format!("invalid max: 1 to {MOST_MAX} previews at once")));
        }
        row.max_previews = max;
    }
    if let Some(ttl) = ttl_s {
        if !(LEAST_TTL_S..=MOST_TTL_S).contains(&ttl) {
            return Err(ApiError::BadRequest("invalid ttl: from an hour to 90 days".into()));
        }
        row.ttl_s = ttl;
    }
    if let Some(database) = database {
        if !DATABASE_MODES.contains(&database) {
            return Err(ApiError::BadRequest(format!("invalid database {database:?}: none, empty or latest-backup")));
        }
        row.database = database.to_string();
    }
    if let Some(instances) = instances {
        if instances.is_some_and(|n| n == 0 || n > crate::deploy::scale::MAX_INSTANCES) {
            return Err(ApiError::BadRequest(format!("invalid instances: 1 to {}", crate::deploy::scale::MAX_INSTANCES)));
        }
        row.instances = instances.map(i64::from);
    }
    if let Some(cpu) = cpu {
        if cpu.is_some_and(|c| !(0.01..=64.0).contains(&c)) {
            return Err(ApiError::BadRequest("invalid cpu: 0.01 to 64 cores".into()));
        }
        row.cpu = cpu;
    }
    if let Some(memory) = memory {
        if memory.is_some_and(|m| !(16 << 20..=1 << 40).contains(&m)) {
            return Err(ApiError::BadRequest("invalid memory: 16 MiB to 1 TiB, in bytes".into()));
        }
        row.memory_bytes = memory.map(|m| m as i64);
    }
    row.enabled = enabled;
    row.updated_at = state.clock.now_ms();
    state.store.put_preview_settings(&row).await?;
    tracing::info!(app, enabled, max = row.max_previews, ttl_s = row.ttl_s, "preview settings saved");
    Ok(row)
}

/// The preview app's name, `<app>-pr-<number>` (at most 63 characters).
pub fn preview_name(app: &str, number: i64) -> Result<String, ApiError> {
    let name = format!("{app}-pr-{number}");
    cloudweb_protocol::validate::node_name("preview", &name).map_err(|_| ApiError::BadRequest(format!("the preview name {name} is over 63 characters: a shorter app name is needed for previews")))?;
    Ok(name)
}

pub use crate::git::preview_notes::preview_host;

/// Acts on a pull or merge request against `app` (made from the
/// repository of `link`).
pub async fn on_change_request(state: &Arc<AppState>, app: &AppRow, link: &AppGitLinkRow, request: &ChangeRequest) -> Result<Outcome, ApiError> {
    if state.store.preview_by_app(&app.name).await?.is_some() {
        return Ok(Outcome::Ignored("a preview has no previews".into()));
    }
    let existing = state.store.preview(&app.name, request.number).await?;
    if request.action == Action::Closed {
        if existing.is_none() {
            return Ok(Outcome::Ignored("no preview to remove".into()));
        }
        remove(state, &app.name, request.number, "its request was closed", false).await?;
        return Ok(Outcome::Removed);
    }
    let settings = settings(state, &app.name).await?;
    if !settings.enabled {
        return Ok(Outcome::Ignored("previews are off for this app".into()));
    }
    if request.base_ref != app.branch {
        return Ok(Outcome::Ignored("a request against another branch".into()));
    }
    cloudweb_protocol::validate::bounded_text("head ref", &request.head_ref, 255)?;
    if cloudweb_protocol::deploy::branch(&request.head_ref).is_err() {
        return Err(ApiError::BadRequest(format!("the head branch {:?} is not a branch name cloud-web clones", request.head_ref)));
    }
    let now = state.clock.now_ms();
    let same_head = existing.as_ref().is_some_and(|e| e.head_sha == request.head_sha);
    let row = PreviewRow {
        app: app.name.clone(),
        number: request.number,
        preview_app: preview_name(&app.name, request.number)?,
        head_ref: request.head_ref.clone(),
        head_sha: request.head_sha.clone(),
        head_clone_url: request.head_clone_url.clone(),
        from_fork: request.from_fork,
        // An approval holds for the head it was given for.
        approved_by: existing.as_ref().filter(|_| same_head).and_then(|e| e.approved_by.clone()),
        state: String::new(),
        comment_id: existing.as_ref().and_then(|e| e.comment_id),
        services: existing.as_ref().map(|e| e.services.clone()).unwrap_or_default(),
        created_at: existing.as_ref().map_or(now, |e| e.created_at),
        updated_at: now,
    };
    if request.from_fork && row.approved_by.is_none() {
        let waiting = PreviewRow { state: AWAITING_APPROVAL.into(), ..row };
        state.store.put_preview(&waiting).await?;
        tracing::info!(app = %app.name, number = request.number, "a request from a fork waits for approval before its preview is built");
        return Ok(Outcome::AwaitingApproval);
    }
    if existing.is_none() {
        make_room(state, &settings).await?;
    }
    deploy_preview(state, app, link, &settings, PreviewRow { state: ACTIVE.into(), ..row }).await
}

/// Approves the head a fork's request waits with, and deploys it.
pub async fn approve(state: &Arc<AppState>, app: &AppRow, number: i64, by: &str) -> Result<Outcome, ApiError> {
    let Some(row) = state.store.preview(&app.name, number).await? else {
        return Err(ApiError::NotFound(format!("{} has no preview of request {number}", app.name)));
    };
    if row.state != AWAITING_APPROVAL {
        return Err(ApiError::Conflict(format!("the preview of request {number} waits for no approval")));
    }
    let link = state.store.app_git_link(&app.name).await?.ok_or_else(|| ApiError::Conflict(format!("{} is not linked to a git provider", app.name)))?;
    let settings = settings(state, &app.name).await?;
    if state.store.app(&row.preview_app).await?.is_none() {
        make_room(state, &settings).await?;
    }
    tracing::info!(app = %app.name, number, by, commit = %row.head_sha, "approved a fork's preview");
    let approved = PreviewRow { approved_by: Some(by.to_string()), state: ACTIVE.into(), updated_at: state.clock.now_ms(), ..row };
    deploy_preview(state, app, &link, &settings, approved).await
}

fn overrides_context(app: &str) -> String {
    format!("preview-env:{app}")
}

/// The variables previews get on top of the app's.
pub fn overrides(state: &AppState, settings: &PreviewSettingsRow) -> Result<std::collections::BTreeMap<String, String>, ApiError> {
    match &settings.env_sealed {
        None => Ok(Default::default()),
        Some(sealed) => state.sealer.open_json(&overrides_context(&settings.app), sealed).map_err(|e| ApiError::Internal(format!("preview variables of {}: {e}", settings.app))),
    }
}

/// Replaces the variables previews get on top of the app's (from the next
/// preview deployment on).
pub async fn set_overrides(state: &AppState, app: &str, vars: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    cloudweb_protocol::deploy::env(vars)?;
    let mut row = settings(state, app).await?;
    row.env_sealed = (!vars.is_empty()).then(|| state.sealer.seal_json(&overrides_context(app), vars));
    row.updated_at = state.clock.now_ms();
    state.store.put_preview_settings(&row).await?;
    tracing::info!(app, variables = vars.len(), "preview variables saved");
    Ok(())
}

/// Removes the preview pushed to longest ago while the app has its most.
async fn make_room(state: &Arc<AppState>, settings: &PreviewSettingsRow) -> Result<(), ApiError> {
    let mut active: Vec<PreviewRow> = state.store.previews_of(&settings.app).await?.into_iter().filter(|p| p.state == ACTIVE).collect();
    active.sort_by_key(|p| p.updated_at);
    while active.len() as i64 >= settings.max_previews {
        let oldest = active.remove(0);
        let why = format!("the app keeps at most {} previews", settings.max_previews);
        remove(state, &settings.app, oldest.number, &why, true).await?;
    }
    Ok(())
}

/// The preview's variables (sealed): none for a fork's, else the app's
/// without the production-only ones, with the preview overrides on top.
async fn preview_env(state: &AppState, app: &AppRow, row: &PreviewRow) -> Result<Option<String>, ApiError> {
    if row.from_fork {
        return Ok(None);
    }
    let mut vars = deploy::app_env(state, app)?;
    for name in state.store.production_only_env(&app.name).await? {
        vars.remove(&name);
    }
    vars.extend(overrides(state, &settings(state, &app.name).await?)?);
    Ok(Some(state.sealer.seal_json(&deploy::env_context(&row.preview_app), &vars)))
}

/// Makes the preview app (or moves its branch) and deploys the head.
async fn deploy_preview(state: &Arc<AppState>, app: &AppRow, link: &AppGitLinkRow, settings: &PreviewSettingsRow, mut row: PreviewRow) -> Result<Outcome, ApiError> {
    let env_sealed = preview_env(state, app, &row).await?;
    let preview = match state.store.app(&row.preview_app).await? {
        Some(mut preview) => {
            preview.branch = row.head_ref.clone();
            preview.env_sealed = env_sealed;
            state.store.update_app_settings(&preview).await?;
            let sealed = match &preview.env_sealed {
                Some(sealed) => sealed.clone(),
                None => state.sealer.seal_json(&deploy::env_context(&preview.name), &std::collections::BTreeMap::<String, String>::new()),
            };
            state.store.set_app_env(&preview.name, &sealed).await?;
            preview
        }
        None => {
            let preview = make_app(state, app, link, settings, &row, env_sealed).await?;
            state.store.put_preview(&row).await?;
            make_databases(state, app, &settings.database, &mut row).await?;
            if !row.services.is_empty() {
                state.store.put_preview(&row).await?;
                tokio::spawn(deploy_when_databases_answer(state.clone(), row));
                return Ok(Outcome::Starting);
            }
            preview
        }
    };
    state.store.put_preview(&row).await?;
    if let Some(newest) = state.store.app_deployments(&preview.name).await?.into_iter().next() {
        let live = DeploymentState::parse(&newest.state).is_some_and(|s| !s.is_terminal());
        if live && newest.commit_sha.as_deref() == Some(row.head_sha.as_str()) {
            return Ok(Outcome::Already(newest.id));
        }
    }
    let deployment = deploy::create(state, &preview, Origin::Source { commit: Some(row.head_sha.clone()) }).await?;
    tracing::info!(app = %app.name, preview = %preview.name, number = row.number, deployment = %deployment.id, commit = %row.head_sha, "deploying a preview");
    Ok(Outcome::Deployed(deployment))
}

async fn make_app(state: &AppState, app: &AppRow, link: &AppGitLinkRow, settings: &PreviewSettingsRow, row: &PreviewRow, env_sealed: Option<String>) -> Result<AppRow, ApiError> {
    // The app's own clone credentials, sealed again under the preview's
    // name; a fork's preview clones with none.
    let git_credentials_sealed = match (&app.git_credentials_sealed, row.from_fork) {
        (Some(sealed), false) => {
            let git: deploy::GitAccess = state.sealer.open_json(&deploy::git_context(&app.name), sealed).map_err(|e| ApiError::Internal(format!("app {}: {e}", app.name)))?;
            Some(state.sealer.seal_json(&deploy::git_context(&row.preview_app), &git))
        }
        _ => None,
    };
    let host = preview_host(state, &app.name, row.number);
    let preview = AppRow {
        name: row.preview_app.clone(),
        repo_url: row.head_clone_url.clone(),
        branch: row.head_ref.clone(),
        domains: serde_json::to_string(&[&host]).expect("strings serialize"),
        env_sealed,
        git_credentials_sealed,
        created_at: state.clock.now_ms(),
        // Smaller than the app's when the settings say so.
        instances: settings.instances.unwrap_or(app.instances),
        cpu: settings.cpu.or(app.cpu),
        memory_bytes: settings.memory_bytes.or(app.memory_bytes),
        ..app.clone()
    };
    let default_host = format!("{}.{}", preview.name, state.config.base_domain);
    match state.store.insert_app(&preview, &default_host).await? {
        Ok(()) => {}
        Err(refusal) => return Err(ApiError::Conflict(format!("cannot make the preview app {}: {refusal:?}", preview.name))),
    }
    if !row.from_fork {
        // Clone credentials and statuses through the app's provider; no
        // webhook of its own (the app's events reach it).
        let preview_link = AppGitLinkRow {
            app: preview.name.clone(),
            hook_id: None,
            webhook_secret_sha256: crate::ca::sha256_hex(crate::git::random_secret().as_bytes()),
            webhook_secret_sealed: None,
            created_at: state.clock.now_ms(),
            ..link.clone()
        };
        state.store.insert_app_git_link(&preview_link).await?;
    }
    crate::routes::app_changed(state, &preview.name).await?;
    tracing::info!(app = %app.name, preview = %preview.name, host, "made a preview app");
    Ok(preview)
}

/// How long a new preview waits for its databases to report an address.
const DATABASE_PATIENCE: Duration = Duration::from_secs(180);

/// Deploys a new preview's head once its databases report an address (a
/// deployment made before would fail at once, finding none), or says on
/// the request that they did not start in time.
async fn deploy_when_databases_answer(state: Arc<AppState>, row: PreviewRow) {
    let started = tokio::time::Instant::now();
    loop {
        match crate::service_links::link_env(&state, &row.preview_app).await {
            Ok(Ok(_)) => break,
            Ok(Err(_)) if started.elapsed() < DATABASE_PATIENCE => tokio::time::sleep(Duration::from_secs(1)).await,
            Ok(Err(why)) => {
                tracing::warn!(preview = %row.preview_app, why, "a preview's database did not start in time");
                let text = format!("**cloud-web preview** of `{}` did not start: {why} after {} s.", row.head_sha.get(..12).unwrap_or(&row.head_sha), DATABASE_PATIENCE.as_secs());
                let _ = crate::git::preview_notes::note(&state, &row, &text).await;
                return;
            }
            Err(err) => {
                tracing::warn!(preview = %row.preview_app, error = %err, "cannot read a preview's databases");
                return;
            }
        }
    }
    // The newest head by now (a push may have come while waiting).
    let (Ok(Some(current)), Ok(Some(preview))) = (state.store.preview(&row.app, row.number).await, state.store.app(&row.preview_app).await) else { return };
    match deploy::create(&state, &preview, Origin::Source { commit: Some(current.head_sha.clone()) }).await {
        Ok(deployment) => tracing::info!(preview = %preview.name, deployment = %deployment.id, commit = %current.head_sha, "deploying a preview once its databases answered"),
        Err(err) => tracing::warn!(preview = %preview.name, error = %err, "could not deploy a preview once its databases answered"),
    }
}

/// `pr<number>-<service>`, cut to a name's 63 characters.
fn database_name(number: i64, service: &str) -> String {
    let mut name = format!("pr{number}-{service}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

/// Makes, for each database service the app is linked to, one of the same
/// kind and version for the preview (`mode` `empty`), or one restored from
/// that service's newest successful backup (`latest-backup`; empty when
/// there is none, and always for a fork's code), and links it under the
/// same variable. Each one made is recorded on the preview at once, so a
/// failure part way leaves none unaccounted for.
async fn make_databases(state: &AppState, app: &AppRow, mode: &str, row: &mut PreviewRow) -> Result<(), ApiError> {
    if mode == "none" {
        return Ok(());
    }
    for link in state.store.app_links(&app.name).await? {
        let Some(service) = state.store.service(&link.service).await? else { continue };
        let name = database_name(row.number, &service.name);
        let backup = match mode == "latest-backup" && !row.from_fork {
            true => {
                let key = crate::backups::Target::Service(service.name.clone()).key();
                state.store.backup_jobs_of(&key, Some("backup"), 20).await?.into_iter().find(|j| j.state == "succeeded")
            }
            false => None,
        };
        match &backup {
            Some(backup) => {
                crate::backups::restore(state, &backup.id, Some(&name), None).await?;
            }
            None => {
                let new = crate::services::NewService {
                    name: name.clone(),
                    kind: crate::service_links::kind_of(&service)?,
                    version: service.version.clone(),
                    node: None,
                    memory_bytes: service.memory_bytes.map(|m| m.max(0) as u64),
                    team_id: app.team_id.clone(),
                };
                crate::services::create(state, new).await?;
            }
        }
        row.services.push(name.clone());
        state.store.put_preview(row).await?;
        crate::services::link(state, &name, &row.preview_app, Some(&link.variable)).await?;
        tracing::info!(app = %app.name, preview = %row.preview_app, service = %name, from_backup = backup.as_ref().map(|b| b.id.as_str()), "made a database for a preview");
    }
    Ok(())
}

/// Removes a preview: cancels its builds, stops its instances, removes its
/// app, routes and record, and (`tell`) says why on its request. Whether
/// there was one.
pub async fn remove(state: &Arc<AppState>, app: &str, number: i64, why: &str, tell: bool) -> Result<bool, ApiError> {
    let Some(row) = remove_quietly(state, app, number, why).await? else { return Ok(false) };
    if tell {
        tell_removed(state.clone(), row, why.to_string());
    }
    Ok(true)
}

/// Removes every preview of an app that is being deleted (its previews
/// would otherwise outlive it as apps of their own).
pub async fn remove_all(state: &AppState, app: &str) -> Result<usize, ApiError> {
    let mut removed = 0;
    for preview in state.store.previews_of(app).await? {
        if remove_quietly(state, app, preview.number, "its app was deleted").await?.is_some() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// [`remove`] without telling the request: the removed preview's record.
async fn remove_quietly(state: &AppState, app: &str, number: i64, why: &str) -> Result<Option<PreviewRow>, ApiError> {
    let Some(row) = state.store.preview(app, number).await? else { return Ok(None) };
    if state.store.app(&row.preview_app).await?.is_some() {
        for deployment in state.store.app_deployments(&row.preview_app).await? {
            if DeploymentState::parse(&deployment.state).is_some_and(|s| !s.is_terminal()) {
                deploy::cancel(state, &deployment).await?;
            }
        }
        crate::tasks::app_deleting(state, &row.preview_app).await?;
        deploy::stop_app(state, &row.preview_app).await?;
        state.store.delete_app(&row.preview_app).await?;
        state.runtime_logs.forget(&row.preview_app);
        crate::routes::app_changed(state, &row.preview_app).await?;
    }
    // Its databases: their containers go; their volumes stay, detached,
    // until deleted by name (data goes only on an explicit request).
    for service in &row.services {
        match crate::services::delete(state, service).await {
            Ok(_) | Err(ApiError::NotFound(_)) => {}
            Err(err) => tracing::warn!(app, number, service, error = %err, "could not delete a preview's database; delete it by name"),
        }
    }
    state.store.delete_preview(app, number).await?;
    tracing::info!(app, number, preview = %row.preview_app, why, "removed a preview");
    Ok(Some(row))
}

/// Tells the request why its preview went, in the background: tried three
/// times, 5 and then 10 s apart, never holding up the removal.
fn tell_removed(state: Arc<AppState>, row: PreviewRow, why: String) {
    tokio::spawn(async move {
        let text = format!("**cloud-web preview** removed: {why}. A new push to the request brings it back.");
        let mut wait = Duration::from_secs(5);
        for attempt in 1..=3 {
            match crate::git::preview_notes::note(&state, &row, &text).await {
                Ok(()) => return,
                Err(err) if attempt == 3 => tracing::warn!(app = %row.app, number = row.number, error = %err, "gave up telling the request its preview was removed"),
                Err(err) => tracing::warn!(app = %row.app, number = row.number, error = %err, attempt, "could not tell the request its preview was removed"),
            }
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
    });
}

/// Removes, once a minute, the previews with no push for their app's TTL.
pub async fn sweeper(state: Arc<AppState>) {
    let mut interval = tokio::time::interval(Duration::from_secs(60));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        if let Err(err) = sweep(&state).await {
            tracing::warn!(error = %err, "cannot sweep idle previews");
        }
    }
}

/// One pass of [`sweeper`]: the previews removed.
pub async fn sweep(state: &Arc<AppState>) -> Result<usize, ApiError> {
    let now = state.clock.now_ms();
    let mut removed = 0;
    for preview in state.store.previews_idle_since(now - LEAST_TTL_S * 1000).await? {
        let ttl_s = settings(state, &preview.app).await?.ttl_s;
        if now - preview.updated_at > ttl_s * 1000 && remove(state, &preview.app, preview.number, "no push for its TTL", true).await? {
            removed += 1;
        }
    }
    Ok(removed)
}
