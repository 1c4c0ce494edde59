//! PostgreSQL's `LISTEN`/`NOTIFY` between control-plane replicas: a
//! replica publishes what its streams are told ("node n has new commands")
//! and every other replica hears it and tells its own streams, so a
//! command queued through one replica reaches a node whose event stream is
//! held by another at once, not at the node's next poll. Nothing is
//! published or heard on SQLite (one control plane).

use sqlx::postgres::PgListener;

use crate::backend::Db;
use super::{Store, StoreError};

/// The channel every replica listens on.
pub const EVENTS_CHANNEL: &str = "cloudweb_events";

/// A connection that hears [`EVENTS_CHANNEL`].
pub struct EventListener(PgListener);

impl EventListener {
    /// The next payload. sqlx reconnects a dropped connection itself
    /// (what was published meanwhile is lost, and nodes catch up at their
    /// next poll); an error means it could not.
    pub async fn recv(&mut self) -> Result<String, StoreError> {
        Ok(self.0.recv().await?.payload().to_string())
    }
}

impl Store {
    /// Publishes `payload` to every replica listening (PostgreSQL only).
    pub async fn publish_event(&self, payload: &str) -> Result<(), StoreError> {
        let Db::Postgres(pool) = &self.db else { return Ok(()) };
        sqlx::query("SELECT pg_notify($1, $2)").bind(EVENTS_CHANNEL).bind(payload).execute(pool).await?;
        Ok(())
    }

    /// A listener on [`EVENTS_CHANNEL`], or `None` on SQLite.
    pub async fn event_listener(&self) -> Result<Option<EventListener>, StoreError> {
        let Db::Postgres(pool) = &self.db else { return Ok(None) };
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(EVENTS_CHANNEL).await?;
        Ok(Some(EventListener(listener)))
    }
}

#[cfg(test)]
mod tests {
    use crate::test_engines::open;
    use crate::Engine;

    #[tokio::test]
    async fn a_published_event_is_heard_by_another_connection() {
        let store = open(Engine::Postgres).await;
        let mut listener = store.event_listener().await.unwrap().expect("a listener on PostgreSQL");
        store.publish_event("origin\nnodes\nn-1\ncommands").await.unwrap();
        let heard = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv()).await.unwrap().unwrap();
        assert_eq!(heard, "origin\nnodes\nn-1\ncommands");
        let sqlite = open(Engine::Sqlite).await;
        assert!(sqlite.event_listener().await.unwrap().is_none());
        sqlite.publish_event("ignored").await.unwrap();
    }
}
