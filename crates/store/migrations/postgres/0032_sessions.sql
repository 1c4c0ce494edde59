-- PostgreSQL twin of ../sqlite/0032_sessions.sql: the same schema, in PostgreSQL's types.
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
    instance      BIGINT NOT NULL,
    container     TEXT NOT NULL,
    program       TEXT,
    port          BIGINT,
    tty           BIGINT NOT NULL,
    replica       TEXT NOT NULL,
    state         TEXT NOT NULL,
    exit_code     BIGINT,
    message       TEXT,
    bytes_in      BIGINT NOT NULL,
    bytes_out     BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    attached_at   BIGINT,
    ended_at      BIGINT
);
CREATE INDEX exec_sessions_by_subject ON exec_sessions (subject, name, created_at);
CREATE INDEX exec_sessions_unfinished ON exec_sessions (state);
