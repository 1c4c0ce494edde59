//! Read-only views an agent fetches: mesh peers, the ingress route table and
//! the image registry settings.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::{PeerList, RegistryConfig, RouteTable};

use super::AuthedNode;
use crate::error::ApiError;
use crate::AppState;

pub async fn peers(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
) -> Result<Json<PeerList>, ApiError> {
    Ok(Json(PeerList { peers: state.nodes.mesh_peers(&node_id) }))
}

pub async fn routes(State(state): State<Arc<AppState>>) -> Json<RouteTable> {
    Json(state.routes.read().expect("routes lock").clone())
}

pub async fn registry(State(state): State<Arc<AppState>>) -> Json<RegistryConfig> {
    Json(state.registry.read().expect("registry lock").clone())
}
