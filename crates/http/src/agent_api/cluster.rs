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
    Ok(Json(state.nodes.mesh_peers(&node_id)))
}

pub async fn routes(State(state): State<Arc<AppState>>) -> Json<RouteTable> {
    Json(state.routes.read().expect("routes lock").clone())
}

/// The registry settings with the asking node's own credential.
pub async fn registry(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
) -> Result<Json<RegistryConfig>, ApiError> {
    let mut config = state.registry.read().expect("registry lock").clone();
    if let (true, Some(credentials)) = (config.configured, &state.registry_credentials) {
        let password = credentials.for_node(&node_id).await.map_err(|e| ApiError::Internal(e.to_string()))?;
        config.username = Some(node_id);
        config.password = Some(password);
    }
    Ok(Json(config))
}
