//! Malformed messages by the thousand among good traffic.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{self, Counters, RunningWorker, TestLadder, secret, subscription};
use crate::harness::SETTLE;
use hookrelay::contract::envelope;
use lapin::types::FieldTable;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_is_dead_lettered_and_good_traffic_keeps_flowing() {
    use lapin::BasicProperties;
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::AMQPValue;

    const HOSTILE: usize = 3000;
    const GOOD: usize = 2000;
    let t = TestLadder::apply("hostile", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let mut config = t.config.clone();
    config.limits.max_body_bytes = 4096;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![subscription("sub_a", "acme", &receiver.url("/"), &s)],
    )
    .await;
    let ch = t.conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let str_header = |v: &str| AMQPValue::LongString(v.into());
    let hostile = |i: usize| -> (String, String, Vec<u8>, BasicProperties) {
        let mut headers = FieldTable::default();
        headers.insert("x-subscription".into(), str_header("sub_a"));
        let good_body = br#"{"ok":1}"#.to_vec();
        let base = BasicProperties::default().with_type("order.paid".into());
        let id = format!("h_{i:05}");
        let ingress = t.ladder.ingress();
        let lane = t.ladder.first_lane();
        let retry = t.ladder.retry_lane();
        match i % 12 {
            0 => (
                ingress,
                "acme".into(),
                good_body,
                base.with_headers(headers),
            ), // no message_id
            1 => (
                ingress,
                "acme".into(),
                good_body,
                base.with_message_id(format!("{id}{}", "x".repeat(255 - id.len())).into())
                    .with_headers(headers),
            ),
            2 => (
                ingress,
                "acme".into(),
                good_body,
                base.with_message_id(format!("{id}.dot").into())
                    .with_headers(headers),
            ),
            3 => (
                ingress,
                "acme".into(),
                b"not json".to_vec(),
                base.with_message_id(id.into()).with_headers(headers),
            ),
            4 => (
                ingress,
                "acme".into(),
                vec![0xc3, 0x28, 0xff],
                base.with_message_id(id.into()).with_headers(headers),
            ),
            5 => (
                ingress,
                "acme".into(),
                vec![b' '; 5000],
                base.with_message_id(id.into()).with_headers(headers),
            ),
            6 => {
                headers.insert("x-subscription".into(), str_header("sub_nobody"));
                (
                    ingress,
                    "acme".into(),
                    good_body,
                    base.with_message_id(id.into()).with_headers(headers),
                )
            }
            7 => {
                headers.insert(
                    "x-subscription".into(),
                    AMQPValue::FieldArray(vec![AMQPValue::Boolean(true)].into()),
                );
                (
                    ingress,
                    "acme".into(),
                    good_body,
                    base.with_message_id(id.into()).with_headers(headers),
                )
            }
            8 => {
                headers.insert(
                    envelope::ATTEMPTS_HEADER.into(),
                    AMQPValue::LongLongInt(i64::MAX),
                );
                (
                    retry,
                    String::new(),
                    good_body,
                    base.with_message_id(id.into()).with_headers(headers),
                )
            }
            9 => {
                headers.insert(envelope::DUE_HEADER.into(), str_header("yesterday"));
                headers.insert("x-death".into(), str_header("forged"));
                headers.insert(envelope::TENANT_HEADER.into(), str_header("acme"));
                (
                    retry,
                    String::new(),
                    good_body,
                    base.with_message_id(id.into()).with_headers(headers),
                )
            }
            10 => (
                String::new(),
                lane,
                good_body,
                base.with_message_id(id.into()).with_headers(headers),
            ),
            _ => {
                headers.insert(envelope::TENANT_HEADER.into(), AMQPValue::LongLongInt(7));
                headers.insert(envelope::REASON_HEADER.into(), str_header("forged"));
                (
                    ingress,
                    "acme".into(),
                    good_body,
                    base.with_message_id(id.into()).with_headers(headers),
                )
            }
        }
    };
    let good_published = AtomicUsize::new(0);
    let started = Instant::now();
    for i in 0..HOSTILE.max(GOOD) {
        if i < HOSTILE {
            let (exchange, key, body, props) = hostile(i);
            let (exchange, key) = if exchange.is_empty() {
                (String::new(), key)
            } else if key.is_empty() {
                (String::new(), exchange)
            } else {
                (exchange, key)
            };
            let confirm = ch
                .basic_publish(
                    exchange.as_str().into(),
                    key.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await
                .unwrap();
            drop(confirm);
        }
        if i < GOOD {
            let e = common::event(&format!("good_{i:05}"), "acme", "sub_a");
            let confirm = ch
                .basic_publish(
                    t.ladder.ingress().as_str().into(),
                    "acme".into(),
                    BasicPublishOptions::default(),
                    &e.body,
                    e.properties(),
                )
                .await
                .unwrap();
            drop(confirm);
            good_published.fetch_add(1, Ordering::SeqCst);
        }
    }
    ch.wait_for_confirms().await.unwrap();
    assert!(
        receiver
            .wait_until(SETTLE, |r| r.delivered_count() == GOOD)
            .await
    );
    let good_rate = GOOD as f64 / started.elapsed().as_secs_f64();
    // Every malformed message reaches the sink; one stored twice (its confirm late under load,
    // the original returned and dead-lettered again) is a duplicate, counted, never a loss. So
    // wait for every id, not for a count.
    let sent_without_id = (0..HOSTILE).filter(|i| i % 12 == 0).count();
    let mut dead = Vec::new();
    let mut ids: HashSet<String> = HashSet::new();
    let mut without_id = 0;
    let deadline = Instant::now() + SETTLE;
    while (ids.len() < HOSTILE - sent_without_id || without_id < sent_without_id)
        && Instant::now() < deadline
    {
        for d in t.drain_dead().await {
            match d.delivery.properties.message_id() {
                Some(id) => {
                    ids.insert(id.to_string());
                }
                None => without_id += 1,
            }
            dead.push(d);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = worker.metrics.clone();
    worker.stop().await; // returns Ok: no panic, no stall
    for d in t.drain_dead().await {
        if let Some(id) = d.delivery.properties.message_id() {
            ids.insert(id.to_string());
        }
        dead.push(d);
    }
    assert_eq!(ids.len(), HOSTILE - sent_without_id);
    assert!(without_id >= sent_without_id);
    let duplicated = dead.len() - HOSTILE;
    for d in &dead {
        let reason = envelope::read_str_header(&d.delivery.properties, envelope::REASON_HEADER);
        assert_eq!(reason.as_deref(), Some("invalid"));
        assert!(
            envelope::read_str_header(&d.delivery.properties, envelope::LAST_ERROR_HEADER)
                .is_some_and(|e| !e.is_empty())
        );
    }
    assert_eq!(
        m.count("hookrelay_outcomes_total", &[("outcome", "invalid")]),
        HOSTILE as u64
    );
    assert!(duplicated <= t.config.worker.in_flight as usize);
    println!(
        "FAULT-TABLE | hostile input ({HOSTILE} malformed among {GOOD} good; good delivered at {good_rate:.0}/s) | published {} | delivered {GOOD} | dead {HOSTILE} | cancelled 0 | lost 0 | duplicated {} |",
        HOSTILE + GOOD,
        duplicated + receiver.duplicates()
    );
}
