//! The attempt log's message forms, written and read. Three forms exist in a log, and every
//! reader (trace, replay, `hookrelay history`, `attempts tail`, the API) reads all three through
//! [`read_message`]:
//!
//! - **one record**, a JSON object ([`AttemptRecord`]): what the worker publishes when a record
//!   must be confirmed before the ack (a cancellation), and what it wrote alone before batches;
//! - **an array of records sharing one routing key** (`[{...},{...}]`): the batches of releases
//!   up to 2026-12-07, still in older logs;
//! - **a compact batch** of records of any routing keys ([`encode_batch`]): the routing key of
//!   each record is inside it (its outcome and tenant), the strings that repeat (tenant,
//!   subscription, outcome, tier, lane, error, replay) are written once per message in a table,
//!   each record is a JSON array of positions, and its time is milliseconds after the
//!   message's first.
//!
//! ```json
//! {"attempts":2,"t":1765094400123,"strings":["acme","sub_a","delivered","x.ready.first"],
//!  "records":[["evt_1",null,0,1,1,204,null,3,2,null,3,0,null,0],
//!             ["evt_2",null,0,1,1,204,null,4,2,null,3,0,null,2]]}
//! ```
//!
//! A record's fields, in order: envelope, event, tenant, subscription, attempt, status, error,
//! latency_ms, outcome, tier, lane, redrives, replay, at (a number of milliseconds after `t`,
//! or the record's own text when it is not a millisecond RFC 3339 time).

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::observe::events::AttemptRecord;

/// What a compact batch starts with; the version of its form.
const COMPACT_PREFIX: &[u8] = b"{\"attempts\":2,";

/// A record's time: milliseconds after the batch's first, or its text as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum At {
    After(i64),
    Text(String),
}

/// One record in a compact batch: strings of the table by position.
type Row = (
    Option<String>, // envelope
    Option<String>, // event
    Option<u32>,    // tenant
    Option<u32>,    // subscription
    u32,            // attempt
    Option<u16>,    // status
    Option<u32>,    // error
    Option<u64>,    // latency_ms
    u32,            // outcome
    Option<u32>,    // tier
    u32,            // lane
    u32,            // redrives
    Option<u32>,    // replay
    At,             // at
);

#[derive(Serialize, Deserialize)]
struct Compact {
    /// The form's version: 2.
    attempts: u32,
    /// The first record's time, in milliseconds since the epoch.
    t: i64,
    strings: Vec<String>,
    records: Vec<Row>,
}

/// The records one attempt-log message holds, in any of the three forms.
pub fn read_message(body: &[u8]) -> Result<Vec<AttemptRecord>, serde_json::Error> {
    let start = body
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(body.len());
    let body = &body[start..];
    if body.starts_with(COMPACT_PREFIX) {
        return decode(serde_json::from_slice(body)?);
    }
    if body.first() == Some(&b'[') {
        serde_json::from_slice(body)
    } else {
        serde_json::from_slice(body).map(|record| vec![record])
    }
}

/// Milliseconds since the epoch of an RFC 3339 time that formats back to exactly `text` at
/// millisecond precision (what the worker writes), so the record reads back unchanged.
fn millis(text: &str) -> Option<i64> {
    let at = humantime::parse_rfc3339(text).ok()?;
    if humantime::format_rfc3339_millis(at).to_string() != text {
        return None;
    }
    i64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()
}

fn text_of(ms: i64) -> Option<String> {
    let at = UNIX_EPOCH.checked_add(Duration::from_millis(u64::try_from(ms).ok()?))?;
    Some(humantime::format_rfc3339_millis(at).to_string())
}

/// The strings of a batch, each written once.
#[derive(Default)]
struct Table {
    strings: Vec<String>,
    index: HashMap<String, u32>,
}

impl Table {
    fn of(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }

    fn opt(&mut self, s: Option<&str>) -> Option<u32> {
        s.map(|s| self.of(s))
    }
}

/// The compact batch of `records` (any routing keys, in the order they settled).
pub fn encode_batch(records: &[AttemptRecord]) -> Vec<u8> {
    let mut table = Table::default();
    let t = records
        .iter()
        .find_map(|r| millis(&r.at))
        .unwrap_or_default();
    let rows: Vec<Row> = records
        .iter()
        .map(|r| {
            (
                r.envelope.clone(),
                r.event.clone(),
                table.opt(r.tenant.as_deref()),
                table.opt(r.subscription.as_deref()),
                r.attempt,
                r.status,
                table.opt(r.error.as_deref()),
                r.latency_ms,
                table.of(&r.outcome),
                table.opt(r.tier.as_deref()),
                table.of(&r.lane),
                r.redrives,
                table.opt(r.replay.as_deref()),
                millis(&r.at).map_or_else(|| At::Text(r.at.clone()), |ms| At::After(ms - t)),
            )
        })
        .collect();
    let compact = Compact {
        attempts: 2,
        t,
        strings: table.strings,
        records: rows,
    };
    // Serializing plain data to a vector cannot fail.
    serde_json::to_vec(&compact).unwrap_or_default()
}

