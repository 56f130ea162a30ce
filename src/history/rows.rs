//! What one stream message becomes in PostgreSQL (pure): an archived event or an attempt
//! record read into a row, rows written as `COPY ... FROM STDIN` text, and the day partitions a
//! batch needs or retention lets go.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lapin::BasicProperties;
use lapin::types::ShortString;

use crate::contract::headers::replay_of;
use crate::contract::headers::{REDRIVES_HEADER, SUBSCRIPTION_HEADER, header_str, read_u64_header};
use crate::observe::events::AttemptRecord;

const DAY: u64 = 86_400;
/// A producer's timestamp further ahead of the reader's clock than this is not believed.
const SKEW: Duration = Duration::from_secs(60);

/// An event the archive kept, as `history_events` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRow {
    pub id: String,
    pub tenant: String,
    pub event_type: Option<String>,
    pub subscription: Option<String>,
    pub replay: Option<String>,
    /// Set on a copy `hookrelay redrive` published (its redrive count).
    pub redrives: u32,
    pub accepted_at: SystemTime,
    pub offset: u64,
}

impl EventRow {
    /// The row of an archived message, `None` without a `message_id` (the ingress refused it
    /// nowhere, but nothing can find it by id either). `read_at` stands in for the time the
    /// broker accepted it when the producer gave none, or one in the future.
    pub fn read(
        offset: u64,
        routing_key: &str,
        properties: &BasicProperties,
        read_at: SystemTime,
    ) -> Option<Self> {
        let id = properties.message_id().as_ref()?.as_str().to_owned();
        let produced = properties
            .timestamp()
            .map(|s| UNIX_EPOCH + Duration::from_secs(s))
            .filter(|t| *t <= read_at + SKEW);
        Some(Self {
            id,
            tenant: routing_key.to_owned(),
            event_type: properties
                .kind()
                .as_ref()
                .map(ShortString::as_str)
                .map(str::to_owned),
            subscription: header_str(properties.headers().as_ref(), SUBSCRIPTION_HEADER)
                .ok()
                .flatten()
                .map(str::to_owned),
            replay: replay_of(properties).map(str::to_owned),
            redrives: read_u64_header(properties, REDRIVES_HEADER)
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            accepted_at: produced.unwrap_or(read_at),
            offset,
        })
    }

    pub fn copy_line(&self, out: &mut String) {
        field(out, Some(&self.id));
        field(out, Some(&self.tenant));
        field(out, self.event_type.as_deref());
        field(out, self.subscription.as_deref());
        field(out, self.replay.as_deref());
        field(out, Some(&self.redrives.to_string()));
        field(out, Some(&rfc3339(self.accepted_at)));
        last(out, &self.offset.to_string());
    }
}

/// The columns [`EventRow::copy_line`] writes, in order.
pub const EVENT_COLUMNS: &str =
    "id, tenant, event_type, subscription, replay, redrives, accepted_at, stream_offset";

/// An attempt record, as `history_attempts` holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub record: AttemptRecord,
    pub at: SystemTime,
    pub offset: u64,
}

impl AttemptRow {
    /// The rows of an attempt-log message (one record, or a batch of them at one offset); the
    /// error says why a body is not records.
    pub fn read(offset: u64, body: &[u8]) -> Result<Vec<Self>, String> {
        let records =
            AttemptRecord::read_message(body).map_err(|e| format!("not an attempt record: {e}"))?;
        records
            .into_iter()
            .map(|record| {
                let at = humantime::parse_rfc3339_weak(&record.at)
                    .map_err(|e| format!("attempt record time {:?}: {e}", record.at))?;
                Ok(Self { record, at, offset })
            })
            .collect()
    }

