-- PostgreSQL twin of ../sqlite/0017_login_attempts.sql: the same schema, in PostgreSQL's types.
-- Login attempts per account and per address, so that a restart of the
-- control plane does not reset the login rate limits. One row per key and
-- table, mirroring the limiter's memory: `key` is a keyed digest (never a
-- typed name, which may be a mistyped password), `window_start` the start
-- of the key's fixed window in ms, `attempts` the attempts counted in it.
-- Rows whose window is over are deleted as new attempts are stored.

CREATE TABLE login_attempts (
    kind         TEXT NOT NULL CHECK (kind IN ('account', 'address')),
    key          TEXT NOT NULL,
    window_start BIGINT NOT NULL,
    attempts     BIGINT NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE INDEX login_attempts_by_window ON login_attempts (window_start);
