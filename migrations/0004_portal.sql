-- The pages' sign-ins: one-time portal links a tenant's backend asks for, and the sessions of
-- the tenant portal and the operator console. Only SHA-256 hashes of link and session tokens are
-- kept: a dump of these tables opens nothing.

CREATE TABLE portal_links (
    token_hash  bytea PRIMARY KEY,
    tenant      text NOT NULL,
    read_only   boolean NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Set when the link was opened: a link opens one session, once.
    used_at     timestamptz
);

CREATE INDEX portal_links_by_tenant ON portal_links (tenant);

CREATE TABLE web_sessions (
    token_hash  bytea PRIMARY KEY,
    -- NULL: an operator's console session (signed in with an admin token).
    tenant      text,
    read_only   boolean NOT NULL,
    -- Sent back in every form; a POST without it is refused.
    csrf        text NOT NULL,
    expires_at  timestamptz NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE INDEX web_sessions_by_tenant ON web_sessions (tenant);
