//! Where two features meet: the retry schedule beside the circuit breaker and the horizon, a
//! fleet's caps beside workers that start together.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{RunningWorker, TestLadder, secret, subscription};
use hookrelay::config::EndpointConfig;
use hookrelay::contract::envelope::NewEvent;
use hookrelay::contract::headers;
use hookrelay_tools::receiver::{Receiver, Reply};

/// The short ladder of the breaker's seam: three retries, 7 s from first attempt to last.
const TIERS: [&str; 2] = ["1s", "3s"];
const SCHEDULE: [&str; 3] = ["1s", "3s", "3s"];
const SUBSCRIPTIONS: usize = 5;
const EVENTS: usize = 20;

/// Tenant `acme` with five subscriptions on one host (one path each), default endpoint
/// settings, and twenty fan-out events: each path sees twenty deliveries at once.
async fn burst_of_twenty(name: &str, script: fn(u32) -> u16) -> (TestLadder, Receiver) {
    let t = TestLadder::apply(name, &TIERS, &SCHEDULE).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), move |req| {
        Reply::Status(script(req.attempt))
    })
    .await
    .unwrap();
    let mut config = t.config.clone();
    // What a user gets: the breaker, the horizon (the schedule's span) and caps as shipped.
    config.endpoints = EndpointConfig::default();
    let subs = (0..SUBSCRIPTIONS)
        .map(|i| {
            subscription(
                &format!("sub_{i}"),
                "acme",
                &receiver.url(&format!("/hooks/{i}")),
                &s,
            )
        })
        .collect();
    let worker = RunningWorker::start_with(&t, config, subs).await;
    t.publish_all((0..EVENTS).map(|i| NewEvent {
        id: format!("evt_{i:02}"),
        tenant: "acme".into(),
        event_type: "order.paid".into(),
        subscription: None,
        timestamp: None,
        body: format!(r#"{{"order":{i}}}"#).into_bytes(),
    }))
    .await;
    let all = (SUBSCRIPTIONS * EVENTS) as u32;
    let ended = common::wait_until(Duration::from_secs(60), async || {
        receiver.delivered_count() as u32 + t.depth(&t.ladder.dead()).await >= all
    })
    .await;
    worker.stop().await;
    assert!(
        ended,
        "{} delivered, {} dead of {all}",
        receiver.delivered_count(),
        t.depth(&t.ladder.dead()).await
    );
    (t, receiver)
}

/// Requests per delivery (path and webhook id), in arrival order: the attempt numbers sent.
fn attempts_by_delivery(receiver: &Receiver) -> BTreeMap<(String, String), Vec<(u32, u16)>> {
    let mut by = BTreeMap::<(String, String), Vec<(u32, u16)>>::new();
    for r in receiver.records() {
        by.entry((r.path.clone(), r.id.clone()))
            .or_default()
            .push((r.attempt, r.status));
    }
    by
}

#[tokio::test]
async fn a_burst_of_first_failures_does_not_cancel_a_short_ladders_retries() {
    // 503 to the first two attempts of each delivery, 204 to the third.
    let (t, receiver) =
        burst_of_twenty("seam-burst", |attempt| if attempt < 3 { 503 } else { 204 }).await;
    let dead = t.drain_dead().await;
    let reasons: Vec<String> = dead
        .iter()
        .filter_map(|d| headers::read_str_header(&d.delivery.properties, headers::REASON_HEADER))
        .collect();
    assert!(
        dead.is_empty(),
        "{} dead-lettered, e.g. {:?}",
        dead.len(),
        reasons.first()
    );
    let by = attempts_by_delivery(&receiver);
    assert_eq!(by.len(), SUBSCRIPTIONS * EVENTS);
    for (delivery, tries) in &by {
        assert_eq!(
            tries,
            &vec![(1, 503), (2, 503), (3, 204)],
            "{delivery:?}: delivered on its third attempt, as scheduled"
        );
    }
    assert_eq!(receiver.duplicates(), 0);
}

