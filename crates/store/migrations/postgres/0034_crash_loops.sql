-- PostgreSQL twin of ../sqlite/0034_crash_loops.sql: the same schema, in PostgreSQL's types.
-- Crash loops and broken probes (issue 25). `instances.crash_loop`: JSON
-- {"since", "restarts", "exit_code", "reason", "last_lines"} while the
-- instance's node reports its container crash-looping (3 stops within 10
-- minutes), NULL otherwise. `instances.probe_problem`: why its liveness
-- probe cannot run as set (a command not in the image), NULL otherwise.
ALTER TABLE instances ADD COLUMN crash_loop TEXT;
ALTER TABLE instances ADD COLUMN probe_problem TEXT;
