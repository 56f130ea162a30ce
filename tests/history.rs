//! History on the real broker and PostgreSQL: `hookrelay history` writes every stream record
//! once, also when it is killed with `kill -9` in the middle of its work, and `hookrelay trace`
//! tells an envelope's story through two tiers, the dead sink, a redrive and its delivery, from
//! the database and from the streams alone.

mod common;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::pg::TestDb;
use common::{RunningWorker, TestLadder, event, hookrelay, ladder_file, secret, subscription};
use futures_util::future::try_join_all;
use hookrelay::contract::retention::StreamKind;
use hookrelay::history::materialize::{self, HistorySetup};
use hookrelay::history::{HistoryMetrics, trace};
use hookrelay::observe::events::AttemptRecord;
use hookrelay_tools::kit::wait_until;
use lapin::BasicProperties;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);

fn record(i: usize) -> AttemptRecord {
    AttemptRecord {
        envelope: Some(format!("evt_{i:06}")),
        event: None,
        tenant: Some("acme".into()),
        subscription: Some("sub_a".into()),
        attempt: 1,
        status: Some(204),
        error: None,
        latency_ms: Some(3),
        outcome: "delivered".into(),
        tier: None,
        lane: "lane".into(),
        redrives: 0,
        replay: None,
        at: hookrelay::units::now_rfc3339(),
    }
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// `hookrelay history` as a process of its own.
fn history_process(t: &TestLadder, ladder: &std::path::Path, db: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .arg("history")
        .env("HOOKRELAY_AMQP_URL", t.config.amqp.url.expose())
        .env("HOOKRELAY_LADDER", ladder)
        .env("HOOKRELAY_HISTORY_DATABASE", db)
        .env("HOOKRELAY_HISTORY_LISTEN", "")
        .env("HOOKRELAY_HISTORY_BATCH", "400")
        .env("HOOKRELAY_LOG_LEVEL", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn history_writes_each_record_once_across_kill_9_in_the_middle_of_its_work() {
    const N: usize = 30_000;
    let t = TestLadder::apply("history_kill", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let db = TestDb::create().await;
    let store = db.store().await;
    let pool = store.pool().clone();

    let publisher = t.publisher().await;
    let exchange = t.ladder.attempts_exchange();
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        let mut confirms = Vec::new();
        for i in chunk {
            let r = record(*i);
            let body = serde_json::to_vec(&r).unwrap();
            confirms.push(
                publisher
                    .send(
                        &exchange,
                        &r.routing_key(),
                        &body,
                        BasicProperties::default(),
                        true,
                    )
                    .await
                    .unwrap(),
            );
        }
        try_join_all(confirms).await.unwrap();
    }

    // Killed twice while it writes: each time some batches are in and more are on the way.
    let mut seen_kills = Vec::new();
    for _ in 0..2 {
        let mut history = history_process(&t, &ladder, &db.url);
        let before = count(&pool, "SELECT count(*) FROM history_attempts").await;
        let started = wait_until(WAIT, async || {
            count(&pool, "SELECT count(*) FROM history_attempts").await > before
        })
        .await;
        assert!(started, "history wrote nothing in {WAIT:?}");
        // kill_on_drop's kill is SIGKILL.
        history.start_kill().unwrap();
        history.wait().await.unwrap();
        seen_kills.push(count(&pool, "SELECT count(*) FROM history_attempts").await);
    }
    assert!(
        seen_kills.iter().all(|n| (*n as usize) < N),
        "killed before the end: {seen_kills:?}"
    );

    let mut history = history_process(&t, &ladder, &db.url);
    let done = wait_until(Duration::from_secs(120), async || {
        count(
            &pool,
            "SELECT next_offset FROM history_progress WHERE stream LIKE '%attempts'",
        )
        .await as usize
            >= N
    })
    .await;
    history.start_kill().unwrap();
    history.wait().await.unwrap();
    assert!(done, "history did not reach the stream's end");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM history_attempts").await as usize,
        N,
        "every record once (killed at {seen_kills:?})"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT envelope) FROM history_attempts"
        )
        .await as usize,
        N
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(DISTINCT stream_offset) FROM history_attempts"
        )
        .await as usize,
        N
    );
    // The day partition was made, and the rows are in it rather than in the parent.
    let partitions: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'history_attempts'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        partitions
            .iter()
            .all(|p| p.starts_with("history_attempts_p"))
            && !partitions.is_empty(),
        "{partitions:?}"
    );
}