#[tokio::test]
async fn an_always_failing_endpoint_gets_its_schedule_or_fresh_evidence_before_a_dead_letter() {
    let (t, receiver) = burst_of_twenty("seam-down", |_| 503).await;
    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), SUBSCRIPTIONS * EVENTS);
    let records = receiver.records();
    let max_attempts = SCHEDULE.len() as u64 + 1;
    let mut full = 0;
    for d in &dead {
        let p = &d.delivery.properties;
        let id = p.message_id().as_ref().unwrap().to_string();
        let reason = headers::read_str_header(p, headers::REASON_HEADER).unwrap();
        let attempts = headers::read_u64_header(p, headers::ATTEMPTS_HEADER).unwrap();
        let path = records
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.path.clone())
            .unwrap_or_default();
        // The budget counts the requests the endpoint saw, nothing else.
        let requests = records.iter().filter(|r| r.id == id).count() as u64;
        assert_eq!(attempts, requests, "{id}: {reason}");
        if attempts == max_attempts {
            assert_eq!(reason, "exhausted", "{id}");
            full += 1;
            continue;
        }
        // Fewer attempts than the schedule: only on fresh evidence, a request to its endpoint
        // made after the envelope last went to wait, which failed.
        assert_eq!(reason, "horizon_expired", "{id} with {attempts} attempts");
        let since = headers::read_u64_header(p, headers::WAITING_SINCE_HEADER)
            .unwrap_or_else(|| panic!("{id}: when it last went to wait is recorded"));
        assert!(
            records
                .iter()
                .any(|r| r.path == path && r.received_at_ms >= since && r.status == 503),
            "{id} ({attempts} attempts) was declared dead without its endpoint tried since {since}"
        );
    }
    eprintln!(
        "{full} of {} dead letters exhausted the schedule; the rest on fresh evidence",
        dead.len()
    );
}

/// `workers` worker processes started at the same moment on a backlog waiting for an endpoint
/// whose fleet-wide cap is 10 and whose answers take 300 ms: the endpoint never sees more than
/// the cap at once.
async fn workers_started_together_keep_the_cap(name: &str, workers: usize) {
    const N: usize = 150;
    const CAP: usize = 10;
    let t = TestLadder::apply(name, &["200ms"], &["200ms"; 3]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| {
        Reply::Slow(Duration::from_millis(300), 204)
    })
    .await
    .unwrap();
    let subs = common::SubsFile::new(&common::subscription_toml(
        "sub_a",
        "acme",
        &receiver.url("/"),
        &s.file_ref(),
        &format!("max_concurrent = {CAP}"),
    ));
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    // The backlog waits before any worker is up.
    t.publish_all((0..N).map(|i| common::event(&format!("evt_{i:03}"), "acme", "sub_a")))
        .await;
    let mut children: Vec<_> = (0..workers)
        .map(|i| {
            common::worker_process(&format!("{} w{i}", t.ladder.prefix), &ladder, &subs.path)
                .spawn()
                .unwrap()
        })
        .collect();
    let delivered = receiver
        .wait_until(Duration::from_secs(120), |r| r.delivered_count() == N)
        .await;
    for child in &mut children {
        let _ = child.start_kill();
    }
    assert!(delivered, "delivered {} of {N}", receiver.delivered_count());
    eprintln!(
        "{workers} workers started together: at most {} at once at the endpoint, cap {CAP}",
        receiver.max_in_flight()
    );
    assert!(
        receiver.max_in_flight() <= CAP,
        "the endpoint saw {} at once from {workers} workers started together; the fleet's cap is {CAP}",
        receiver.max_in_flight()
    );
    assert_eq!(receiver.duplicates(), 0);
}

#[tokio::test]
async fn two_workers_started_together_keep_the_fleets_cap() {
    workers_started_together_keep_the_cap("seam-fleet2", 2).await;
}

#[tokio::test]
async fn three_workers_started_together_keep_the_fleets_cap() {
    workers_started_together_keep_the_cap("seam-fleet3", 3).await;
}
