//! Isolation on the real broker: the retry lane's bounded share, dedicated tenant lanes (routing,
//! retry return, removal without loss), the per-endpoint cap, the circuit breaker's states, the
//! ramp after an endpoint recovers, and Retry-After under load.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{
    Counters, RunningWorker, TestLadder, event, hookrelay, ladder_file, secret, subscription,
    wait_until,
};
use hookrelay::contract::headers;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::subscriptions::Subscription;
use hookrelay_tools::receiver::{Receiver, Reply};

const WAIT: Duration = Duration::from_secs(30);

/// Publishes retries into the retry lane as the tiers promote them: through the promote
/// exchange, with a tier's routing key naming the tenant.
async fn publish_retries(t: &TestLadder, n: usize, subscription: &str) {
    let publisher = t.publisher().await;
    let key = t
        .ladder
        .tier_routing_key(t.ladder.tier_at(0).unwrap(), "acme");
    for i in 0..n {
        let e = event(&format!("evt_backlog_{i:04}"), "acme", subscription);
        let props = headers::retry_properties(
            &e.properties(),
            "acme",
            1,
            hookrelay::units::now_ms(),
            "HTTP 503",
            None,
            None,
        );
        publisher
            .publish(&t.ladder.promote_exchange(), &key, &e.body, props)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_deep_retry_backlog_gets_only_its_share_and_new_events_flow() {
    let t = TestLadder::apply("share", &["10s"], &["10s", "10s"]).await;
    let s = secret();
    let slow = Receiver::start(std::slice::from_ref(&s.whsec), |_| {
        Reply::Slow(Duration::from_millis(400), 200)
    })
    .await
    .unwrap();
    let fast = common::ok_receiver(&s).await;
    publish_retries(&t, 120, "sub_slow").await;
    let mut config = t.config.clone();
    config.worker.in_flight = 20; // 14 first-attempt, 6 retry
    // The retry lane's prefetch is the bound here, not one endpoint's share of it.
    config.endpoints.lane_share = 1.0;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![
            subscription("sub_slow", "acme", &slow.url("/"), &s),
            subscription("sub_fast", "acme", &fast.url("/"), &s),
        ],
    )
    .await;
    assert!(slow.wait_until(WAIT, |r| r.request_count() >= 6).await);
    t.publish_all((0..40).map(|i| event(&format!("evt_new_{i:02}"), "acme", "sub_fast")))
        .await;
    // New events are all delivered while most of the backlog still waits.
    assert!(fast.wait_until(WAIT, |r| r.delivered_count() == 40).await);
    let backlog_done = slow.delivered_count();
    assert!(
        backlog_done < 60,
        "new events did not wait for the backlog ({backlog_done} of 120 done)"
    );
    assert!(
        slow.wait_until(Duration::from_secs(60), |r| r.delivered_count() == 120)
            .await
    );
    worker.stop().await;
    assert_eq!(
        slow.max_in_flight(),
        6,
        "the retry lane never had more than its share"
    );
}

#[tokio::test]
async fn a_dedicated_tenant_has_lanes_of_its_own_and_can_leave_them_without_loss() {
    let mut t = TestLadder::apply("dedicated", &["300ms"], &["300ms"]).await;
    t.ladder = t.ladder.clone().with_dedicated("bigco", 10).unwrap();
    t.ladder.objects().apply(&t.channel).await.unwrap();
    // Without a worker: bigco's events land in its own lane, everyone else's in the shared one.
    t.publish_all(vec![
        event("evt_big_1", "bigco", "sub_big"),
        event("evt_small_1", "acme", "sub_small"),
    ])
    .await;
    assert_eq!(t.depth(&t.ladder.first_lane_of("bigco")).await, 1);
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 1);

    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| {
        match (req.id, req.attempt) {
            ("evt_big_2", 1) => Reply::Status(503),
            _ => Reply::Status(200),
        }
    })
    .await
    .unwrap();
    let subs = vec![
        subscription("sub_big", "bigco", &receiver.url("/big"), &s),
        subscription("sub_small", "acme", &receiver.url("/small"), &s),
    ];
    let tail = t.tail_attempts("bigco", 3).await;
    let worker = RunningWorker::start(&t, subs.clone()).await;
    t.publish_all(vec![event("evt_big_2", "bigco", "sub_big")])
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 3)
            .await
    );
    let records = tokio::time::timeout(WAIT, tail).await.unwrap().unwrap();
    worker.stop().await;
    let lanes: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            (
                r.envelope.clone().unwrap(),
                r.outcome.clone(),
                r.lane.clone(),
            )
        })
        .collect();
    let big_first = t.ladder.first_lane_of("bigco");
    let big_retry = t.ladder.retry_lane_of("bigco");
    assert!(
        lanes.contains(&("evt_big_1".into(), "delivered".into(), big_first.clone())),
        "{lanes:?}"
    );
    assert!(
        lanes.contains(&("evt_big_2".into(), "retried".into(), big_first.clone())),
        "{lanes:?}"
    );
    // Its retry came back to its own retry lane, not the shared one.
    assert!(
        lanes.contains(&("evt_big_2".into(), "delivered".into(), big_retry.clone())),
        "{lanes:?}"
    );

    // bigco stops being dedicated while an event waits in its lane.
    t.publish_all(vec![event("evt_big_3", "bigco", "sub_big")])
        .await;
    assert_eq!(t.depth(&big_first).await, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = ladder_file(&t, &dir); // without the [[dedicated]] entry
    let (code, out, err) = hookrelay(
        &["topology", "apply", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("Tenant \"bigco\" is no longer dedicated"),
        "{out}"
    );
    assert_eq!(t.depth(&big_first).await, 1, "nothing was moved");
    // New events take the shared lane; the worker (with the shorter ladder) drains the old one.
    t.publish_all(vec![event("evt_big_4", "bigco", "sub_big")])
        .await;
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 1);
    t.ladder = hookrelay::contract::ladder::Ladder::load(&file).unwrap();
    let worker = RunningWorker::start(&t, subs).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 5)
            .await
    );
    worker.stop().await;
    assert_eq!(receiver.duplicates(), 0);
    // The test ladder no longer lists bigco's lanes; remove them by hand.
    for q in [big_first, big_retry] {
        t.channel
            .queue_delete(q.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}

/// A healthy endpoint answering 2xx in 100 ms, and tenant acme's subscription `sub_a` to it with
/// a cap of `cap`. Faster than the shortest deferral queue: an endpoint none of whose attempts
/// has answered within that delay counts as stuck (see `route::is_stuck`), which is not what
/// its tests are about.
/// The secret's file lives as long as the third value.
async fn slow_capped_endpoint(cap: u32) -> (Receiver, Subscription, common::Secret) {
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| {
        Reply::Slow(Duration::from_millis(100), 200)
    })
    .await
    .unwrap();
    let mut capped = subscription("sub_a", "acme", &receiver.url("/"), &s);
    capped.max_concurrent = Some(cap);
    (receiver, capped, s)
}

