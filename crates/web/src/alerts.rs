//! `/alerts`: the open alerts (the bell in every page's header counts
//! them) and the recent resolved ones; then the alert channels the user
//! sees, each with a "send test" button and its newest deliveries with
//! every attempt (status or error), and a form that adds a channel. Each
//! form acts through the core's channel functions, as the API does.

use std::collections::HashMap;

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use axum::Form;
use cloudweb_api_types::alerts::{AlertView, ChannelDetail, ChannelTarget, NewAlertChannel, SmtpServer, SmtpTls, ALERT_KINDS, DEFAULT_ALERT_KINDS};
use cloudweb_core::alerts::channels;
use maud::{html, Markup};

use super::layout::{self, Nav};
use super::{csrf_field, Ctx};
use crate::error::ApiError;

/// Resolved alerts the page lists.
const RESOLVED_SHOWN: i64 = 50;

fn alerts_table(ctx: &Ctx, id: &str, alerts: &[AlertView]) -> Markup {
    html! {
        table id=(id) {
            thead { tr { th { (ctx.t("alerts.severity")) } th { (ctx.t("alerts.kind")) } th { (ctx.t("alerts.subject")) } th { (ctx.t("alerts.summary")) } th { (ctx.t("alerts.opened")) } th { (ctx.t("alerts.resolved")) } } }
            tbody {
                @for a in alerts {
                    tr class=(format!("severity-{}", a.severity)) {
                        td { (a.severity) } td { code { (a.kind) } } td { (a.subject) }
                        td {
                            (a.summary)
                            @if let Some(detail) = &a.detail { details { summary { (ctx.t("alerts.detail")) } pre { (detail) } } }
                        }
                        td { time { (a.opened_at) } @if a.occurrences > 1 { " (×" (a.occurrences) ")" } }
                        td { @if let Some(at) = &a.resolved_at { time { (at) } } @else { "–" } }
                    }
                }
            }
        }
    }
}

