-- GitHub as a GitHub App (issue 27): the one App this control plane is,
-- on github.com or a GitHub Enterprise Server. Its private key (which
-- signs the App's JWTs) and its webhook secret (which signs every event
-- GitHub sends) are sealed with the cluster key. Apps made from one of
-- its repositories are rows of app_git_links with provider 'github',
-- project_id the repository id, project_path its owner/name, and account
-- the App's installation id.
CREATE TABLE github_settings (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    api_url TEXT NOT NULL,
    app_id BIGINT NOT NULL,
    private_key_sealed TEXT NOT NULL,
    webhook_secret_sealed TEXT NOT NULL,
    updated_at BIGINT NOT NULL
);
