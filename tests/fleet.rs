//! A fleet of workers shares its endpoint limits, measured at the endpoint: two workers on one
//! ladder keep an endpoint's cap and rate limit, not twice them.

mod common;

use std::time::Duration;

use common::{Counters, RunningWorker, TestLadder, event, secret, subscription, wait_until};
use hookrelay::subscriptions::Subscription;
use hookrelay_tools::receiver::{Receiver, Reply};

const WAIT: Duration = Duration::from_secs(30);

/// Starts `n` workers on `t`'s ladder and waits until each counts the fleet as `n` (its next
/// count after the last one consumes).
async fn fleet(t: &TestLadder, n: usize, subscriptions: &[Subscription]) -> Vec<RunningWorker> {
    let mut workers = Vec::new();
    for _ in 0..n {
        workers.push(RunningWorker::start_with(t, t.config.clone(), subscriptions.to_vec()).await);
    }
    for w in &workers {
        let m = w.metrics.clone();
        assert!(
            wait_until(WAIT, async || m.fleet_workers.get() == n as i64).await,
            "a worker counts {} workers, not {n}",
            m.fleet_workers.get()
        );
    }
    workers
}

/// Runs `workers` workers with `sub` (`sub_a` of tenant `acme`), publishes `n` events for it,
/// waits until `receiver` has them all, stops the workers and returns how many deliveries
/// they deferred for `reason`.
async fn deliver_all(
    t: &TestLadder,
    workers: usize,
    sub: Subscription,
    n: usize,
    receiver: &Receiver,
    reason: &str,
) -> u64 {
    let workers = fleet(t, workers, &[sub]).await;
    t.publish_all((0..n).map(|i| event(&format!("evt_{i:03}"), "acme", "sub_a")))
        .await;
    assert!(
        receiver
            .wait_until(Duration::from_secs(120), |r| r.delivered_count() == n)
            .await,
        "delivered {} of {n}",
        receiver.delivered_count()
    );
    let deferred = workers
        .iter()
        .map(|w| {
            w.metrics
                .count("hookrelay_deferrals_total", &[("reason", reason)])
        })
        .sum();
    for w in workers {
        w.stop().await;
    }
    deferred
}

#[tokio::test]
async fn two_workers_keep_an_endpoint_under_its_cap() {
    const N: usize = 200;
    const CAP: usize = 10;
    let t = TestLadder::apply("fleetcap", &["200ms"], &["200ms"; 3]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| {
        Reply::Slow(Duration::from_millis(200), 200)
    })
    .await
    .unwrap();
    let mut sub = subscription("sub_a", "acme", &receiver.url("/"), &s);
    sub.max_concurrent = Some(CAP as u32);
    let deferred = deliver_all(&t, 2, sub, N, &receiver, "concurrency").await;
    // Measured at the endpoint: with each worker at the whole cap it would see up to 20.
    assert!(
        receiver.max_in_flight() <= CAP,
        "the endpoint saw {} at once; the fleet's cap is {CAP}",
        receiver.max_in_flight()
    );
    assert!(deferred > 0, "the cap was reached and paced the rest");
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(receiver.request_count(), N, "one request per event");
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
    eprintln!(
        "max in flight {} of cap {CAP}; {deferred} concurrency deferrals",
        receiver.max_in_flight()
    );
}

/// The most requests the endpoint received within any `window`.
fn busiest_window(receiver: &Receiver, window: Duration) -> usize {
    let mut at: Vec<u64> = receiver
        .records()
        .iter()
        .map(|r| r.received_at_ms)
        .collect();
    at.sort_unstable();
    let width = window.as_millis() as u64;
    (0..at.len())
        .map(|i| at[i..].iter().take_while(|&&t| t < at[i] + width).count())
        .max()
        .unwrap_or(0)
}

/// `workers` workers deliver 100 events to an endpoint limited to 20/s: no second at the
/// endpoint holds more than 20 and a small allowance for network jitter (the limiter spaces
/// requests; two spaced 50 ms apart at the worker may land closer at the endpoint).
async fn rate_limit_holds_at_the_endpoint(name: &str, workers: usize) {
    const N: usize = 100;
    const RATE: usize = 20;
    let t = TestLadder::apply(name, &["200ms"], &["200ms"; 3]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let mut sub = subscription("sub_a", "acme", &receiver.url("/"), &s);
    sub.rate = Some(format!("{RATE}/s").parse().unwrap());
    let deferred = deliver_all(&t, workers, sub, N, &receiver, "rate").await;
    let busiest = busiest_window(&receiver, Duration::from_secs(1));
    let allowance = 2 * workers;
    eprintln!("{workers} worker(s): busiest second {busiest} requests, {deferred} rate deferrals");
    assert!(
        busiest <= RATE + allowance,
        "{busiest} requests in one second at the endpoint; the limit is {RATE}/s"
    );
    assert!(deferred > 0, "the backlog was over the rate and was paced");
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(
        receiver.request_count(),
        N,
        "over-rate deliveries made no request"
    );
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
}

#[tokio::test]
async fn one_worker_keeps_an_endpoint_under_its_rate() {
    rate_limit_holds_at_the_endpoint("fleetrate1", 1).await;
}

#[tokio::test]
async fn two_workers_keep_an_endpoint_under_its_rate() {
    rate_limit_holds_at_the_endpoint("fleetrate2", 2).await;
}

#[tokio::test]
async fn a_joining_worker_is_counted_from_the_brokers_live_answer_not_a_poll() {
    let t = TestLadder::apply("fleet-join", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let sub = subscription("sub_a", "acme", &receiver.url("/"), &s);
    // The management API is read once an hour: whatever either worker counts, it counted from
    // the broker's answers to its own passive declares.
    let mut config = t.config.clone();
    config.metrics.poll_interval = Duration::from_secs(3600);
    let first = RunningWorker::start_with(&t, config.clone(), vec![sub.clone()]).await;
    let m1 = first.metrics.clone();
    assert!(wait_until(WAIT, async || m1.fleet_workers.get() == 1).await);
    let second = RunningWorker::start_with(&t, config, vec![sub]).await;
    let m2 = second.metrics.clone();
    assert!(
        wait_until(WAIT, async || m2.fleet_workers.get() == 2).await,
        "the joiner counts itself and the other: {}",
        m2.fleet_workers.get()
    );
    assert!(
        wait_until(WAIT, async || m1.fleet_workers.get() == 2).await,
        "the other counts the joiner: {}",
        m1.fleet_workers.get()
    );
    // Both deliver once settled.
    t.publish_all((0..10).map(|i| event(&format!("evt_{i}"), "acme", "sub_a")))
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 10)
            .await
    );
    second.stop().await;
    assert!(
        wait_until(WAIT, async || m1.fleet_workers.get() == 1).await,
        "a worker that leaves is counted out"
    );
    first.stop().await;
}
