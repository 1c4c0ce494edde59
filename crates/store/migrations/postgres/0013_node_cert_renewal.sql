-- PostgreSQL twin of ../sqlite/0013_node_cert_renewal.sql: the same schema, in PostgreSQL's types.
-- Node certificate renewal: when the current certificate ends, the
-- certificate a renewal issued but the node has not used yet, and the one
-- it replaced (refused with a "replaced" answer rather than "not
-- registered"). Fingerprints are lowercase hex SHA-256 of the DER.

ALTER TABLE nodes ADD COLUMN cert_not_after BIGINT;
ALTER TABLE nodes ADD COLUMN next_cert_sha256 TEXT;
ALTER TABLE nodes ADD COLUMN next_cert_not_after BIGINT;
ALTER TABLE nodes ADD COLUMN replaced_cert_sha256 TEXT;
ALTER TABLE nodes ADD COLUMN cert_renewed_at BIGINT;
