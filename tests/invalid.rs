//! Messages that break the contract (the table in `common::hostile`), published by a client that
//! is not ours (raw lapin): each lands in the dead sink with reason `invalid` and a readable
//! error, and good messages published among them are delivered.

mod common;

use std::time::Duration;

use common::{TestLadder, hostile, ok_receiver, secret};
use hookrelay::contract::headers;
use hookrelay::contract::headers::{LAST_ERROR_HEADER, REASON_HEADER};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};

fn good_properties(id: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        headers::SUBSCRIPTION_HEADER.into(),
        AMQPValue::LongString(hostile::SUBSCRIPTION.into()),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(id.into())
        .with_type("order.paid".into())
        .with_headers(headers)
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

/// A channel in confirm mode, for [`raw_publish`].
async fn confirming(t: &TestLadder) -> Channel {
    let ch = t.conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    ch
}

/// Publishes `properties` with a good body to the ingress as the table's tenant.
async fn to_ingress(ch: &Channel, t: &TestLadder, properties: BasicProperties) {
    let good = br#"{"ok":true}"#;
    raw_publish(ch, &t.ladder.ingress(), hostile::TENANT, good, properties).await;
}

#[tokio::test]
async fn every_kind_of_invalid_message_is_dead_lettered_while_good_ones_flow() {
    let t = TestLadder::apply("invalid", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = hostile::start_worker(&t, &receiver, &s).await;

    let ch = confirming(&t).await;
    // Each hostile message's id ("" for none) and the error its dead letter must carry.
    let mut expected = std::collections::HashMap::new();
    for (i, m) in hostile::table("bad", &t.ladder).into_iter().enumerate() {
        raw_publish(&ch, &m.exchange, &m.routing_key, &m.body, m.properties).await;
        expected.insert(m.id.unwrap_or_default(), (m.label, m.error));
        to_ingress(&ch, &t, good_properties(&format!("good_{i}"))).await;
    }

    assert!(
        receiver
            .wait_until(Duration::from_secs(20), |r| r.delivered_count()
                == expected.len())
            .await
    );
    assert!(
        t.wait_dead(expected.len() as u32, Duration::from_secs(20))
            .await
    );
    let metrics = worker.metrics.clone();
    worker.stop().await;
    // A queue name found in a message is never a metric label.
    let rendered = metrics.render();
    assert!(
        !rendered.contains(hostile::FORGED_QUEUE),
        "{}",
        rendered
            .lines()
            .filter(|l| l.contains(hostile::FORGED_QUEUE))
            .collect::<Vec<_>>()
            .join("\n")
    );

    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), expected.len());
    for m in &dead {
        let p = &m.delivery.properties;
        let id = p.message_id().as_ref().map_or("", |s| s.as_str());
        let error = headers::read_str_header(p, LAST_ERROR_HEADER).unwrap();
        let (label, want) = expected
            .get(id)
            .unwrap_or_else(|| panic!("unexpected dead message {id:?}"));
        assert_eq!(
            headers::read_str_header(p, REASON_HEADER).as_deref(),
            Some("invalid"),
            "{label}: {error}"
        );
        assert!(error.contains(want), "{label}: {error:?} lacks {want:?}");
    }
    assert_eq!(receiver.duplicates(), 0);
    // Nothing hostile reached an endpoint (a forged tenant, say, to another tenant's).
    let reached: Vec<String> = receiver
        .records()
        .into_iter()
        .map(|r| r.id)
        .filter(|id| !id.starts_with("good_"))
        .collect();
    assert!(reached.is_empty(), "{reached:?}");
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 0);
}

