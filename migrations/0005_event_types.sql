-- The catalog of event types: what a producer promises an event of each type looks like, and
-- what a worker does with one that breaks the promise. Schemas and examples are kept as the
-- text an administrator wrote (checked and compiled by hookrelay on write and on read).

CREATE SEQUENCE event_types_revision;

CREATE TABLE event_types (
    name        text PRIMARY KEY,
    description text NOT NULL DEFAULT '',
    mode        text NOT NULL CHECK (mode IN ('enforce', 'warn', 'off')),
    deprecated  boolean NOT NULL DEFAULT false,
    -- Taken from the sequence at every write: workers look at max(revision) and count(*) to
    -- learn that the catalog changed, without reading it whole.
    revision    bigint NOT NULL DEFAULT nextval('event_types_revision'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE event_type_versions (
    name        text NOT NULL REFERENCES event_types (name) ON DELETE CASCADE,
    version     integer NOT NULL CHECK (version > 0),
    schema      text NOT NULL,
    example     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, version)
);
