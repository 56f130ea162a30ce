//! Signed delivery, the retry ladder and the dead sink, end to end on the real broker.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{Counters, RunningWorker, TestLadder, event, ok_receiver, secret, subscription};
use hookrelay::contract::headers;
use hookrelay::contract::headers::{
    ATTEMPTS_HEADER, LAST_ERROR_HEADER, REASON_HEADER, STATUS_HEADER,
};
use hookrelay_tools::receiver::{Receiver, Reply};

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_delivery_verifies_with_the_standardwebhooks_crate() {
    let t = TestLadder::apply("signed", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = RunningWorker::start(
        &t,
        vec![subscription("sub_a", "acme", &receiver.url("/hook"), &s)],
    )
    .await;
    let e = event("evt_signed_1", "acme", "sub_a");
    t.publish(&e).await;

    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    let record = &receiver.records()[0];
    assert_eq!(record.verified_with, vec![true]);
    assert_eq!(record.id, "evt_signed_1");
    assert_eq!(record.idempotency_key, "evt_signed_1");
    assert_eq!(record.attempt, 1);
    assert_eq!(record.path, "/hook");
    assert_eq!(&record.body[..], &e.body[..]);
    worker.stop().await;
    assert_eq!(
        t.depth(&t.ladder.first_lane()).await,
        0,
        "the delivery was acked"
    );
}

/// An endpoint answering 503 to the first two attempts and 200 to the next, a worker delivering
/// to it (signing with `s`, which must outlive it), and envelope `id` published.
async fn fails_twice_then_succeeds(
    t: &TestLadder,
    s: &common::Secret,
    id: &str,
) -> (Receiver, RunningWorker) {
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| match req.attempt {
        1 | 2 => Reply::Status(503),
        _ => Reply::Status(200),
    })
    .await
    .unwrap();
    let worker = RunningWorker::start_for_receiver(t, &receiver, s).await;
    t.publish(&event(id, "acme", "sub_a")).await;
    (receiver, worker)
}

#[tokio::test]
async fn two_failures_then_success_walk_the_first_two_tiers() {
    let t = TestLadder::apply("ladder", &["300ms", "600ms"], &["300ms", "600ms", "600ms"]).await;
    let s = secret();
    let (receiver, worker) = fails_twice_then_succeeds(&t, &s, "evt_ladder").await;

    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    let records = receiver.records_for("evt_ladder");
    let attempts: Vec<u32> = records.iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    assert!(records.iter().all(|r| r.idempotency_key == "evt_ladder"));
    assert!(records.iter().all(|r| r.verified_with == vec![true]));
    // The waits between attempts are the tiers': at least 300 ms, then at least 600 ms.
    let gap1 = records[1].received_at_ms - records[0].received_at_ms;
    let gap2 = records[2].received_at_ms - records[1].received_at_ms;
    assert!(gap1 >= 300 && gap2 >= 600, "gaps {gap1} ms, {gap2} ms");
    // After the drain every settled outcome is counted.
    let m = worker.metrics.clone();
    worker.stop().await;
    assert_eq!(
        m.count("hookrelay_retries_total", &[("tier", "retry-300ms")]),
        1
    );
    assert_eq!(
        m.count("hookrelay_retries_total", &[("tier", "retry-600ms")]),
        1
    );
    assert_eq!(
        m.count(
            "hookrelay_outcomes_total",
            &[
                ("lane", t.ladder.retry_lane().as_str()),
                ("outcome", "delivered")
            ]
        ),
        1
    );
}

