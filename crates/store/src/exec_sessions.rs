//! The record of exec and port-forward sessions (`exec_sessions`): one row
//! per session, written with its `session_open` command in one
//! transaction, attached once by its node, ended once.

use crate::backend::Cols;

use super::commands::CommandsTx;
use super::{NewCommand, Store, StoreError};

/// Ended sessions an app or a service keeps in its record (the newest).
pub const KEEP_PER_APP: i64 = 500;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecSessionRow {
    pub id: String,
    /// `app` or `service`.
    pub subject: String,
    /// The app's or the service's name.
    pub name: String,
    /// `exec` or `port-forward`.
    pub kind: String,
    /// Who opened it: a user's name, or `admin` for the admin token.
    pub user_name: String,
    pub node_id: String,
    pub deployment_id: String,
    pub instance: i64,
    pub container: String,
    /// An exec's program (its first argument only).
    pub program: Option<String>,
    /// A port-forward's port in the container.
    pub port: Option<i64>,
    pub tty: bool,
    /// The agent URL of the replica holding the user's side.
    pub replica: String,
    /// `opening`, `open`, `ended` or `failed`.
    pub state: String,
    pub exit_code: Option<i64>,
    pub message: Option<String>,
    /// Bytes from the user to the container, and back.
    pub bytes_in: i64,
    pub bytes_out: i64,
    pub created_at: i64,
    pub attached_at: Option<i64>,
    pub ended_at: Option<i64>,
}

const COLUMNS: &str = "id, subject, name, kind, user_name, node_id, deployment_id, instance, container, program, port, tty, replica, state, exit_code, \
     message, bytes_in, bytes_out, created_at, attached_at, ended_at";