#[tokio::test]
async fn the_per_endpoint_cap_bounds_concurrency_and_defers_what_finds_it_full() {
    // One long tier: a deferral that waited there would hold its envelope for 30 s. The
    // deferral queues are short, and the second is in no step of anything but an escalation.
    let ladder = Ladder::build(
        &common::unique("cap"),
        QueueType::Quorum,
        &["30s"],
        &["30s"; 2],
    )
    .unwrap()
    .with_deferrals(&["200ms", "700ms"])
    .unwrap();
    let t = TestLadder::apply_ladder(common::config(), ladder).await;
    let (receiver, capped, _secret) = slow_capped_endpoint(3).await;
    let worker = RunningWorker::start_with(&t, t.config.clone(), vec![capped]).await;
    let published = std::time::Instant::now();
    t.publish_all((0..30).map(|i| event(&format!("evt_{i:02}"), "acme", "sub_a")))
        .await;
    assert!(
        receiver
            .wait_until(Duration::from_secs(60), |r| r.delivered_count() == 30)
            .await
    );
    let took = published.elapsed();
    let m = worker.metrics.clone();
    worker.stop().await;
    assert_eq!(receiver.max_in_flight(), 3);
    // 30 envelopes at 3 x 100 ms cannot all get a slot at once: some were deferred, with no
    // request made, and none was charged an attempt for it.
    assert!(m.count("hookrelay_deferrals_total", &[("reason", "concurrency")]) > 0);
    assert_eq!(
        receiver.request_count(),
        receiver.delivered_count(),
        "no request was made for a deferral"
    );
    assert!(receiver.records().iter().all(|r| r.attempt == 1));
    // A healthy endpoint at its cap: deferred into the deferral queues, never into the tier,
    // so the last envelope came back in a fraction of the tier's 30 s (10 rounds of 100 ms
    // take 1 s; the rest is the deferrals' round trips).
    let into = |tier: &str| m.count("hookrelay_retries_total", &[("tier", tier)]);
    assert_eq!(into("retry-30s"), 0, "a cap deferral waited in the tier");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // The first deferral waits 200 ms; one that finds the cap full again in a row waits longer.
    assert!(into("defer-200ms") > 0);
    assert!(
        into("defer-700ms") > 0,
        "busy deferrals in a row escalate: {} then {}",
        into("defer-200ms"),
        into("defer-700ms")
    );
    eprintln!(
        "took {took:?}; deferrals into defer-200ms {}, into defer-700ms {}",
        into("defer-200ms"),
        into("defer-700ms")
    );
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
}

