-- PostgreSQL twin of ../sqlite/0010_git_providers.sql: the same schema, in PostgreSQL's types.
-- Git providers (issue 11): the GitLab connection, GitLab identities and
-- their tokens, which apps push-to-deploy from which project, webhook
-- deliveries already handled, and the short-lived clone credentials of
-- deployments still building. Every secret is sealed (secrets.rs) or
-- stored as a SHA-256 digest.

-- The one GitLab connection: base URL (gitlab.com or self-hosted), the
-- OAuth application, and who may log in.
CREATE TABLE gitlab_settings (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    base_url TEXT NOT NULL,
    client_id TEXT NOT NULL,
    client_secret_sealed TEXT NOT NULL,
    -- JSON arrays: GitLab usernames, and group full paths.
    allowed_users TEXT NOT NULL,
    allowed_groups TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- A GitLab identity, keyed by GitLab's user id (the only thing that links
-- it to a local user), with its OAuth tokens.
CREATE TABLE gitlab_accounts (
    gitlab_user_id BIGINT PRIMARY KEY,
    username TEXT NOT NULL,
    -- The local user this identity logs in as, once linked.
    local_user TEXT,
    access_token_sealed TEXT NOT NULL,
    refresh_token_sealed TEXT,
    -- Unix ms; NULL when GitLab gave no expiry.
    expires_at BIGINT,
    updated_at BIGINT NOT NULL
);

-- Where an app's pushes come from.
CREATE TABLE app_git_links (
    app TEXT PRIMARY KEY REFERENCES apps(name) ON DELETE CASCADE,
    -- 'gitlab' or 'generic'.
    provider TEXT NOT NULL,
    project_id BIGINT,
    project_path TEXT,
    -- The GitLab identity whose token registers hooks, posts statuses and
    -- hands out clone credentials.
    account BIGINT,
    hook_id BIGINT,
    -- GitLab's X-Gitlab-Token is checked by its digest; a generic
    -- provider's secret keys an HMAC, so it is kept sealed.
    webhook_secret_sha256 TEXT NOT NULL,
    webhook_secret_sealed TEXT,
    created_at BIGINT NOT NULL
);
CREATE INDEX app_git_links_project ON app_git_links (provider, project_id);
CREATE UNIQUE INDEX app_git_links_secret ON app_git_links (webhook_secret_sha256);

-- Webhook deliveries handled, by the sender's delivery id (GitLab's
-- X-Gitlab-Event-UUID), so a redelivery deploys nothing more.
CREATE TABLE webhook_deliveries (
    app TEXT NOT NULL REFERENCES apps(name) ON DELETE CASCADE,
    delivery TEXT NOT NULL,
    deployment_id TEXT,
    received_at BIGINT NOT NULL,
    PRIMARY KEY (app, delivery)
);
CREATE INDEX webhook_deliveries_received ON webhook_deliveries (received_at);

-- One deployment's clone credentials while it builds, and the commit
-- statuses already posted for it. The row goes when the deployment ends.
CREATE TABLE deployment_git (
    deployment_id TEXT PRIMARY KEY REFERENCES deployments(id) ON DELETE CASCADE,
    credentials_sealed TEXT,
    -- A GitLab project deploy token made for this deployment, revoked at its end.
    deploy_token_id BIGINT,
    last_status TEXT,
    created_at BIGINT NOT NULL
);
