//! Operating hookrelay on the real broker: vital signs, status, drain on SIGTERM, tier hold and
//! release, dead-letter redrive, the attempt log, and the shipped alert rules.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{
    Counters, RunningWorker, SubsFile, TestLadder, event, hookrelay, ladder_file, secret,
    subscription, subscription_toml, unique, wait_until, worker_process,
};
use hookrelay::contract::headers;
use hookrelay::contract::headers::REASON_HEADER;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::retention::StreamKind;
use hookrelay::observe::events::AttemptRecord;
use hookrelay_tools::receiver::{Receiver, Reply};

const WAIT: Duration = Duration::from_secs(30);

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let resp = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

fn sample(metrics: &str, name_and_labels: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(name_and_labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn the_worker_serves_metrics_health_and_readiness() {
    let t = TestLadder::apply("vitals", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| match req.attempt {
        1 if req.id == "evt_retry" => Reply::Status(503),
        _ => Reply::Status(200),
    })
    .await
    .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    let addr = worker.vitals.unwrap();
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    let mut ready = 0;
    wait_until(Duration::from_secs(5), async || {
        ready = http_get(addr, "/readyz").await.0;
        ready == 200
    })
    .await;
    assert_eq!(ready, 200, "ready once consuming");
    for id in ["evt_ok", "evt_retry"] {
        t.publish(&event(id, "acme", "sub_a")).await;
    }
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    // The queue gauges come from polls of the management API: wait until one has succeeded.
    let tier_gauge = format!(
        "hookrelay_queue_ready_messages{{queue=\"{}\",role=\"tier\"}}",
        t.ladder.tier_queue(first_tier(&t.ladder))
    );
    let (mut status, mut text) = (0, String::new());
    wait_until(WAIT, async || {
        (status, text) = http_get(addr, "/metrics").await;
        // An outcome is counted once settled (its record confirmed, the delivery acked), a
        // moment after the endpoint answered.
        sample(&text, "hookrelay_broker_stats_up") == Some(1.0)
            && text.contains(&tier_gauge)
            && sample(
                &text,
                &format!(
                    "hookrelay_outcomes_total{{lane=\"{}\",outcome=\"delivered\"}}",
                    t.ladder.retry_lane()
                ),
            ) == Some(1.0)
    })
    .await;
    assert_eq!(status, 200);
    let first = t.ladder.first_lane();
    let retry = t.ladder.retry_lane();
    assert_eq!(
        sample(
            &text,
            &format!("hookrelay_outcomes_total{{lane=\"{first}\",outcome=\"retried\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("hookrelay_outcomes_total{{lane=\"{retry}\",outcome=\"delivered\"}}")
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "hookrelay_promotions_total{tier=\"retry-300ms\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "hookrelay_promotion_lag_seconds_count{tier=\"retry-300ms\"}"
        ),
        Some(1.0)
    );
    assert_eq!(sample(&text, "hookrelay_broker_stats_up"), Some(1.0));
    assert_eq!(sample(&text, "hookrelay_consuming"), Some(1.0));
    assert!(
        text.contains(&format!(
            "hookrelay_queue_ready_messages{{queue=\"{}\",role=\"tier\"}}",
            t.ladder.tier_queue(first_tier(&t.ladder))
        )),
        "{text}"
    );
    assert!(
        sample(
            &text,
            &format!("hookrelay_oldest_ready_age_seconds{{lane=\"{first}\"}}")
        )
        .is_some()
    );
    assert!(text.contains("hookrelay_attempt_duration_seconds_bucket"));
    worker.stop().await;
    assert!(
        reqwest::get(format!("http://{addr}/healthz"))
            .await
            .is_err(),
        "served no more after stop"
    );
}

#[tokio::test]
async fn status_shows_every_queue_of_the_ladder_and_explains_failures() {
    let t = TestLadder::apply("status", &["1s", "5s"], &["1s", "5s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();

    let (code, out, err) = hookrelay(&["status", "--json", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<serde_json::Value> = serde_json::from_str(out.trim()).unwrap();
    let roles: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["queue"].as_str().unwrap().to_owned(),
                r["role"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let p = &t.ladder.prefix;
    assert_eq!(
        roles,
        vec![
            (format!("{p}.ready.first"), "lane".into()),
            (format!("{p}.ready.retry"), "lane".into()),
            (format!("{p}.retry-1s"), "tier".into()),
            (format!("{p}.retry-5s"), "tier".into()),
            // The deferral queues, after the tiers, as TTL queues like them.
            (format!("{p}.defer-250ms"), "tier".into()),
            (format!("{p}.defer-500ms"), "tier".into()),
            (format!("{p}.defer-1s"), "tier".into()),
            (format!("{p}.defer-5s"), "tier".into()),
            (format!("{p}.dead"), "dead".into()),
            // The streams, last: history, not work.
            (format!("{p}.archive"), "stream".into()),
            (format!("{p}.attempts"), "stream".into()),
        ]
    );
    assert_eq!(
        rows[9]["next"],
        "every accepted event, kept max_age 7days, max_bytes 5.0 GB"
    );
    assert_eq!(rows[2]["ttl"], "1s");
    assert_eq!(
        rows[2]["next"],
        format!("on expiry -> {p}.promote -> retry lane")
    );
    assert_eq!(rows[4]["ttl"], "250ms");
    assert_eq!(rows[4]["next"], rows[2]["next"]);

    let (code, table, _) = hookrelay(&["status", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0));
    assert!(
        table.contains("READY") && table.contains("UNACKED") && table.contains("TTL"),
        "{table}"
    );
    assert!(table.contains(&format!("{p}.retry-5s")), "{table}");
    // Nobody consumes the test's ladder: a fleet of none.
    assert!(
        table.contains(&format!("Workers: 0 (consumers of {p}.ready.first;")),
        "{table}"
    );

    // A ladder nobody applied, and a management API that does not answer.
    let other = dir.path().join("other.toml");
    std::fs::write(
        &other,
        "prefix = \"t-nowhere\"\ntiers = [\"1s\"]\nschedule = []\n",
    )
    .unwrap();
    let (code, _, err) = hookrelay(&["status", "--ladder", other.to_str().unwrap()], &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("hookrelay topology apply"), "{err}");
    let (code, _, err) = hookrelay(
        &["status", "--ladder", ladder],
        &[("HOOKRELAY_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:1")],
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains("management API at http://127.0.0.1:1/ is not reachable"),
        "{err}"
    );
}

#[tokio::test]
async fn sigterm_drains_under_load_and_loses_nothing() {
    const N: usize = 600;
    let t = TestLadder::apply("drain", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| {
        Reply::Slow(Duration::from_millis(100), 200)
    })
    .await
    .unwrap();
    let (_files, mut worker) = subprocess_for(&t, &receiver, &s);
    let mut child = worker
        .env("HOOKRELAY_WORKER_IN_FLIGHT", "70")
        .env("HOOKRELAY_WORKER_SHUTDOWN_GRACE", "25s")
        .env("HOOKRELAY_HTTP_REQUEST_TIMEOUT", "5s")
        .env("HOOKRELAY_HTTP_TOKEN_TIMEOUT", "1s")
        .env("HOOKRELAY_LOG_LEVEL", "warn")
        .spawn()
        .unwrap();
    t.publish_all((0..N).map(|i| event(&format!("evt_{i:04}"), "acme", "sub_a")))
        .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() >= 100)
            .await
    );
    terminate(&child);
    let exit = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit.code(), Some(0), "a drained worker exits 0");
    let at_exit = receiver.request_count();
    assert!(
        at_exit < N,
        "the drain stopped consuming ({at_exit} of {N} delivered)"
    );

    // Another worker delivers the rest: every envelope once, none twice.
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == N)
            .await
    );
    worker.stop().await;
    assert_eq!(receiver.duplicates(), 0);
    assert_eq!(receiver.request_count(), N);
}

/// The files a worker process delivering to `receiver` as `sub_a` of acme runs from (kept
/// while the returned guard lives), and its command.
fn subprocess_for(
    t: &TestLadder,
    receiver: &Receiver,
    s: &common::Secret,
) -> ((tempfile::TempDir, SubsFile), tokio::process::Command) {
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(t, &dir);
    let subs = SubsFile::new(&subscription_toml(
        "sub_a",
        "acme",
        &receiver.url("/"),
        &s.file_ref(),
        "",
    ));
    let name = format!("{} subprocess", t.ladder.prefix);
    let command = worker_process(&name, &ladder, &subs.path);
    ((dir, subs), command)
}

/// Sends SIGTERM to `child`.
fn terminate(child: &tokio::process::Child) {
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
}

#[tokio::test]
async fn sigterm_with_a_republish_in_flight_exits_within_the_grace() {
    const GRACE: Duration = Duration::from_secs(8);
    // Generous for a loaded machine; a drain that waited the grace twice would take 16 s.
    const MARGIN: Duration = Duration::from_secs(6);
    let t = TestLadder::apply("graceful", &["300ms"], &["300ms"]).await;
    // The tier is unreachable: the retry comes back as unroutable and is tried again for as
    // long as the lease allows, far longer than the grace.
    let tier = first_tier(&t.ladder);
    t.channel
        .queue_unbind(
            t.ladder.tier_queue(tier).as_str().into(),
            t.ladder.tier_exchange(tier).as_str().into(),
            "".into(),
            Default::default(),
        )
        .await
        .unwrap();
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(503))
        .await
        .unwrap();
    let port = common::node::free_port();
    let (_files, mut worker) = subprocess_for(&t, &receiver, &s);
    let mut child = worker
        .env(
            "HOOKRELAY_WORKER_SHUTDOWN_GRACE",
            format!("{}s", GRACE.as_secs()),
        )
        .env("HOOKRELAY_HTTP_CONNECT_TIMEOUT", "1s")
        .env("HOOKRELAY_HTTP_REQUEST_TIMEOUT", "2s")
        .env("HOOKRELAY_HTTP_TOKEN_TIMEOUT", "1s")
        .env("HOOKRELAY_AMQP_CONFIRM_TIMEOUT", "1s")
        .env("HOOKRELAY_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("HOOKRELAY_LOG_LEVEL", "warn")
        .spawn()
        .unwrap();
    t.publish(&event("evt_in_flight", "acme", "sub_a")).await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let retrying = wait_until(WAIT, async || {
        let Ok(resp) = reqwest::get(format!("http://{addr}/metrics")).await else {
            return false;
        };
        let text = resp.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("hookrelay_republish_failures_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            >= 2.0
    })
    .await;
    assert!(retrying, "the retry's republish is being tried again");
    assert_eq!(receiver.request_count(), 1);
    let asked = std::time::Instant::now();
    terminate(&child);
    let exit = tokio::time::timeout(GRACE * 4, child.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    let took = asked.elapsed();
    println!("exit {took:?} after SIGTERM, grace {GRACE:?}");
    assert_eq!(exit.code(), Some(0), "a drained worker exits 0");
    assert!(
        took <= GRACE + MARGIN,
        "exit took {took:?}, grace {GRACE:?} (+ {MARGIN:?} allowed)"
    );
    // What could not be settled within the grace was never acked: it is back in its lane.
    assert!(
        wait_until(WAIT, async || t.depth(&t.ladder.first_lane()).await == 1).await,
        "the envelope is back in its lane"
    );
}

#[tokio::test]
async fn sigterm_while_the_worker_first_connects_exits_cleanly() {
    // A broker that takes the TCP connection and never says a word.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let t = TestLadder::apply("early", &["300ms"], &["300ms"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let s = secret();
    let subs = SubsFile::new(&subscription_toml(
        "sub_a",
        "acme",
        "http://127.0.0.1:9/",
        &s.file_ref(),
        "",
    ));
    let mut child = worker_process("early", &ladder, &subs.path)
        .env(
            "HOOKRELAY_AMQP_URL",
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        )
        // Long enough that the connect is still waiting when the signal comes.
        .env("HOOKRELAY_AMQP_CONFIRM_TIMEOUT", "20s")
        .env("HOOKRELAY_WORKER_SHUTDOWN_GRACE", "2m")
        .spawn()
        .unwrap();
    let (_held, _) = tokio::time::timeout(WAIT, silent.accept())
        .await
        .expect("the worker connects")
        .unwrap();
    terminate(&child);
    let exit = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the worker exits")
        .unwrap();
    assert_eq!(
        exit.code(),
        Some(0),
        "SIGTERM before the worker started is a clean exit, not death by signal: {exit:?}"
    );
}

#[tokio::test]
async fn a_held_tier_parks_what_expires_and_release_delivers_each_once() {
    const N: usize = 40;
    let t = TestLadder::apply("hold", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let s = secret();
    let receiver = common::failing_first_attempts(&s).await;
    let (code, out, err) = hookrelay(&["tier", "hold", "retry-1s", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Held"), "{out}");

    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    for i in 0..N {
        t.publish(&event(&format!("evt_{i:03}"), "acme", "sub_a"))
            .await;
    }
    // Every first attempt fails; after the tier's second, everything is parked, nothing promoted.
    let parked = t.ladder.held_queue(first_tier(&t.ladder));
    wait_until(WAIT, async || t.depth(&parked).await >= N as u32).await;
    assert_eq!(t.depth(&parked).await, N as u32);
    assert_eq!(receiver.request_count(), N, "no second attempt while held");
    let (code, out, _) = hookrelay(&["tier", "status", "--json", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0));
    let states: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(states[0]["held"], true);

    let (code, out, err) = hookrelay(
        &[
            "tier", "release", "retry-1s", "--rate", "200/s", "--ladder", ladder,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("{N} parked message(s) returned")),
        "{out}"
    );
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == N)
            .await
    );
    worker.stop().await;
    // Exactly once each, with the original ids, on their second attempt.
    let delivered = receiver.delivered();
    assert_eq!(delivered.len(), N);
    assert!(delivered.values().all(|&n| n == 1));
    assert!((0..N).all(|i| delivered.contains_key(&format!("evt_{i:03}"))));
    assert!(
        receiver
            .records()
            .iter()
            .filter(|r| r.status == 200)
            .all(|r| r.attempt == 2)
    );
    let (_, out, _) = hookrelay(&["tier", "status", "--json", "--ladder", ladder], &[]);
    let states: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(states[0]["held"], false);
    assert!(
        states[0]["parked"].is_null(),
        "the parking queue is removed once empty"
    );
}

#[tokio::test]
async fn redrive_moves_what_matches_with_its_ids_and_leaves_the_rest_in_order() {
    let t = TestLadder::apply("redrive", &["200ms"], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let s = secret();
    let (receiver, healthy) = common::failing_until_healthy(&s, "reject").await;
    let mut subs = vec![subscription("sub_a", "acme", &receiver.url("/"), &s)];
    subs.push(subscription("sub_g", "globex", &receiver.url("/"), &s));
    let worker = RunningWorker::start(&t, subs.clone()).await;
    // One attempt per envelope (empty schedule): 500 is exhausted at once, 400 rejected.
    let sent = [
        ("evt_reject_1", "acme", "sub_a"),
        ("evt_fail_1", "acme", "sub_a"),
        ("evt_reject_2", "globex", "sub_g"),
        ("evt_reject_3", "acme", "sub_a"),
        ("evt_fail_2", "globex", "sub_g"),
    ];
    for (id, tenant, sub) in sent {
        t.publish(&event(id, tenant, sub)).await;
        // One at a time, so the sink's order is known.
        assert!(
            t.wait_dead(
                sent.iter().position(|x| x.0 == id).unwrap() as u32 + 1,
                WAIT
            )
            .await
        );
    }
    let m = worker.metrics.clone();
    worker.stop().await;
    assert_eq!(
        m.count("hookrelay_outcomes_total", &[("outcome", "rejected")]),
        3
    );

    let (code, out, err) = hookrelay(
        &[
            "redrive",
            "--tenant",
            "acme",
            "--reason",
            "rejected",
            "--dry-run",
            "--ladder",
            ladder,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("would move 2"), "{out}");
    // The dry run hands back what it looked at with a nack the broker applies a moment later.
    wait_until(WAIT, async || t.depth(&t.ladder.dead()).await >= 5).await;
    assert_eq!(
        t.depth(&t.ladder.dead()).await,
        5,
        "a dry run moves nothing"
    );

    let (code, out, err) = hookrelay(
        &[
            "redrive", "--tenant", "acme", "--reason", "rejected", "--rate", "100/s", "--ladder",
            ladder,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("moved 2"), "{out}");
    assert!(out.contains("3 stayed in the sink"), "{out}");

    healthy.store(true, Ordering::SeqCst);
    let before = receiver.request_count();
    let worker = RunningWorker::start(&t, subs).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    worker.stop().await;
    let redelivered: Vec<(String, u32)> = receiver.records()[before..]
        .iter()
        .map(|r| (r.id.clone(), r.attempt))
        .collect();
    let ids: HashSet<_> = redelivered.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, HashSet::from(["evt_reject_1", "evt_reject_3"]));
    assert!(
        redelivered.iter().all(|(_, attempt)| *attempt == 1),
        "a fresh budget: {redelivered:?}"
    );

    // The rest stayed, in their order, untouched.
    let rest: Vec<(String, String)> = t
        .drain_dead()
        .await
        .iter()
        .map(|m| {
            let p = &m.delivery.properties;
            (
                p.message_id().as_ref().unwrap().to_string(),
                headers::read_str_header(p, REASON_HEADER).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rest,
        vec![
            ("evt_fail_1".to_owned(), "exhausted".to_owned()),
            ("evt_reject_2".to_owned(), "rejected".to_owned()),
            ("evt_fail_2".to_owned(), "exhausted".to_owned()),
        ]
    );
}

#[tokio::test]
async fn the_attempt_log_records_every_outcome() {
    let t = TestLadder::apply("attempts", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| {
        match (req.id, req.attempt) {
            ("evt_retry", 1) => Reply::Status(503),
            ("evt_bad", _) => Reply::Status(404),
            _ => Reply::Status(200),
        }
    })
    .await
    .unwrap();
    let tail = t.tail_attempts("acme", 5).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    for id in ["evt_ok", "evt_retry", "evt_bad"] {
        t.publish(&event(id, "acme", "sub_a")).await;
    }
    t.publish(&event("evt_nosub", "acme", "sub_missing")).await;
    let records = tokio::time::timeout(WAIT, tail).await.unwrap().unwrap();
    worker.stop().await;
    let mut by_outcome: BTreeMap<String, Vec<AttemptRecord>> = BTreeMap::new();
    for r in records.iter() {
        by_outcome
            .entry(r.outcome.clone())
            .or_default()
            .push(r.clone());
    }
    let delivered = &by_outcome["delivered"];
    assert_eq!(delivered.len(), 2);
    assert!(
        delivered
            .iter()
            .all(|r| r.status == Some(200) && r.latency_ms.is_some())
    );
    let retried = &by_outcome["retried"][0];
    assert_eq!(
        (retried.envelope.as_deref(), retried.attempt, retried.status),
        (Some("evt_retry"), 1, Some(503))
    );
    assert_eq!(retried.tier.as_deref(), Some("retry-300ms"));
    assert_eq!(retried.lane, t.ladder.first_lane());
    let rejected = &by_outcome["rejected"][0];
    assert_eq!(
        (rejected.status, rejected.subscription.as_deref()),
        (Some(404), Some("sub_a"))
    );
    let invalid = &by_outcome["invalid"][0];
    assert_eq!(invalid.attempt, 0);
    assert_eq!(
        invalid.error.as_deref(),
        Some("unknown subscription \"sub_missing\"")
    );
    assert!(records.iter().all(|r| r.tenant.as_deref() == Some("acme")));
}

/// The metrics and labels each expression names are checked in tests/monitoring.rs.
#[test]
fn the_alert_rules_parse_and_cover_every_tier() {
    let text = include_str!("../monitoring/alerts.yml");
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap();
    let mut alerts = Vec::new();
    let mut stalled_tiers = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            assert!(rule["expr"].as_str().is_some(), "{alert} has an expr");
            assert!(rule["for"].as_str().is_some(), "{alert} has a for: clause");
            assert!(rule["annotations"]["summary"].as_str().is_some());
            if alert == "HookrelayTierStalled" {
                stalled_tiers.push(rule["labels"]["tier"].as_str().unwrap().to_owned());
            }
            alerts.push(alert.to_owned());
        }
    }
    for must in [
        "HookrelayReadyLaneBehind",
        "HookrelayTierStalled",
        "HookrelayDeadSinkGrowing",
        "HookrelayHistoryBehind",
    ] {
        assert!(alerts.iter().any(|a| a == must), "{must} missing");
    }
    let ladder =
        hookrelay::contract::ladder::Ladder::parse(include_str!("../topology/ladder.toml"))
            .unwrap();
    let tiers: Vec<String> = ladder
        .tier_ids()
        .map(|id| ladder.tier(id).name.clone())
        .collect();
    assert_eq!(
        stalled_tiers, tiers,
        "every tier and deferral queue of the default ladder has a stall rule"
    );
}

fn first_tier(ladder: &hookrelay::contract::ladder::Ladder) -> hookrelay::contract::ladder::TierId {
    ladder.tier_at(0).unwrap()
}

/// Release lifts the hold, then unbinds the parking queue only once the broker is seen to stop
/// parking the tier's expiries. Here a policy of the operator's own keeps the tier parking after
/// the hold is gone: release must stop, say so, and leave the parking queue bound.
#[tokio::test]
async fn release_refuses_to_unbind_while_the_tier_still_parks() {
    let t = TestLadder::apply("unlifted", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let tier = first_tier(&t.ladder);
    let parking = t.ladder.held_queue(tier);
    t.owns_queue(&parking);
    let (code, _, err) = hookrelay(&["tier", "hold", "retry-1s", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0), "{err}");

    let api = common::management(&t.config);
    let other = format!("{}.operators-own", t.ladder.prefix);
    let pattern = format!("^{}$", t.ladder.tier_queue(tier).replace('.', "\\."));
    api.put_policy(
        &other,
        &hookrelay::broker::management::Policy {
            pattern,
            apply_to: "queues".into(),
            priority: 1,
            definition: [(
                "dead-letter-routing-key".to_owned(),
                serde_json::json!(t.ladder.held_routing_key(tier)),
            )]
            .into_iter()
            .collect(),
        },
    )
    .await
    .unwrap();

    let (code, out, err) = hookrelay(
        &[
            "tier", "release", "retry-1s", "--rate", "200/s", "--ladder", ladder,
        ],
        &[],
    );
    let still_bound = api.objects().await.unwrap().bindings.iter().any(|b| {
        b.source == t.ladder.promote_exchange()
            && b.destination == parking
            && b.routing_key == t.ladder.held_routing_key(tier)
    });
    api.delete_policy(&other).await.unwrap();
    assert_ne!(code, Some(0), "release claimed success: {out}");
    assert!(err.contains("still parks"), "{err}");
    assert!(err.contains(&other), "the error names the policy: {err}");
    assert!(still_bound, "the parking queue stays bound");
}

/// Pausing and resuming a subscription (the command line sets `paused` in the file the worker
/// reloads), under load: what arrives while it is paused (fresh events, a fan-out's delivery,
/// retries promoted from a tier) waits in its parking queue, unattempted and uncharged; resume
/// returns each once, with its id and its attempt count as they were.
// Two threads: the worker goes on while the command line runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_subscription_parks_everything_and_resume_delivers_each_once_uncharged() {
    const RETRIED: usize = 20;
    const FRESH: usize = 60;
    let t = TestLadder::apply("pause", &["3s"], &["3s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let s = secret();
    // The first attempts of the `evt_r` envelopes fail, so they wait in the tier when the pause
    // comes; everything else is accepted.
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| {
        match (req.id.starts_with("evt_r"), req.attempt) {
            (true, 1) => Reply::Status(503),
            _ => Reply::Status(200),
        }
    })
    .await
    .unwrap();
    let entry =
        |extra: &str| subscription_toml("sub_a", "acme", &receiver.url("/"), &s.file_ref(), extra);
    let file = SubsFile::new(&entry(""));
    let subs = file.path.to_str().unwrap();
    let worker = RunningWorker::start_from_file(&t, &file).await;
    let reloads = |w: &RunningWorker| {
        w.metrics.count(
            "hookrelay_subscription_reloads_total",
            &[("result", "applied")],
        )
    };

    t.publish_all((0..RETRIED).map(|i| event(&format!("evt_r{i:03}"), "acme", "sub_a")))
        .await;
    assert!(wait_until(WAIT, async || receiver.request_count() >= RETRIED).await);
    // A reload that pauses, before the tier gives the failed ones back.
    let (code, out, err) = hookrelay(&["subscriptions", "pause", "sub_a", "--file", subs], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("Paused sub_a"), "{out}");
    assert!(wait_until(WAIT, async || reloads(&worker) >= 1).await);
    t.publish_all((0..FRESH).map(|i| event(&format!("evt_f{i:03}"), "acme", "sub_a")))
        .await;
    let mut fan = event("evt_fan", "acme", "sub_a");
    fan.subscription = None;
    t.publish(&fan).await;

    let parking = t.ladder.paused_queue("sub_a");
    t.owns_queue(&parking);
    let total = RETRIED + FRESH + 1;
    assert!(
        wait_until(WAIT, async || t.depth_if_exists(&parking).await
            >= total as u32)
        .await,
        "everything parks ({} of {total})",
        t.depth_if_exists(&parking).await
    );
    assert_eq!(
        receiver.request_count(),
        RETRIED,
        "nothing attempted while paused"
    );
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);

    // Resume unpauses the file (a reload that resumes), then returns the parked ones.
    let resume = [
        "subscriptions",
        "resume",
        "sub_a",
        "--rate",
        "500/s",
        "--ladder",
        ladder,
        "--file",
        subs,
    ];
    let (code, out, err) = hookrelay(&resume, &[("HOOKRELAY_RELOAD_INTERVAL", "200ms")]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains(&format!("{total} parked")), "{out}");
    assert!(
        wait_until(WAIT, async || reloads(&worker) >= 2).await,
        "the worker saw the file unpaused"
    );
    let text = std::fs::read_to_string(&file.path).unwrap();
    assert_eq!(
        text,
        entry("").replace("id = \"sub_a\"\n", "id = \"sub_a\"\npaused = false\n"),
        "the file keeps its layout; pause added the line, resume changed its value"
    );
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == total)
            .await,
        "every parked envelope delivered ({} of {total})",
        receiver.delivered_count()
    );
    worker.stop().await;

    let delivered = receiver.delivered();
    assert_eq!(delivered.len(), total);
    assert!(delivered.values().all(|&n| n == 1), "{delivered:?}");
    let fanned = hookrelay::contract::envelope::derived_id("evt_fan", "sub_a");
    assert!(delivered.contains_key(fanned.as_str()), "{delivered:?}");
    for r in receiver.records().iter().filter(|r| r.status == 200) {
        // The parking charged nothing: a retried one's second attempt is its second.
        let expected = if r.id.starts_with("evt_r") { 2 } else { 1 };
        assert_eq!(r.attempt, expected, "{}", r.id);
    }
    assert!(
        (0..FRESH).all(|i| delivered.contains_key(&format!("evt_f{i:03}"))),
        "original ids"
    );
    assert!(
        wait_until(WAIT, async || !t.queue_exists(&parking).await).await,
        "the parking queue is removed once empty"
    );
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
}

#[tokio::test]
async fn an_unbound_attempt_log_is_counted_and_said_once_never_dumped_per_record() {
    // A ladder whose attempt log has no stream (turned off), and nobody else keeps it.
    let ladder = Ladder::build(&unique("unrouted-log"), QueueType::Quorum, &["1s"], &["1s"])
        .unwrap()
        .with_stream(StreamKind::Attempts, None);
    let t = TestLadder::apply_ladder(common::config(), ladder).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let ((_dir, _subs), mut command) = subprocess_for(&t, &receiver, &s);
    let port = common::node::free_port();
    let child = command
        .env("HOOKRELAY_LOG_LEVEL", "info")
        .env("HOOKRELAY_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Records with several routing keys, over more than a second: nobody keeps the log.
    for round in 0..3 {
        t.publish_all((0..20).map(|i| common::event(&format!("evt_{round}_{i}"), "acme", "sub_a")))
            .await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    assert!(
        receiver
            .wait_until(Duration::from_secs(20), |r| r.delivered_count() == 60)
            .await
    );
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let counted = wait_until(Duration::from_secs(10), async || {
        let (_, metrics) = http_get(addr, "/metrics").await;
        sample(&metrics, "hookrelay_notices_unroutable_total").is_some_and(|n| n >= 1.0)
    })
    .await;
    terminate(&child);
    let out = child.wait_with_output().await.unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !log.contains("returned us a message"),
        "no record is dumped per return: {log}"
    );
    assert!(counted, "unroutable notices are counted");
    let said = log.matches("no queue is bound").count();
    assert_eq!(said, 1, "said once a minute at most: {log}");
}

/// Every redrive pass returns to the sink what it keeps, and a quorum queue counts each return.
/// RabbitMQ 4 gives quorum queues a delivery limit of 20 by default and drops a message past it
/// (the sink has no dead-letter exchange of its own); the ladder's delivery-limit policy lifts
/// that. A dead letter kept by 25 passes is still in the sink, on 3.x and on 4.x alike.
#[tokio::test]
async fn a_dead_letter_kept_by_25_redrive_passes_stays_in_the_sink() {
    const PASSES: usize = 25;
    let t = TestLadder::apply("kept25", &["300ms"], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(400))
        .await
        .unwrap();
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    t.publish(&event("evt_kept", "acme", "sub_a")).await;
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;
    let sink = t.ladder.dead();
    let api = common::management(&t.config);
    // The management API shows a queue's policy with its statistics, a moment late.
    let in_force = wait_until(WAIT, async || {
        api.queue(&sink)
            .await
            .unwrap()
            .and_then(|q| q.policy)
            .is_some_and(|p| p == t.ladder.delivery_limit_policy())
    })
    .await;
    assert!(
        in_force,
        "the ladder's delivery-limit policy is in force on the sink"
    );
    for _ in 0..PASSES {
        // Another tenant's: the pass examines the dead letter and returns it.
        let (code, out, err) =
            hookrelay(&["redrive", "--tenant", "nobody", "--ladder", ladder], &[]);
        assert_eq!(code, Some(0), "{out}{err}");
    }
    let kept = t.drain_dead().await;
    assert_eq!(kept.len(), 1, "the dead letter survived {PASSES} returns");
    let returns = kept[0]
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count").cloned());
    let returns = match returns {
        Some(lapin::types::AMQPValue::LongLongInt(n)) => n,
        Some(lapin::types::AMQPValue::LongInt(n)) => i64::from(n),
        other => panic!("a quorum queue counts returns in x-delivery-count: {other:?}"),
    };
    assert!(returns >= PASSES as i64, "returned {returns} times");
}
