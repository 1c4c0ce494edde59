//! `/api/control-planes`: the control plane's replicas, which one leads,
//! and whether each was heard from within the lease.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use cloudweb_api_types::control_planes::{ControlPlaneList, ControlPlaneView};

use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::store::Engine;
use crate::AppState;

/// The control-plane replicas: which one leads (with its term) and whether
/// each renewed or tried for the lease within its length. On SQLite there
/// is one, this one, and it leads.
#[utoipa::path(get, path = "/api/control-planes", operation_id = "control_planes_list", tag = "nodes",
    responses((status = 200, description = "Every control-plane replica heard from within the last hour, the leader first", body = ControlPlaneList)))]
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<ControlPlaneList>, ApiError> {
    let lease = state.config.leader_lease;
    let lease_seconds = lease.as_secs();
    if state.store.engine() == Engine::Sqlite {
        return Ok(Json(ControlPlaneList {
            database: "sqlite".into(),
            term: None,
            lease_seconds,
            replicas: vec![ControlPlaneView {
                url: state.leader.url().to_string(),
                leader: true,
                state: "live".into(),
                last_seen: rfc3339_ms(state.clock.now_ms()),
                this_replica: true,
            }],
        }));
    }
    let stored = state.store.replicas().await?;
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let replicas = stored
        .replicas
        .into_iter()
        .map(|r| ControlPlaneView {
            this_replica: r.url == state.leader.url(),
            leader: r.leads,
            // Each replica tries for the lease every quarter of it.
            state: if stored.now_ms - r.seen_at_ms <= lease_ms { "live" } else { "unreachable" }.into(),
            last_seen: rfc3339_ms(r.seen_at_ms),
            url: r.url,
        })
        .collect();
    Ok(Json(ControlPlaneList { database: "postgres".into(), term: stored.term, lease_seconds, replicas }))
}
