//! `hookrelay replay`: events the archive kept, published again through the ingress with their
//! original ids (so receivers deduplicate), selected by the time the broker accepted them and by
//! tenant, subscription and type; optionally only those the attempt log does not show delivered.
//!
//! The archive is read from a timestamp offset. Where to stop is fixed before the first publish
//! (the first offset at or after `--to`, or the stream's end), so the replayed copies, which the
//! archive keeps too, are never read back by the same replay.

use std::collections::{HashMap, HashSet};
use std::time::SystemTime;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, ShortString};
use serde::Serialize;

use crate::broker::publish::{PublishError, Publisher};
use crate::broker::streams::{StreamReadError, end_of, read_window};
use crate::contract::envelope::derived_id;
use crate::contract::headers::{
    EVENT_ID_HEADER, REDRIVES_HEADER, REPLAY_HEADER, SUBSCRIPTION_HEADER, fanout_properties,
    header_str, read_u64_header,
};
use crate::contract::ladder::Ladder;
use crate::contract::retention::StreamKind;
use crate::observe::events::AttemptRecord;
use crate::ops::progress::Progress;
use crate::subscriptions::EventFilter;
use crate::units::Rate;

/// Replayed publishes awaiting their confirm at once.
const WINDOW: usize = 256;

/// Which archived events a replay takes.
#[derive(Debug, Clone, Default)]
pub struct ReplayFilter {
    pub tenant: Option<String>,
    pub subscription: Option<String>,
    pub event_type: Option<EventFilter>,
    /// Only the event of this id (its producer's `message_id`).
    pub event: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// The replay's id (`rpl_<hex>`); `None`: a new one.
    pub id: Option<String>,
    pub from: SystemTime,
    /// Accepted before this; `None`: up to the archive's end when the replay starts.
    pub to: Option<SystemTime>,
    pub filter: ReplayFilter,
    pub only_undelivered: bool,
    /// The most envelope ids the `only_undelivered` index may hold; `None`: no bound (the
    /// command line's, whose operator sees the process).
    pub index_max: Option<usize>,
    pub rate: Option<Rate>,
    pub dry_run: bool,
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// The replay's id, in [`REPLAY_HEADER`] of every copy.
    pub id: String,
    /// Archived events read in the window.
    pub read: u64,
    /// Of those, the ones the filter took.
    pub matched: u64,
    /// Matched, but delivered according to the attempt log (`--only-undelivered`).
    pub delivered_already: u64,
    /// Published again (in a dry run: that would have been).
    pub published: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(
        "the ladder has no archive ([archive] enabled = false): there is nothing to replay from"
    )]
    NoArchive,
    #[error(
        "--only-undelivered needs the attempt log's stream ([attempts] enabled = false in the ladder)"
    )]
    NoAttemptLog,
    #[error(
        "only_undelivered: the attempt log from the window's start to now names more than {max} \
         envelopes, the most one replay keeps in memory (api.replay_index_max); start the window \
         later, or replay without only_undelivered (receivers deduplicate by id)"
    )]
    IndexFull { max: usize },
    #[error(transparent)]
    Read(#[from] StreamReadError),
    #[error("publishing a replayed event: {0}")]
    Publish(#[from] PublishError),
}

/// What the attempt log says was delivered: envelope ids with a `delivered` record, and each
/// fanned-out event's deliveries.
#[derive(Debug, Default)]
pub struct DeliveredIndex {
    delivered: HashSet<String>,
    fanned_out: HashSet<String>,
    children: HashMap<String, HashSet<String>>,
    /// Ids held, over all three: what its memory grows with.
    ids: usize,
}

impl DeliveredIndex {
    pub fn add(&mut self, record: &AttemptRecord) {
        let Some(id) = &record.envelope else {
            return;
        };
        let added = match record.outcome.as_str() {
            "delivered" => self.delivered.insert(id.clone()),
            "fanned_out" => self.fanned_out.insert(id.clone()),
            _ => false,
        };
        self.ids += usize::from(added);
        if let Some(event) = &record.event {
            let children = self.children.entry(event.clone()).or_insert_with(|| {
                self.ids += 1;
                HashSet::new()
            });
            self.ids += usize::from(children.insert(id.clone()));
        }
    }

    /// Envelope and event ids held.
    pub fn len(&self) -> usize {
        self.ids
    }

    pub fn is_empty(&self) -> bool {
        self.ids == 0
    }

    /// Whether every delivery of envelope `id` succeeded: its own, or, for an event that was
    /// fanned out, each delivery the fan-out made (all of them seen in the log, all delivered).
    pub fn is_delivered(&self, id: &str, fans_out: bool) -> bool {
        if !fans_out {
            return self.delivered.contains(id);
        }
        self.fanned_out.contains(id)
            && self
                .children
                .get(id)
                .is_some_and(|c| !c.is_empty() && c.iter().all(|c| self.delivered.contains(c)))
    }
}

/// What to do with one archived event. (One is made per message and consumed at once, so the
/// size difference between the variants costs nothing worth a box.)
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Decision {
    /// Not selected by the filter.
    Skip,
    /// Selected, but delivered already.
    Delivered,
    /// Publish to the ingress with this routing key and these properties.
    Replay {
        routing_key: String,
        properties: BasicProperties,
    },
}

/// Decides one archived event (pure): its routing key (the tenant) and properties as the
/// producer published them. An event published to fan out, replayed for one subscription,
/// becomes that subscription's delivery with the id the fan-out gave it, so receivers see the
/// same `webhook-id` again.
pub fn decide(
    routing_key: &str,
    properties: &BasicProperties,
    filter: &ReplayFilter,
    delivered: Option<&DeliveredIndex>,
    replay_id: &str,
) -> Decision {
    let Some(id) = properties.message_id().as_ref().map(ShortString::as_str) else {
        return Decision::Skip;
    };
    if filter.tenant.as_deref().is_some_and(|t| t != routing_key)
        || filter.event.as_deref().is_some_and(|e| e != id)
    {
        return Decision::Skip;
    }
    if let Some(types) = &filter.event_type {
        let kind = properties.kind().as_ref().map(ShortString::as_str);
        if !kind.is_some_and(|k| types.matches(k)) {
            return Decision::Skip;
        }
    }
    let headers = properties.headers().as_ref();
    // A fan-out's own delivery (it carries its event's id) is never what a producer published:
    // not an event to replay.
    if header_str(headers, EVENT_ID_HEADER)
        .ok()
        .flatten()
        .is_some()
    {
        return Decision::Skip;
    }
    // Nor is a redrive's copy: the archive keeps it as the ingress took it, but the producer's
    // own publish is the event.
    if read_u64_header(properties, REDRIVES_HEADER).is_some() {
        return Decision::Skip;
    }
    let subscription = header_str(headers, SUBSCRIPTION_HEADER).ok().flatten();
    let (properties, id, fans_out) = match (&filter.subscription, subscription) {
        (Some(wanted), Some(own)) if wanted != own => return Decision::Skip,
        (Some(wanted), None) => {
            let derived = derived_id(id, wanted);
            let props = fanout_properties(properties, &derived, wanted, id);
            (props, derived.as_str().to_owned(), false)
        }
        (_, own) => (properties.clone(), id.to_owned(), own.is_none()),
    };
    if delivered.is_some_and(|d| d.is_delivered(&id, fans_out)) {
        return Decision::Delivered;
    }
    let mut headers = properties.headers().clone().unwrap_or_default();
    headers.insert(
        REPLAY_HEADER.into(),
        AMQPValue::LongString(replay_id.into()),
    );
    Decision::Replay {
        routing_key: routing_key.to_owned(),
        properties: properties.with_headers(headers),
    }
}

/// A replayed publish's wait for its confirm.
type ConfirmWait =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PublishError>> + Send>>;

/// The attempt log's view of what was delivered, from `from` to the log's end now; at most
/// `max` ids of it, else [`ReplayError::IndexFull`].
async fn delivered_since(
    conn: &lapin::Connection,
    ladder: &Ladder,
    from: SystemTime,
    max: Option<usize>,
) -> Result<DeliveredIndex, ReplayError> {
    let stream = ladder.stream(StreamKind::Attempts);
    let mut index = DeliveredIndex::default();
    let Some(end) = end_of(conn, &stream, None).await? else {
        return Ok(index);
    };
    read_window::<ReplayError>(
        conn,
        &stream,
        from,
        end,
        |_| (),
        async |d| {
            for record in AttemptRecord::read_message(&d.data).unwrap_or_default() {
                index.add(&record);
            }
            match max {
                Some(max) if index.len() > max => Err(ReplayError::IndexFull { max }),
                _ => Ok(()),
            }
        },
    )
    .await?;
    Ok(index)
}

/// A new replay id.
pub fn new_id() -> String {
    format!("rpl_{}", &uuid::Uuid::new_v4().simple().to_string()[..16])
}

/// How often (in archived events read) a watcher is told the report so far.
const WATCH_EVERY: u64 = 200;

/// Runs a replay: reads the archive's window and publishes what it selects to the ingress,
/// confirmed, at most `rate` per second. `progress` draws it; `watch` is sent the report as it
/// grows (for the API's replay jobs).
pub async fn replay(
    conn: &lapin::Connection,
    publisher: &Publisher,
    ladder: &Ladder,
    options: &ReplayOptions,
    progress: Option<&Progress>,
    watch: Option<&tokio::sync::watch::Sender<ReplayReport>>,
) -> Result<ReplayReport, ReplayError> {
    if ladder.archive.is_none() {
        return Err(ReplayError::NoArchive);
    }
    if options.only_undelivered && ladder.attempts.is_none() {
        return Err(ReplayError::NoAttemptLog);
    }
    let mut report = ReplayReport {
        id: options.id.clone().unwrap_or_else(new_id),
        ..ReplayReport::default()
    };
    let archive = ladder.stream(StreamKind::Archive);
    let Some(end) = end_of(conn, &archive, options.to).await? else {
        return Ok(report);
    };
    let delivered = if options.only_undelivered {
        Some(delivered_since(conn, ladder, options.from, options.index_max).await?)
    } else {
        None
    };
    let ingress = ladder.ingress();
    let mut pace = options.rate.map(|r| {
        let mut i = tokio::time::interval(r.interval());
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let mut confirms: FuturesUnordered<ConfirmWait> = FuturesUnordered::new();
    let report_ref = &mut report;
    read_window::<ReplayError>(
        conn,
        &archive,
        options.from,
        end,
        |total| {
            if let Some(p) = progress {
                p.set_total(total)
            }
        },
        async |d| {
            report_ref.read += 1;
            match decide(
                d.routing_key.as_str(),
                &d.properties,
                &options.filter,
                delivered.as_ref(),
                &report_ref.id,
            ) {
                Decision::Skip => {}
                Decision::Delivered => {
                    report_ref.matched += 1;
                    report_ref.delivered_already += 1;
                }
                Decision::Replay {
                    routing_key,
                    properties,
                } => {
                    report_ref.matched += 1;
                    if !options.dry_run {
                        if let Some(pace) = pace.as_mut() {
                            pace.tick().await;
                        }
                        while confirms.len() >= WINDOW {
                            if let Some(outcome) = confirms.next().await {
                                outcome?;
                            }
                        }
                        let confirm = publisher
                            .send(&ingress, &routing_key, &d.data, properties, true)
                            .await?;
                        // Boxed: the confirm owns nothing of this message's.
                        let confirm: ConfirmWait = Box::pin(confirm);
                        confirms.push(confirm);
                    }
                    report_ref.published += 1;
                }
            }
            if let Some(w) = watch
                && report_ref.read.is_multiple_of(WATCH_EVERY)
            {
                w.send_replace(report_ref.clone());
            }
            if let Some(p) = progress {
                p.set(
                    report_ref.read,
                    &format!(
                        "{} matched, {} published",
                        report_ref.matched, report_ref.published
                    ),
                );
            }
            Ok(())
        },
    )
    .await?;
    while let Some(outcome) = confirms.next().await {
        outcome?;
    }
    if let Some(w) = watch {
        w.send_replace(report.clone());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::envelope::NewEvent;
    use crate::contract::headers::redrive_properties;
    use crate::contract::headers::replay_of;

    fn archived(id: &str, tenant: &str, subscription: Option<&str>) -> BasicProperties {
        NewEvent {
            id: id.into(),
            tenant: tenant.into(),
            event_type: "order.paid".into(),
            subscription: subscription.map(str::to_owned),
            timestamp: None,
            body: b"{}".to_vec(),
        }
        .properties()
    }

    fn record(envelope: &str, outcome: &str, event: Option<&str>) -> AttemptRecord {
        AttemptRecord {
            envelope: Some(envelope.into()),
            event: event.map(str::to_owned),
            tenant: Some("acme".into()),
            subscription: None,
            attempt: 1,
            status: None,
            error: None,
            latency_ms: None,
            outcome: outcome.into(),
            tier: None,
            lane: "lane".into(),
            redrives: 0,
            replay: None,
            at: String::new(),
        }
    }

    #[test]
    fn the_filter_selects_one_event_by_its_id() {
        let one = ReplayFilter {
            event: Some("evt_2".into()),
            ..Default::default()
        };
        let other = archived("evt_1", "acme", None);
        assert!(matches!(
            decide("acme", &other, &one, None, "rpl_1"),
            Decision::Skip
        ));
        let it = archived("evt_2", "acme", None);
        assert!(matches!(
            decide("acme", &it, &one, None, "rpl_1"),
            Decision::Replay { .. }
        ));
    }

    #[test]
    fn the_filter_selects_by_tenant_type_and_subscription() {
        let all = ReplayFilter::default();
        let p = archived("evt_1", "acme", Some("sub_a"));
        let Decision::Replay {
            routing_key,
            properties,
        } = decide("acme", &p, &all, None, "rpl_1")
        else {
            panic!("replayed")
        };
        assert_eq!(routing_key, "acme");
        assert_eq!(properties.message_id().as_ref().unwrap().as_str(), "evt_1");
        assert_eq!(replay_of(&properties), Some("rpl_1"));

        let other_tenant = ReplayFilter {
            tenant: Some("globex".into()),
            ..ReplayFilter::default()
        };
        assert_eq!(decide("acme", &p, &other_tenant, None, "r"), Decision::Skip);
        let types = ReplayFilter {
            event_type: Some(EventFilter::parse("invoice.*").unwrap()),
            ..ReplayFilter::default()
        };
        assert_eq!(decide("acme", &p, &types, None, "r"), Decision::Skip);
        let orders = ReplayFilter {
            event_type: Some(EventFilter::parse("order.*").unwrap()),
            ..ReplayFilter::default()
        };
        assert!(matches!(
            decide("acme", &p, &orders, None, "r"),
            Decision::Replay { .. }
        ));
        let sub_b = ReplayFilter {
            subscription: Some("sub_b".into()),
            ..ReplayFilter::default()
        };
        assert_eq!(decide("acme", &p, &sub_b, None, "r"), Decision::Skip);
        // A redrive's copy in the archive is not the producer's event.
        assert_eq!(
            decide("acme", &redrive_properties(&p), &all, None, "r"),
            Decision::Skip
        );
    }

    #[test]
    fn a_fan_out_event_replayed_for_one_subscription_keeps_the_id_its_fan_out_gave() {
        let p = archived("evt_fan", "acme", None);
        let sub_b = ReplayFilter {
            subscription: Some("sub_b".into()),
            ..ReplayFilter::default()
        };
        let Decision::Replay { properties, .. } = decide("acme", &p, &sub_b, None, "r") else {
            panic!("replayed")
        };
        let derived = derived_id("evt_fan", "sub_b");
        assert_eq!(
            properties.message_id().as_ref().unwrap().as_str(),
            derived.as_str()
        );
        let h = properties.headers().as_ref();
        assert_eq!(header_str(h, SUBSCRIPTION_HEADER), Ok(Some("sub_b")));
        assert_eq!(header_str(h, EVENT_ID_HEADER), Ok(Some("evt_fan")));
    }

    #[test]
    fn only_what_the_attempt_log_does_not_show_delivered_is_replayed() {
        let mut index = DeliveredIndex::default();
        index.add(&record("evt_ok", "delivered", None));
        index.add(&record("evt_retried", "retried", None));
        index.add(&record("evt_fan", "fanned_out", None));
        let a = derived_id("evt_fan", "sub_a");
        let b = derived_id("evt_fan", "sub_b");
        index.add(&record(a.as_str(), "delivered", Some("evt_fan")));
        index.add(&record(b.as_str(), "exhausted", Some("evt_fan")));
        let all = ReplayFilter::default();
        let p = |id: &str, sub: Option<&str>| archived(id, "acme", sub);
        assert_eq!(
            decide("acme", &p("evt_ok", Some("sub_a")), &all, Some(&index), "r"),
            Decision::Delivered
        );
        assert!(matches!(
            decide(
                "acme",
                &p("evt_retried", Some("sub_a")),
                &all,
                Some(&index),
                "r"
            ),
            Decision::Replay { .. }
        ));
        // One of the fan-out's deliveries failed: the event goes again (the delivered one
        // deduplicates at its receiver), and for that subscription alone only the failed one.
        assert!(matches!(
            decide("acme", &p("evt_fan", None), &all, Some(&index), "r"),
            Decision::Replay { .. }
        ));
        let sub_a = ReplayFilter {
            subscription: Some("sub_a".into()),
            ..ReplayFilter::default()
        };
        assert_eq!(
            decide("acme", &p("evt_fan", None), &sub_a, Some(&index), "r"),
            Decision::Delivered
        );
        index.add(&record(b.as_str(), "delivered", Some("evt_fan")));
        assert_eq!(
            decide("acme", &p("evt_fan", None), &all, Some(&index), "r"),
            Decision::Delivered
        );
    }

    #[test]
    fn the_index_counts_every_id_it_holds_once() {
        let mut index = DeliveredIndex::default();
        assert!(index.is_empty());
        index.add(&record("evt_ok", "delivered", None));
        index.add(&record("evt_ok", "delivered", None));
        index.add(&record("evt_retried", "retried", None));
        assert_eq!(index.len(), 1);
        index.add(&record("evt_fan", "fanned_out", None));
        // A fan-out's delivery: its own id twice (delivered, a child) and its event's once.
        let a = derived_id("evt_fan", "sub_a");
        index.add(&record(a.as_str(), "delivered", Some("evt_fan")));
        assert_eq!(index.len(), 5);
        let b = derived_id("evt_fan", "sub_b");
        index.add(&record(b.as_str(), "retried", Some("evt_fan")));
        assert_eq!(index.len(), 6);
    }
}
