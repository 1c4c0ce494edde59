//! The store's tests run on both engines: [`both_engines!`] turns one test
//! body into a test on a fresh SQLite file and one on a fresh database of a
//! real PostgreSQL server that the test starts itself
//! ([`cloudweb_test_support::postgres`]).

use std::ops::Deref;

use cloudweb_test_support::postgres::TestPostgres;

use crate::{DatabaseUrl, Engine, Store};

/// A store and what must live as long as it.
pub(crate) struct TestStore {
    store: Store,
    /// The `postgres://` URL of its database, on PostgreSQL.
    pub(crate) url: Option<String>,
    // Dropped after the store's pool (fields drop in order).
    _server: Option<TestPostgres>,
    _dir: tempfile::TempDir,
}

impl Deref for TestStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

/// A new, empty, migrated store on `engine`.
pub(crate) async fn open(engine: Engine) -> TestStore {
    let dir = tempfile::tempdir().unwrap();
    match engine {
        Engine::Sqlite => TestStore { store: Store::open(dir.path(), "test").await.unwrap(), url: None, _server: None, _dir: dir },
        Engine::Postgres => {
            let server = tokio::task::spawn_blocking(TestPostgres::start).await.unwrap();
            let admin = sqlx::PgPool::connect(&server.url("postgres")).await.unwrap();
            sqlx::query("CREATE DATABASE cloudweb").execute(&admin).await.unwrap();
            admin.close().await;
            let text = server.url("cloudweb");
            let store = Store::connect(&DatabaseUrl::parse(&text).unwrap(), dir.path(), "test").await.unwrap();
            TestStore { store, url: Some(text), _server: Some(server), _dir: dir }
        }
    }
}

/// A bind value of a test's own statement.
pub(crate) enum Arg<'a> {
    Text(&'a str),
    Int(i64),
}

impl Store {
    /// Runs one statement of a test's own: a fixture no method writes.
    pub(crate) async fn test_execute(&self, sql: &str, args: &[Arg<'_>]) {
        on_db!(self, pool => {
            let mut query = sqlx::query(sql);
            for arg in args {
                query = match arg {
                    Arg::Text(text) => query.bind(*text),
                    Arg::Int(n) => query.bind(*n),
                };
            }
            query.execute(pool).await.unwrap();
        })
    }

    /// The rows of a test's own query of two text columns.
    pub(crate) async fn test_pairs(&self, sql: &str) -> Vec<(String, String)> {
        on_db!(self, pool => { sqlx::query_as(sql).fetch_all(pool).await.unwrap() })
    }
}

/// `both_engines! { async fn name(store) { … } }` is the test `name::sqlite`
/// and the test `name::postgres`, each with `store` a fresh store of that
/// engine.
macro_rules! both_engines {
    ($(async fn $name:ident($store:ident) $body:block)*) => {$(
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn run($store: &$crate::Store) $body

            #[tokio::test]
            async fn sqlite() {
                let store = $crate::test_engines::open($crate::Engine::Sqlite).await;
                run(&store).await;
            }

            #[tokio::test]
            async fn postgres() {
                let store = $crate::test_engines::open($crate::Engine::Postgres).await;
                run(&store).await;
            }
        }
    )*};
}
pub(crate) use both_engines;
