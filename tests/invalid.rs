//! Messages that break the contract, published by a client that is not ours (raw lapin): each
//! lands in the dead sink with reason `invalid` and a readable error, and good messages published
//! among them are delivered.

mod common;

use std::time::Duration;

use common::{RunningWorker, TestLadder, ok_receiver, secret, subscription};
use hookrelay::contract::headers;
use hookrelay::contract::headers::{LAST_ERROR_HEADER, REASON_HEADER, SUBSCRIPTION_HEADER};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};

fn props(id: Option<&str>, kind: Option<&str>, subscription: Option<AMQPValue>) -> BasicProperties {
    let mut p = BasicProperties::default().with_delivery_mode(2);
    if let Some(id) = id {
        p = p.with_message_id(id.into());
    }
    if let Some(kind) = kind {
        p = p.with_type(kind.into());
    }
    let mut headers = FieldTable::default();
    if let Some(s) = subscription {
        headers.insert(SUBSCRIPTION_HEADER.into(), s);
    }
    p.with_headers(headers)
}

fn sub(id: &str) -> Option<AMQPValue> {
    Some(AMQPValue::LongString(id.into()))
}

async fn raw_publish(ch: &Channel, exchange: &str, key: &str, body: &[u8], p: BasicProperties) {
    let confirm = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            body,
            p,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack() && confirm.take_message().is_none());
}

#[tokio::test]
async fn every_kind_of_invalid_message_is_dead_lettered_while_good_ones_flow() {
    let t = TestLadder::apply("invalid", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let mut orders = subscription("sub_orders", "acme", &receiver.url("/"), &s);
    orders.event_types = Some(vec![
        hookrelay::delivery::subscriptions::EventFilter::Prefix("order.".into()),
    ]);
    let mut config = t.config.clone();
    config.limits.max_body_bytes = 1024;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![
            orders,
            subscription("sub_other", "globex", &receiver.url("/"), &s),
        ],
    )
    .await;

    let ch = t.conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let ingress = t.ladder.ingress();
    let good = br#"{"ok":true}"#;
    let mut absurd = FieldTable::default();
    absurd.insert(
        SUBSCRIPTION_HEADER.into(),
        AMQPValue::LongString("sub_orders".into()),
    );
    absurd.insert(
        headers::ATTEMPTS_HEADER.into(),
        AMQPValue::LongLongInt(1 << 40),
    );

    // (id, routing key, body, properties, expected error text)
    let cases: Vec<(&str, &str, Vec<u8>, BasicProperties, &str)> = vec![
        (
            "",
            "acme",
            good.to_vec(),
            props(None, Some("order.paid"), sub("sub_orders")),
            "message_id is missing",
        ),
        (
            "bad.id",
            "acme",
            good.to_vec(),
            props(Some("bad.id"), Some("order.paid"), sub("sub_orders")),
            "is not an envelope id",
        ),
        (
            "long",
            "acme",
            good.to_vec(),
            props(
                Some(&"x".repeat(129)),
                Some("order.paid"),
                sub("sub_orders"),
            ),
            "is not an envelope id",
        ),
        (
            "no_type",
            "acme",
            good.to_vec(),
            props(Some("no_type"), None, sub("sub_orders")),
            "type (the event type) is missing",
        ),
        (
            "int_sub",
            "acme",
            good.to_vec(),
            props(
                Some("int_sub"),
                Some("order.paid"),
                Some(AMQPValue::LongLongInt(7)),
            ),
            "header x-subscription must be a string",
        ),
        (
            "unknown_sub",
            "acme",
            good.to_vec(),
            props(Some("unknown_sub"), Some("order.paid"), sub("sub_nope")),
            "unknown subscription \"sub_nope\"",
        ),
        (
            "other_tenant",
            "acme",
            good.to_vec(),
            props(Some("other_tenant"), Some("order.paid"), sub("sub_other")),
            "belongs to tenant \"globex\"",
        ),
        (
            "not_json",
            "acme",
            b"{oops".to_vec(),
            props(Some("not_json"), Some("order.paid"), sub("sub_orders")),
            "body is not JSON",
        ),
        (
            "not_utf8",
            "acme",
            vec![0xff, 0xfe, 0x00],
            props(Some("not_utf8"), Some("order.paid"), sub("sub_orders")),
            "body is not JSON",
        ),
        (
            "too_big",
            "acme",
            format!("\"{}\"", "a".repeat(2000)).into_bytes(),
            props(Some("too_big"), Some("order.paid"), sub("sub_orders")),
            "over the 1024-byte limit",
        ),
        (
            "absurd",
            "acme",
            good.to_vec(),
            props(Some("absurd"), Some("order.paid"), None).with_headers(absurd),
            "x-hookrelay-attempts",
        ),
    ];
    let mut expected = std::collections::HashMap::new();
    for (i, (label, key, body, p, error)) in cases.into_iter().enumerate() {
        raw_publish(&ch, &ingress, key, &body, p).await;
        expected.insert(label.to_owned(), error);
        let id = format!("good_{i}");
        raw_publish(
            &ch,
            &ingress,
            "acme",
            good,
            props(Some(&id), Some("order.paid"), sub("sub_orders")),
        )
        .await;
    }
    // Straight onto the lane through the default exchange: the routing key is not a tenant.
    raw_publish(
        &ch,
        "",
        &t.ladder.first_lane(),
        good,
        props(Some("direct"), Some("order.paid"), sub("sub_orders")),
    )
    .await;
    expected.insert("direct".into(), "is not a tenant id");

    assert!(
        receiver
            .wait_until(Duration::from_secs(20), |r| r.delivered_count() == 11)
            .await
    );
    assert!(
        t.wait_dead(expected.len() as u32, Duration::from_secs(20))
            .await
    );
    worker.stop().await;

    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), expected.len());
    for m in &dead {
        let p = &m.delivery.properties;
        let id = p.message_id().as_ref().map_or("", |s| s.as_str());
        let label = if id.len() > 100 { "long" } else { id };
        let error = headers::read_str_header(p, LAST_ERROR_HEADER).unwrap();
        assert_eq!(
            headers::read_str_header(p, REASON_HEADER).as_deref(),
            Some("invalid"),
            "{label}: {error}"
        );
        let want = expected
            .get(label)
            .unwrap_or_else(|| panic!("unexpected dead message {label:?}"));
        assert!(error.contains(want), "{label}: {error:?} lacks {want:?}");
    }
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 0);
}
