//! Deployment pages: an app's deployments newest first (with rollback to
//! any that ran), and one deployment's timeline, commit, image, nodes and
//! build log (followed live by the page's script).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt};
use maud::{html, Markup};

use super::format;
use super::i18n::Lang;
use super::layout::{self, Nav};
use super::{csrf_field, Ctx};
use crate::store::{DeploymentRow, InstanceRow};
use crate::AppState;

/// Most stored log lines a page shows; the rest stay in the API.
const PAGE_LOG_LINES: i64 = 5000;

pub fn state_key(state: &str) -> &'static str {
    match state {
        "queued" => "dstate.queued",
        "building" => "dstate.building",
        "deploying" => "dstate.deploying",
        "running" => "dstate.running",
        "failed" => "dstate.failed",
        _ => "dstate.superseded",
    }
}

pub fn state_badge(lang: Lang, state: &str) -> Markup {
    html! { span class=(format!("badge {state}")) data-state=(state) { (lang.t(state_key(state))) } }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// An app's deployments, newest first, with a rollback button on each
/// earlier one that ran.
pub fn list(ctx: &Ctx, app: &str, deployments: &[DeploymentRow]) -> Markup {
    html! {
        @if deployments.is_empty() { p { (ctx.t("apps.no_deployments")) } }
        @else {
            div.scroll { table.deployments {
                thead { tr {
                    th scope="col" { (ctx.t("deploy.created")) }
                    th scope="col" { (ctx.t("deploy.state")) }
                    th scope="col" { (ctx.t("deploy.kind")) }
                    th scope="col" { (ctx.t("deploy.commit")) }
                    th scope="col" { (ctx.t("deploy.image")) }
                    th scope="col" { (ctx.t("nodes.actions")) }
                } }
                tbody {
                    @for (index, deployment) in deployments.iter().enumerate() {
                        tr data-deployment=(deployment.id) {
                            td data-label=(ctx.t("deploy.created")) { a href=(format!("/deployments/{}", deployment.id)) { (format::datetime(deployment.created_at)) } }
                            td data-label=(ctx.t("deploy.state")) { (state_badge(ctx.lang, &deployment.state)) }
                            td data-label=(ctx.t("deploy.kind")) { (deployment.kind) }
                            td data-label=(ctx.t("deploy.commit")) { code { (deployment.commit_sha.as_deref().map(short).unwrap_or("–")) } }
                            td data-label=(ctx.t("deploy.image")) { code.image { (deployment.image.as_deref().unwrap_or("–")) } }
                            td data-label=(ctx.t("nodes.actions")) {
                                a href=(format!("/deployments/{}", deployment.id)) { (ctx.t("deploy.view")) }
                                @if index > 0 && deployment.image.is_some() && matches!(deployment.state.as_str(), "running" | "superseded") {
                                    form.inline method="post" action=(format!("/apps/{app}/rollback")) {
                                        (csrf_field(ctx))
                                        input type="hidden" name="deployment_id" value=(deployment.id);
                                        button type="submit" { (ctx.t("deploy.rollback")) }
                                    }
                                }
                            }
                        }
                    }
                }
            } }
        }
    }
}

/// What the deployment page shows of a deployment besides its log: the
/// page renders it, and its stream sends it again (`event: state`, as
/// JSON) whenever it changes, for the script to put in place with
/// `textContent`. Words are in the page's language already.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LiveDeployment {
    /// `queued`, `building`, `deploying`, `running`, `failed` or `superseded`.
    pub state: String,
    /// The state in the page's language.
    pub state_label: String,
    pub commit: Option<String>,
    pub image: Option<String>,
    /// Each placed instance: `node #instance (instance state)`.
    pub instances: Vec<String>,
    pub error: Option<String>,
    pub timeline: Vec<LiveEvent>,
}

/// One state the deployment went through, and when.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LiveEvent {
    pub state: String,
    pub state_label: String,
    pub at: String,
}

impl LiveDeployment {
    pub fn new(lang: Lang, deployment: &DeploymentRow, events: &[(String, i64)], instances: &[InstanceRow], node_names: &HashMap<String, String>) -> LiveDeployment {
        LiveDeployment {
            state: deployment.state.clone(),
            state_label: lang.t(state_key(&deployment.state)).to_string(),
            commit: deployment.commit_sha.clone(),
            image: deployment.image.clone(),
            instances: instances
                .iter()
                .filter_map(|instance| {
                    let node = instance.node_id.as_ref()?;
                    Some(format!("{} #{} ({})", node_names.get(node).unwrap_or(node), instance.instance, instance.state))
                })
                .collect(),
            error: deployment.error.clone(),
            timeline: events
                .iter()
                .map(|(state, at)| LiveEvent { state: state.clone(), state_label: lang.t(state_key(state)).to_string(), at: format::datetime(*at) })
                .collect(),
        }
    }

    /// Settled: nothing on the page changes any more.
    fn settled(&self) -> bool {
        matches!(self.state.as_str(), "running" | "failed" | "superseded")
    }
}

