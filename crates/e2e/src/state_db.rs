//! Which database the control planes of a test keep their state in.
//!
//! By default each one has SQLite's `state.db` under its data dir. With
//! `CLOUDWEB_TEST_DATABASE=postgres` in the environment (`scripts/test.sh`
//! runs part of the suite that way), each one gets a database of its own on
//! a real PostgreSQL server that this test process starts on first use
//! (Debian's `initdb` and `postgres` on a Unix socket in a temporary
//! directory, killed with the process). The database's name comes from the
//! data dir, so a control plane restarted on the same data dir finds its
//! state again.

use std::path::Path;
use std::sync::OnceLock;

use cloudweb_test_support::postgres::TestPostgres;
use sha2::{Digest, Sha256};

/// The environment variable that picks the engine: `postgres` or unset.
pub const ENGINE_VARIABLE: &str = "CLOUDWEB_TEST_DATABASE";

/// Whether this run keeps control-plane state in PostgreSQL.
pub fn on_postgres() -> bool {
    match std::env::var(ENGINE_VARIABLE).as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Ok("") | Err(_) => false,
        Ok(other) => panic!("{ENGINE_VARIABLE}={other:?}: use postgres or sqlite"),
    }
}

static SERVER: OnceLock<TestPostgres> = OnceLock::new();

fn server() -> &'static TestPostgres {
    SERVER.get_or_init(|| {
        let server = TestPostgres::start();
        // A static is never dropped: stop the server and remove its files
        // when the test process exits (a killed one leaves them; the
        // server dies with it all the same).
        // SAFETY: registers a plain function without captured state.
        unsafe { libc::atexit(stop_at_exit) };
        server
    })
}

extern "C" fn stop_at_exit() {
    if let Some(server) = SERVER.get() {
        server.stop_and_remove();
    }
}

/// The `--database-url` of the control plane on `data_dir`, made on first
/// use; `None` when this run uses SQLite.
pub fn url_for(data_dir: &Path) -> Option<String> {
    if !on_postgres() {
        return None;
    }
    let server = server();
    let digest = Sha256::digest(data_dir.as_os_str().as_encoded_bytes());
    let name: String = format!("cw_{}", digest.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>());
    server.create_database(&name);
    Some(server.url(&name))
}

/// For a test about SQLite's own file (a full disk under it, a damaged or
/// missing `state.db`): true, with a line saying so, when this run keeps
/// the state in PostgreSQL, where that file does not exist. The test runs
/// in the default (SQLite) run all the same.
pub fn skip_unless_sqlite(what: &str) -> bool {
    if on_postgres() {
        eprintln!("not run on PostgreSQL: {what} is about SQLite's state.db");
        return true;
    }
    false
}
