-- PostgreSQL twin of ../sqlite/0009_accounts.sql: the same schema, in PostgreSQL's types.
-- Accounts: users, their browser sessions and their personal API tokens.
-- Secrets are stored only as digests (sessions, tokens) or argon2id hashes
-- (passwords). Timestamps are Unix milliseconds (UTC).

CREATE TABLE users (
    id            TEXT PRIMARY KEY,
    -- Login name; unique without regard to ASCII case.
    name          TEXT NOT NULL,
    -- argon2id PHC string; NULL: this user cannot log in with a password
    -- (e.g. one who only logs in through GitLab).
    password_hash TEXT,
    created_at    BIGINT NOT NULL,
    -- Set: the user can no longer log in, and their sessions and tokens
    -- stop working.
    disabled_at   BIGINT
);
CREATE UNIQUE INDEX users_by_name ON users (lower(name));

CREATE TABLE sessions (
    -- SHA-256 of the session id the browser holds in its cookie.
    id_sha256    TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- Sent back by the browser in X-CSRF-Token on every state-changing
    -- request; useless without the cookie.
    csrf_token   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    -- The absolute end; the idle end is last_seen_at plus the idle limit.
    expires_at   BIGINT NOT NULL
);
CREATE INDEX sessions_by_user ON sessions (user_id);
CREATE INDEX sessions_by_expiry ON sessions (expires_at);

CREATE TABLE api_tokens (
    id           TEXT PRIMARY KEY,
    user_id      TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    -- The first characters of the token, to recognise it in a list.
    prefix       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    last_used_at BIGINT,
    revoked_at   BIGINT
);
CREATE INDEX api_tokens_by_user ON api_tokens (user_id);
