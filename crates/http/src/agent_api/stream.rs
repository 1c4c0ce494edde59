//! `GET /agent/v1/stream`: server-sent events that only say "look again".

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use futures_util::stream::Stream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::StreamExt;

use super::AuthedNode;
use crate::AppState;

/// A comment line at least this often keeps proxies and NATs from closing an
/// idle stream.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub async fn stream(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let receiver = state.hub.subscribe(&node_id);
    // The node may have been removed between authentication and subscribing;
    // its channel would then outlive it. Drop it, which ends this stream.
    if state.nodes.get(&node_id).is_none() {
        state.hub.remove(&node_id);
    }
    let events = BroadcastStream::new(receiver).map(|message| {
        let name = match message {
            Ok(name) => name,
            // Missed messages: tell the agent to re-read its commands, which
            // is always safe.
            Err(BroadcastStreamRecvError::Lagged(_)) => cloudweb_protocol::events::COMMANDS,
        };
        Ok(Event::default().event(name).data("{}"))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
}
