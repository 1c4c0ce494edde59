//! Alerts and their channels (see [`cloudweb_core::alerts`]):
//! `GET /api/alerts[?all=1][&limit=N]`, the open alerts (or every alert
//! kept, open and resolved), newest first; `/api/alerts/channels`, where
//! they are sent, with each delivery and its attempts, and a test message.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use cloudweb_api_types::alerts::{AlertList, ChannelDetail, ChannelList, ChannelView, DeliveryView, NewAlertChannel};
use cloudweb_core::alerts::channels as alert_channels;
use cloudweb_api_types::ErrorBody;
use serde::Deserialize;

use crate::auth::Principal;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

/// Most alerts one answer lists.
const MAX_LIMIT: i64 = 1000;

#[derive(Debug, Default, Deserialize)]
pub struct AlertsQuery {
    all: Option<String>,
    limit: Option<String>,
}

/// The alerts, newest first, and how many are open.
pub async fn list_alerts(state: &AppState, all: bool, limit: i64) -> Result<AlertList, ApiError> {
    let open = u64::try_from(state.store.alerts(true, MAX_LIMIT).await?.len()).unwrap_or(0);
    let alerts = state.store.alerts(!all, limit).await?.into_iter().map(cloudweb_core::alerts::view).collect();
    Ok(AlertList { alerts, open })
}

#[utoipa::path(get, path = "/api/alerts", operation_id = "alerts_list", tag = "alerts",
    params(("all" = Option<bool>, Query, description = "1: resolved alerts too (kept 30 days)"), ("limit" = Option<u32>, Query, description = "At most this many (1 to 1000, default 100)")),
    responses(
        (status = 200, description = "Alerts, newest first, and how many are open", body = AlertList),
        (status = 400, description = "Invalid query", body = ErrorBody),
    ))]
pub async fn list(State(state): State<Arc<AppState>>, Extension(access): Extension<crate::access::Access>, Query(query): Query<AlertsQuery>) -> Result<Json<AlertList>, ApiError> {
    let all = match query.all.as_deref() {
        None | Some("0" | "false") => false,
        Some("1" | "true" | "") => true,
        Some(_) => return Err(ApiError::BadRequest("all must be 1, true, 0 or false".into())),
    };
    let limit = match query.limit.as_deref() {
        None => 100,
        Some(text) => text.parse::<i64>().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| ApiError::BadRequest(format!("limit must be 1 to {MAX_LIMIT}")))?,
    };
    let mut list = list_alerts(&state, all, limit).await?;
    if !access.sees_all() {
        // Alerts about the caller's apps and services only (their subject
        // starts with the app's or service's name); the cluster's own
        // (nodes, certificates of the listener) need a cluster role.
        let mut kept = Vec::new();
        for alert in list.alerts {
            let head = alert.subject.split(['#', '/']).next().unwrap_or_default().to_string();
            let app = crate::access::sees_owned(&state, &access, crate::store::Owned::App, &head).await?;
            if app || crate::access::sees_owned(&state, &access, crate::store::Owned::Service, &head).await? {
                kept.push(alert);
            }
        }
        list.open = kept.iter().filter(|a| a.resolved_at.is_none()).count() as u64;
        list.alerts = kept;
    }
    Ok(Json(list))
}

/// `GET /api/alerts/channels`: the channels the caller sees.
#[utoipa::path(get, path = "/api/alerts/channels", operation_id = "alert_channels_list", tag = "alerts",
    responses((status = 200, description = "The cluster's channels and the caller's own", body = ChannelList)))]
pub async fn channels(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>) -> Result<Json<ChannelList>, ApiError> {
    Ok(Json(ChannelList { channels: alert_channels::list(&state, &principal).await? }))
}

/// `POST /api/alerts/channels`: adds a channel.
#[utoipa::path(post, path = "/api/alerts/channels", operation_id = "alert_channels_create", tag = "alerts",
    request_body = NewAlertChannel,
    responses(
        (status = 201, description = "Added; its URL's path, secret and password are never shown again", body = ChannelView),
        (status = 400, description = "Invalid channel", body = ErrorBody),
        (status = 409, description = "The name is taken, or too many channels", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn create_channel(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ChannelView>), ApiError> {
    let request: NewAlertChannel = parse_json(&body_bytes(body)?)?;
    Ok((StatusCode::CREATED, Json(alert_channels::create(&state, &principal, request).await?)))
}

/// `GET /api/alerts/channels/{id}`: a channel and its newest deliveries.
#[utoipa::path(get, path = "/api/alerts/channels/{id}", operation_id = "alert_channels_get", tag = "alerts",
    params(("id" = String, Path, description = "The channel's id")),
    responses(
        (status = 200, description = "The channel and its newest 50 deliveries, each with every attempt", body = ChannelDetail),
        (status = 404, description = "No such channel (or another person's)", body = ErrorBody),
    ))]
pub async fn channel(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Path(id): Path<String>) -> Result<Json<ChannelDetail>, ApiError> {
    Ok(Json(alert_channels::detail(&state, &principal, &id).await?))
}

/// `DELETE /api/alerts/channels/{id}`: deletes a channel, its queue and
/// its delivery history.
#[utoipa::path(delete, path = "/api/alerts/channels/{id}", operation_id = "alert_channels_delete", tag = "alerts",
    params(("id" = String, Path, description = "The channel's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such channel (or another person's)", body = ErrorBody),
    ))]
pub async fn delete_channel(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    alert_channels::delete(&state, &principal, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/alerts/channels/{id}/test`: queues a test message.
#[utoipa::path(post, path = "/api/alerts/channels/{id}/test", operation_id = "alert_channels_test", tag = "alerts",
    params(("id" = String, Path, description = "The channel's id")),
    responses(
        (status = 202, description = "Queued; sent within a second or two, its attempts shown on the channel", body = DeliveryView),
        (status = 404, description = "No such channel (or another person's)", body = ErrorBody),
    ))]
pub async fn test_channel(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Path(id): Path<String>) -> Result<(StatusCode, Json<DeliveryView>), ApiError> {
    Ok((StatusCode::ACCEPTED, Json(alert_channels::send_test(&state, &principal, &id).await?)))
}
