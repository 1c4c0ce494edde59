-- The runtime-log store on SQLite (issue 26): its own file, `logs.db`
-- beside the state database, so that a chatty app's lines never wait on
-- (or hold up) a state write, never grow the state's backups, and can be
-- bounded on their own. On PostgreSQL the same tables live in the state
-- database (../postgres/0036_runtime_logs.sql).
--
-- `runtime_log_sources`: the containers lines came from (one row per app,
-- container, deployment, node and instance), so a line stores a number.
-- `runtime_logs`: one row per line; `ts_ns` the Engine's timestamp in
-- nanoseconds since the epoch, `seq` the number the control plane gave
-- the line (the live stream's event id), `bytes` what the line costs
-- against its app's bound. `runtime_logs_fts` indexes the words of every
-- line (FTS5, kept by the triggers). `runtime_log_usage`: per app, what is
-- held and how many lines went (pruned by age or size) or never came
-- (dropped at the rate limit or when the store fell behind).
CREATE TABLE runtime_log_sources (
    id            INTEGER PRIMARY KEY,
    app           TEXT NOT NULL,
    container     TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    node_id       TEXT NOT NULL,
    instance      INTEGER NOT NULL,
    UNIQUE (app, container, deployment_id, node_id, instance)
);
CREATE TABLE runtime_logs (
    id     INTEGER PRIMARY KEY,
    app    TEXT NOT NULL,
    source INTEGER NOT NULL,
    ts_ns  INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    stream TEXT NOT NULL,
    line   TEXT NOT NULL,
    bytes  INTEGER NOT NULL
);
CREATE INDEX runtime_logs_by_time ON runtime_logs (app, ts_ns);
CREATE INDEX runtime_logs_by_seq ON runtime_logs (app, seq);
CREATE VIRTUAL TABLE runtime_logs_fts USING fts5(line, content = 'runtime_logs', content_rowid = 'id', tokenize = 'unicode61');
CREATE TRIGGER runtime_logs_words_in AFTER INSERT ON runtime_logs BEGIN
    INSERT INTO runtime_logs_fts (rowid, line) VALUES (new.id, new.line);
END;
CREATE TRIGGER runtime_logs_words_out AFTER DELETE ON runtime_logs BEGIN
    INSERT INTO runtime_logs_fts (runtime_logs_fts, rowid, line) VALUES ('delete', old.id, old.line);
END;
CREATE TABLE runtime_log_usage (
    app     TEXT PRIMARY KEY,
    lines   INTEGER NOT NULL DEFAULT 0,
    bytes   INTEGER NOT NULL DEFAULT 0,
    pruned  INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0
);
