-- PostgreSQL twin of ../sqlite/0004_moves.sql: the same schema, in PostgreSQL's types.
-- An instance started to replace another one of the same deployment (a
-- node drained or lost); the replaced one stops once the new one runs.
ALTER TABLE instances ADD COLUMN replaces BIGINT;
