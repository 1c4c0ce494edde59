-- Values a browser carries from one request to its next, which any
-- control-plane replica may answer (issue 24 item 5): the dashboard's
-- one-shot messages after a form (kind 'flash', keyed by the session's id
-- digest) and GitLab logins under way (kind 'gitlab-login', keyed by the
-- digest of the login's state). Each is taken out once; values are sealed
-- where they hold a secret (a join command, a PKCE verifier); rows older
-- than their kind's lifetime are deleted when another of the kind is put.
CREATE TABLE one_shot_values (
    kind       TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (kind, key)
);