    pub fn copy_line(&self, out: &mut String) {
        let r = &self.record;
        field(out, r.envelope.as_deref());
        field(out, r.event.as_deref());
        field(out, r.tenant.as_deref());
        field(out, r.subscription.as_deref());
        field(out, Some(&r.attempt.to_string()));
        field(out, r.status.map(|s| s.to_string()).as_deref());
        field(out, r.error.as_deref());
        field(out, r.latency_ms.map(|l| l.to_string()).as_deref());
        field(out, Some(&r.outcome));
        field(out, r.tier.as_deref());
        field(out, Some(&r.lane));
        field(out, Some(&r.redrives.to_string()));
        field(out, r.replay.as_deref());
        field(out, Some(&rfc3339(self.at)));
        last(out, &self.offset.to_string());
    }
}

/// The columns [`AttemptRow::copy_line`] writes, in order.
pub const ATTEMPT_COLUMNS: &str = "envelope, event, tenant, subscription, attempt, status, error, \
     latency_ms, outcome, tier, lane, redrives, replay, at, stream_offset";

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// One field of a `COPY` text line and its tab: `\N` for NULL; backslash, tab, newline and
/// carriage return escaped; NUL (which PostgreSQL text cannot hold) dropped.
fn field(out: &mut String, value: Option<&str>) {
    escape(out, value);
    out.push('\t');
}

fn last(out: &mut String, value: &str) {
    escape(out, Some(value));
    out.push('\n');
}

fn escape(out: &mut String, value: Option<&str>) {
    let Some(value) = value else {
        out.push_str("\\N");
        return;
    };
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\0' => {}
            c => out.push(c),
        }
    }
}

/// The day (since the epoch) a time falls in, UTC.
pub fn day_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / DAY)
}

/// `YYYY-MM-DD` of a day since the epoch.
pub fn date_of(day: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(day * DAY);
    humantime::format_rfc3339_seconds(t).to_string()[..10].to_owned()
}

/// The partition of `table` for `day`: `<table>_pYYYYMMDD`.
pub fn partition_name(table: &str, day: u64) -> String {
    format!("{table}_p{}", date_of(day).replace('-', ""))
}

/// The statement creating `table`'s partition for `day` if it is missing.
pub fn create_partition(table: &str, day: u64) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} FOR VALUES FROM ('{}') TO ('{}')",
        partition_name(table, day),
        date_of(day),
        date_of(day + 1),
    )
}

