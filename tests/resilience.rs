//! The worker keeps going when the broker drops its connections, and delivers a large batch with
//! nothing lost and nothing doubled.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    Counters, RunningWorker, TestLadder, event, management, ok_receiver, secret, wait_until,
};
use futures_util::StreamExt;

#[tokio::test]
async fn the_worker_reconnects_after_the_broker_closes_its_connections() {
    let t = TestLadder::apply("reconnect", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    t.publish(&event("evt_before", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(Duration::from_secs(10), |r| r.delivered_count() == 1)
            .await
    );

    // The broker closes both of the worker's connections (as `rabbitmqctl close_connection` does).
    let api = management(&t.config);
    let consume = format!("{} consume", worker.name);
    let publish = format!("{} publish", worker.name);
    // The management API lists a connection a moment after it opens (seconds on a loaded
    // machine): wait until it lists both, then close both at once.
    let listed = wait_until(Duration::from_secs(30), async || {
        common::connections_named(&api, &consume).await >= 1
            && common::connections_named(&api, &publish).await >= 1
    })
    .await;
    assert!(listed, "the management API lists both worker connections");
    let closed = api.close_connections_named(&consume).await.unwrap()
        + api.close_connections_named(&publish).await.unwrap();
    assert_eq!(closed, 2, "both worker connections were found and closed");

    t.publish(&event("evt_after", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(Duration::from_secs(20), |r| r.delivered_count() == 2)
            .await
    );
    // The consumer came back under the same name (the API lists it within a few seconds).
    let back = wait_until(Duration::from_secs(10), async || {
        common::connections_named(&api, &consume).await >= 1
    })
    .await;
    assert!(back, "the worker's consume connection is back");
    assert!(worker.metrics.count("hookrelay_reconnects_total", &[]) >= 1);
    worker.stop().await;
    assert_eq!(receiver.duplicates(), 0);
}

#[tokio::test]
async fn ten_thousand_events_are_delivered_once_each() {
    const N: usize = 10_000;
    let t = TestLadder::apply("volume", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    let publisher = Arc::new(t.publisher().await);
    let ingress = t.ladder.ingress();
    let failures = futures_util::stream::iter(0..N)
        .map(|i| {
            let publisher = Arc::clone(&publisher);
            let ingress = ingress.clone();
            async move {
                publisher
                    .publish_event(
                        &ingress,
                        &event(&format!("evt_{i:05}"), "acme", "sub_a"),
                        1024,
                    )
                    .await
            }
        })
        .buffer_unordered(200)
        .filter_map(|r| std::future::ready(r.err()))
        .collect::<Vec<_>>()
        .await;
    assert!(
        failures.is_empty(),
        "{} publishes failed, the first: {:?}",
        failures.len(),
        failures.first()
    );
    assert!(
        receiver
            .wait_until(Duration::from_secs(120), |r| r.delivered_count() == N)
            .await,
        "delivered {} of {N}",
        receiver.delivered_count()
    );
    worker.stop().await;
    let delivered = receiver.delivered();
    assert_eq!(delivered.len(), N);
    assert_eq!(receiver.duplicates(), 0);
    assert!((0..N).all(|i| delivered.contains_key(&format!("evt_{i:05}"))));
    assert!(
        receiver
            .records()
            .iter()
            .all(|r| r.verified_with == vec![true])
    );
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 0);
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
}

#[tokio::test]
async fn a_returned_retry_is_stored_again_within_the_lease_and_the_attempt_is_not_repeated() {
    let t = TestLadder::apply("returned", &["300ms"], &["300ms"]).await;
    // The tier is not reachable from its exchange (as before `topology apply` adds it): every
    // retry published there comes back as unroutable.
    let tier = t.ladder.tier_at(0).unwrap();
    let (queue, exchange, key) = (
        t.ladder.tier_queue(tier),
        t.ladder.tier_exchange(tier),
        String::new(),
    );
    t.channel
        .queue_unbind(
            queue.as_str().into(),
            exchange.as_str().into(),
            key.as_str().into(),
            Default::default(),
        )
        .await
        .unwrap();
    let s = secret();
    let receiver =
        hookrelay_tools::receiver::Receiver::start(std::slice::from_ref(&s.whsec), |req| match req
            .attempt
        {
            1 => hookrelay_tools::receiver::Reply::Status(503),
            _ => hookrelay_tools::receiver::Reply::Status(200),
        })
        .await
        .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    t.publish(&event("evt_returned", "acme", "sub_a")).await;
    let returned = || {
        worker.metrics.count(
            "hookrelay_republish_failures_total",
            &[("target", "retry-300ms")],
        )
    };
    assert!(
        wait_until(Duration::from_secs(30), async || returned() >= 3).await,
        "the retry was returned again and again"
    );
    assert_eq!(
        receiver.records_for("evt_returned").len(),
        1,
        "the attempt whose retry could not be stored was made once"
    );
    // Once the tier is reachable the same retry is stored, and the next attempt is made.
    t.channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            key.as_str().into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    assert!(
        receiver
            .wait_until(Duration::from_secs(30), |r| r.delivered_count() == 1)
            .await
    );
    worker.stop().await;
    let attempts: Vec<u32> = receiver
        .records_for("evt_returned")
        .iter()
        .map(|r| r.attempt)
        .collect();
    assert_eq!(attempts, [1, 2]);
}
