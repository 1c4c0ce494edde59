-- An app's liveness probe (issue 25): JSON {"interval_seconds",
-- "timeout_seconds", "failure_threshold"}, or NULL for none. Agents probe
-- the app's health path with it once an instance passed its health check.
ALTER TABLE apps ADD COLUMN liveness TEXT;
