-- Gitea and Forgejo (issue 27): the OAuth application the control plane
-- logs people in with and acts through, and the tokens of each identity.
--
-- The instance's URL, the OAuth client id and secret (sealed), and who
-- may log in (JSON arrays: Gitea user names or `id:<number>`, and
-- organization names).
CREATE TABLE gitea_settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    base_url TEXT NOT NULL,
    client_id TEXT NOT NULL,
    client_secret_sealed TEXT NOT NULL,
    allowed_users TEXT NOT NULL,
    allowed_orgs TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- The tokens of a Gitea identity (its row in git_identities, provider
-- 'gitea'), sealed: the access token (one hour at Gitea) acts for the
-- apps made through it and clones their code; the refresh token, which
-- Gitea rotates at each use, makes the next one.
CREATE TABLE gitea_tokens (
    gitea_user_id BIGINT PRIMARY KEY,
    access_token_sealed TEXT NOT NULL,
    refresh_token_sealed TEXT,
    -- Unix ms; NULL when Gitea did not say.
    expires_at BIGINT,
    updated_at BIGINT NOT NULL
);
