-- A subscription's payload filter (docs/subscriptions.md): which events of its types it is
-- sent, by what their payload holds. NULL: every event. Checked and compiled by the API and
-- the workers; stored as written.

ALTER TABLE subscriptions ADD COLUMN payload_filter jsonb;
