-- PostgreSQL twin of ../sqlite/0002_apps_deployments.sql: the same schema, in PostgreSQL's types.
-- Apps, their deployments, and the instances a deployment runs.

CREATE TABLE apps (
    name             TEXT PRIMARY KEY,
    repo_url         TEXT NOT NULL,
    branch           TEXT NOT NULL,
    port             BIGINT NOT NULL,
    domains          TEXT NOT NULL,
    build            TEXT,
    strategy         TEXT NOT NULL,
    instances        BIGINT NOT NULL,
    cpu              DOUBLE PRECISION,
    memory_bytes     BIGINT,
    health_path      TEXT NOT NULL,
    health_timeout_s BIGINT NOT NULL,
    -- AES-256-GCM sealed JSON objects (see server/src/secrets.rs).
    env_sealed       TEXT,
    git_credentials_sealed TEXT,
    created_at       BIGINT NOT NULL
);

CREATE TABLE deployments (
    id          TEXT PRIMARY KEY,
    seq         BIGINT NOT NULL,
    app         TEXT NOT NULL,
    kind        TEXT NOT NULL,
    commit_sha  TEXT,
    rollback_of TEXT,
    state       TEXT NOT NULL,
    image       TEXT,
    error       TEXT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX deployments_by_app ON deployments (app, seq);

CREATE TABLE instances (
    deployment_id TEXT NOT NULL,
    instance      BIGINT NOT NULL,
    node_id       TEXT,
    container     TEXT,
    state         TEXT NOT NULL,
    address       TEXT,
    -- When a replaced instance may be stopped (after the drain period).
    stop_after    BIGINT,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (deployment_id, instance)
);
CREATE INDEX instances_by_node ON instances (node_id, state);