fn decode(c: Compact) -> Result<Vec<AttemptRecord>, serde_json::Error> {
    use serde::de::Error;
    let string = |i: u32| {
        c.strings
            .get(i as usize)
            .cloned()
            .ok_or_else(|| serde_json::Error::custom(format!("string {i} not in the batch")))
    };
    let opt = |i: Option<u32>| i.map(string).transpose();
    c.records
        .iter()
        .map(|row| {
            let (envelope, event, tenant, subscription, attempt, status, error, latency_ms) = (
                row.0.clone(),
                row.1.clone(),
                opt(row.2)?,
                opt(row.3)?,
                row.4,
                row.5,
                opt(row.6)?,
                row.7,
            );
            let at = match &row.13 {
                At::Text(s) => s.clone(),
                At::After(ms) => text_of(c.t.saturating_add(*ms))
                    .ok_or_else(|| serde_json::Error::custom("record time out of range"))?,
            };
            Ok(AttemptRecord {
                envelope,
                event,
                tenant,
                subscription,
                attempt,
                status,
                error,
                latency_ms,
                outcome: string(row.8)?,
                tier: opt(row.9)?,
                lane: string(row.10)?,
                redrives: row.11,
                replay: opt(row.12)?,
                at,
            })
        })
        .collect()
}

/// How many body bytes a record adds to a compact batch, about: its own strings and the
/// positions (the table's strings mostly repeat).
pub fn estimated_size(r: &AttemptRecord) -> usize {
    40 + r.envelope.as_ref().map_or(0, String::len)
        + r.event.as_ref().map_or(0, String::len)
        + r.error.as_ref().map_or(0, |e| e.len() / 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(envelope: &str, outcome: &str, tenant: Option<&str>) -> AttemptRecord {
        AttemptRecord {
            envelope: Some(envelope.into()),
            event: None,
            tenant: tenant.map(str::to_owned),
            subscription: Some("sub_a".into()),
            attempt: 1,
            status: Some(204),
            error: None,
            latency_ms: Some(3),
            outcome: outcome.into(),
            tier: None,
            lane: "x.ready.first".into(),
            redrives: 0,
            replay: None,
            at: crate::units::now_rfc3339(),
        }
    }

    #[test]
    fn a_compact_batch_of_many_keys_reads_back_record_for_record() {
        let mut retried = record("evt_2", "retried", Some("bigco"));
        retried.status = Some(503);
        retried.error = Some("HTTP 503".into());
        retried.tier = Some("retry-10m".into());
        retried.attempt = 3;
        let mut odd = record("evt_3", "cancelled", None);
        odd.at = "2026-12-05T10:00:00.123456Z".into(); // not at millisecond precision
        odd.event = Some("evt_fan".into());
        odd.replay = Some("rpl_1".into());
        odd.redrives = 2;
        odd.envelope = None;
        odd.latency_ms = None;
        let mut early = record("evt_4", "delivered", Some("acme"));
        early.at = "2026-12-05T09:59:59.001Z".into(); // before the batch's first
        let records = vec![
            record("evt_1", "delivered", Some("acme")),
            retried,
            odd,
            early,
        ];
        let body = encode_batch(&records);
        assert!(body.starts_with(COMPACT_PREFIX));
        assert_eq!(read_message(&body).unwrap(), records);
        // Smaller than the array of the same records.
        assert!(body.len() * 2 < serde_json::to_vec(&records).unwrap().len());
    }

    #[test]
    fn the_older_forms_still_read() {
        let one = record("evt_1", "delivered", Some("acme"));
        let two = record("evt_2", "delivered", Some("acme"));
        let alone = serde_json::to_vec(&one).unwrap();
        assert_eq!(read_message(&alone).unwrap(), std::slice::from_ref(&one));
        let array = serde_json::to_vec(&[&one, &two]).unwrap();
        assert_eq!(read_message(&array).unwrap(), [one, two]);
        // Written by a release before this one, byte for byte.
        let old = br#"[{"envelope":"ord_1","tenant":"acme","subscription":"sub_orders","attempt":3,"status":503,"error":"HTTP 503","latency_ms":48,"outcome":"retried","tier":"retry-10m","lane":"hookrelay.ready.retry","at":"2026-12-02T16:02:27.331Z"}]"#;
        let read = read_message(old).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].tier.as_deref(), Some("retry-10m"));
        assert_eq!(read[0].at, "2026-12-02T16:02:27.331Z");
    }

    #[test]
    fn a_damaged_batch_is_an_error_not_a_panic() {
        assert!(read_message(b"{\"attempts\":2,\"t\":0,\"strings\":[],\"records\":[[null,null,null,null,1,null,null,null,7,null,0,0,null,0]]}").is_err());
        assert!(read_message(b"{\"attempts\":2,").is_err());
        assert!(read_message(b"[1]").is_err());
        assert!(read_message(b"").is_err());
    }
}
