-- The dashboard's history.
--
-- Each state a deployment entered and when, for the dashboard's timeline
-- (queued → building → deploying → running / failed / superseded). At most
-- one row per state per deployment; removed with the app.

CREATE TABLE deployment_events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id TEXT NOT NULL,
    state         TEXT NOT NULL,
    at            BIGINT NOT NULL
);
CREATE INDEX deployment_events_by_deployment ON deployment_events (deployment_id, at);

-- Restarts of an app's containers on a node, per usage sample (absent when
-- no container reported a count), for the restarts chart.
ALTER TABLE app_usage ADD COLUMN restarts BIGINT;