/// An endpoint that answers 503 until the flag is set, then as `recovered`.
async fn down_until_healthy(s: &common::Secret, recovered: Reply) -> (Receiver, Arc<AtomicBool>) {
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&healthy);
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), move |_| {
        if flag.load(Ordering::SeqCst) {
            recovered.clone()
        } else {
            Reply::Status(503)
        }
    })
    .await
    .unwrap();
    (receiver, healthy)
}

#[tokio::test]
async fn the_breaker_opens_refuses_probes_and_closes() {
    // The 2s tier is where retries and deferred envelopes wait out the breaker's cool-down,
    // which is never longer than the schedule's shortest wait.
    let t = TestLadder::apply("breaker", &["200ms", "2s"], &["2s"; 8]).await;
    let s = secret();
    let (receiver, healthy) = down_until_healthy(&s, Reply::Status(200)).await;
    let mut config = t.config.clone();
    config.endpoints.breaker_failures = 3;
    config.endpoints.breaker_cooldown = Duration::from_secs(2);
    // Deferred envelopes outlive this ladder's 1.6 s span, the default horizon.
    config.endpoints.horizon = Duration::from_secs(60);
    config.worker.in_flight = 4; // few at once, so the breaker sees failures in sequence
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![subscription("sub_a", "acme", &receiver.url("/"), &s)],
    )
    .await;
    t.publish_all((0..5).map(|i| event(&format!("evt_{i}"), "acme", "sub_a")))
        .await;
    // Open: after a few failures, attempts stop while envelopes keep cycling through the tier.
    let m = worker.metrics.clone();
    wait_until(WAIT, async || {
        m.count("hookrelay_deferrals_total", &[("reason", "breaker_open")]) >= 5
    })
    .await;
    let while_open = receiver.request_count();
    assert!(
        while_open <= 6,
        "at most the threshold (plus in-flight) reached the endpoint: {while_open}"
    );
    // A deliberate pause: whatever would reach the open endpoint has time to.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        receiver.request_count(),
        while_open,
        "nothing reaches an open endpoint"
    );
    // It recovers; the next probe succeeds and closes the breaker; everything is delivered.
    healthy.store(true, Ordering::SeqCst);
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 5)
            .await
    );
    worker.stop().await;
    let records = receiver.records();
    let first_ok = records.iter().position(|r| r.status == 200).unwrap();
    let last_fail = &records[first_ok - 1];
    assert!(
        records[first_ok].received_at_ms - last_fail.received_at_ms >= 1_900,
        "the probe came after the cool-down"
    );
}

#[tokio::test]
async fn retry_after_is_honoured_under_load() {
    const N: usize = 200;
    let t = TestLadder::apply_typed(
        "retryafter",
        QueueType::Quorum,
        &["500ms", "2s", "5s"],
        &["500ms", "500ms"],
    )
    .await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| match req.attempt {
        1 => Reply::RetryAfter(429, 2),
        _ => Reply::Status(200),
    })
    .await
    .unwrap();
    // Room for all at once: an envelope over the endpoint's cap would be deferred (at once,
    // into a deferral queue) rather than wait, which is not what this test is about.
    let mut sub = subscription("sub_a", "acme", &receiver.url("/"), &s);
    sub.max_concurrent = Some(N as u32);
    let worker = RunningWorker::start(&t, vec![sub]).await;
    t.publish_all((0..N).map(|i| event(&format!("evt_{i:03}"), "acme", "sub_a")))
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == N)
            .await
    );
    let m = worker.metrics.clone();
    worker.stop().await;
    assert_eq!(
        m.count("hookrelay_retries_total", &[("tier", "retry-2s")]),
        N as u64
    );
    assert_eq!(
        m.count("hookrelay_retries_total", &[("tier", "retry-500ms")]),
        0
    );
    let mut first = std::collections::HashMap::new();
    for r in receiver.records() {
        match r.attempt {
            1 => {
                first.insert(r.id.clone(), r.received_at_ms);
            }
            _ => {
                let gap = r.received_at_ms - first[&r.id];
                assert!(gap >= 2_000, "{} came back after {gap} ms", r.id);
            }
        }
    }
    assert_eq!(receiver.duplicates(), 0);
}