/// One deployment's page body. The elements with ids are the ones the
/// script updates from the stream.
pub fn page_body(ctx: &Ctx, deployment: &DeploymentRow, live: &LiveDeployment, lines: &[(i64, String, String, String)]) -> Markup {
    let last_seq = lines.last().map(|l| l.0).unwrap_or(0);
    let stream = format!("/deployments/{}/logs?after={last_seq}&lang={}", deployment.id, ctx.lang.code());
    html! {
        p { a href=(format!("/apps/{}", deployment.app)) { "← " (deployment.app) } }
        dl.settings {
            dt { (ctx.t("deploy.state")) } dd id="deployment-state" { (state_badge(ctx.lang, &live.state)) }
            dt { (ctx.t("deploy.kind")) } dd { (deployment.kind) }
            dt { (ctx.t("deploy.commit")) } dd { code id="deployment-commit" { (live.commit.as_deref().unwrap_or("–")) } }
            dt { (ctx.t("deploy.image")) } dd { code.image id="deployment-image" { (live.image.as_deref().unwrap_or("–")) } }
            dt { (ctx.t("deploy.nodes")) } dd id="deployment-instances" {
                @for instance in &live.instances { span.instance { (instance) } " " }
            }
            dt id="deployment-error-term" hidden[live.error.is_none()] { (ctx.t("deploy.error")) }
            dd.error id="deployment-error" hidden[live.error.is_none()] { (live.error.as_deref().unwrap_or("")) }
        }
        h2 { (ctx.t("deploy.timeline")) }
        ol.timeline id="deployment-timeline" {
            @for event in &live.timeline {
                li { (state_badge(ctx.lang, &event.state)) " " time { (event.at) } }
            }
        }
        h2 { (ctx.t("deploy.logs")) @if !live.settled() { " " span.live { "● " (ctx.t("deploy.live")) } } }
        @if lines.is_empty() { p.empty id="log-empty" { (ctx.t("deploy.logs_empty")) } }
        pre.log id="log" tabindex="0" data-stream=[(!live.settled()).then_some(stream)] {
            @for (_, ts, stream, line) in lines {
                span class=(format!("line {stream}")) title=(ts) { (line) "\n" }
            }
        }
    }
}

/// The deployment as the page shows it, read from the store.
async fn load_live(store: &crate::store::Store, lang: Lang, deployment: &DeploymentRow, node_names: &mut HashMap<String, String>) -> Result<LiveDeployment, crate::store::StoreError> {
    let events = store.deployment_events(&deployment.id).await?;
    let instances = store.instances(&deployment.id).await?;
    if instances.iter().any(|i| i.node_id.as_ref().is_some_and(|n| !node_names.contains_key(n))) {
        *node_names = store.nodes().await?.into_iter().map(|n| (n.id, n.name)).collect();
    }
    Ok(LiveDeployment::new(lang, deployment, &events, &instances, node_names))
}

pub async fn page(ctx: Ctx, Path(id): Path<String>) -> Response {
    let store = &ctx.state.store;
    let loaded = async {
        let Some(deployment) = store.deployment(&id).await? else { return Ok(None) };
        let live = load_live(store, ctx.lang, &deployment, &mut HashMap::new()).await?;
        let lines = store.deployment_logs(&id, 0, PAGE_LOG_LINES).await?;
        Ok::<_, crate::store::StoreError>(Some((deployment, live, lines)))
    }
    .await;
    match loaded {
        Ok(Some((deployment, live, lines))) => {
            let title = format!("{} · {}", ctx.t("deploy.title"), deployment.app);
            let body = page_body(&ctx, &deployment, &live, &lines);
            layout::page(&ctx, &title, Nav::Apps, &format!("/deployments/{id}"), body).into_response()
        }
        Ok(None) => super::not_found(&ctx),
        Err(err) => crate::error::ApiError::from(err).into_response(),
    }
}

#[derive(serde::Deserialize)]
pub struct After {
    after: Option<i64>,
    lang: Option<String>,
}

/// How often the stream looks at the deployment's state.
const STATE_POLL: Duration = Duration::from_millis(500);

/// `event: state` with a [`LiveDeployment`] each time what the page shows
/// changes, the first one at once (the page may be a moment old); it ends
/// with the first settled one.
fn state_events(state: Arc<AppState>, id: String, lang: Lang) -> impl Stream<Item = Event> {
    stream::unfold((state, None::<LiveDeployment>, HashMap::new(), false), move |(state, last, mut nodes, done)| {
        let id = id.clone();
        async move {
            if done {
                return None;
            }
            let mut wait = last.is_some();
            loop {
                if wait {
                    tokio::time::sleep(STATE_POLL).await;
                }
                wait = true;
                let deployment = state.store.deployment(&id).await.ok()??;
                let Ok(live) = load_live(&state.store, lang, &deployment, &mut nodes).await else { continue };
                if last.as_ref() != Some(&live) {
                    let event = Event::default().event("state").data(serde_json::to_string(&live).unwrap_or_default());
                    let done = live.settled();
                    return Some((event, (state, Some(live), nodes, done)));
                }
            }
        }
    })
}

/// The deployment's stream for the page's script (the session, not a
/// bearer token, authorizes it): the API's log stream from line `after`
/// on, with `event: state` whenever the state, commit, image, instances
/// or timeline change.
pub async fn log_stream(ctx: Ctx, Path(id): Path<String>, Query(after): Query<After>) -> Response {
    if !matches!(ctx.state.store.deployment(&id).await, Ok(Some(_))) {
        return super::not_found(&ctx);
    }
    let lang = after.lang.as_deref().and_then(Lang::parse).unwrap_or(ctx.lang);
    let logs = crate::api::deployments::log_events(ctx.state.clone(), id.clone(), after.after.unwrap_or(0).max(0));
    let states = state_events(ctx.state.clone(), id, lang).map(Ok);
    let events: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> = Box::pin(stream::select(logs, states));
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}
