//! Copying a whole state from one store into another (`cloudweb-server
//! migrate-state`, SQLite to PostgreSQL), verified table by table: the
//! same number of rows, and the same checksum over every row's values.
//!
//! Both stores are at the same migration (each was migrated when it was
//! opened), so they have the same tables and columns. The target must be
//! empty; the copy is one transaction on it, so a failure leaves it empty.

use sha2::{Digest, Sha256};
use sqlx::{Column, Row, TypeInfo};

use super::{Store, StoreError};
use crate::backend::{Db, WritePool};

/// What was copied of one table, and how it was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCopy {
    pub table: String,
    pub rows: u64,
    /// SHA-256 (hex) over the sorted digests of the rows' values, the same
    /// on both sides.
    pub checksum: String,
}

/// One value of a row, in the few types the state uses.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Real(f64),
    Bool(bool),
    Text(String),
}

impl Value {
    /// The bytes a row's digest is made of: the type and the value, so
    /// `1`, `'1'` and `TRUE` differ. Booleans are their integers, as SQLite
    /// stores them.
    fn digest_into(&self, hasher: &mut Sha256) {
        match self {
            Value::Null => hasher.update(b"n;"),
            Value::Int(n) => hasher.update(format!("i{n};")),
            Value::Bool(b) => hasher.update(format!("i{};", i64::from(*b))),
            Value::Real(x) => hasher.update(format!("r{:016x};", x.to_bits())),
            Value::Text(t) => {
                hasher.update(format!("t{}:", t.len()));
                hasher.update(t.as_bytes());
            }
        }
    }
}

/// Rows a migration writes into a new database, by table: the condition
/// (` WHERE NOT …`) that leaves them out of the "is it empty" count.
const SEEDED: &[(&str, &str)] = &[("teams", " WHERE NOT (id = 'team_default')")];

/// The tables to copy, parents before children (by their foreign keys).
async fn tables(source: &sqlx::SqlitePool) -> Result<Vec<(String, Vec<String>)>, StoreError> {
    let names: Vec<String> = sqlx::query(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations' ORDER BY name",
    )
    .fetch_all(source)
    .await?
    .iter()
    .map(|row| row.get("name"))
    .collect();
    let mut parents: Vec<(String, Vec<String>)> = Vec::new();
    for name in &names {
        let refs: Vec<String> = sqlx::query(&format!("SELECT \"table\" AS parent FROM pragma_foreign_key_list('{name}')"))
            .fetch_all(source)
            .await?
            .iter()
            .map(|row| row.get::<String, _>("parent"))
            .filter(|parent| parent != name)
            .collect();
        parents.push((name.clone(), refs));
    }
    let mut ordered: Vec<String> = Vec::new();
    while ordered.len() < parents.len() {
        let before = ordered.len();
        for (name, refs) in &parents {
            if !ordered.contains(name) && refs.iter().all(|r| ordered.contains(r)) {
                ordered.push(name.clone());
            }
        }
        if ordered.len() == before {
            return Err(StoreError::Invariant("the tables' foreign keys form a cycle".into()));
        }
    }
    let mut out = Vec::new();
    for name in ordered {
        let columns: Vec<String> = sqlx::query(&format!("SELECT name FROM pragma_table_info('{name}') ORDER BY cid"))
            .fetch_all(source)
            .await?
            .iter()
            .map(|row| row.get("name"))
            .collect();
        out.push((name, columns));
    }
    Ok(out)
}

fn sqlite_value(row: &sqlx::sqlite::SqliteRow, index: usize) -> Result<Value, StoreError> {
    use sqlx::ValueRef;
    let raw = row.try_get_raw(index)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    // SQLite stores a BOOLEAN as an integer; its declared type says so.
    if row.column(index).type_info().name().eq_ignore_ascii_case("BOOLEAN") {
        return Ok(Value::Bool(row.try_get(index)?));
    }
    // Otherwise the value's own storage class.
    let kind = raw.type_info().name().to_ascii_uppercase();
    Ok(match kind.as_str() {
        "INTEGER" | "BIGINT" | "INT8" | "INT" | "BOOLEAN" => Value::Int(row.try_get(index)?),
        "REAL" | "DOUBLE" | "DOUBLE PRECISION" | "FLOAT" => Value::Real(row.try_get(index)?),
        "TEXT" => Value::Text(row.try_get(index)?),
        other => return Err(StoreError::Invariant(format!("column {} holds a {other}, which the state never stores", row.column(index).name()))),
    })
}

