-- Tasks (issue 25): a command run to its end in a one-off container of an
-- app's running image, with the app's environment.
--
-- A scheduled job runs at the ticks of its cron `schedule`, read in
-- `timezone`. `next_run_at` (ms) is the next tick, NULL while suspended;
-- the leader moves it on in the same transaction that records the tick's
-- run, and only from the value it read, so a tick runs once however many
-- replicas or restarts see it. `command` is a JSON array of arguments.
CREATE TABLE cron_jobs (
    app                 TEXT NOT NULL,
    name                TEXT NOT NULL,
    schedule            TEXT NOT NULL,
    timezone            TEXT NOT NULL,
    command             TEXT NOT NULL,
    timeout_s           INTEGER NOT NULL,
    concurrency         TEXT NOT NULL,
    retry_lost          INTEGER NOT NULL,
    starting_deadline_s INTEGER NOT NULL,
    suspended           INTEGER NOT NULL,
    next_run_at         INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    PRIMARY KEY (app, name)
);
CREATE INDEX cron_jobs_due ON cron_jobs (next_run_at);

-- One row per run: a job's tick (`scheduled_for`), a `cron run`, a one-off
-- run (`job` NULL) or a retry after a lost node. `state` is `queued` (its
-- command is queued on `node_id`), `running`, `succeeded`, `failed`,
-- `timed_out`, `cancelled`, `lost` or `skipped`; `deadline` (ms) is when
-- the control plane gives up waiting for its node.
CREATE TABLE task_runs (
    id            TEXT PRIMARY KEY,
    app           TEXT NOT NULL,
    job           TEXT,
    trigger       TEXT NOT NULL,
    scheduled_for INTEGER,
    state         TEXT NOT NULL,
    exit_code     INTEGER,
    message       TEXT,
    command       TEXT NOT NULL,
    node_id       TEXT,
    image         TEXT,
    deployment_id TEXT,
    attempt       INTEGER NOT NULL,
    timeout_s     INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    started_at    INTEGER,
    finished_at   INTEGER,
    deadline      INTEGER NOT NULL
);
CREATE INDEX task_runs_by_app ON task_runs (app, job, created_at);
CREATE INDEX task_runs_unfinished ON task_runs (state);
-- A tick is recorded once (its retry is another attempt).
CREATE UNIQUE INDEX task_runs_one_per_tick ON task_runs (app, job, scheduled_for, attempt);

-- A run's output lines as its node numbered them (from 1); the last 2,000
-- of a run are kept.
CREATE TABLE task_run_lines (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    at     TEXT NOT NULL,
    stderr INTEGER NOT NULL,
    line   TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
