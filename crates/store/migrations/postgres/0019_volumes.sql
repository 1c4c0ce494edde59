-- PostgreSQL twin of ../sqlite/0019_volumes.sql: the same schema, in PostgreSQL's types.
-- Persistent volumes (issue 22). A volume is named once in the cluster and
-- lives on one node: `node_id` is set at the first placement of the app it
-- is attached to and stays until the volume is moved or deleted. `app` and
-- `mount_path` are NULL while the volume is detached (its app was deleted
-- with the volumes kept, or the user detached it): the data stays on the
-- node until an explicit delete.
CREATE TABLE volumes (
    name        TEXT PRIMARY KEY,
    app         TEXT,
    mount_path  TEXT,
    node_id     TEXT,
    size_bytes  BIGINT,
    size_at     BIGINT,
    created_at  BIGINT NOT NULL,
    CHECK ((app IS NULL) = (mount_path IS NULL))
);
CREATE UNIQUE INDEX volumes_by_app_path ON volumes (app, mount_path) WHERE app IS NOT NULL;