/// Of `table`'s partitions (by name), those holding only days older than `keep_days` before
/// `today`: what retention drops. Names of another shape are never touched.
pub fn expired_partitions(
    table: &str,
    names: &[String],
    today: u64,
    keep_days: u32,
) -> Vec<String> {
    let oldest_kept = today.saturating_sub(u64::from(keep_days.max(1)) - 1);
    let oldest_date = date_of(oldest_kept).replace('-', "");
    let prefix = format!("{table}_p");
    names
        .iter()
        .filter(|n| {
            n.strip_prefix(&prefix).is_some_and(|d| {
                d.len() == 8 && d.bytes().all(|b| b.is_ascii_digit()) && *d < *oldest_date
            })
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::envelope::NewEvent;

    #[test]
    fn copy_text_escapes_what_would_break_a_line_and_writes_null_as_backslash_n() {
        let mut out = String::new();
        field(&mut out, Some("a\tb\\c\nd\re\0f"));
        field(&mut out, None);
        last(&mut out, "7");
        assert_eq!(out, "a\\tb\\\\c\\nd\\ref\t\\N\t7\n");
    }

    #[test]
    fn an_attempt_record_becomes_a_row_and_a_bad_one_says_why() {
        let body = br#"{"envelope":"evt_1","tenant":"acme","subscription":"sub_a","attempt":2,
            "status":503,"error":"HTTP 503","latency_ms":48,"outcome":"retried","tier":"retry-10s",
            "lane":"hookrelay.ready","redrives":1,"at":"2026-12-04T10:00:00.120Z"}"#;
        let rows = AttemptRow::read(41, body).unwrap();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.record.redrives, 1);
        let mut line = String::new();
        row.copy_line(&mut line);
        assert_eq!(
            line,
            "evt_1\t\\N\tacme\tsub_a\t2\t503\tHTTP 503\t48\tretried\tretry-10s\thookrelay.ready\t1\t\\N\t2026-12-04T10:00:00.120000Z\t41\n"
        );
        assert_eq!(
            line.matches('\t').count() + 1,
            ATTEMPT_COLUMNS.split(',').count()
        );
        assert!(
            AttemptRow::read(1, b"not json")
                .unwrap_err()
                .contains("not an attempt record")
        );
    }

    #[test]
    fn a_message_carrying_several_records_becomes_their_rows_in_order_at_its_offset() {
        let one = |id: &str| {
            format!(
                r#"{{"envelope":"{id}","tenant":"acme","subscription":"sub_a","attempt":1,
                "status":503,"error":null,"latency_ms":2,"outcome":"retried","tier":"retry-10s",
                "lane":"hookrelay.ready","at":"2026-12-04T10:00:00Z"}}"#
            )
        };
        let body = format!(" [{},{}]", one("evt_1"), one("evt_2"));
        let rows = AttemptRow::read(7, body.as_bytes()).unwrap();
        let ids: Vec<_> = rows
            .iter()
            .map(|r| (r.record.envelope.as_deref(), r.offset))
            .collect();
        assert_eq!(ids, [(Some("evt_1"), 7), (Some("evt_2"), 7)]);
        // One broken record spoils its message, which is passed over whole and said why.
        let broken = format!("[{},{{\"envelope\":1}}]", one("evt_3"));
        assert!(
            AttemptRow::read(8, broken.as_bytes())
                .unwrap_err()
                .contains("not an attempt record")
        );
    }

    #[test]
    fn an_archived_event_takes_the_producers_time_unless_it_is_in_the_future() {
        let read_at = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut event = NewEvent {
            id: "evt_1".into(),
            tenant: "acme".into(),
            event_type: "order.paid".into(),
            subscription: Some("sub_a".into()),
            timestamp: Some(1_799_999_990),
            body: b"{}".to_vec(),
        };
        let row = EventRow::read(3, "acme", &event.properties(), read_at).unwrap();
        assert_eq!(
            row.accepted_at,
            UNIX_EPOCH + Duration::from_secs(1_799_999_990)
        );
        assert_eq!(row.subscription.as_deref(), Some("sub_a"));
        assert_eq!(row.event_type.as_deref(), Some("order.paid"));
        let mut line = String::new();
        row.copy_line(&mut line);
        assert_eq!(
            line.matches('\t').count() + 1,
            EVENT_COLUMNS.split(',').count()
        );
        event.timestamp = Some(1_800_000_000 + 3_600);
        let row = EventRow::read(3, "acme", &event.properties(), read_at).unwrap();
        assert_eq!(row.accepted_at, read_at);
        assert!(EventRow::read(3, "acme", &BasicProperties::default(), read_at).is_none());
    }

    #[test]
    fn partitions_are_days_and_retention_drops_only_whole_old_days() {
        let day = day_of(UNIX_EPOCH + Duration::from_secs(1_796_342_400)); // 2026-12-04
        assert_eq!(date_of(day), "2026-12-04");
        assert_eq!(
            partition_name("history_attempts", day),
            "history_attempts_p20261204"
        );
        assert_eq!(
            create_partition("history_attempts", day),
            "CREATE TABLE IF NOT EXISTS history_attempts_p20261204 PARTITION OF history_attempts \
             FOR VALUES FROM ('2026-12-04') TO ('2026-12-05')"
        );
        let names: Vec<String> = [
            "history_attempts_p20261201",
            "history_attempts_p20261202",
            "history_attempts_p20261203",
            "history_attempts_p20261204",
            "history_attempts_pnot_a_day",
            "history_events_p20200101",
        ]
        .map(String::from)
        .to_vec();
        // Two days kept: today and yesterday.
        assert_eq!(
            expired_partitions("history_attempts", &names, day, 2),
            vec!["history_attempts_p20261201", "history_attempts_p20261202"]
        );
        assert!(expired_partitions("history_attempts", &names, day, 30).is_empty());
    }
}