#[tokio::test]
async fn each_attempt_is_signed_with_the_time_it_is_made() {
    // Tiers of whole seconds, so consecutive attempts fall in different seconds.
    let t = TestLadder::apply("stamped", &["1s"], &["1s", "1s"]).await;
    let s = secret();
    let (receiver, worker) = fails_twice_then_succeeds(&t, &s, "evt_stamped").await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    worker.stop().await;
    let records = receiver.records_for("evt_stamped");
    assert_eq!(
        records.iter().map(|r| r.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let stamps: Vec<u64> = records.iter().map(|r| r.timestamp.unwrap()).collect();
    for (r, stamp) in records.iter().zip(&stamps) {
        // Verified with the timestamp it carries, which is the time of this attempt: at most
        // the request timeout (2 s) and the second's rounding before it arrived.
        assert_eq!(r.verified_with, vec![true], "attempt {}", r.attempt);
        let signed_ms = stamp * 1000;
        assert!(
            signed_ms <= r.received_at_ms && r.received_at_ms - signed_ms < 3000,
            "attempt {} signed at {stamp} s, arrived at {} ms",
            r.attempt,
            r.received_at_ms
        );
    }
    assert!(
        stamps.windows(2).all(|w| w[0] < w[1]),
        "every attempt has a timestamp of its own: {stamps:?}"
    );
}

#[tokio::test]
async fn a_client_error_is_dead_lettered_with_its_reason_and_the_original_message() {
    let t = TestLadder::apply("rejected", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(400))
        .await
        .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    let e = event("evt_rejected", "acme", "sub_a");
    t.publish(&e).await;
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;

    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), 1);
    let p = &dead[0].delivery.properties;
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "evt_rejected");
    assert_eq!(&dead[0].delivery.data[..], &e.body[..]);
    assert_eq!(
        headers::read_str_header(p, REASON_HEADER).as_deref(),
        Some("rejected")
    );
    assert_eq!(headers::read_u64_header(p, STATUS_HEADER), Some(400));
    assert_eq!(headers::read_u64_header(p, ATTEMPTS_HEADER), Some(1));
    assert_eq!(
        headers::read_str_header(p, headers::SUBSCRIPTION_HEADER).as_deref(),
        Some("sub_a")
    );
    assert!(headers::read_u64_header(p, headers::DEAD_AT_HEADER).is_some());
    assert_eq!(receiver.request_count(), 1, "a 4xx is not retried");
}

#[tokio::test]
async fn a_spent_budget_is_dead_lettered_as_exhausted() {
    let t = TestLadder::apply("exhausted", &["200ms", "400ms"], &["200ms", "400ms"]).await;
    let s = secret();
    let calls = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&calls);
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), move |_| {
        counted.fetch_add(1, Ordering::SeqCst);
        Reply::Status(500)
    })
    .await
    .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    t.publish(&event("evt_exhausted", "acme", "sub_a")).await;
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;

    // 1 + 2 schedule entries = 3 attempts, then nothing more.
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(
        headers::read_str_header(p, REASON_HEADER).as_deref(),
        Some("exhausted")
    );
    assert_eq!(headers::read_u64_header(p, ATTEMPTS_HEADER), Some(3));
    assert_eq!(
        headers::read_str_header(p, LAST_ERROR_HEADER).as_deref(),
        Some("HTTP 500")
    );
    // The broker's dead-letter headers of the last tier are not carried into the sink.
    assert!(
        !p.headers()
            .as_ref()
            .unwrap()
            .inner()
            .contains_key("x-death")
    );
}

#[tokio::test]
async fn timeouts_and_refused_connections_are_retried() {
    let t = TestLadder::apply("transport", &["200ms"], &["200ms"]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| match req.attempt {
        1 => Reply::Slow(Duration::from_secs(4), 200),
        _ => Reply::Status(200),
    })
    .await
    .unwrap();
    // Nothing listens on this port: bind and drop to find a free one.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let worker = RunningWorker::start(
        &t,
        vec![
            subscription("sub_slow", "acme", &receiver.url("/"), &s),
            subscription("sub_closed", "acme", &format!("http://{closed}/"), &s),
        ],
    )
    .await;
    t.publish(&event("evt_slow", "acme", "sub_slow")).await;
    t.publish(&event("evt_closed", "acme", "sub_closed")).await;
    // The slow one times out (request timeout 2 s), then succeeds on attempt 2.
    assert!(
        receiver
            .wait_until(WAIT, |r| r
                .records_for("evt_slow")
                .iter()
                .any(|x| x.attempt == 2))
            .await
    );
    // The refused one runs out of its two attempts.
    assert!(t.wait_dead(1, WAIT).await);
    // One retry each: the timeout and the refused connection.
    assert_eq!(worker.metrics.count("hookrelay_retries_total", &[]), 2);
    worker.stop().await;
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "evt_closed");
    let error = headers::read_str_header(p, LAST_ERROR_HEADER).unwrap();
    assert!(error.starts_with("transport error: connect"), "{error}");
}

