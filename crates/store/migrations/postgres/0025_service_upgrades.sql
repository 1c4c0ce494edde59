-- PostgreSQL twin of ../sqlite/0025_service_upgrades.sql: the same schema, in PostgreSQL's types.
-- Major version upgrades of managed PostgreSQL services (issue 23): a
-- fresh backup of `service`, restored into the new service `to_service`
-- of `version`, then the links of `service` moved to it (its apps
-- redeployed); `service` itself is kept until it is deleted by name.
-- `state`: `backing_up` → `restoring` → `switching` → `switched`, or
-- `failed` with `message`. One unfinished upgrade per service.
CREATE TABLE service_upgrades (
    id           TEXT PRIMARY KEY,
    service      TEXT NOT NULL,
    to_service   TEXT NOT NULL,
    from_version TEXT NOT NULL,
    version      TEXT NOT NULL,
    state        TEXT NOT NULL,
    backup_job   TEXT,
    restore_job  TEXT,
    message      TEXT,
    created_at   BIGINT NOT NULL,
    finished_at  BIGINT
);
CREATE UNIQUE INDEX service_upgrades_one_unfinished ON service_upgrades (service)
    WHERE state IN ('backing_up', 'restoring', 'switching');
CREATE INDEX service_upgrades_by_target ON service_upgrades (to_service);
