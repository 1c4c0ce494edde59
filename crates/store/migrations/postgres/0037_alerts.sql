-- PostgreSQL twin of ../sqlite/0037_alerts.sql: the same schema.
-- Alerts (issue 26). `alerts`: one row per occurrence of a condition the
-- control plane watches (a deployment failed, an instance crash-loops, a
-- node is unreachable), open while it holds (`resolved_at` NULL) and
-- resolved when it is over. `dedupe_key` (`<kind>:<subject>`) is open at
-- most once, so one outage is one alert however often it is seen.
-- `alert_cursor`: where the alert evaluator is in the tables it follows
-- (the deployment events' `seq`), so a restart neither repeats nor skips.
CREATE TABLE alerts (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    subject      TEXT NOT NULL,
    dedupe_key   TEXT NOT NULL,
    severity     TEXT NOT NULL,
    summary      TEXT NOT NULL,
    detail       TEXT,
    opened_at    BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    resolved_at  BIGINT,
    occurrences  BIGINT NOT NULL DEFAULT 1,
    -- Set in the transaction that queues the deliveries of the alert's
    -- opening / resolution to every channel (an outbox flag).
    opened_sent   BIGINT NOT NULL DEFAULT 0,
    resolved_sent BIGINT NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX alerts_open_once ON alerts (dedupe_key) WHERE resolved_at IS NULL;
CREATE INDEX alerts_by_time ON alerts (opened_at);
CREATE TABLE alert_cursor (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);

CREATE INDEX alerts_unsent ON alerts (opened_sent, resolved_sent);
-- Where alerts go. `owner`: '' for the cluster's channels, else the user
-- id of the person whose channel it is. `kind`: webhook, slack or email.
-- `target`: what may be shown (a URL's scheme and host, the addresses);
-- `config_sealed`: the whole configuration (URL with its token, signing
-- secret, SMTP password), sealed with the cluster's key. `events`: JSON
-- list of the alert kinds it wants.
CREATE TABLE alert_channels (
    id            TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    name          TEXT NOT NULL,
    kind          TEXT NOT NULL,
    target        TEXT NOT NULL,
    config_sealed TEXT NOT NULL,
    events        TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    UNIQUE (owner, name)
);
-- One message to one channel: queued durably, tried until delivered or
-- given up (`failed`) after its deadline. `event`: opened, resolved or
-- test. `payload`: the message as JSON, fixed when it was queued.
CREATE TABLE alert_deliveries (
    id              TEXT PRIMARY KEY,
    channel_id      TEXT NOT NULL,
    alert_id        TEXT,
    event           TEXT NOT NULL,
    payload         TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    give_up_at      BIGINT NOT NULL,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    finished_at     BIGINT
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (state, next_attempt_at);
CREATE INDEX alert_deliveries_of_channel ON alert_deliveries (channel_id, created_at);
-- Every try of a delivery, for the settings page: when, how long, and
-- the answer (an HTTP status, the SMTP reply) or the error.
CREATE TABLE alert_delivery_attempts (
    delivery_id TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    ok          BIGINT NOT NULL,
    outcome     TEXT NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
