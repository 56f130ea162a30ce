//! Malformed messages (the table in `common::hostile`) by the thousand among good traffic.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::common::{self, Counters, TestLadder, hostile, secret, wait_until};
use crate::harness::SETTLE;
use hookrelay::contract::headers;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_is_dead_lettered_and_good_traffic_keeps_flowing() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};

    const HOSTILE: usize = 3000;
    const GOOD: usize = 2000;
    let t = TestLadder::apply("hostile", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let worker = hostile::start_worker(&t, &receiver, &s).await;
    let ch = t.conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    // The table's kinds in turn, each message with an id of its own.
    let kinds = hostile::table("h", &t.ladder).len();
    let nth_hostile =
        |i: usize| hostile::table(&format!("h_{i:05}"), &t.ladder).swap_remove(i % kinds);
    let mut hostile_published: usize = 0;
    let good_published = AtomicUsize::new(0);
    let started = Instant::now();
    for i in 0..HOSTILE.max(GOOD) {
        if i < HOSTILE {
            let m = nth_hostile(i);
            let confirm = ch
                .basic_publish(
                    m.exchange.as_str().into(),
                    m.routing_key.as_str().into(),
                    BasicPublishOptions::default(),
                    &m.body,
                    m.properties,
                )
                .await
                .unwrap();
            drop(confirm);
            hostile_published += 1;
        }
        if i < GOOD {
            let e = common::event(
                &format!("good_{i:05}"),
                hostile::TENANT,
                hostile::SUBSCRIPTION,
            );
            let confirm = ch
                .basic_publish(
                    t.ladder.ingress().as_str().into(),
                    hostile::TENANT.into(),
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
    let good_rate = receiver.delivered_count() as f64 / started.elapsed().as_secs_f64();
    // Every malformed message reaches the sink; one stored twice (its confirm late under load,
    // the original returned and dead-lettered again) is a duplicate, counted, never a loss. So
    // wait for every id, not for a count.
    let sent_without_id = (0..HOSTILE)
        .filter(|&i| nth_hostile(i).id.is_none())
        .count();
    let mut dead = Vec::new();
    let mut ids: HashSet<String> = HashSet::new();
    let mut without_id = 0;
    wait_until(SETTLE, async || {
        for d in t.drain_dead().await {
            match d.delivery.properties.message_id() {
                Some(id) => {
                    ids.insert(id.to_string());
                }
                None => without_id += 1,
            }
            dead.push(d);
        }
        ids.len() >= HOSTILE - sent_without_id && without_id >= sent_without_id
    })
    .await;
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
    // Messages in the sink, each counted once (those without an id cannot be told apart).
    let dead_once = ids.len() + without_id.min(sent_without_id);
    let duplicated = dead.len() - dead_once;
    for d in &dead {
        let reason = headers::read_str_header(&d.delivery.properties, headers::REASON_HEADER);
        assert_eq!(reason.as_deref(), Some("invalid"));
        assert!(
            headers::read_str_header(&d.delivery.properties, headers::LAST_ERROR_HEADER)
                .is_some_and(|e| !e.is_empty())
        );
    }
    assert_eq!(
        m.count("hookrelay_outcomes_total", &[("outcome", "invalid")]),
        HOSTILE as u64
    );
    assert!(duplicated <= t.config.worker.in_flight as usize);
    let good_published = good_published.load(Ordering::SeqCst);
    let delivered = receiver.delivered_count();
    let lost =
        good_published.saturating_sub(delivered) + hostile_published.saturating_sub(dead_once);
    println!(
        "FAULT-TABLE | {} | hostile input ({hostile_published} malformed among {good_published} good; good delivered at {good_rate:.0}/s) | published {} | delivered {delivered} | dead {dead_once} | cancelled {} | lost {lost} | duplicated {} |",
        crate::harness::broker(&t.config).await,
        hostile_published + good_published,
        m.count("hookrelay_outcomes_total", &[("outcome", "cancelled")]),
        duplicated + receiver.duplicates()
    );
}
