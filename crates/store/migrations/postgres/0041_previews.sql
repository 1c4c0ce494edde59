-- PostgreSQL twin of ../sqlite/0041_previews.sql: the same schema, in PostgreSQL's types.
-- Preview environments (issue 27): an app's previews of its pull and
-- merge requests, and the variables previews never get.
--
-- Per app: previews on or off, at most how many at once, and how long one
-- may go without a push before it is removed.
CREATE TABLE preview_settings (
    app TEXT PRIMARY KEY REFERENCES apps(name) ON DELETE CASCADE,
    enabled BOOLEAN NOT NULL,
    max_previews BIGINT NOT NULL,
    ttl_s BIGINT NOT NULL,
    -- What a preview gets for each database service the app is linked to:
    -- 'none', 'empty' (a new service of the same kind and version) or
    -- 'latest-backup' (a new service restored from that service's newest
    -- backup; a fork's preview gets an empty one).
    database TEXT NOT NULL DEFAULT 'none',
    -- Variables previews get on top of the app's (sealed JSON object);
    -- never given to a fork's preview.
    env_sealed TEXT,
    -- Resources of each preview, when smaller than the app's are wanted
    -- (NULL: the app's own).
    instances BIGINT,
    cpu DOUBLE PRECISION,
    memory_bytes BIGINT,
    updated_at BIGINT NOT NULL
);

-- One preview per change request of an app: the app that runs it (made
-- from the app's settings, named <app>-pr-<number>), the head it runs,
-- and where it stands: 'awaiting-approval' (from a fork: nothing is built
-- until a user approves it) or 'active'.
CREATE TABLE previews (
    app TEXT NOT NULL REFERENCES apps(name) ON DELETE CASCADE,
    number BIGINT NOT NULL,
    preview_app TEXT NOT NULL,
    head_ref TEXT NOT NULL,
    head_sha TEXT NOT NULL,
    head_clone_url TEXT NOT NULL,
    from_fork BOOLEAN NOT NULL,
    approved_by TEXT,
    state TEXT NOT NULL,
    -- The one comment on the request that says where the preview stands
    -- (updated, never a new one per push).
    comment_id BIGINT,
    -- JSON array: the services made for this preview (deleted with it;
    -- their volumes stay, detached, until deleted by name).
    services TEXT NOT NULL DEFAULT '[]',
    created_at BIGINT NOT NULL,
    -- The last push (or approval): the TTL counts from here.
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (app, number)
);
CREATE UNIQUE INDEX previews_preview_app ON previews (preview_app);

-- Variables of an app that its previews never get (production-only).
CREATE TABLE env_production_only (
    app TEXT NOT NULL REFERENCES apps(name) ON DELETE CASCADE,
    name TEXT NOT NULL,
    PRIMARY KEY (app, name)
);
