-- PostgreSQL twin of ../sqlite/0021_rollout.sql: the same schema, in PostgreSQL's types.
-- How an app's deploys replace its instances (issue 22): `blue-green`
-- (the new one starts beside the old, which stops once it is healthy) or
-- `recreate` (the old ones stop first, for apps that cannot share their
-- files with a second copy of themselves).
ALTER TABLE apps ADD COLUMN rollout TEXT NOT NULL DEFAULT 'blue-green';
