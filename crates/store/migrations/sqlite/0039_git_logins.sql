-- Logging in with GitHub (issue 27), and the identities of git hosts other
-- than GitLab.
--
-- The GitHub App's OAuth side: its client id and secret (sealed), the
-- web URL of its authorize and token endpoints, the API URL the user is
-- read from, and who may log in
-- (JSON arrays: GitHub logins or numeric ids, organization logins, and
-- `org/team-slug` teams).
CREATE TABLE github_login_settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    web_url TEXT NOT NULL,
    api_url TEXT NOT NULL,
    client_id TEXT NOT NULL,
    client_secret_sealed TEXT NOT NULL,
    allowed_users TEXT NOT NULL,
    allowed_orgs TEXT NOT NULL,
    allowed_teams TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- An identity on a git host, keyed by the host and the host's numeric
-- user id (the only thing that links it to a local user; never a name or
-- an email address). GitLab identities stay in gitlab_accounts, which
-- also keeps their tokens; a GitHub login keeps no token.
CREATE TABLE git_identities (
    provider TEXT NOT NULL,
    provider_user_id BIGINT NOT NULL,
    username TEXT NOT NULL,
    -- The local user this identity logs in as, once linked.
    local_user TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (provider, provider_user_id)
);
CREATE INDEX git_identities_user ON git_identities (local_user);