async fn readyz(addr: std::net::SocketAddr) -> u16 {
    match reqwest::get(format!("http://{addr}/readyz")).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test]
async fn deleting_a_retired_lane_under_load_ends_only_its_consumer_and_lanes_are_rediscovered() {
    const N: usize = 600;
    let t = TestLadder::apply("retire", &["300ms"], &["300ms"]).await;
    // bigco was dedicated once: its lanes exist (and are still bound), but the ladder the worker
    // runs with no longer names it, so the worker finds them through the management API.
    let once = t.ladder.clone().with_dedicated("bigco", 10).unwrap();
    once.objects().apply(&t.channel).await.unwrap();
    let (big_first, big_retry) = (once.first_lane_of("bigco"), once.retry_lane_of("bigco"));
    t.publish_all(vec![event("evt_big_1", "bigco", "sub_big")])
        .await;
    assert_eq!(t.depth(&big_first).await, 1);
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let subs = vec![
        subscription("sub_big", "bigco", &receiver.url("/big"), &s),
        subscription("sub_a", "acme", &receiver.url("/"), &s),
    ];
    let worker = RunningWorker::start(&t, subs).await;
    let addr = worker.vitals.unwrap();
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered().contains_key("evt_big_1"))
            .await,
        "the retired lane is drained"
    );
    assert!(wait_until(WAIT, async || readyz(addr).await == 200).await);
    // `hookrelay status` shows the retired lanes, and what to do with them.
    let api = common::management(&t.config);
    let mut next = None;
    wait_until(WAIT, async || {
        let rows = hookrelay::ops::status::collect(&api, &t.ladder, None)
            .await
            .unwrap();
        next = rows
            .into_iter()
            .find(|r| r.queue == big_first)
            .map(|r| r.next);
        next.is_some()
    })
    .await;
    let next = next.expect("status lists a retired lane");
    assert!(next.contains("no longer dedicated"), "{next}");

    // Load on the shared lane; the retired lanes are deleted while it flows.
    let load = {
        let publisher = t.publisher().await;
        let ingress = t.ladder.ingress();
        tokio::spawn(async move {
            for i in 0..N {
                let e = event(&format!("evt_{i:04}"), "acme", "sub_a");
                publisher.publish_event(&ingress, &e, 4096).await.unwrap();
            }
        })
    };
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() > N / 10)
            .await
    );
    for q in [&big_first, &big_retry] {
        t.channel
            .queue_delete(q.as_str().into(), Default::default())
            .await
            .unwrap();
    }
    load.await.unwrap();
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == N + 1)
            .await,
        "deliveries on the other lanes continued ({} of {})",
        receiver.delivered_count(),
        N + 1
    );
    assert_eq!(
        readyz(addr).await,
        200,
        "still ready without the retired lanes"
    );
    assert_eq!(
        worker.metrics.count("hookrelay_reconnects_total", &[]),
        0,
        "the session went on: only the deleted lanes' consumers ended"
    );

    // A new session (the broker closed the connection) consumes what exists and no more: it
    // does not try the deleted lanes forever.
    let consume = format!("{} consume", worker.name);
    assert!(
        wait_until(WAIT, async || common::connections_named(&api, &consume)
            .await
            >= 1)
        .await
    );
    assert_eq!(api.close_connections_named(&consume).await.unwrap(), 1);
    t.publish_all(vec![event("evt_after_reconnect", "acme", "sub_a")])
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered().contains_key("evt_after_reconnect"))
            .await
    );
    assert!(
        wait_until(WAIT, async || readyz(addr).await == 200).await,
        "ready again after the reconnect"
    );

    // Retired lanes that appear later are found without a restart.
    once.objects().apply(&t.channel).await.unwrap();
    t.publish_all(vec![event("evt_big_2", "bigco", "sub_big")])
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered().contains_key("evt_big_2"))
            .await,
        "a retired lane that appeared later was drained"
    );
    assert_eq!(readyz(addr).await, 200);
    worker.stop().await;
    assert_eq!(receiver.duplicates(), 0);
    // The ladder the test removes does not name bigco's lanes.
    t.owns_queue(&big_first);
    t.owns_queue(&big_retry);
}

