-- Per-host HTTP traffic reported by ingress nodes, one row per host per
-- node per usage sample (about every 30 s).

CREATE TABLE traffic_samples (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    node_id    TEXT NOT NULL,
    host       TEXT NOT NULL,
    at         BIGINT NOT NULL,
    requests   BIGINT NOT NULL,
    r2xx       BIGINT NOT NULL,
    r3xx       BIGINT NOT NULL,
    r4xx       BIGINT NOT NULL,
    r5xx       BIGINT NOT NULL,
    dur_sum_ms DOUBLE PRECISION NOT NULL,
    slow       BIGINT NOT NULL
);
CREATE INDEX traffic_by_host ON traffic_samples (host, at);

-- A replaced instance stops only once every ready ingress node serves a
-- route table without it (this version or newer).
ALTER TABLE instances ADD COLUMN stop_after_routes BIGINT;
