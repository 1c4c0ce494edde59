-- Teams, roles, scoped tokens and the audit log (issue 28).
--
-- A team owns apps, services, volumes and backup destinations (previews
-- are apps of their app's team). Each member has one role in a team:
-- 'owner', 'admin', 'deployer' or 'viewer'. `source`: 'manual' (granted
-- through the API) or the login mapping that granted it, e.g.
-- 'gitlab:acme/devs' (taken away again at a later login without it).
CREATE TABLE teams (
    id         TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX teams_by_name ON teams (lower(name));

CREATE TABLE team_members (
    team_id  TEXT NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    user_id  TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    role     TEXT NOT NULL,
    source   TEXT NOT NULL DEFAULT 'manual',
    added_at BIGINT NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
CREATE INDEX team_members_by_user ON team_members (user_id);

-- Login mappings: a member of `external_group` at `provider` (e.g.
-- 'gitlab', 'acme/devs') gets `role` in `team_id` when logging in, and
-- loses it when no longer a member (memberships so granted carry the
-- source '<provider>:<group>').
CREATE TABLE team_mappings (
    provider       TEXT NOT NULL,
    external_group TEXT NOT NULL,
    team_id        TEXT NOT NULL REFERENCES teams (id) ON DELETE CASCADE,
    role           TEXT NOT NULL,
    PRIMARY KEY (provider, external_group, team_id)
);

-- Roles over the whole cluster, apart from teams: 'cluster-admin',
-- 'cluster-viewer' or NULL. Every user before this migration could do
-- everything, so each keeps that as cluster-admin.
ALTER TABLE users ADD COLUMN cluster_role TEXT;
UPDATE users SET cluster_role = 'cluster-admin';

-- What existed before teams belongs to the team 'default'.
INSERT INTO teams (id, name, created_at) VALUES ('team_default', 'default', 0);
ALTER TABLE apps ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
ALTER TABLE services ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
ALTER TABLE volumes ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
ALTER TABLE backup_destinations ADD COLUMN team_id TEXT NOT NULL DEFAULT 'team_default';
CREATE INDEX apps_by_team ON apps (team_id);

-- A personal token's scope: at most `role` (a team role, or a cluster
-- role; NULL: its user's own roles), only the apps in `apps` (JSON list;
-- NULL: all its user may reach), until `expires_at` (NULL: no end).
ALTER TABLE api_tokens ADD COLUMN role TEXT;
ALTER TABLE api_tokens ADD COLUMN apps TEXT;
ALTER TABLE api_tokens ADD COLUMN expires_at BIGINT;

-- Deploy tokens: one app's, for a CI system; they deploy and read that
-- app only, and belong to no user (they outlive who made them).
CREATE TABLE deploy_tokens (
    id           TEXT PRIMARY KEY,
    app          TEXT NOT NULL REFERENCES apps (name) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    token_sha256 TEXT NOT NULL UNIQUE,
    prefix       TEXT NOT NULL,
    created_by   TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    last_used_at BIGINT,
    revoked_at   BIGINT
);
CREATE INDEX deploy_tokens_by_app ON deploy_tokens (app);

-- The audit log: append-only, each entry carrying the hash of the one
-- before (`prev_hash`) and its own (`hash`, SHA-256 over prev_hash and
-- its fields), so that an edited or deleted row breaks the chain.
-- `request_id` ties a request's entry to its outcome's.
CREATE TABLE audit_log (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    at         BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    phase      TEXT NOT NULL,
    actor      TEXT NOT NULL,
    team       TEXT,
    source     TEXT,
    action     TEXT NOT NULL,
    target     TEXT,
    result     TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_log_by_time ON audit_log (at);

-- Where the chain starts once old entries are pruned (retention): the
-- hash of the last pruned entry. One row at most.
CREATE TABLE audit_anchor (
    id   BIGINT PRIMARY KEY,
    seq  BIGINT NOT NULL,
    hash TEXT NOT NULL
);