#[tokio::test]
async fn one_paths_failures_never_defer_another_paths_deliveries() {
    // Three subscriptions of one tenant on three paths of one host, as hooks.slack.com-style
    // shared hosts are: one path fails, one takes everything, one rejects.
    let t = TestLadder::apply("paths", &["300ms", "2s"], &["300ms"; 8]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |r| match r.path {
        "/hook/flaky" => Reply::Status(503),
        "/hook/reject" => Reply::Status(400),
        _ => Reply::Status(204),
    })
    .await
    .unwrap();
    let mut config = t.config.clone();
    config.endpoints.breaker_failures = 3;
    config.endpoints.breaker_cooldown = Duration::from_secs(60);
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![
            subscription("sub_flaky", "acme", &receiver.url("/hook/flaky"), &s),
            subscription("sub_ok", "acme", &receiver.url("/hook/ok"), &s),
            subscription("sub_reject", "acme", &receiver.url("/hook/reject"), &s),
        ],
    )
    .await;
    t.publish_all((0..10).map(|i| event(&format!("evt_flaky_{i}"), "acme", "sub_flaky")))
        .await;
    // The flaky path's breaker is open before the others' events arrive.
    let m = worker.metrics.clone();
    wait_until(WAIT, async || {
        m.count("hookrelay_deferrals_total", &[("reason", "breaker_open")]) >= 1
    })
    .await;
    t.publish_all((0..10).map(|i| event(&format!("evt_ok_{i}"), "acme", "sub_ok")))
        .await;
    t.publish_all((0..5).map(|i| event(&format!("evt_reject_{i}"), "acme", "sub_reject")))
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| {
                r.records()
                    .iter()
                    .filter(|x| x.path != "/hook/flaky")
                    .count()
                    >= 15
            })
            .await,
        "every envelope of the healthy paths reached its endpoint"
    );
    worker.stop().await;
    // Each got its request on its first attempt: nothing was deferred behind the flaky path.
    for r in receiver
        .records()
        .iter()
        .filter(|r| r.path != "/hook/flaky")
    {
        assert_eq!(r.attempt, 1, "{} to {} was deferred first", r.id, r.path);
    }
    assert_eq!(receiver.delivered_count(), 10);
    let mut rejected = 0;
    for dead in t.drain_dead().await {
        let p = &dead.delivery.properties;
        let sub = headers::read_str_header(p, headers::SUBSCRIPTION_HEADER).unwrap_or_default();
        if sub != "sub_reject" {
            continue;
        }
        assert_eq!(
            headers::read_str_header(p, headers::REASON_HEADER).as_deref(),
            Some("rejected")
        );
        rejected += 1;
    }
    assert_eq!(rejected, 5, "every 400 was dead-lettered as rejected");
}

/// An endpoint that accepts connections and never answers, until dropped.
struct Hang {
    url: String,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Hang {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        Self {
            url,
            accepted,
            task,
        }
    }
}

impl Drop for Hang {
    fn drop(&mut self) {
        // The held sockets close: a request still waiting fails at once.
        self.task.abort();
    }
}

#[tokio::test]
async fn a_delivery_over_its_endpoints_cap_leaves_the_lane_at_once() {
    let t = TestLadder::apply("nowait", &["1s"], &["1s"; 4]).await;
    let s = secret();
    let hang = Hang::start().await;
    let healthy = common::ok_receiver(&s).await;
    let mut a = subscription("sub_a", "acme", &hang.url, &s);
    a.max_concurrent = Some(1);
    let mut config = t.config.clone();
    config.http.request_timeout = Duration::from_secs(60);
    config.worker.shutdown_grace = Duration::from_secs(90);
    config.worker.in_flight = 4;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![a, subscription("sub_b", "bravo", &healthy.url("/"), &s)],
    )
    .await;
    // A's backlog first: one attempt hangs at A's endpoint, the rest find A's cap full.
    t.publish_all((0..20).map(|i| event(&format!("evt_a_{i:02}"), "acme", "sub_a")))
        .await;
    t.publish_all((0..5).map(|i| event(&format!("evt_b_{i}"), "bravo", "sub_b")))
        .await;
    assert!(
        healthy.wait_until(WAIT, |r| r.delivered_count() == 5).await,
        "B's events were delivered while A's one attempt still hangs"
    );
    assert_eq!(hang.accepted.load(Ordering::SeqCst), 1, "A's cap is 1");
    let m = worker.metrics.clone();
    assert!(m.count("hookrelay_deferrals_total", &[("reason", "concurrency")]) >= 1);
    // A's one attempt never answers: once its endpoint has shown no progress for the shortest
    // deferral queue's delay, its deliveries wait in the tier instead of cycling through the
    // deferral queues.
    let into = |tier: &str| m.count("hookrelay_retries_total", &[("tier", tier)]);
    assert!(
        wait_until(WAIT, async || into("retry-1s") > 0).await,
        "a stuck endpoint's deferrals went on cycling: {} into defer-250ms",
        into("defer-250ms")
    );
    assert_eq!(into("defer-5s"), 0, "no escalation while stuck");
    drop(hang);
    worker.stop().await;
}

