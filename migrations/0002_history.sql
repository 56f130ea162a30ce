-- History: what the archive and attempt-log streams hold, materialized by `hookrelay history`
-- for `hookrelay trace` and the API's history routes. The delivery path never writes here.
--
-- Both tables are partitioned by day (`history_events_pYYYYMMDD`, `history_attempts_pYYYYMMDD`):
-- `hookrelay history` creates the partitions a batch needs and drops those older than
-- `history.retention_days`, so retention costs a DROP TABLE, never a DELETE.

-- One row per event the broker accepted at the ingress (the archive stream): the producer's,
-- and the copies replays and redrives publish through the ingress.
CREATE TABLE history_events (
    id            text NOT NULL,
    tenant        text NOT NULL,
    event_type    text,
    -- Set when the producer addressed one subscription (x-hookrelay-subscription).
    subscription  text,
    -- rpl_<hex> when `hookrelay replay` published this copy.
    replay        text,
    -- n when `hookrelay redrive` published this copy (its n-th redrive out of the dead sink).
    redrives      integer NOT NULL DEFAULT 0,
    -- The producer's timestamp property when it has one that is not in the future, else when
    -- history read the event: the archive stream keeps no per-message time of its own.
    accepted_at   timestamptz NOT NULL,
    stream_offset bigint NOT NULL
) PARTITION BY RANGE (accepted_at);

CREATE INDEX history_events_by_id ON history_events (id);

-- One row per attempt-log record: every settled delivery.
CREATE TABLE history_attempts (
    envelope      text,
    -- For a delivery made by fan-out: the event it came from.
    event         text,
    tenant        text,
    subscription  text,
    -- 0 when no HTTP request was made (deferred, invalid, cancelled, fanned out).
    attempt       integer NOT NULL,
    status        integer,
    error         text,
    latency_ms    bigint,
    outcome       text NOT NULL,
    tier          text,
    lane          text NOT NULL,
    -- How many times the envelope had been redriven out of the dead sink.
    redrives      integer NOT NULL DEFAULT 0,
    replay        text,
    at            timestamptz NOT NULL,
    stream_offset bigint NOT NULL
) PARTITION BY RANGE (at);

CREATE INDEX history_attempts_by_envelope ON history_attempts (envelope);
CREATE INDEX history_attempts_by_event ON history_attempts (event) WHERE event IS NOT NULL;
CREATE INDEX history_attempts_by_subscription ON history_attempts (subscription, at, stream_offset);

-- Where `hookrelay history` is in each stream. Written in the same transaction as the rows of
-- each batch, so every record lands exactly once across restarts and crashes.
CREATE TABLE history_progress (
    stream      text PRIMARY KEY,
    -- The first offset not yet materialized.
    next_offset bigint NOT NULL,
    -- The newest record's time in the last batch.
    newest_at   timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
