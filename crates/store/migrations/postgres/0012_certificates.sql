-- PostgreSQL twin of ../sqlite/0012_certificates.sql: the same schema, in PostgreSQL's types.
-- ACME: one account per directory URL, and one certificate per public host
-- for the whole cluster. The account key and each certificate's private key
-- are sealed (secrets.rs); the chain is public.
CREATE TABLE acme_accounts (
    directory TEXT PRIMARY KEY,
    credentials_sealed TEXT NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE certificates (
    host TEXT PRIMARY KEY,
    chain_pem TEXT NOT NULL,
    key_sealed TEXT NOT NULL,
    not_before BIGINT NOT NULL,
    not_after BIGINT NOT NULL,
    issued_at BIGINT NOT NULL
);
