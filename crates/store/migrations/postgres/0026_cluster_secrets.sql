-- PostgreSQL twin of ../sqlite/0026_cluster_secrets.sql: the same schema, in PostgreSQL's types.
-- The cluster's identity shared by every control-plane replica of one
-- database (issue 24): the CA's certificate and key and the agent
-- listener's key, each sealed with the master key (which is never stored
-- here), and a sealed check value that tells a replica given another
-- master key to stop. Written once, by the first replica that starts;
-- a row is never replaced.
CREATE TABLE cluster_secrets (
    name       TEXT PRIMARY KEY,
    sealed     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