fn channel_section(ctx: &Ctx, detail: &ChannelDetail) -> Markup {
    let c = &detail.channel;
    html! {
        section.channel id=(format!("channel-{}", c.name)) {
            h3 {
                (c.name) " "
                small { (c.kind) " · " @if let Some(owner) = &c.owner { (ctx.t("alerts.personal")) " (" (owner) ")" } @else { (ctx.t("alerts.cluster")) } }
            }
            p { code { (c.target) } " · " (c.events.join(", ")) }
            @if c.failing { p.warning { (ctx.t("alerts.failing")) } }
            form.inline method="post" action=(format!("/alerts/channels/{}/test", c.id)) {
                (csrf_field(ctx))
                button type="submit" { (ctx.t("alerts.send_test")) }
            }
            " "
            form.inline method="post" action=(format!("/alerts/channels/{}/delete", c.id)) {
                (csrf_field(ctx))
                button.danger type="submit" { (ctx.t("alerts.delete_channel")) }
            }
            @if detail.deliveries.is_empty() {
                p { (ctx.t("alerts.no_deliveries")) }
            } @else {
                table.deliveries {
                    thead { tr { th { (ctx.t("alerts.queued")) } th { (ctx.t("alerts.event")) } th { (ctx.t("alerts.summary")) } th { (ctx.t("alerts.state")) } th { (ctx.t("alerts.attempts")) } } }
                    tbody {
                        @for d in &detail.deliveries {
                            tr class=(format!("delivery-{}", d.state)) {
                                td { time { (d.created_at) } } td { (d.event) } td { (d.summary) }
                                td { (d.state) @if let Some(next) = &d.next_attempt_at { @if d.attempts > 0 { " · " (ctx.t("alerts.next")) " " time { (next) } } } }
                                td {
                                    ul.attempts {
                                        @for a in &d.attempt_log {
                                            li class=(if a.ok { "ok" } else { "failed" }) { "#" (a.attempt) " " time { (a.at) } " " (a.duration_ms) " ms: " (a.outcome) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn add_form(ctx: &Ctx) -> Markup {
    html! {
        details id="add-channel" {
            summary { (ctx.t("alerts.add")) }
            form method="post" action="/alerts/channels" id="channel-form" {
                (csrf_field(ctx))
                label { (ctx.t("alerts.name")) " " input type="text" name="name" required pattern="[a-z][a-z0-9-]*" maxlength="63"; }
                " "
                label { (ctx.t("alerts.kind")) " " select name="kind" {
                    option value="webhook" { (ctx.t("alerts.kind_webhook")) }
                    option value="slack" { (ctx.t("alerts.kind_slack")) }
                    option value="email" { (ctx.t("alerts.kind_email")) }
                } }
                " "
                label { input type="checkbox" name="personal" value="1"; " " (ctx.t("alerts.only_me")) }
                fieldset {
                    legend { (ctx.t("alerts.webhook_fields")) }
                    label { "URL " input type="url" name="url" maxlength="2048" autocomplete="off"; }
                    " "
                    label { (ctx.t("alerts.secret")) " " input type="password" name="secret" minlength="16" maxlength="256" autocomplete="off"; }
                }
                fieldset {
                    legend { (ctx.t("alerts.email_fields")) }
                    label { (ctx.t("alerts.to")) " " input type="text" name="to" placeholder="ops@example.com, oncall@example.com" maxlength="2000"; }
                    " "
                    label { (ctx.t("alerts.from")) " " input type="text" name="from" placeholder="cloud-web <alerts@example.com>" maxlength="320"; }
                    br;
                    label { (ctx.t("alerts.smtp_host")) " " input type="text" name="smtp_host" maxlength="253"; }
                    " "
                    label { (ctx.t("alerts.smtp_port")) " " input type="number" name="smtp_port" min="1" max="65535"; }
                    " "
                    label { "TLS " select name="smtp_tls" { option value="starttls" { "STARTTLS" } option value="tls" { "TLS" } option value="none" { (ctx.t("alerts.no_tls")) } } }
                    br;
                    label { (ctx.t("alerts.smtp_user")) " " input type="text" name="smtp_user" maxlength="256" autocomplete="off"; }
                    " "
                    label { (ctx.t("alerts.smtp_password")) " " input type="password" name="smtp_password" maxlength="256" autocomplete="off"; }
                }
                fieldset {
                    legend { (ctx.t("alerts.events")) }
                    @for kind in ALERT_KINDS {
                        label { input type="checkbox" name=(format!("event.{kind}")) value="1" checked[DEFAULT_ALERT_KINDS.contains(kind)]; " " code { (kind) } } " "
                    }
                }
                button type="submit" { (ctx.t("alerts.add")) }
            }
        }
    }
}

async fn body(ctx: &Ctx) -> Result<Markup, ApiError> {
    let open: Vec<AlertView> = ctx.state.store.alerts(true, 1000).await?.into_iter().map(cloudweb_core::alerts::view).collect();
    let resolved: Vec<AlertView> =
        ctx.state.store.alerts(false, RESOLVED_SHOWN + 1000).await?.into_iter().filter(|a| a.resolved_at.is_some()).take(RESOLVED_SHOWN as usize).map(cloudweb_core::alerts::view).collect();
    let mut details = Vec::new();
    for channel in channels::list(&ctx.state, &ctx.principal).await? {
        details.push(channels::detail(&ctx.state, &ctx.principal, &channel.id).await?);
    }
    Ok(html! {
        p { (ctx.t("alerts.help")) }
        h2 { (ctx.t("alerts.open")) " (" (open.len()) ")" }
        @if open.is_empty() { p id="no-open-alerts" { (ctx.t("alerts.none_open")) } } @else { (alerts_table(ctx, "open-alerts", &open)) }
        @if !resolved.is_empty() {
            details { summary { (ctx.t("alerts.recently_resolved")) } (alerts_table(ctx, "resolved-alerts", &resolved)) }
        }
        h2 { (ctx.t("alerts.channels")) }
        @if details.is_empty() { p.warning id="no-channels" { (ctx.t("alerts.no_channels")) } }
        @for detail in &details { (channel_section(ctx, detail)) }
        (add_form(ctx))
    })
}

pub async fn page(ctx: Ctx) -> Response {
    match body(&ctx).await {
        Ok(markup) => layout::page(&ctx, ctx.t("alerts.title"), Nav::Alerts, "/alerts", markup).into_response(),
        Err(err) => err.into_response(),
    }
}

/// The form's channel: only the chosen kind's fields count.
fn new_channel(form: &HashMap<String, String>) -> Result<NewAlertChannel, ApiError> {
    let field = |key: &str| form.get(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let target = match field("kind").as_deref() {
        Some("webhook") => ChannelTarget::Webhook { url: field("url").unwrap_or_default(), secret: field("secret").unwrap_or_default() },
        Some("slack") => ChannelTarget::Slack { url: field("url").unwrap_or_default() },
        Some("email") => {
            let port = match field("smtp_port") {
                Some(text) => Some(text.parse::<u16>().map_err(|_| ApiError::BadRequest(format!("smtp port: {text:?} is not a port")))?),
                None => None,
            };
            let tls = match field("smtp_tls").as_deref() {
                Some("tls") => SmtpTls::Tls,
                Some("none") => SmtpTls::None,
                _ => SmtpTls::Starttls,
            };
            ChannelTarget::Email {
                smtp: SmtpServer { host: field("smtp_host").unwrap_or_default(), port, tls, username: field("smtp_user"), password: field("smtp_password") },
                from: field("from").unwrap_or_default(),
                to: field("to").unwrap_or_default().split(',').map(|a| a.trim().to_string()).filter(|a| !a.is_empty()).collect(),
            }
        }
        _ => return Err(ApiError::BadRequest("kind: webhook, slack or email".into())),
    };
    let events: Vec<String> = ALERT_KINDS.iter().filter(|k| form.contains_key(&format!("event.{k}"))).map(|k| k.to_string()).collect();
    Ok(NewAlertChannel { name: field("name").unwrap_or_default(), personal: field("personal").is_some(), events: Some(events), target })
}

pub async fn add(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = match new_channel(&form) {
        Ok(request) => channels::create(&ctx.state, &ctx.principal, request).await.map(drop),
        Err(err) => Err(err),
    };
    ctx.outcome(result, "/alerts").await
}

pub async fn test(ctx: Ctx, Path(id): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = channels::send_test(&ctx.state, &ctx.principal, &id).await;
    ctx.outcome(result, "/alerts").await
}

pub async fn delete(ctx: Ctx, Path(id): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = channels::delete(&ctx.state, &ctx.principal, &id).await;
    ctx.outcome(result, "/alerts").await
}

/// How many alerts are open (the header's bell), or 0 when unknown.
pub async fn open_count(state: &cloudweb_core::AppState) -> usize {
    state.store.alerts(true, 1000).await.map(|a| a.len()).unwrap_or(0)
}