fn from_row(row: &impl Cols) -> ExecSessionRow {
    ExecSessionRow {
        id: row.col("id"),
        subject: row.col("subject"),
        name: row.col("name"),
        kind: row.col("kind"),
        user_name: row.col("user_name"),
        node_id: row.col("node_id"),
        deployment_id: row.col("deployment_id"),
        instance: row.col("instance"),
        container: row.col("container"),
        program: row.col("program"),
        port: row.col("port"),
        tty: row.col::<i64>("tty") != 0,
        replica: row.col("replica"),
        state: row.col("state"),
        exit_code: row.col("exit_code"),
        message: row.col("message"),
        bytes_in: row.col("bytes_in"),
        bytes_out: row.col("bytes_out"),
        created_at: row.col("created_at"),
        attached_at: row.col("attached_at"),
        ended_at: row.col("ended_at"),
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEnd<'a> {
    /// `ended` or `failed`.
    pub state: &'a str,
    pub exit_code: Option<i64>,
    pub message: Option<&'a str>,
    pub bytes_in: i64,
    pub bytes_out: i64,
}

impl Store {
    /// Records a session and queues its `session_open` command in one
    /// transaction, and drops the app's oldest ended sessions beyond
    /// [`KEEP_PER_APP`].
    pub async fn insert_exec_session(&self, row: &ExecSessionRow, command: &NewCommand, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query(&format!(
                "INSERT INTO exec_sessions ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)"
            ))
            .bind(&row.id)
            .bind(&row.subject)
            .bind(&row.name)
            .bind(&row.kind)
            .bind(&row.user_name)
            .bind(&row.node_id)
            .bind(&row.deployment_id)
            .bind(row.instance)
            .bind(&row.container)
            .bind(&row.program)
            .bind(row.port)
            .bind(i64::from(row.tty))
            .bind(&row.replica)
            .bind(&row.state)
            .bind(row.exit_code)
            .bind(&row.message)
            .bind(row.bytes_in)
            .bind(row.bytes_out)
            .bind(row.created_at)
            .bind(row.attached_at)
            .bind(row.ended_at)
            .execute(&mut *tx)
            .await?;
            tx.insert_command(command, now_ms).await?;
            sqlx::query(
                "DELETE FROM exec_sessions WHERE subject = $1 AND name = $2 AND state IN ('ended', 'failed') AND id NOT IN \
                 (SELECT id FROM exec_sessions WHERE subject = $1 AND name = $2 ORDER BY created_at DESC, id DESC LIMIT $3)",
            )
            .bind(&row.subject)
            .bind(&row.name)
            .bind(KEEP_PER_APP)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// The node `node_id` dialed back for an opening session; false when
    /// the session is not opening on that node (another node, attached
    /// already, or ended).
    pub async fn attach_exec_session(&self, id: &str, node_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE exec_sessions SET state = 'open', attached_at = $1 WHERE id = $2 AND node_id = $3 AND state = 'opening'")
                .bind(now_ms)
                .bind(id)
                .bind(node_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Ends an unfinished session; false when it had ended already.
    pub async fn end_exec_session(&self, id: &str, end: &SessionEnd<'_>, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query(
                "UPDATE exec_sessions SET state = $1, exit_code = $2, message = $3, bytes_in = $4, bytes_out = $5, ended_at = $6 \
                 WHERE id = $7 AND state IN ('opening', 'open')",
            )
            .bind(end.state)
            .bind(end.exit_code)
            .bind(end.message)
            .bind(end.bytes_in)
            .bind(end.bytes_out)
            .bind(now_ms)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Ends the sessions a replica (by its agent URL) left unfinished: it
    /// restarted, so nobody holds their user side any more.
    pub async fn end_exec_sessions_of_replica(&self, replica: &str, message: &str, now_ms: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE exec_sessions SET state = 'failed', message = $1, ended_at = $2 WHERE replica = $3 AND state IN ('opening', 'open')")
                .bind(message)
                .bind(now_ms)
                .bind(replica)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(result.rows_affected())
        })
    }

    pub async fn exec_session(&self, id: &str) -> Result<Option<ExecSessionRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {COLUMNS} FROM exec_sessions WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.as_ref().map(from_row))
        })
    }

    /// An app's or a service's sessions (`subject` `app` or `service`),
    /// newest first.
    pub async fn exec_sessions_of(&self, subject: &str, name: &str, limit: i64) -> Result<Vec<ExecSessionRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM exec_sessions WHERE subject = $1 AND name = $2 ORDER BY created_at DESC, id DESC LIMIT $3"))
                .bind(subject)
                .bind(name)
                .bind(limit)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(from_row).collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> ExecSessionRow {
        ExecSessionRow {
            id: id.into(),
            subject: "app".into(),
            name: "web".into(),
            kind: "exec".into(),
            user_name: "ana".into(),
            node_id: "n1".into(),
            deployment_id: "d1".into(),
            instance: 1,
            container: "c".into(),
            program: Some("sh".into()),
            tty: true,
            replica: "https://cp1".into(),
            state: "opening".into(),
            created_at: 10,
            ..Default::default()
        }
    }

    crate::test_engines::both_engines! {
        async fn a_session_is_attached_once_by_its_node_and_ended_once(store) {
            let command = NewCommand { node_id: "n1".into(), kind: "session_open".into(), payload: "{}".into() };
            store.insert_exec_session(&row("xs_1"), &command, 10).await.unwrap();
            assert_eq!(store.pending_commands("n1").await.unwrap().len(), 1, "the command is queued with the record");
            assert!(!store.attach_exec_session("xs_1", "n2", 11).await.unwrap(), "another node cannot attach");
            assert!(store.attach_exec_session("xs_1", "n1", 11).await.unwrap());
            assert!(!store.attach_exec_session("xs_1", "n1", 12).await.unwrap(), "attached once");
            let end = SessionEnd { state: "ended", exit_code: Some(3), message: None, bytes_in: 5, bytes_out: 7 };
            assert!(store.end_exec_session("xs_1", &end, 20).await.unwrap());
            assert!(!store.end_exec_session("xs_1", &end, 21).await.unwrap(), "ended once");
            let got = store.exec_session("xs_1").await.unwrap().unwrap();
            assert_eq!((got.state.as_str(), got.exit_code, got.attached_at, got.ended_at, got.bytes_out), ("ended", Some(3), Some(11), Some(20), 7));
            // A restarted replica ends what it left open.
            let mut second = row("xs_2");
            second.created_at = 30;
            store.insert_exec_session(&second, &command, 30).await.unwrap();
            assert_eq!(store.end_exec_sessions_of_replica("https://cp1", "restarted", 40).await.unwrap(), 1);
            let states: Vec<String> = store.exec_sessions_of("app", "web", 10).await.unwrap().into_iter().map(|s| s.state).collect();
            assert_eq!(states, ["failed", "ended"]);
        }
    }
}
