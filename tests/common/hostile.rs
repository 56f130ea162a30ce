//! Messages that break the contract, as a client that is not ours could publish them: one table
//! for the test that reads each one's reason (`tests/invalid.rs`) and for the fault suite's flood
//! (`tests/faults/hostile.rs`). Each must end in the dead sink as `invalid`, with its error.

use hookrelay::contract::headers::{
    ATTEMPTS_HEADER, DUE_HEADER, EVENT_ID_HEADER, LAST_ERROR_HEADER, REASON_HEADER,
    SUBSCRIPTION_HEADER, TENANT_HEADER,
};
use hookrelay::contract::ladder::Ladder;
use hookrelay::subscriptions::{EventFilter, Subscription};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use hookrelay_tools::receiver::Receiver;

use super::{RunningWorker, Secret, TestLadder, subscription};

/// The body limit the worker runs with for the table (one message is over it).
pub const MAX_BODY: usize = 1024;
/// The tenant the table publishes as.
pub const TENANT: &str = "acme";
/// The tenant's subscription (event types `order.*`), for the table and for good traffic.
pub const SUBSCRIPTION: &str = "sub_orders";
/// A subscription of another tenant.
pub const OTHER_TENANTS: &str = "sub_other";

/// The subscriptions the table is written against, both to `url`.
pub fn subscriptions(url: &str, secret: &Secret) -> Vec<Subscription> {
    let mut orders = subscription(SUBSCRIPTION, TENANT, url, secret);
    orders.event_types = Some(vec![EventFilter::Prefix("order.".into())]);
    vec![orders, subscription(OTHER_TENANTS, "globex", url, secret)]
}

/// A worker set up for the table: its body limit and its subscriptions, to `receiver`.
pub async fn start_worker(t: &TestLadder, receiver: &Receiver, secret: &Secret) -> RunningWorker {
    let mut config = t.config.clone();
    config.limits.max_body_bytes = MAX_BODY;
    RunningWorker::start_with(t, config, subscriptions(&receiver.url("/"), secret)).await
}

/// RabbitMQ's default `frame_max`, which the test broker keeps: the largest frame it takes, the
/// content header (every property, headers included) among them.
pub const FRAME_MAX: usize = 131_072;

/// The size of the content-header frame `properties` travel in, encoded as the AMQP client
/// encodes them; counted here independently of hookrelay's own arithmetic.
pub fn content_header_frame_len(properties: &BasicProperties) -> usize {
    let (encoded, _) = lapin::protocol::basic::gen_properties(properties)(Vec::new().into())
        .expect("properties encode")
        .into_inner();
    // Frame type, channel and size; class, weight and body size; the frame-end octet.
    encoded.len() + 7 + 12 + 1
}

/// The encoded size of a header table, its length prefix included.
pub fn table_len(table: &FieldTable) -> usize {
    let (encoded, _) = lapin::types::generation::gen_field_table(table)(Vec::new().into())
        .expect("the table encodes")
        .into_inner();
    encoded.len()
}

/// The size of the header table of `properties`.
pub fn headers_len(properties: &BasicProperties) -> usize {
    table_len(&properties.headers().clone().unwrap_or_default())
}

/// `properties` with a header `x-padding` sized so that `measure` of them is `len` bytes (each
/// byte of padding weighs one).
pub fn padded_to(
    properties: &BasicProperties,
    measure: fn(&BasicProperties) -> usize,
    len: usize,
) -> BasicProperties {
    let with = |n: usize| {
        let mut headers = properties.headers().clone().unwrap_or_default();
        headers.insert(
            "x-padding".into(),
            AMQPValue::LongString("p".repeat(n).into()),
        );
        properties.clone().with_headers(headers)
    };
    let padded = with(len - measure(&with(0)));
    assert_eq!(measure(&padded), len);
    padded
}

/// The start of the queue name the table's forged `x-death` names.
pub const FORGED_QUEUE: &str = "forged_queue";

/// An `x-death` header of the broker's shape whose latest entry names `queue`.
fn forged_death(queue: &str) -> AMQPValue {
    let mut entry = FieldTable::default();
    entry.insert("queue".into(), AMQPValue::LongString(queue.into()));
    entry.insert("reason".into(), AMQPValue::LongString("expired".into()));
    entry.insert("count".into(), AMQPValue::LongLongInt(1));
    AMQPValue::FieldArray(vec![AMQPValue::FieldTable(entry)].into())
}

/// One hostile message, ready to publish.
pub struct Hostile {
    pub label: &'static str,
    /// Its `message_id`, when it has one.
    pub id: Option<String>,
    pub exchange: String,
    pub routing_key: String,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
    /// What the dead letter's last error contains.
    pub error: String,
}

