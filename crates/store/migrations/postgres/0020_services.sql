-- PostgreSQL twin of ../sqlite/0020_services.sql: the same schema, in PostgreSQL's types.
-- Managed services (issue 22): PostgreSQL, Redis/Valkey and MariaDB, each
-- one container with its data on a volume (`volumes.service`), its
-- credentials sealed like an app's environment, and the apps it is linked
-- to (which get its connection settings at their next deploy).
CREATE TABLE services (
    name         TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    version      TEXT,
    image        TEXT NOT NULL,
    node_id      TEXT NOT NULL,
    host_port    BIGINT NOT NULL,
    memory_bytes BIGINT,
    volume       TEXT NOT NULL,
    secret_sealed TEXT NOT NULL,
    generation   BIGINT NOT NULL DEFAULT 1,
    created_at   BIGINT NOT NULL
);
CREATE UNIQUE INDEX services_by_node_port ON services (node_id, host_port);

CREATE TABLE service_links (
    service    TEXT NOT NULL,
    app        TEXT NOT NULL,
    -- The environment variable the app gets (DATABASE_URL, REDIS_URL, ...).
    variable   TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (service, app)
);
CREATE UNIQUE INDEX service_links_by_app_variable ON service_links (app, variable);

-- A service's data volume: set while the service exists (the volume is
-- neither attached to an app nor detached then).
ALTER TABLE volumes ADD COLUMN service TEXT;
