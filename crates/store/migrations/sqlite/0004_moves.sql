-- An instance started to replace another one of the same deployment (a
-- node drained or lost); the replaced one stops once the new one runs.
ALTER TABLE instances ADD COLUMN replaces BIGINT;