#[tokio::test]
async fn a_hanging_endpoint_holds_at_most_its_share_of_the_lane() {
    let t = TestLadder::apply("share", &["1s"], &["1s"; 4]).await;
    let s = secret();
    let hang = Hang::start().await;
    let healthy = common::ok_receiver(&s).await;
    let mut config = t.config.clone();
    config.http.request_timeout = Duration::from_secs(60);
    config.worker.shutdown_grace = Duration::from_secs(90);
    // 16 first-attempt slots and 4 retry slots; A's cap (64) is far above both.
    config.worker.in_flight = 20;
    config.worker.retry_share = 0.2;
    config.endpoints.lane_share = 0.25;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![
            subscription("sub_a", "acme", &hang.url, &s),
            subscription("sub_b", "bravo", &healthy.url("/"), &s),
        ],
    )
    .await;
    // A's backlog first: 4 attempts (a quarter of 16) hang; the rest leave the lane at once.
    t.publish_all((0..30).map(|i| event(&format!("evt_a_{i:02}"), "acme", "sub_a")))
        .await;
    t.publish_all((0..5).map(|i| event(&format!("evt_b_{i}"), "bravo", "sub_b")))
        .await;
    assert!(
        healthy.wait_until(WAIT, |r| r.delivered_count() == 5).await,
        "B's events were delivered while A's attempts hang: {} of A's accepted",
        hang.accepted.load(Ordering::SeqCst)
    );
    let m = worker.metrics.clone();
    assert!(m.count("hookrelay_deferrals_total", &[("reason", "lane_share")]) >= 1);
    // A's deferrals come back through the retry lane, whose quarter of 4 is 1.
    let accepted = hang.accepted.load(Ordering::SeqCst);
    assert!(
        (4..=5).contains(&accepted),
        "A's endpoint took {accepted} attempts at once: 4 from the first-attempt lane, at most 1 from the retry lane"
    );
    drop(hang);
    worker.stop().await;
}

#[tokio::test]
async fn deferrals_are_not_attempts_and_the_horizon_ends_them_on_fresh_evidence() {
    // A budget of 31 attempts that a 3 s horizon ends long before it is spent.
    let t = TestLadder::apply("horizon", &["200ms", "400ms", "800ms"], &["200ms"; 30]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(503))
        .await
        .unwrap();
    let mut config = t.config.clone();
    // The first failure opens the breaker. Its cool-down is cut to the schedule's shortest
    // wait (200 ms), so probes go on; everything else is deferred, not attempted.
    config.endpoints.breaker_failures = 1;
    config.endpoints.breaker_cooldown = Duration::from_secs(3600);
    config.endpoints.horizon = Duration::from_secs(3);
    config.worker.in_flight = 4;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![subscription("sub_a", "acme", &receiver.url("/"), &s)],
    )
    .await;
    t.publish_all((0..10).map(|i| event(&format!("evt_{i}"), "acme", "sub_a")))
        .await;
    assert!(t.wait_dead(10, WAIT).await, "every envelope ended");
    worker.stop().await;
    let dead = t.drain_dead().await;
    assert_eq!(dead.len(), 10);
    for d in dead {
        let p = &d.delivery.properties;
        let id = p.message_id().as_ref().unwrap().to_string();
        let reason = headers::read_str_header(p, headers::REASON_HEADER).unwrap();
        let attempts = headers::read_u64_header(p, headers::ATTEMPTS_HEADER).unwrap();
        // The budget counts the requests the endpoint saw, nothing else.
        let requests = receiver.records_for(&id).len() as u64;
        assert_eq!(
            attempts, requests,
            "{id}: {reason} with {attempts} attempts"
        );
        assert_ne!(
            (reason.as_str(), attempts),
            ("exhausted", 0),
            "{id} was exhausted without a request"
        );
        // An envelope that happened to take every probe may spend its whole budget.
        if reason == "exhausted" {
            assert_eq!(attempts, 31, "{id}");
            continue;
        }
        assert_eq!(reason, "horizon_expired", "{id}");
        let deferrals = headers::read_u64_header(p, headers::DEFERRALS_HEADER).unwrap();
        assert!(deferrals >= 1, "{id}");
        // Not before its horizon.
        let first = headers::read_u64_header(p, headers::FIRST_TRY_HEADER).unwrap();
        let dead_at = headers::read_u64_header(p, headers::DEAD_AT_HEADER).unwrap();
        assert!(dead_at - first >= 3_000, "{id} expired early");
        let error = headers::read_str_header(p, headers::LAST_ERROR_HEADER).unwrap();
        assert!(error.contains("the delivery horizon 3s passed"), "{error}");
        // On fresh evidence: a request to the endpoint since the envelope last went to wait,
        // which failed.
        let since = headers::read_u64_header(p, headers::WAITING_SINCE_HEADER).unwrap();
        assert!(
            receiver
                .records()
                .iter()
                .any(|r| r.received_at_ms >= since && r.status == 503),
            "{id} expired with no request to its endpoint since it last waited"
        );
    }
}

