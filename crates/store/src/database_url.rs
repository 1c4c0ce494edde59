//! Where the state lives: `sqlite://PATH` (the default, `state.db` under
//! the data dir) or `postgres://…` (`--database-url`, for several
//! control-plane replicas on one database).

use std::fmt;
use std::path::{Path, PathBuf};

/// A parsed `--database-url`. Its `Display` never shows a password.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// A SQLite file (made when missing).
    Sqlite(PathBuf),
    /// A PostgreSQL database, as libpq and sqlx read it:
    /// `postgres://user:password@host:port/db`, or
    /// `postgres:///db?host=/run/postgresql` for a Unix socket.
    Postgres(url::Url),
}

impl DatabaseUrl {
    /// The default: `<data_dir>/state.db`.
    pub fn sqlite_in(data_dir: &Path) -> DatabaseUrl {
        DatabaseUrl::Sqlite(data_dir.join(super::DATABASE_FILE))
    }

    /// Reads `sqlite:///absolute/path`, `sqlite:relative/path` or
    /// `postgres://…` (`postgresql://` too), refusing anything else with a
    /// reason that never repeats a password.
    pub fn parse(text: &str) -> Result<DatabaseUrl, String> {
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("sqlite://").or_else(|| text.strip_prefix("sqlite:")) {
            let path = rest.split('?').next().unwrap_or_default();
            if path.is_empty() {
                return Err("a sqlite:// URL needs a file path (sqlite:///var/lib/cloudweb/state.db)".into());
            }
            return Ok(DatabaseUrl::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            let url = url::Url::parse(text).map_err(|err| format!("not a PostgreSQL URL ({err}): postgres://user:password@host:5432/cloudweb"))?;
            let database = url.path().trim_start_matches('/');
            if database.is_empty() || database.contains('/') {
                return Err("a postgres:// URL names one database as its path (postgres://host/cloudweb)".into());
            }
            if url.host_str().is_none_or(str::is_empty) && !url.query_pairs().any(|(k, _)| k == "host") {
                return Err("a postgres:// URL needs a host, or ?host=/socket/dir for a Unix socket".into());
            }
            return Ok(DatabaseUrl::Postgres(url));
        }
        let scheme = text.split_once(':').map(|(s, _)| s).unwrap_or(text);
        Err(format!("{scheme:?} is not a database URL: use sqlite:///path/to/state.db or postgres://user:password@host/db"))
    }

    /// The URL without its password, for pg_dump's argument list and for
    /// logs; the password goes separately ([`DatabaseUrl::password`]).
    pub fn without_password(&self) -> String {
        match self {
            DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
            DatabaseUrl::Postgres(url) => {
                let mut url = url.clone();
                let _ = url.set_password(None);
                url.to_string()
            }
        }
    }

    /// The same URL with `password` in it (a PostgreSQL URL only).
    pub fn with_password(&self, password: &str) -> Result<DatabaseUrl, String> {
        match self {
            DatabaseUrl::Postgres(url) => {
                let mut url = url.clone();
                url.set_password(Some(password)).map_err(|()| "this URL cannot hold a password (it needs a user@host)".to_string())?;
                Ok(DatabaseUrl::Postgres(url))
            }
            DatabaseUrl::Sqlite(_) => Err("a sqlite:// URL has no password".into()),
        }
    }

    /// The PostgreSQL password the URL holds, percent-decoded.
    pub fn password(&self) -> Option<String> {
        match self {
            DatabaseUrl::Postgres(url) => url.password().map(percent_decode),
            DatabaseUrl::Sqlite(_) => None,
        }
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Some(byte) = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.without_password())
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_engines_and_refuses_the_rest() {
        assert_eq!(DatabaseUrl::parse("sqlite:///var/lib/cw/state.db").unwrap(), DatabaseUrl::Sqlite("/var/lib/cw/state.db".into()));
        assert_eq!(DatabaseUrl::parse("sqlite:state.db").unwrap(), DatabaseUrl::Sqlite("state.db".into()));
        let pg = DatabaseUrl::parse("postgres://cw:s%40cret@db.internal:5432/cloudweb").unwrap();
        assert_eq!(pg.password().as_deref(), Some("s@cret"));
        assert_eq!(pg.to_string(), "postgres://cw@db.internal:5432/cloudweb");
        assert!(!format!("{pg:?}").contains("cret"));
        assert!(DatabaseUrl::parse("postgres:///cloudweb?host=/tmp/pg").is_ok());
        for bad in ["mysql://x/y", "postgres://host", "postgres://host/a/b", "postgres:///db", "sqlite://", "state.db"] {
            assert!(DatabaseUrl::parse(bad).is_err(), "{bad}");
        }
        let err = DatabaseUrl::parse("postgres://cw:hunter2@/a/b").unwrap_err();
        assert!(!err.contains("hunter2"), "{err}");
    }
}
