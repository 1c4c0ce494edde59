-- PostgreSQL twin of ../sqlite/0006_hosts_joins_idempotency.sql: the same schema, in PostgreSQL's types.
-- Who owns each host name. A host (an app's default `<app>.<base domain>`
-- or one of its custom domains) belongs to at most one app; the primary
-- key makes a second claim fail even when two requests race. Default
-- hosts are (re)written at start from the current base domain.
CREATE TABLE app_hosts (
    host       TEXT PRIMARY KEY,
    app        TEXT NOT NULL,
    is_default BOOLEAN NOT NULL
);
CREATE INDEX app_hosts_by_app ON app_hosts (app);

-- Existing custom domains; where two apps already claimed the same one, the
-- older app keeps it (the others' claims are dropped here, and the API
-- refuses new ones).
INSERT INTO app_hosts (host, app, is_default)
SELECT lower(j.value), a.name, FALSE FROM apps a, json_array_elements_text(a.domains::json) AS j(value) ORDER BY a.created_at, a.name
ON CONFLICT (host) DO NOTHING;

-- A join answer that was lost can be asked for again with the same token
-- and the same CSR: the node's certificate is kept with the spent token.
ALTER TABLE join_tokens ADD COLUMN csr_sha256 TEXT;
ALTER TABLE join_tokens ADD COLUMN certificate TEXT;

-- Answers to deploy and rollback requests that carried an Idempotency-Key,
-- replayed when the same key comes again (kept 24 hours).
CREATE TABLE idempotency_keys (
    key            TEXT PRIMARY KEY,
    request_sha256 TEXT NOT NULL,
    status         BIGINT,
    response       TEXT,
    created_at     BIGINT NOT NULL
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);

-- Traffic samples are folded like the usage history: 30 s rows for a day,
-- then 5-minute sums kept for 30 days.
ALTER TABLE traffic_samples ADD COLUMN resolution BIGINT NOT NULL DEFAULT 30;
CREATE INDEX traffic_by_age ON traffic_samples (resolution, at);
CREATE INDEX deployment_reports_by_deployment ON deployment_reports (deployment_id);
CREATE INDEX commands_acked ON commands (acked_at);