#[tokio::test]
async fn waiting_for_a_busy_endpoints_turn_never_runs_out_the_horizon() {
    // A short ladder, so a short horizon: 1 s. A healthy endpoint at its cap of 2, each answer
    // taking 100 ms, gets 60 envelopes at once: draining them takes 3 s of its time and
    // several busy deferrals in a row for many (escalating to defer-5s), far past the horizon.
    // Waiting one's turn is not trying: every envelope is delivered, none expires.
    let t = TestLadder::apply("busyhorizon", &["200ms"], &["200ms"]).await;
    let (receiver, capped, _secret) = slow_capped_endpoint(2).await;
    let mut config = t.config.clone();
    config.endpoints.horizon = Duration::from_secs(1);
    let worker = RunningWorker::start_with(&t, config, vec![capped]).await;
    let published = std::time::Instant::now();
    t.publish_all((0..60).map(|i| event(&format!("evt_{i:02}"), "acme", "sub_a")))
        .await;
    let delivered = receiver
        .wait_until(Duration::from_secs(90), |r| r.delivered_count() == 60)
        .await;
    eprintln!("60 delivered in {:?}", published.elapsed());
    let m = worker.metrics.clone();
    worker.stop().await;
    let dead = t.depth(&t.ladder.dead()).await;
    assert!(
        delivered,
        "{} of 60 delivered, {dead} dead-lettered",
        receiver.delivered_count()
    );
    assert_eq!(dead, 0);
    assert!(m.count("hookrelay_deferrals_total", &[("reason", "concurrency")]) > 0);
    assert_eq!(receiver.max_in_flight(), 2);
    assert_eq!(receiver.duplicates(), 0);
}

/// The operational events published on the events exchange whose key matches `pattern`, from
/// the moment the queue is bound.
async fn events_queue(t: &TestLadder, pattern: &str) -> String {
    use lapin::options::{QueueBindOptions, QueueDeclareOptions};
    let q = t
        .channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                ..QueueDeclareOptions::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    t.channel
        .queue_bind(
            q.name().clone(),
            t.ladder.events_exchange().as_str().into(),
            pattern.into(),
            QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    q.name().to_string()
}

async fn next_events(t: &TestLadder, queue: &str, seen: &mut Vec<serde_json::Value>) {
    while let Some(m) = t
        .channel
        .basic_get(
            queue.into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        seen.push(serde_json::from_slice(&m.delivery.data).unwrap());
    }
}

#[tokio::test]
async fn an_endpoint_open_too_long_is_quarantined_then_recovers() {
    // Budget enough that the probes (every 200 ms, the schedule's shortest wait) do not spend
    // it before the endpoint recovers.
    let t = TestLadder::apply("quarantine", &["200ms", "1s"], &["200ms"; 30]).await;
    let s = secret();
    let (receiver, healthy) = down_until_healthy(&s, Reply::Status(200)).await;
    let events = events_queue(&t, "endpoint.*").await;
    let mut config = t.config.clone();
    config.endpoints.breaker_failures = 1;
    config.endpoints.breaker_cooldown = Duration::from_millis(300);
    config.endpoints.quarantine_after = Duration::from_secs(1);
    config.worker.in_flight = 4;
    let worker = RunningWorker::start_with(
        &t,
        config,
        vec![subscription("sub_a", "acme", &receiver.url("/hook"), &s)],
    )
    .await;
    t.publish_all((0..3).map(|i| event(&format!("evt_{i}"), "acme", "sub_a")))
        .await;
    let mut seen = Vec::new();
    wait_until(WAIT, async || {
        next_events(&t, &events, &mut seen).await;
        !seen.is_empty()
    })
    .await;
    assert_eq!(seen[0]["event"], "endpoint.quarantined", "{seen:?}");
    let endpoint = seen[0]["endpoint"].as_str().unwrap().to_owned();
    assert!(
        endpoint.starts_with("127.0.0.1:") && endpoint.contains('#'),
        "{endpoint}"
    );
    assert!(!endpoint.contains("/hook"), "the path is not shown");
    let m = worker.metrics.clone();
    assert_eq!(m.endpoints_quarantined.get(), 1);
    assert_eq!(
        m.endpoint_quarantined
            .with_label_values(&[endpoint.as_str()])
            .get(),
        1
    );
    // It recovers: the next probe closes the breaker, once announced.
    healthy.store(true, Ordering::SeqCst);
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 3)
            .await
    );
    wait_until(WAIT, async || {
        next_events(&t, &events, &mut seen).await;
        seen.len() >= 2
    })
    .await;
    worker.stop().await;
    next_events(&t, &events, &mut seen).await;
    let kinds: Vec<&str> = seen.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["endpoint.quarantined", "endpoint.recovered"]);
    assert_eq!(seen[1]["endpoint"], endpoint.as_str());
    assert_eq!(m.endpoints_quarantined.get(), 0);
}

