-- PostgreSQL twin of ../sqlite/0022_volume_moves.sql: the same schema, in PostgreSQL's types.
-- Volume moves (issue 22): one row per `volumes move`, from the request to
-- the end. `state` is `copying` (the agents copy; the volume is still on
-- `from_node`), `switched` (the volume is on `to_node`; its app is
-- starting there as `deployment_id`), `done` or `failed`. At most one move
-- of a volume is unfinished at a time. `source_copy` says what became of
-- the data left on `from_node`: `in-use` until the switch, `kept` once set
-- aside (until `keep_until`, or the user confirms), `purging` (its
-- deletion is queued on `from_node`), `purged`.
CREATE TABLE volume_moves (
    id              TEXT PRIMARY KEY,
    volume          TEXT NOT NULL,
    from_node       TEXT NOT NULL,
    to_node         TEXT NOT NULL,
    state           TEXT NOT NULL,
    reason          TEXT,
    grant_sealed    TEXT NOT NULL,
    port            BIGINT,
    files           BIGINT,
    bytes           BIGINT,
    sent_digest     TEXT,
    received_digest TEXT,
    stopped_at      BIGINT,
    switched_at     BIGINT,
    finished_at     BIGINT,
    deployment_id   TEXT,
    downtime_ms     BIGINT,
    source_copy     TEXT NOT NULL DEFAULT 'in-use',
    keep_until      BIGINT,
    created_at      BIGINT NOT NULL,
    deadline        BIGINT NOT NULL
);
CREATE UNIQUE INDEX volume_moves_one_unfinished ON volume_moves (volume) WHERE state IN ('copying', 'switched');
CREATE INDEX volume_moves_by_volume ON volume_moves (volume, created_at);
