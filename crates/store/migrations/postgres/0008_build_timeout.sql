-- PostgreSQL twin of ../sqlite/0008_build_timeout.sql: the same schema, in PostgreSQL's types.
-- Per-app build time limit in seconds; NULL means the agent's default
-- (30 minutes). The API caps it at 2 hours.
ALTER TABLE apps ADD COLUMN build_timeout_s BIGINT;