#[tokio::test]
async fn trace_tells_two_tiers_a_dead_letter_a_redrive_and_the_delivery() {
    let t = TestLadder::apply("history_trace", &["300ms", "600ms"], &["300ms", "600ms"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder_arg = ladder.to_str().unwrap();
    let db = TestDb::create().await;
    let store = db.store().await;
    let pool = store.pool().clone();
    let stop = CancellationToken::new();
    let mut config = t.config.history.clone();
    config.flush = Duration::from_millis(50);
    let history = tokio::spawn(materialize::run(
        HistorySetup {
            pool: pool.clone(),
            amqp_url: t.config.amqp.url.clone(),
            ladder: t.ladder.clone(),
            config,
            metrics: HistoryMetrics::new(),
        },
        stop.clone(),
    ));

    let s = secret();
    let (receiver, healthy) = common::failing_until_healthy(&s, "never").await;
    let subs = vec![subscription("sub_a", "acme", &receiver.url("/"), &s)];
    let worker = RunningWorker::start(&t, subs.clone()).await;
    let mut e = event("evt_traced", "acme", "sub_a");
    e.event_type = "order.paid".into();
    t.publish(&e).await;
    // Attempt 1 retried into 300ms, 2 into 600ms, 3 exhausted: dead.
    assert!(t.wait_dead(1, WAIT).await);
    worker.stop().await;
    healthy.store(true, Ordering::SeqCst);
    let (code, out, err) = hookrelay(&["redrive", "--ladder", ladder_arg], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let worker = RunningWorker::start(&t, subs).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    worker.stop().await;

    let mut story = None;
    let told = wait_until(WAIT, async || {
        story = trace::story(&pool, "evt_traced", None).await.unwrap();
        story
            .as_ref()
            .is_some_and(|s| s.attempts.len() == 4 && s.accepted.len() == 2)
    })
    .await;
    assert!(told, "history: {story:?}");
    let story = story.unwrap();
    let steps: Vec<(i32, &str, Option<&str>, i32)> = story
        .attempts
        .iter()
        .map(|a| (a.attempt, a.outcome.as_str(), a.tier.as_deref(), a.redrives))
        .collect();
    let tiers: Vec<String> = t.ladder.tiers.iter().map(|t| t.name.clone()).collect();
    assert_eq!(
        steps,
        vec![
            (1, "retried", Some(tiers[0].as_str()), 0),
            (2, "retried", Some(tiers[1].as_str()), 0),
            (3, "exhausted", None, 0),
            (1, "delivered", None, 1),
        ]
    );
    // The producer's publish, and the redrive's through the ingress.
    let accepted: Vec<i32> = story.accepted.iter().map(|a| a.redrives).collect();
    assert_eq!(accepted, vec![0, 1], "{:?}", story.accepted);
    assert_eq!(story.accepted[0].event_type.as_deref(), Some("order.paid"));
    assert_eq!(
        story
            .outcomes
            .iter()
            .map(|o| (o.envelope.as_str(), o.outcome.as_str()))
            .collect::<Vec<_>>(),
        vec![("evt_traced", "delivered")]
    );
    // Another tenant's caller learns nothing.
    assert!(
        trace::story(&pool, "evt_traced", Some("globex"))
            .await
            .unwrap()
            .is_none()
    );

    let (code, out, err) = hookrelay(
        &["trace", "evt_traced"],
        &[("HOOKRELAY_HISTORY_DATABASE", db.url.as_str())],
    );
    assert_eq!(code, Some(0), "{err}");
    for expected in [
        "accepted at the ingress",
        &format!("waits in {}", tiers[0]),
        &format!("waits in {}", tiers[1]),
        "attempt 3 to sub_a: exhausted",
        "redriven out of the dead sink (1)",
        "attempt 1 to sub_a: delivered, HTTP 200",
        "outcome: delivered",
    ] {
        assert!(out.contains(expected), "{expected:?} in:\n{out}");
    }
    // Without the database: the streams over a window tell the same.
    let (code, scanned, err) = hookrelay(
        &[
            "trace",
            "evt_traced",
            "--since",
            "10m",
            "--ladder",
            ladder_arg,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(scanned, out, "the streams and the database tell one story");
    let (code, _, err) = hookrelay(
        &[
            "trace",
            "evt_never",
            "--since",
            "10m",
            "--ladder",
            ladder_arg,
        ],
        &[],
    );
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("history holds nothing"), "{err}");

    // Status says how far history has read each stream.
    let (code, status, err) = hookrelay(
        &["status", "--ladder", ladder_arg],
        &[("HOOKRELAY_HISTORY_DATABASE", db.url.as_str())],
    );
    assert_eq!(code, Some(0), "{err}");
    for kind in [StreamKind::Archive, StreamKind::Attempts] {
        let line = format!("{}: read to offset", t.ladder.stream(kind));
        assert!(status.contains(&line), "{line:?} in:\n{status}");
    }

    stop.cancel();
    history.await.unwrap().unwrap();
    let ids: Vec<String> = sqlx::query_scalar("SELECT DISTINCT envelope FROM history_attempts")
        .fetch_all(&pool)
        .await
        .unwrap();
    let ids: BTreeSet<String> = ids.into_iter().collect();
    assert_eq!(ids, BTreeSet::from(["evt_traced".to_owned()]));
}

#[tokio::test]
async fn an_attempt_log_in_every_form_reads_the_same_into_history_and_trace() {
    // Records as releases before the compact batch wrote them (one object; an array of one
    // routing key), and a compact batch of two tenants, in one attempt log.
    let t = TestLadder::apply("history_forms", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let db = TestDb::create().await;
    let store = db.store().await;
    let pool = store.pool().clone();
    let exchange = t.ladder.attempts_exchange();
    let mut bigco = record(5);
    bigco.tenant = Some("bigco".into());
    bigco.outcome = "retried".into();
    bigco.status = Some(503);
    bigco.error = Some("HTTP 503".into());
    bigco.tier = Some("retry-1s".into());
    let old_one = serde_json::to_vec(&record(1)).unwrap();
    let old_array = serde_json::to_vec(&[record(2), record(3)]).unwrap();
    let compact = hookrelay::observe::attempt_log::encode_batch(&[record(4), bigco.clone()]);
    let publisher = t.publisher().await;
    for (key, body) in [
        ("delivered.acme", old_one),
        ("delivered.acme", old_array),
        ("delivered.acme", compact),
    ] {
        publisher
            .send(&exchange, key, &body, BasicProperties::default(), true)
            .await
            .unwrap()
            .await
            .unwrap();
    }
    publisher.close().await;

    let mut history = history_process(&t, &ladder, &db.url);
    let done = wait_until(WAIT, async || {
        count(
            &pool,
            "SELECT coalesce(max(next_offset), 0) FROM history_progress WHERE stream LIKE '%attempts'",
        )
        .await
            >= 3
    })
    .await;
    history.start_kill().unwrap();
    history.wait().await.unwrap();
    assert!(done, "history did not read the three messages");
    let envelopes: Vec<String> =
        sqlx::query_scalar("SELECT envelope FROM history_attempts ORDER BY envelope")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        envelopes,
        (1..=5).map(|i| format!("evt_{i:06}")).collect::<Vec<_>>()
    );
    // The compact batch's second record, whole: its tenant, error and tier, from the database
    // and from the stream alone.
    let story = trace::story(&pool, "evt_000005", None)
        .await
        .unwrap()
        .unwrap();
    let a = &story.attempts[0];
    assert_eq!(
        (a.outcome.as_str(), a.status, a.tier.as_deref()),
        ("retried", Some(503), Some("retry-1s"))
    );
    assert!(
        trace::story(&pool, "evt_000005", Some("acme"))
            .await
            .unwrap()
            .is_none(),
        "the record is bigco's"
    );
    let ladder_arg = ladder.to_str().unwrap();
    let (code, from_db, err) = hookrelay(
        &["trace", "evt_000005"],
        &[("HOOKRELAY_HISTORY_DATABASE", db.url.as_str())],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, from_streams, err) = hookrelay(
        &[
            "trace",
            "evt_000005",
            "--since",
            "10m",
            "--ladder",
            ladder_arg,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(from_streams, from_db);
    for i in [1, 2, 3, 4] {
        let (code, out, err) = hookrelay(
            &[
                "trace",
                &format!("evt_{i:06}"),
                "--since",
                "10m",
                "--ladder",
                ladder_arg,
            ],
            &[],
        );
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("delivered, HTTP 204"), "{out}");
    }
}
