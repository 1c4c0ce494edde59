-- PostgreSQL twin of ../sqlite/0024_backups.sql: the same schema, in PostgreSQL's types.
-- Backups (issue 23).
--
-- A destination is where restic repositories live: `<base_url>/data` for
-- volumes and services, `<base_url>/control-plane` for the control plane's
-- own state; both are opened with the destination's password (the
-- recovery key, shown once when the destination is added), kept sealed
-- like the S3 secret. Removing a destination forgets these settings only:
-- nothing at the destination is deleted.
CREATE TABLE backup_destinations (
    name            TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    base_url        TEXT NOT NULL,
    region          TEXT,
    access_key_id   TEXT,
    secret_sealed   TEXT,
    password_sealed TEXT NOT NULL,
    keep_daily      BIGINT NOT NULL,
    keep_weekly     BIGINT NOT NULL,
    keep_monthly    BIGINT NOT NULL,
    created_at      BIGINT NOT NULL
);

-- A target's own settings; a target without a row (every service, every
-- volume not holding a service's data) is backed up with the defaults once
-- a destination exists. `target` is `service/<name>` or `volume/<name>`.
-- NULL columns take the default (the oldest destination; daily at a
-- minute of a night hour derived from the target's name; verification
-- weekly).
CREATE TABLE backup_plans (
    target          TEXT PRIMARY KEY,
    destination     TEXT,
    schedule        TEXT,
    verify_schedule TEXT,
    pause           BIGINT NOT NULL DEFAULT 0,
    enabled         BIGINT NOT NULL DEFAULT 1,
    updated_at      BIGINT NOT NULL
);

-- One row per job: a backup, a verification (of a backup: `of_job`), or a
-- restore (of a backup). `state` is `queued` (its command is queued),
-- `running`, `succeeded`, `failed` or `cancelled`. A backup's row also
-- carries the outcome of its newest verification (`verify_*`). A restore
-- into the same target keeps the data it replaced as the volume
-- `kept_volume` until `keep_until` or a confirmation (`kept_state`:
-- `kept`, `purging`, `purged`).
CREATE TABLE backup_jobs (
    id              TEXT PRIMARY KEY,
    kind            TEXT NOT NULL,
    target          TEXT NOT NULL,
    destination     TEXT NOT NULL,
    node_id         TEXT NOT NULL,
    state           TEXT NOT NULL,
    trigger         TEXT NOT NULL,
    attempt         BIGINT NOT NULL DEFAULT 1,
    of_job          TEXT,
    snapshot        TEXT,
    files           BIGINT,
    bytes           BIGINT,
    added_bytes     BIGINT,
    duration_ms     BIGINT,
    counts          TEXT,
    detail          TEXT,
    message         TEXT,
    pruned          BIGINT,
    verify_state    TEXT,
    verify_job      TEXT,
    verified_at     BIGINT,
    verify_detail   TEXT,
    restore_to      TEXT,
    kept_volume     TEXT,
    kept_state      TEXT,
    keep_until      BIGINT,
    created_at      BIGINT NOT NULL,
    started_at      BIGINT,
    finished_at     BIGINT,
    deadline        BIGINT NOT NULL
);
CREATE INDEX backup_jobs_by_target ON backup_jobs (target, kind, created_at);
CREATE UNIQUE INDEX backup_jobs_one_unfinished ON backup_jobs (target, kind) WHERE state IN ('queued', 'running');
