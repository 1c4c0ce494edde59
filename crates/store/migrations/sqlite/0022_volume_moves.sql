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
    port            INTEGER,
    files           INTEGER,
    bytes           INTEGER,
    sent_digest     TEXT,
    received_digest TEXT,
    stopped_at      INTEGER,
    switched_at     INTEGER,
    finished_at     INTEGER,
    deployment_id   TEXT,
    downtime_ms     INTEGER,
    source_copy     TEXT NOT NULL DEFAULT 'in-use',
    keep_until      INTEGER,
    created_at      INTEGER NOT NULL,
    deadline        INTEGER NOT NULL
);
CREATE UNIQUE INDEX volume_moves_one_unfinished ON volume_moves (volume) WHERE state IN ('copying', 'switched');
CREATE INDEX volume_moves_by_volume ON volume_moves (volume, created_at);
