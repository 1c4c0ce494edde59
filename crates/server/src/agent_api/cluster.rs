//! Read-only views an agent fetches: mesh peers, the ingress route table and
//! the image registry settings.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::{Peer, PeerList, RegistryConfig, RouteTable};

use super::AuthedNode;
use crate::error::ApiError;
use crate::AppState;

/// Every registered node except `node_id`, as mesh peers.
pub async fn peers_of(state: &AppState, node_id: &str) -> Result<Vec<Peer>, ApiError> {
    Ok(state
        .store
        .nodes()
        .await?
        .into_iter()
        .filter(|n| n.id != node_id)
        .map(|n| Peer {
            node_id: n.id,
            name: n.name,
            mesh_address: crate::mesh_address(n.mesh_index),
            wireguard_public_key: n.wireguard_public_key,
            endpoint: n.endpoint,
        })
        .collect())
}

pub async fn peers(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
) -> Result<Json<PeerList>, ApiError> {
    Ok(Json(PeerList { peers: peers_of(&state, &node_id).await? }))
}

pub async fn routes(State(state): State<Arc<AppState>>) -> Json<RouteTable> {
    Json(state.routes.read().expect("routes lock").clone())
}

pub async fn registry(State(state): State<Arc<AppState>>) -> Json<RegistryConfig> {
    Json(state.registry.read().expect("registry lock").clone())
}
