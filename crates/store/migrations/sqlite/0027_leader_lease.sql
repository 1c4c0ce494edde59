-- The one lease that says which control-plane replica leads (issue 24):
-- the leader runs the loops that must run once (reconciler, renewals,
-- retention, backups). `token` grows by one each time another replica
-- takes the lease over, and is the fencing token checked in a leader's
-- write transactions; `expires_at` is in the database's own clock
-- (milliseconds since the epoch), so replicas' clocks do not matter.
CREATE TABLE leader_lease (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    holder     TEXT NOT NULL,
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    renewed_at INTEGER NOT NULL
);
