-- PostgreSQL twin of ../sqlite/0027_leader_lease.sql: the same schema, in PostgreSQL's types.
-- The one lease that says which control-plane replica leads (issue 24):
-- the leader runs the loops that must run once (reconciler, renewals,
-- retention, backups). `token` grows by one each time another replica
-- takes the lease over, and is the fencing token checked in a leader's
-- write transactions; `expires_at` is in the database's own clock
-- (milliseconds since the epoch), so replicas' clocks do not matter.
CREATE TABLE leader_lease (
    id         BIGINT PRIMARY KEY CHECK (id = 1),
    holder     TEXT NOT NULL,
    token      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    renewed_at BIGINT NOT NULL
);