/// A catalog with `order.paid` in `mode`: a realistic schema, amount a non-negative integer.
fn order_catalog(mode: hookrelay::catalog::ValidationMode) -> hookrelay::catalog::Catalog {
    use hookrelay::catalog::{Catalog, EventType, SchemaVersion, ValidationMode};
    let order = EventType {
        name: "order.paid".into(),
        description: "An order was paid".into(),
        mode,
        deprecated: false,
        versions: vec![SchemaVersion {
            version: 1,
            schema: serde_json::json!({
                "type": "object",
                "required": ["id", "amount"],
                "properties": {
                    "id": {"type": "string", "pattern": "^evt_"},
                    "amount": {"type": "integer", "minimum": 0}
                }
            }),
            example: serde_json::json!({"id": "evt_1", "amount": 1}),
        }],
    };
    let (catalog, problems) = Catalog::compile(&[order], ValidationMode::Off);
    assert!(problems.is_empty(), "{problems:?}");
    catalog
}

/// A worker for `sub_a` (acme, to `receiver`) validating against `catalog`.
async fn validating_worker(
    t: &TestLadder,
    receiver: &Receiver,
    s: &common::Secret,
    catalog: hookrelay::catalog::Catalog,
) -> RunningWorker {
    use hookrelay::delivery::worker::WorkerSetup;
    use hookrelay::subscriptions::{LiveSubscriptions, Subscriptions};
    let live = LiveSubscriptions::fixed(Subscriptions::from_list([subscription(
        "sub_a",
        "acme",
        &receiver.url("/"),
        s,
    )]));
    let mut setup = WorkerSetup::new(t.config.clone(), t.ladder.clone(), live);
    setup.catalog = Arc::new(hookrelay::catalog::LiveCatalog::new(catalog));
    RunningWorker::start_setup(t, setup).await
}

fn with_body(
    mut e: hookrelay::contract::envelope::NewEvent,
    body: &str,
) -> hookrelay::contract::envelope::NewEvent {
    e.body = body.as_bytes().to_vec();
    e
}

