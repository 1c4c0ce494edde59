-- Autoscaling (issue 25). `apps.autoscale`: JSON {"min", "max", "target",
-- "up_window_seconds", "down_window_seconds"}, or NULL when off.
-- `autoscale_decisions`: each change of an app's instance count the
-- autoscaler made, or could not make (`reason` says which and why); the
-- newest 200 per app are kept, and they go with the app.
ALTER TABLE apps ADD COLUMN autoscale TEXT;
CREATE TABLE autoscale_decisions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    app        TEXT NOT NULL,
    at         INTEGER NOT NULL,
    from_count INTEGER NOT NULL,
    to_count   INTEGER NOT NULL,
    metric     TEXT NOT NULL,
    value      REAL,
    target     REAL NOT NULL,
    reason     TEXT NOT NULL
);
CREATE INDEX autoscale_decisions_by_app ON autoscale_decisions (app, id);
