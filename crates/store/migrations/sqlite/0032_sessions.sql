-- Exec and port-forward sessions (issue 25): one row per session a user
-- opened into an app's instance or a managed service's container, kept as
-- its record (who, which instance, when, how long, how it ended).
--
-- `subject` is `app` or `service`, `name` the app's or the service's name
-- (a service's session has no deployment: `deployment_id` is empty and
-- `instance` 0).
-- `kind` is `exec` or `port-forward`; `program` is the exec's first
-- argument only (the rest of a command line may carry a secret the user
-- typed); `port` the forwarded port. `state` is `opening` (its
-- `session_open` command is queued on `node_id`), `open` (the node dialed
-- back), `ended` or `failed` (with `message`). `replica` is the agent URL
-- of the control plane that holds the user's side: a replica that starts
-- ends its own sessions left open.
CREATE TABLE exec_sessions (
    id            TEXT PRIMARY KEY,
    subject       TEXT NOT NULL,
    name          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    user_name     TEXT NOT NULL,
    node_id       TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    instance      INTEGER NOT NULL,
    container     TEXT NOT NULL,
    program       TEXT,
    port          INTEGER,
    tty           INTEGER NOT NULL,
    replica       TEXT NOT NULL,
    state         TEXT NOT NULL,
    exit_code     INTEGER,
    message       TEXT,
    bytes_in      INTEGER NOT NULL,
    bytes_out     INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    attached_at   INTEGER,
    ended_at      INTEGER
);
CREATE INDEX exec_sessions_by_subject ON exec_sessions (subject, name, created_at);
CREATE INDEX exec_sessions_unfinished ON exec_sessions (state);