/// A message with a tenant header of 300 bytes is invalid; `redrive` must leave it in the sink
/// with a reason instead of using the header as a routing key (over 255 bytes, the AMQP client
/// panics), and move the rest.
#[tokio::test]
async fn redrive_keeps_a_message_whose_tenant_header_is_no_tenant_and_moves_the_rest() {
    let t = TestLadder::apply("longtenant", &["300ms"], &["300ms"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = hostile::start_worker(&t, &receiver, &s).await;
    let ch = confirming(&t).await;
    let long = good_properties("long_tenant");
    let mut h = long.headers().clone().unwrap();
    h.insert(
        headers::TENANT_HEADER.into(),
        AMQPValue::LongString("t".repeat(300).into()),
    );
    to_ingress(&ch, &t, long.with_headers(h)).await;
    // Invalid too, but with a tenant it can be routed by.
    let mut unknown = good_properties("unknown_sub");
    let mut h = unknown.headers().clone().unwrap();
    h.insert(
        headers::SUBSCRIPTION_HEADER.into(),
        AMQPValue::LongString("sub_nope".into()),
    );
    unknown = unknown.with_headers(h);
    to_ingress(&ch, &t, unknown).await;
    assert!(t.wait_dead(2, Duration::from_secs(20)).await);
    worker.stop().await;

    let (code, out, err) =
        common::hookrelay(&["redrive", "--ladder", ladder.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("moved 1"), "{out}");
    // The dead copy of an invalid message no longer keeps a tenant header it came with, and
    // redrive checks the one a sink may still hold (`ops::redrive`'s unit tests): either way the
    // message stays, with a reason.
    assert!(out.contains("stayed: 1 ("), "{out}");
    assert!(t.wait_dead(1, Duration::from_secs(20)).await);
    let left = common::message_ids(&t.drain_dead().await);
    assert_eq!(left, ["long_tenant"]);
    assert_eq!(
        t.depth(&t.ladder.first_lane()).await,
        1,
        "the other was redriven"
    );
}

/// A producer's headers may fill a frame almost to the broker's `frame_max`; what hookrelay
/// republishes adds its own headers, and a content header over `frame_max` makes the broker
/// close the publishing connection. Such a message is `invalid` (its header table is over the
/// read limit), its dead copy leaves the producer's headers out and says so, and a message just
/// under the read limit is carried whole into its dead copy: no republish fails, nothing loops,
/// and the traffic around them is delivered.
#[tokio::test]
async fn headers_near_the_frame_limit_are_dead_lettered_and_every_republish_fits() {
    let t = TestLadder::apply("frames", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver =
        hookrelay_tools::receiver::Receiver::start(std::slice::from_ref(&s.whsec), |req| {
            hookrelay_tools::receiver::Reply::Status(if req.id.starts_with("good_") {
                204
            } else {
                400
            })
        })
        .await
        .unwrap();
    let worker = hostile::start_worker(&t, &receiver, &s).await;
    let ch = confirming(&t).await;
    // Just under the broker's limit: the broker takes it; as it is, no copy of it with more
    // headers could be published.
    let huge = hostile::padded_to(
        &good_properties("huge_headers"),
        hostile::content_header_frame_len,
        hostile::FRAME_MAX - 16,
    );
    // Just under the read limit (64 KiB of encoded header table): a valid envelope, rejected by
    // its endpoint (400), whose dead copy carries every header it came with.
    let limit = 65_536;
    assert_eq!(limit, headers::MAX_HEADER_TABLE_BYTES);
    let near = hostile::padded_to(
        &good_properties("near_limit"),
        hostile::headers_len,
        limit - 16,
    );
    for i in 0..10 {
        to_ingress(&ch, &t, good_properties(&format!("good_{i}"))).await;
        if i == 3 {
            to_ingress(&ch, &t, huge.clone()).await;
        }
        if i == 6 {
            to_ingress(&ch, &t, near.clone()).await;
        }
    }
    assert!(
        receiver
            .wait_until(Duration::from_secs(30), |r| r.delivered_count() == 10)
            .await
    );
    assert!(t.wait_dead(2, Duration::from_secs(30)).await);
    // And traffic after them.
    for i in 10..20 {
        to_ingress(&ch, &t, good_properties(&format!("good_{i}"))).await;
    }
    assert!(
        receiver
            .wait_until(Duration::from_secs(30), |r| r.delivered_count() == 20)
            .await
    );
    let metrics = worker.metrics.clone();
    worker.stop().await;
    // Each republish confirmed at its first try: none failed, none was returned to its lane.
    let failures = metrics.render();
    assert!(
        !failures.contains("hookrelay_republish_failures_total{"),
        "{failures}"
    );
    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), 2);
    for m in &dead {
        let p = &m.delivery.properties;
        assert!(hostile::content_header_frame_len(p) <= hostile::FRAME_MAX);
        let id = p.message_id().as_ref().unwrap().as_str();
        let reason = headers::read_str_header(p, REASON_HEADER).unwrap();
        let error = headers::read_str_header(p, LAST_ERROR_HEADER).unwrap();
        let has_padding = p
            .headers()
            .as_ref()
            .is_some_and(|h| h.inner().contains_key("x-padding"));
        let dropped = headers::read_str_header(p, "x-hookrelay-headers-dropped");
        match id {
            "huge_headers" => {
                assert_eq!(reason, "invalid");
                assert!(
                    error.contains(&format!("over the {limit}-byte limit")),
                    "{error}"
                );
                assert!(!has_padding);
                let dropped = dropped.unwrap();
                assert!(dropped.contains("x-padding"), "{dropped}");
                // What it was sent to is still readable.
                assert_eq!(
                    headers::read_str_header(p, headers::SUBSCRIPTION_HEADER).as_deref(),
                    Some(hostile::SUBSCRIPTION)
                );
            }
            "near_limit" => {
                assert_eq!(reason, "rejected", "{error}");
                assert!(has_padding);
                assert_eq!(dropped, None);
            }
            other => panic!("unexpected dead message {other}"),
        }
    }
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 0);
}
