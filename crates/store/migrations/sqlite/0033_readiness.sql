-- Readiness probes (issue 25). `apps.readiness`: JSON {"interval_seconds",
-- "timeout_seconds", "failure_threshold", "success_threshold"}, or NULL for
-- none. `instances.unready_since` (ms): when the instance's node reported
-- its probe failing, NULL while it is ready; `unready_reason` says why. An
-- unready instance leaves the ingress's upstreams (unless every running
-- instance of its app is unready: then all stay).
ALTER TABLE apps ADD COLUMN readiness TEXT;
ALTER TABLE instances ADD COLUMN unready_since INTEGER;
ALTER TABLE instances ADD COLUMN unready_reason TEXT;
