-- PostgreSQL twin of ../sqlite/0005_usage.sql: the same schema, in PostgreSQL's types.
-- Usage history for the monitoring view: node and per-app samples at 30 s
-- resolution for a day, then averaged into 5-minute rows kept for 30 days.

CREATE TABLE node_usage (
    node_id    TEXT NOT NULL,
    at         BIGINT NOT NULL,
    resolution BIGINT NOT NULL,
    cpu_pct    DOUBLE PRECISION,
    mem_used   BIGINT,
    disk_used  BIGINT
);
CREATE INDEX node_usage_by_node ON node_usage (node_id, resolution, at);

CREATE TABLE app_usage (
    app        TEXT NOT NULL,
    node_id    TEXT NOT NULL,
    at         BIGINT NOT NULL,
    resolution BIGINT NOT NULL,
    cpu_cores  DOUBLE PRECISION,
    mem_bytes  BIGINT
);
CREATE INDEX app_usage_by_app ON app_usage (app, resolution, at);
