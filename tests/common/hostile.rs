//! Messages that break the contract, as a client that is not ours could publish them: one table
//! for the test that reads each one's reason (`tests/invalid.rs`) and for the fault suite's flood
//! (`tests/faults/hostile.rs`). Each must end in the dead sink as `invalid`, with its error.

use hookrelay::broker::topology::Ladder;
use hookrelay::contract::envelope::{
    ATTEMPTS_HEADER, DUE_HEADER, REASON_HEADER, SUBSCRIPTION_HEADER, TENANT_HEADER,
};
use hookrelay::delivery::subscriptions::{EventFilter, Subscription};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};

use super::{Secret, subscription};

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

/// Every kind of hostile message, each with an id made from `id` (a valid envelope id), aimed
/// at `ladder`.
pub fn table(id: &str, ladder: &Ladder) -> Vec<Hostile> {
    let good = br#"{"ok":true}"#.to_vec();
    let text = |s: &str| AMQPValue::LongString(s.into());
    let headers = |extra: Vec<(&str, AMQPValue)>| {
        let mut headers = FieldTable::default();
        headers.insert(SUBSCRIPTION_HEADER.into(), text(SUBSCRIPTION));
        for (name, value) in extra {
            headers.insert(name.into(), value);
        }
        headers
    };
    let padded =
        |label: &str, len: usize| format!("{id}_{label}_{}", "x".repeat(len))[..len].to_owned();
    let ingress = (ladder.ingress(), TENANT.to_owned());
    // Through the default exchange, straight onto a queue: the routing key is the queue's name.
    let queue = |name: String| (String::new(), name);
    let bad_header = |header: &str, expected: &str| format!("header {header} must be {expected}");

    let case = |label: &'static str,
                id: Option<String>,
                kind: Option<&str>,
                headers: FieldTable,
                (exchange, routing_key): (String, String),
                body: Vec<u8>,
                error: String| {
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = &id {
            properties = properties.with_message_id(id.as_str().into());
        }
        if let Some(kind) = kind {
            properties = properties.with_type(kind.into());
        }
        Hostile {
            label,
            id,
            exchange,
            routing_key,
            body,
            properties,
            error,
        }
    };
    vec![
        case(
            "no_id",
            None,
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            good.clone(),
            "message_id is missing".into(),
        ),
        case(
            "dotted_id",
            Some(format!("{id}.dotted")),
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            good.clone(),
            "is not an envelope id".into(),
        ),
        case(
            "long_id",
            Some(padded("long_id", 129)),
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            good.clone(),
            "is not an envelope id".into(),
        ),
        case(
            "longest_id",
            Some(padded("longest_id", 255)),
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            good.clone(),
            "is not an envelope id".into(),
        ),
        case(
            "no_type",
            Some(format!("{id}_no_type")),
            None,
            headers(vec![]),
            ingress.clone(),
            good.clone(),
            "type (the event type) is missing".into(),
        ),
        case(
            "integer_subscription",
            Some(format!("{id}_integer_subscription")),
            Some("order.paid"),
            headers(vec![(SUBSCRIPTION_HEADER, AMQPValue::LongLongInt(7))]),
            ingress.clone(),
            good.clone(),
            bad_header(SUBSCRIPTION_HEADER, "a string"),
        ),
        case(
            "array_subscription",
            Some(format!("{id}_array_subscription")),
            Some("order.paid"),
            headers(vec![(
                SUBSCRIPTION_HEADER,
                AMQPValue::FieldArray(vec![AMQPValue::Boolean(true)].into()),
            )]),
            ingress.clone(),
            good.clone(),
            bad_header(SUBSCRIPTION_HEADER, "a string"),
        ),
        case(
            "unknown_subscription",
            Some(format!("{id}_unknown_subscription")),
            Some("order.paid"),
            headers(vec![(SUBSCRIPTION_HEADER, text("sub_nope"))]),
            ingress.clone(),
            good.clone(),
            "unknown subscription \"sub_nope\"".into(),
        ),
        case(
            "other_tenant",
            Some(format!("{id}_other_tenant")),
            Some("order.paid"),
            headers(vec![(SUBSCRIPTION_HEADER, text(OTHER_TENANTS))]),
            ingress.clone(),
            good.clone(),
            "belongs to tenant \"globex\"".into(),
        ),
        case(
            "not_json",
            Some(format!("{id}_not_json")),
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            b"{oops".to_vec(),
            "body is not JSON".into(),
        ),
        case(
            "not_utf8",
            Some(format!("{id}_not_utf8")),
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            vec![0xff, 0xfe, 0x00],
            "body is not JSON".into(),
        ),
        case(
            "too_big",
            Some(format!("{id}_too_big")),
            Some("order.paid"),
            headers(vec![]),
            ingress.clone(),
            format!("\"{}\"", "a".repeat(2 * MAX_BODY)).into_bytes(),
            format!("over the {MAX_BODY}-byte limit"),
        ),
        case(
            "absurd_attempts",
            Some(format!("{id}_absurd_attempts")),
            Some("order.paid"),
            headers(vec![(ATTEMPTS_HEADER, AMQPValue::LongLongInt(1 << 40))]),
            ingress.clone(),
            good.clone(),
            bad_header(ATTEMPTS_HEADER, "an attempt count hookrelay wrote"),
        ),
        case(
            "forged_tenant",
            Some(format!("{id}_forged_tenant")),
            Some("order.paid"),
            headers(vec![
                (TENANT_HEADER, AMQPValue::LongLongInt(7)),
                (REASON_HEADER, text("forged")),
            ]),
            ingress.clone(),
            good.clone(),
            bad_header(TENANT_HEADER, "a string"),
        ),
        case(
            "onto_the_lane",
            Some(format!("{id}_onto_the_lane")),
            Some("order.paid"),
            headers(vec![]),
            queue(ladder.first_lane()),
            good.clone(),
            "is not a tenant id".into(),
        ),
        case(
            "forged_retry",
            Some(format!("{id}_forged_retry")),
            Some("order.paid"),
            headers(vec![(ATTEMPTS_HEADER, AMQPValue::LongLongInt(i64::MAX))]),
            queue(ladder.retry_lane()),
            good.clone(),
            "is not a tenant id".into(),
        ),
        case(
            "forged_due",
            Some(format!("{id}_forged_due")),
            Some("order.paid"),
            headers(vec![
                (DUE_HEADER, text("yesterday")),
                ("x-death", text("forged")),
                (TENANT_HEADER, text(TENANT)),
            ]),
            queue(ladder.retry_lane()),
            good,
            bad_header(DUE_HEADER, "an integer"),
        ),
    ]
}