/// `enforce`: a payload its schema refuses is dead-lettered `schema_invalid`, naming the JSON
/// pointer and the schema's message, and never reaches the endpoint, whether it was published
/// to a subscription or to fan out; a valid one is delivered.
#[tokio::test]
async fn an_enforced_schema_dead_letters_an_invalid_payload_before_any_endpoint_sees_it() {
    use hookrelay::catalog::ValidationMode;
    let t = TestLadder::apply("schema-enforce", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = validating_worker(&t, &receiver, &s, order_catalog(ValidationMode::Enforce)).await;
    t.publish(&with_body(
        event("evt_bad", "acme", "sub_a"),
        r#"{"id":"evt_bad","amount":-5}"#,
    ))
    .await;
    let mut fanned = with_body(event("evt_bad_fan", "acme", "sub_a"), r#"{"amount":1}"#);
    fanned.subscription = None;
    t.publish(&fanned).await;
    t.publish(&event("evt_good", "acme", "sub_a")).await;
    assert!(t.wait_dead(2, WAIT).await);
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    let metrics = worker.metrics.clone();
    worker.stop().await;
    assert_eq!(receiver.request_count(), 1, "only the valid event was sent");
    assert_eq!(receiver.records()[0].id, "evt_good");
    let mut errors: Vec<String> = t
        .drain_dead()
        .await
        .iter()
        .map(|d| {
            let p = &d.delivery.properties;
            assert_eq!(
                headers::read_str_header(p, REASON_HEADER).as_deref(),
                Some("schema_invalid")
            );
            headers::read_str_header(p, LAST_ERROR_HEADER).unwrap_or_default()
        })
        .collect();
    errors.sort();
    assert!(
        errors[0].contains(r#"at "": "id" is a required property"#),
        "{errors:?}"
    );
    assert!(
        errors[1].contains(r#"at "/amount": -5 is less than the minimum of 0"#),
        "{errors:?}"
    );
    assert_eq!(
        metrics.count(
            "hookrelay_schema_invalid_total",
            &[("event_type", "order.paid"), ("mode", "enforce")]
        ),
        2
    );
    assert_eq!(
        metrics.count("hookrelay_outcomes_total", &[("outcome", "schema_invalid")]),
        2
    );
}

/// `warn`: the invalid payload is delivered, counted and reported; types the catalog does not
/// list follow `catalog.unlisted` (here `off`) and are not counted under their own name.
#[tokio::test]
async fn a_warned_schema_delivers_an_invalid_payload_and_counts_it() {
    use hookrelay::catalog::ValidationMode;
    let t = TestLadder::apply("schema-warn", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let events = t.keep_all(&t.ladder.events_exchange()).await;
    let worker = validating_worker(&t, &receiver, &s, order_catalog(ValidationMode::Warn)).await;
    t.publish(&with_body(
        event("evt_warned", "acme", "sub_a"),
        r#"{"id":"evt_warned","amount":"lots"}"#,
    ))
    .await;
    let mut unlisted = with_body(event("evt_unlisted", "acme", "sub_a"), r#"{"x":1}"#);
    unlisted.event_type = "order.shipped".into();
    t.publish(&unlisted).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    let metrics = worker.metrics.clone();
    assert!(common::wait_until(WAIT, async || { t.depth(&events).await >= 1 }).await);
    worker.stop().await;
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
    assert_eq!(
        metrics.count(
            "hookrelay_schema_invalid_total",
            &[("event_type", "order.paid"), ("mode", "warn")]
        ),
        1
    );
    assert_eq!(metrics.count("hookrelay_schema_invalid_total", &[]), 1);
    let notice = t.take_all(&events).await;
    let notice: serde_json::Value = serde_json::from_slice(&notice[0].delivery.data).unwrap();
    assert_eq!(notice["event"], "delivery.schema_invalid");
    assert_eq!(notice["reason"], "warn");
    assert_eq!(notice["envelope"], "evt_warned");
    assert!(
        notice["detail"]
            .as_str()
            .unwrap()
            .contains(r#"at "/amount""#),
        "{notice}"
    );
}

/// A producer may send `x-death` itself: RabbitMQ 4 drops it, 3.x keeps it. hookrelay counts
/// attempts in a header of its own, so a forged history changes nothing on either: attempt 1,
/// then attempt 2 after one failure, one real promotion counted, delivered once.
#[tokio::test]
async fn a_producers_own_x_death_counts_for_nothing() {
    use lapin::types::{AMQPValue, FieldTable};
    let t = TestLadder::apply("xdeath", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = common::failing_first_attempts(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    let tier = t.ladder.tier_queue(t.ladder.tier_at(0).unwrap());
    // The broker's shape: the ladder's own tier, dead-lettered seven times.
    let mut death = FieldTable::default();
    death.insert("queue".into(), AMQPValue::LongString(tier.as_str().into()));
    death.insert("reason".into(), AMQPValue::LongString("expired".into()));
    death.insert("count".into(), AMQPValue::LongLongInt(7));
    let e = event("evt_forged_death", "acme", "sub_a");
    let props = e.properties();
    let mut headers = props.headers().clone().unwrap_or_default();
    headers.insert(
        "x-death".into(),
        AMQPValue::FieldArray(vec![AMQPValue::FieldTable(death)].into()),
    );
    headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(30));
    t.publisher()
        .await
        .publish(
            &t.ladder.ingress(),
            "acme",
            &e.body,
            props.with_headers(headers),
        )
        .await
        .unwrap();
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    let attempts: Vec<u32> = receiver
        .records_for("evt_forged_death")
        .iter()
        .map(|r| r.attempt)
        .collect();
    assert_eq!(attempts, vec![1, 2]);
    assert!(
        common::wait_until(WAIT, async || {
            worker
                .metrics
                .count("hookrelay_promotions_total", &[("tier", "retry-300ms")])
                == 1
        })
        .await,
        "the one real promotion is counted, not the forged seven"
    );
    worker.stop().await;
}