fn postgres_value(row: &sqlx::postgres::PgRow, index: usize) -> Result<Value, StoreError> {
    use sqlx::ValueRef;
    let raw = row.try_get_raw(index)?;
    if raw.is_null() {
        return Ok(Value::Null);
    }
    let kind = row.column(index).type_info().name().to_ascii_uppercase();
    Ok(match kind.as_str() {
        "INT8" => Value::Int(row.try_get(index)?),
        "BOOL" => Value::Bool(row.try_get(index)?),
        "FLOAT8" => Value::Real(row.try_get(index)?),
        "TEXT" => Value::Text(row.try_get(index)?),
        other => return Err(StoreError::Invariant(format!("column {} is a {other}, which the migrations never make", row.column(index).name()))),
    })
}

/// The checksum of a table: its rows' digests sorted (so neither engine's
/// order nor its collation matters), then hashed together.
fn checksum(mut digests: Vec<[u8; 32]>) -> String {
    digests.sort_unstable();
    let mut all = Sha256::new();
    for digest in &digests {
        all.update(digest);
    }
    all.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn row_digest(values: &[Value]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for value in values {
        value.digest_into(&mut hasher);
    }
    hasher.finalize().into()
}

impl Store {
    /// Copies every row of this SQLite store into `target`, a PostgreSQL
    /// store with no rows, in one transaction, then checks each table on
    /// both sides. Nothing of the source changes.
    pub async fn copy_into(&self, target: &Store) -> Result<Vec<TableCopy>, StoreError> {
        let Db::Sqlite(source) = &self.db else { return Err(StoreError::Unsupported("copying from a PostgreSQL state")) };
        let Db::Postgres(pg) = &target.db else { return Err(StoreError::Unsupported("copying into a SQLite state")) };
        let tables = tables(source).await?;
        let mut tx = pg.begin_write().await?;
        for (table, _) in &tables {
            // Rows the migrations themselves wrote (the default team) do not
            // count: the source has them too, and they are copied over.
            let seeded = SEEDED.iter().find(|(t, _)| t == table).map_or("", |(_, except)| *except);
            let n: i64 = sqlx::query(&format!("SELECT COUNT(*) AS n FROM \"{table}\"{seeded}")).fetch_one(&mut *tx).await?.get("n");
            if n > 0 {
                return Err(StoreError::Invariant(format!(
                    "the target database is not empty ({table} holds {n} rows): copy into a new database"
                )));
            }
        }
        for (table, except) in SEEDED {
            let only_seeds = except.replacen(" WHERE NOT ", " WHERE ", 1);
            sqlx::query(&format!("DELETE FROM \"{table}\"{only_seeds}")).execute(&mut *tx).await?;
        }
        // One read transaction on the source: every table as of one moment.
        let mut snapshot = source.begin().await?;
        let mut copies = Vec::new();
        for (table, columns) in &tables {
            let types: Vec<String> = {
                let rows = sqlx::query(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1",
                )
                .bind(table)
                .fetch_all(&mut *tx)
                .await?;
                let mut types = Vec::with_capacity(columns.len());
                for column in columns {
                    let found = rows.iter().find(|r| r.get::<String, _>("column_name") == *column);
                    let Some(found) = found else {
                        return Err(StoreError::Invariant(format!("the target has no column {table}.{column}: is it at the same version?")));
                    };
                    types.push(found.get::<String, _>("data_type"));
                }
                types
            };
            let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
            let placeholders = (1..=columns.len()).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
            let insert = format!("INSERT INTO \"{table}\" ({list}) VALUES ({placeholders})");
            let rows = sqlx::query(&format!("SELECT {list} FROM \"{table}\"")).fetch_all(&mut *snapshot).await?;
            let mut digests = Vec::with_capacity(rows.len());
            for row in &rows {
                let values = (0..columns.len()).map(|i| sqlite_value(row, i)).collect::<Result<Vec<_>, _>>()?;
                digests.push(row_digest(&values));
                let mut query = sqlx::query(&insert);
                for (value, kind) in values.into_iter().zip(&types) {
                    // Bound in the target column's own type (a NULL too:
                    // PostgreSQL does not turn a text parameter into a
                    // number).
                    query = match (kind.as_str(), value) {
                        ("boolean", Value::Null) => query.bind(None::<bool>),
                        ("boolean", Value::Int(n)) => query.bind(n != 0),
                        ("bigint", Value::Null) => query.bind(None::<i64>),
                        ("double precision", Value::Null) => query.bind(None::<f64>),
                        ("double precision", Value::Int(n)) => query.bind(n as f64),
                        (_, Value::Null) => query.bind(None::<String>),
                        (_, Value::Int(n)) => query.bind(n),
                        (_, Value::Real(x)) => query.bind(x),
                        (_, Value::Bool(b)) => query.bind(b),
                        (_, Value::Text(t)) => query.bind(t),
                    };
                }
                query.execute(&mut *tx).await.map_err(|err| StoreError::Invariant(format!("copying a row of {table}: {err}")))?;
            }
            copies.push(TableCopy { table: table.clone(), rows: rows.len() as u64, checksum: checksum(digests) });
        }
        // Identity columns go on after the highest value copied.
        let identities = sqlx::query(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = current_schema() AND is_identity = 'YES'",
        )
        .fetch_all(&mut *tx)
        .await?;
        for identity in &identities {
            let (table, column): (String, String) = (identity.get("table_name"), identity.get("column_name"));
            sqlx::query(&format!(
                "SELECT setval(pg_get_serial_sequence('\"{table}\"', '{column}'), COALESCE(MAX(\"{column}\"), 0) + 1, false) FROM \"{table}\""
            ))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        snapshot.rollback().await?;
        self.count_commit().await;

        // Read back from the target and compare, table by table.
        for copy in &copies {
            let columns = &tables.iter().find(|(t, _)| *t == copy.table).expect("copied from this list").1;
            let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
            let rows = sqlx::query(&format!("SELECT {list} FROM \"{}\"", copy.table)).fetch_all(pg).await?;
            let mut digests = Vec::with_capacity(rows.len());
            for row in &rows {
                let values = (0..columns.len()).map(|i| postgres_value(row, i)).collect::<Result<Vec<_>, _>>()?;
                digests.push(row_digest(&values));
            }
            let (rows, sum) = (rows.len() as u64, checksum(digests));
            if rows != copy.rows || sum != copy.checksum {
                return Err(StoreError::Invariant(format!(
                    "{} differs after the copy: {} rows with checksum {} in the source, {rows} with {sum} in the target",
                    copy.table, copy.rows, copy.checksum
                )));
            }
        }
        Ok(copies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_engines::{open, Arg};
    use crate::{Engine, NewCommand};

    #[tokio::test]
    async fn a_sqlite_state_is_copied_into_postgresql_row_for_row_and_only_into_an_empty_one() {
        let source = open(Engine::Sqlite).await;
        source.insert_admin_token("digest-1", 1).await.unwrap();
        source
            .test_execute(
                "INSERT INTO nodes (id, name, hostname, ingress, mesh_index, cert_sha256, joined_at, cpu_cores) VALUES ($1, $1, 'h', TRUE, $2, 'c', 5, NULL)",
                &[Arg::Text("n_a"), Arg::Int(1)],
            )
            .await;
        source
            .test_execute(
                "INSERT INTO nodes (id, name, hostname, ingress, mesh_index, cert_sha256, joined_at, cpu_cores, health_json) VALUES ($1, $1, 'h', FALSE, $2, 'c', 6, 4, 'ünïcode ✓')",
                &[Arg::Text("n_b"), Arg::Int(2)],
            )
            .await;
        for n in 0..3 {
            source.enqueue_command(&NewCommand { node_id: "n_a".into(), kind: "deploy".into(), payload: format!("p{n}") }, 10 + n).await.unwrap();
        }
        let target = open(Engine::Postgres).await;
        let copies = source.copy_into(&target).await.unwrap();
        let rows = |table: &str| copies.iter().find(|c| c.table == table).map(|c| c.rows);
        assert_eq!((rows("nodes"), rows("commands"), rows("admin_tokens")), (Some(2), Some(3), Some(1)), "{copies:?}");
        // Parents come before the tables that point at them.
        let position = |table: &str| copies.iter().position(|c| c.table == table).unwrap();
        assert!(position("users") < position("sessions"));
        assert_eq!(target.admin_token_digests().await.unwrap(), vec!["digest-1".to_string()]);
        let nodes = target.test_pairs("SELECT id, CAST(ingress AS TEXT) FROM nodes ORDER BY id").await;
        assert_eq!(nodes, vec![("n_a".into(), "true".into()), ("n_b".into(), "false".into())]);
        // The identity goes on after the copied commands.
        let next = target.enqueue_command(&NewCommand { node_id: "n_a".into(), kind: "deploy".into(), payload: "p".into() }, 20).await.unwrap();
        assert_eq!(next.seq, 4);

        // Into a database that holds rows: refused, nothing written.
        let err = source.copy_into(&target).await.unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        assert_eq!(target.test_pairs("SELECT id, name FROM nodes").await.len(), 2);
        // Only from SQLite into PostgreSQL.
        assert!(matches!(target.copy_into(&source).await, Err(StoreError::Unsupported(_))));
    }
}
