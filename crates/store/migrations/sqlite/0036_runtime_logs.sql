-- Runtime logs (issue 26). On SQLite they live in their own file,
-- `logs.db`, with its own migrations (../sqlite-logs/); this migration
-- changes nothing in the state database and keeps the two engines'
-- migration numbers twins (../postgres/0036_runtime_logs.sql creates the
-- tables in the PostgreSQL state database).
SELECT 1;
