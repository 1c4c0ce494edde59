-- PostgreSQL twin of ../sqlite/0023_service_rotation.sql: the same schema, in PostgreSQL's types.
-- Password rotation of managed services (issue 22): until the service's
-- node reports the generation that carries the new password healthy, its
-- database may still accept only the old one, which linked apps keep
-- getting; `previous_secret_sealed` holds it (sealed like the current
-- one) and marks the rotation as unfinished since `rotation_started_at`.
ALTER TABLE services ADD COLUMN previous_secret_sealed TEXT;
ALTER TABLE services ADD COLUMN rotation_started_at BIGINT;