/// What varies from one hostile message to the next; [`table`] starts each from a good one.
struct Draft {
    id: Option<String>,
    kind: Option<&'static str>,
    headers: Vec<(&'static str, AMQPValue)>,
    /// Exchange and routing key.
    target: (String, String),
    body: Vec<u8>,
}

/// Every kind of hostile message, each with an id made from `id` (a valid envelope id), aimed
/// at `ladder`.
pub fn table(id: &str, ladder: &Ladder) -> Vec<Hostile> {
    let text = |s: &str| AMQPValue::LongString(s.into());
    let bad_header = |header: &str, expected: &str| format!("header {header} must be {expected}");
    // Through the default exchange, straight onto a queue: the routing key is the queue's name.
    let onto = |queue: String| (String::new(), queue);
    // A good message of the tenant's subscription, with an id naming its kind.
    let good = |label: &str| Draft {
        id: Some(format!("{id}_{label}")),
        kind: Some("order.paid"),
        headers: vec![],
        target: (ladder.ingress(), TENANT.to_owned()),
        body: br#"{"ok":true}"#.to_vec(),
    };
    let padded = |label: &str, len: usize| {
        Some(format!("{id}_{label}_{}", "x".repeat(len))[..len].to_owned())
    };
    let cases: Vec<(&'static str, Draft, String)> = vec![
        (
            "no_id",
            Draft {
                id: None,
                ..good("no_id")
            },
            "message_id is missing".into(),
        ),
        (
            "dotted_id",
            Draft {
                id: Some(format!("{id}.dotted")),
                ..good("dotted_id")
            },
            "is not an envelope id".into(),
        ),
        (
            "long_id",
            Draft {
                id: padded("long_id", 129),
                ..good("long_id")
            },
            "is not an envelope id".into(),
        ),
        (
            "longest_id",
            Draft {
                id: padded("longest_id", 255),
                ..good("longest_id")
            },
            "is not an envelope id".into(),
        ),
        (
            "no_type",
            Draft {
                kind: None,
                ..good("no_type")
            },
            "type (the event type) is missing".into(),
        ),
        (
            "integer_subscription",
            Draft {
                headers: vec![(SUBSCRIPTION_HEADER, AMQPValue::LongLongInt(7))],
                ..good("integer_subscription")
            },
            bad_header(SUBSCRIPTION_HEADER, "a string"),
        ),
        (
            "array_subscription",
            Draft {
                headers: vec![(
                    SUBSCRIPTION_HEADER,
                    AMQPValue::FieldArray(vec![AMQPValue::Boolean(true)].into()),
                )],
                ..good("array_subscription")
            },
            bad_header(SUBSCRIPTION_HEADER, "a string"),
        ),
        (
            "unknown_subscription",
            Draft {
                headers: vec![(SUBSCRIPTION_HEADER, text("sub_nope"))],
                ..good("unknown_subscription")
            },
            "unknown subscription \"sub_nope\"".into(),
        ),
        (
            "other_tenant",
            Draft {
                headers: vec![(SUBSCRIPTION_HEADER, text(OTHER_TENANTS))],
                ..good("other_tenant")
            },
            "belongs to tenant \"globex\"".into(),
        ),
        (
            "not_json",
            Draft {
                body: b"{oops".to_vec(),
                ..good("not_json")
            },
            "body is not JSON".into(),
        ),
        (
            "not_utf8",
            Draft {
                body: vec![0xff, 0xfe, 0x00],
                ..good("not_utf8")
            },
            "body is not JSON".into(),
        ),
        (
            "too_big",
            Draft {
                body: format!("\"{}\"", "a".repeat(2 * MAX_BODY)).into_bytes(),
                ..good("too_big")
            },
            format!("over the {MAX_BODY}-byte limit"),
        ),
        (
            "absurd_attempts",
            Draft {
                headers: vec![(ATTEMPTS_HEADER, AMQPValue::LongLongInt(1 << 40))],
                ..good("absurd_attempts")
            },
            bad_header(ATTEMPTS_HEADER, "an attempt count hookrelay wrote"),
        ),
        (
            "forged_tenant",
            Draft {
                headers: vec![
                    (TENANT_HEADER, AMQPValue::LongLongInt(7)),
                    (REASON_HEADER, text("forged")),
                ],
                ..good("forged_tenant")
            },
            bad_header(TENANT_HEADER, "a string"),
        ),
        (
            // On acme's lane, claiming to be globex's, to globex's subscription.
            "forged_tenant_name",
            Draft {
                headers: vec![
                    (TENANT_HEADER, text("globex")),
                    (SUBSCRIPTION_HEADER, text(OTHER_TENANTS)),
                ],
                ..good("forged_tenant_name")
            },
            "header x-hookrelay-tenant \"globex\" disagrees with the routing key \"acme\"".into(),
        ),
        (
            // Straight onto the retry lane, naming a tenant its routing key (the lane's name)
            // does not.
            "tenant_onto_the_retry_lane",
            Draft {
                headers: vec![
                    (TENANT_HEADER, text(TENANT)),
                    (ATTEMPTS_HEADER, AMQPValue::LongLongInt(1)),
                ],
                target: onto(ladder.retry_lane()),
                ..good("tenant_onto_the_retry_lane")
            },
            "disagrees with the routing key".into(),
        ),
        (
            // An unknown subscription on a first attempt, dressed as a fan-out delivery.
            "forged_event_id",
            Draft {
                headers: vec![
                    (SUBSCRIPTION_HEADER, text("sub_nope")),
                    (EVENT_ID_HEADER, text("evt_forged")),
                ],
                ..good("forged_event_id")
            },
            format!("header {EVENT_ID_HEADER}"),
        ),
        (
            // The same, dressed as a retry.
            "forged_attempts",
            Draft {
                headers: vec![
                    (SUBSCRIPTION_HEADER, text("sub_nope")),
                    (ATTEMPTS_HEADER, AMQPValue::LongLongInt(3)),
                ],
                ..good("forged_attempts")
            },
            "never on a first attempt".into(),
        ),
        (
            // Onto the retry lane through the promote exchange, as a promotion would come, with
            // an `x-death` naming a queue no ladder has (a metric label, if believed).
            "forged_death",
            Draft {
                headers: vec![
                    (TENANT_HEADER, text(TENANT)),
                    (ATTEMPTS_HEADER, AMQPValue::LongLongInt(1)),
                    (SUBSCRIPTION_HEADER, text(OTHER_TENANTS)),
                    ("x-death", forged_death(&format!("{FORGED_QUEUE}_{id}"))),
                ],
                target: (
                    ladder.promote_exchange(),
                    ladder.tier_routing_key(ladder.tier_at(0).expect("a tier"), TENANT),
                ),
                ..good("forged_death")
            },
            "belongs to tenant \"globex\"".into(),
        ),
        (
            // A header table over the read limit (64 KiB), well within the broker's frame.
            "oversized_headers",
            Draft {
                headers: vec![("x-padding", text(&"p".repeat(70_000)))],
                ..good("oversized_headers")
            },
            "over the 65536-byte limit".into(),
        ),
        (
            // One of hookrelay's own headers, far longer than hookrelay ever writes it.
            "long_own_header",
            Draft {
                headers: vec![(LAST_ERROR_HEADER, text(&"e".repeat(5_000)))],
                ..good("long_own_header")
            },
            format!("header {LAST_ERROR_HEADER} takes"),
        ),
        (
            "onto_the_lane",
            Draft {
                target: onto(ladder.first_lane()),
                ..good("onto_the_lane")
            },
            "is not a tenant id".into(),
        ),
        (
            "forged_retry",
            Draft {
                headers: vec![(ATTEMPTS_HEADER, AMQPValue::LongLongInt(i64::MAX))],
                target: onto(ladder.retry_lane()),
                ..good("forged_retry")
            },
            "is not a tenant id".into(),
        ),
        (
            "forged_due",
            Draft {
                headers: vec![
                    (DUE_HEADER, text("yesterday")),
                    ("x-death", text("forged")),
                    (TENANT_HEADER, text(TENANT)),
                ],
                // As a promotion comes: the tenant agrees with the routing key.
                target: (
                    ladder.promote_exchange(),
                    ladder.tier_routing_key(ladder.tier_at(0).expect("a tier"), TENANT),
                ),
                ..good("forged_due")
            },
            bad_header(DUE_HEADER, "an integer"),
        ),
    ];
    cases
        .into_iter()
        .map(|(label, draft, error)| {
            let mut headers = FieldTable::default();
            headers.insert(SUBSCRIPTION_HEADER.into(), text(SUBSCRIPTION));
            for (name, value) in draft.headers {
                headers.insert(name.into(), value);
            }
            let mut properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_headers(headers);
            if let Some(id) = &draft.id {
                properties = properties.with_message_id(id.as_str().into());
            }
            if let Some(kind) = draft.kind {
                properties = properties.with_type(kind.into());
            }
            Hostile {
                label,
                id: draft.id,
                exchange: draft.target.0,
                routing_key: draft.target.1,
                body: draft.body,
                properties,
                error,
            }
        })
        .collect()
}