#[tokio::test]
async fn a_recovered_endpoint_is_ramped_up_not_stampeded() {
    const N: usize = 40;
    const CAP: usize = 8;
    // The 1s tier is where envelopes wait out the breaker's cool-down, and they come back from
    // it together; the 200ms tier paces those that find the recovering endpoint at its limit.
    let t = TestLadder::apply("ramp", &["200ms", "1s"], &["200ms"; 8]).await;
    let s = secret();
    // Slow enough that what is sent together is answered together.
    let (receiver, healthy) =
        down_until_healthy(&s, Reply::Slow(Duration::from_millis(200), 200)).await;
    let mut config = t.config.clone();
    config.endpoints.breaker_failures = 3;
    config.endpoints.breaker_cooldown = Duration::from_secs(1);
    let start = config.endpoints.recovery_start as usize; // the default
    assert!((1..CAP / 2).contains(&start));
    let mut sub = subscription("sub_a", "acme", &receiver.url("/"), &s);
    sub.max_concurrent = Some(CAP as u32);
    let worker = RunningWorker::start_with(&t, config, vec![sub]).await;
    t.publish_all((0..N).map(|i| event(&format!("evt_{i:02}"), "acme", "sub_a")))
        .await;
    // The outage: the breaker opens and the backlog waits in the tiers.
    let m = worker.metrics.clone();
    assert!(
        wait_until(WAIT, async || {
            m.count("hookrelay_deferrals_total", &[("reason", "breaker_open")]) >= N as u64
        })
        .await
    );
    healthy.store(true, Ordering::SeqCst);
    assert!(
        receiver
            .wait_until(Duration::from_secs(60), |r| r.delivered_count() == N)
            .await,
        "delivered {} of {N}",
        receiver.delivered_count()
    );
    worker.stop().await;

    // After the probe that closed the breaker (the first 200), in arrival order: when k requests
    // have gone out and c of them were answered, the limit is start + c and k - c are out at
    // once, so the k-th found at most (k + start) / 2. With the full cap at once, the backlog
    // coming back together finds 1, 2, ... 8 at once.
    let mut records = receiver.records();
    records.sort_by_key(|r| r.arrival);
    let probe = records.iter().position(|r| r.status == 200).unwrap();
    let after: Vec<usize> = records[probe + 1..].iter().map(|r| r.concurrent).collect();
    assert!(
        records[probe + 1..].iter().all(|r| r.status == 200),
        "nothing failed after the recovery"
    );
    for (k, concurrent) in (1..).zip(&after) {
        assert!(
            2 * concurrent <= k + start,
            "request {k} after the recovery found {concurrent} at once (start {start}): {after:?}"
        );
    }
    assert!(
        after[..4].iter().all(|&c| c <= start + 1),
        "the first requests after the recovery came few at a time: {after:?}"
    );
    // It grew to the cap, and the ramp ended there.
    assert_eq!(after.iter().max(), Some(&CAP), "{after:?}");
    assert_eq!(m.endpoints_recovering.get(), 0);
    assert!(m.count("hookrelay_deferrals_total", &[("reason", "recovery")]) > 0);
    // Every envelope exactly once, none dead-lettered.
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
}
