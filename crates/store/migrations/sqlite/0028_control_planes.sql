-- Every control-plane replica that renewed or tried for the leader's lease
-- lately (issue 24): its lease holder name (its public URL and a part of
-- its process's own), its public URL, and when it was last seen, in the
-- database's clock. Agents learn the URLs from heartbeat answers, to fail
-- over between replicas. Rows unseen for an hour are removed when a
-- replica records itself.
CREATE TABLE control_planes (
    holder  TEXT PRIMARY KEY,
    url     TEXT NOT NULL,
    seen_at INTEGER NOT NULL
);
