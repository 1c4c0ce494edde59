//! The Engine's `die` events of this node's app instance containers: a
//! container's process ended (it crashed, exited, or a restart stopped
//! it). The crash-loop watch counts them.

use std::collections::HashMap;

use bollard::query_parameters::EventsOptionsBuilder;
use futures_util::{Stream, StreamExt};

use super::usage::engine_time;
use super::{DockerRuntime, RuntimeError, LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_NODE};

/// One container's process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Died {
    pub container: String,
    pub deployment: String,
    pub instance: u32,
    pub exit_code: Option<i64>,
    /// Unix time in nanoseconds, the Engine's.
    pub at_nanos: i64,
}

impl DockerRuntime {
    /// Follows the `die` events of this node's instance containers from
    /// `since_nanos` on; the stream ends when the Engine goes away.
    pub fn die_events(
        &self,
        since_nanos: i64,
    ) -> Result<impl Stream<Item = Result<Died, RuntimeError>> + use<>, RuntimeError> {
        let filters = HashMap::from([
            ("type", vec!["container".to_string()]),
            ("event", vec!["die".to_string()]),
            (
                "label",
                vec![
                    format!("{LABEL_NODE}={}", self.node_id),
                    LABEL_INSTANCE.to_string(),
                ],
            ),
        ]);
        let options = EventsOptionsBuilder::new()
            .since(&engine_time(since_nanos))
            .filters(&filters)
            .build();
        let stream = self.docker()?.events(Some(options));
        Ok(stream.filter_map(|event| async move {
            let event = match event {
                Ok(event) => event,
                Err(err) => return Some(Err(RuntimeError::from(err))),
            };
            let actor = event.actor?;
            let attributes = actor.attributes.unwrap_or_default();
            Some(Ok(Died {
                container: actor.id?,
                deployment: attributes.get(LABEL_DEPLOYMENT)?.clone(),
                instance: attributes.get(LABEL_INSTANCE)?.parse().ok()?,
                exit_code: attributes.get("exitCode").and_then(|c| c.parse().ok()),
                at_nanos: event
                    .time_nano
                    .or(event.time.map(|s| s.saturating_mul(1_000_000_000)))
                    .unwrap_or(0),
            }))
        }))
    }
}
