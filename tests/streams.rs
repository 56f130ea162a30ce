//! The ladder's streams on the real broker: the archive keeps every event the ingress accepts
//! (shared lanes and dedicated ones alike), the attempt log keeps every record, and `topology
//! apply` adds them to a running ladder and takes them out again without touching delivery.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{
    RunningWorker, TestLadder, config, event, hookrelay, ladder_file, ok_receiver, secret,
    subscription, unique,
};
use hookrelay::broker::streams::{StreamReader, StreamStart};
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::contract::retention::StreamKind;
use hookrelay::observe::events::AttemptRecord;

const WAIT: Duration = Duration::from_secs(20);
/// How long a read waits for messages beyond those expected.
const EXTRA: Duration = Duration::from_secs(2);

/// What `each` makes of the messages of `stream` from its start, read until it has made `n` or
/// `wait` ends. What is published with a confirm is in the stream already, so a short `wait`
/// past the expected count sees any extra.
async fn read_with<T>(
    t: &TestLadder,
    stream: &str,
    n: usize,
    wait: Duration,
    mut each: impl FnMut(&lapin::message::Delivery) -> Vec<T>,
) -> Vec<T> {
    let mut reader = StreamReader::open(&t.conn, stream, StreamStart::First, 100)
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, async {
        while out.len() < n {
            let Some(Ok(m)) = reader.next().await else {
                break;
            };
            out.extend(each(&m.delivery));
        }
    })
    .await;
    reader.close().await;
    out
}

/// (message id or body, routing key, `type`, `x-subscription`) of each of `stream`'s first `n`
/// messages, or of what arrived within `wait`.
async fn read(
    t: &TestLadder,
    stream: &str,
    n: usize,
    wait: Duration,
) -> Vec<(String, String, String, String)> {
    read_with(t, stream, n, wait, |d| {
        let p = &d.properties;
        let id = p
            .message_id()
            .as_ref()
            .map(|s| s.to_string())
            .unwrap_or_else(|| String::from_utf8_lossy(&d.data).into_owned());
        let subscription = p
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-subscription").cloned())
            .map(|v| match v {
                lapin::types::AMQPValue::LongString(s) => s.to_string(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        vec![(
            id,
            d.routing_key.to_string(),
            p.kind().as_ref().map(|s| s.to_string()).unwrap_or_default(),
            subscription,
        )]
    })
    .await
}

/// At least `n` attempt records from the start of `stream` (a message may carry several), each
/// with its message's routing key, or what arrived within `wait`.
async fn read_records(
    t: &TestLadder,
    stream: &str,
    n: usize,
    wait: Duration,
) -> Vec<(AttemptRecord, String)> {
    read_with(t, stream, n, wait, |d| {
        let records = AttemptRecord::read_message(&d.data).unwrap();
        // A batch goes out under its first record's routing key; the other keys it carries
        // ride in `BCC`, which the broker routes by and strips.
        assert_eq!(
            records.first().map(AttemptRecord::routing_key).as_deref(),
            Some(d.routing_key.as_str())
        );
        records
            .into_iter()
            .map(|r| (r, d.routing_key.to_string()))
            .collect()
    })
    .await
}

#[tokio::test]
async fn the_archive_keeps_every_accepted_event_and_the_attempt_log_every_record() {
    let ladder = Ladder::build(
        &unique("streams"),
        QueueType::Quorum,
        &["300ms"],
        &["300ms"],
    )
    .unwrap()
    .with_dedicated("bigco", 10)
    .unwrap();
    let t = TestLadder::apply_ladder(config(), ladder).await;
    let archive = t.ladder.stream(StreamKind::Archive);
    let attempts = t.ladder.stream(StreamKind::Attempts);

    // Shared-lane and dedicated-lane events, published (and confirmed) before any worker runs.
    let mut published = BTreeSet::new();
    for i in 0..10 {
        let id = format!("evt_arch_acme_{i}");
        t.publish(&event(&id, "acme", "sub_a")).await;
        published.insert(id);
    }
    for i in 0..5 {
        let id = format!("evt_arch_bigco_{i}");
        t.publish(&event(&id, "bigco", "sub_b")).await;
        published.insert(id);
    }
    let kept = read(&t, &archive, published.len() + 1, EXTRA).await;
    let ids: BTreeSet<String> = kept.iter().map(|k| k.0.clone()).collect();
    assert_eq!(ids, published, "every accepted event, once: {kept:?}");
    assert_eq!(kept.len(), published.len(), "{kept:?}");
    for (id, routing_key, kind, sub) in &kept {
        let tenant = if id.contains("bigco") {
            "bigco"
        } else {
            "acme"
        };
        assert_eq!(routing_key, tenant, "the producer's routing key is kept");
        assert_eq!(kind, "order.paid", "the event type is kept");
        assert_eq!(sub, if tenant == "bigco" { "sub_b" } else { "sub_a" });
    }
    // The lanes got them too: the archive is a copy, not a detour.
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 10);
    assert_eq!(t.depth(&t.ladder.first_lane_of("bigco")).await, 5);

    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = RunningWorker::start(
        &t,
        vec![
            subscription("sub_a", "acme", &receiver.url("/a"), &s),
            subscription("sub_b", "bigco", &receiver.url("/b"), &s),
        ],
    )
    .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == published.len())
            .await
    );
    // Every delivery's record is in the attempt log's stream, with nothing bound by hand.
    let records = read_records(&t, &attempts, published.len(), WAIT).await;
    let delivered: BTreeSet<String> = records
        .into_iter()
        .map(|(r, _)| {
            assert_eq!(r.outcome, "delivered", "{r:?}");
            r.envelope.unwrap()
        })
        .collect();
    assert_eq!(delivered, published);
    worker.stop().await;
    // Delivery read nothing out of the archive.
    assert_eq!(
        read(&t, &archive, published.len() + 1, EXTRA).await.len(),
        15
    );
}

#[tokio::test]
async fn apply_takes_a_stream_out_and_puts_it_back_without_touching_delivery() {
    let mut t = TestLadder::apply("streams-apply", &["300ms"], &["300ms"]).await;
    let archive = t.ladder.stream(StreamKind::Archive);
    let dir = tempfile::tempdir().unwrap();
    let with_archive = t.ladder.clone();

    // Turned off: apply unbinds it, keeps what it holds, and plan names it as not the ladder's.
    t.publish(&event("evt_before", "acme", "sub_a")).await;
    t.ladder = with_archive.clone().with_stream(StreamKind::Archive, None);
    let file = ladder_file(&t, &dir);
    let (code, _, err) = hookrelay(
        &["topology", "apply", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    t.publish(&event("evt_while_off", "acme", "sub_a")).await;
    let (_, plan, _) = hookrelay(
        &["topology", "plan", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert!(plan.contains(&format!("queue {archive}")), "{plan}");
    let kept: Vec<String> = read(&t, &archive, 2, EXTRA)
        .await
        .into_iter()
        .map(|k| k.0)
        .collect();
    assert_eq!(kept, ["evt_before"]);

    // Deleted, as on a ladder applied before the archive existed; apply creates it again.
    t.channel
        .queue_delete(archive.as_str().into(), Default::default())
        .await
        .unwrap();
    t.ladder = with_archive;
    let file = ladder_file(&t, &dir);
    let (code, _, err) = hookrelay(
        &["topology", "apply", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, plan, _) = hookrelay(
        &["topology", "plan", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(0), "no drift once applied: {plan}");
    t.publish(&event("evt_after", "acme", "sub_a")).await;
    let kept: Vec<String> = read(&t, &archive, 2, EXTRA)
        .await
        .into_iter()
        .map(|k| k.0)
        .collect();
    assert_eq!(kept, ["evt_after"]);
    // Every event reached the lane, whatever the archive's state.
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 3);
}

/// An RFC 3339 time for the command line, a whole second after `now` has passed: the archive's
/// time offsets are whole seconds, so the test keeps its windows two seconds apart.
async fn second_mark() -> String {
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let mark = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    mark
}

#[tokio::test]
async fn replay_publishes_what_an_outage_left_undelivered_with_the_original_ids() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let t = TestLadder::apply("replay", &["300ms"], &["300ms"]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = ladder_file(&t, &dir);
    let file = file.to_str().unwrap();
    let s = secret();
    let down = Arc::new(AtomicBool::new(true));
    let outage = Arc::clone(&down);
    // acme's endpoint is down (503) until the test brings it back; globex's is up throughout.
    let receiver =
        hookrelay_tools::receiver::Receiver::start(std::slice::from_ref(&s.whsec), move |req| {
            if req.path == "/acme" && outage.load(Ordering::SeqCst) {
                hookrelay_tools::receiver::Reply::Status(503)
            } else {
                hookrelay_tools::receiver::Reply::Status(204)
            }
        })
        .await
        .unwrap();
    let worker = RunningWorker::start(
        &t,
        vec![
            subscription("sub_a", "acme", &receiver.url("/acme"), &s),
            subscription("sub_g", "globex", &receiver.url("/globex"), &s),
        ],
    )
    .await;

    t.publish(&event("evt_before", "globex", "sub_g")).await;
    let from = second_mark().await;
    let acme: Vec<String> = (0..10).map(|i| format!("evt_out_{i}")).collect();
    for id in &acme {
        t.publish(&event(id, "acme", "sub_a")).await;
    }
    for i in 0..5 {
        t.publish(&event(&format!("evt_ok_{i}"), "globex", "sub_g"))
            .await;
    }
    // acme's ten spend their two attempts and are dead-lettered; globex's are delivered.
    assert!(t.wait_dead(10, WAIT).await);
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 6)
            .await
    );
    let to = second_mark().await;
    t.publish(&event("evt_after", "globex", "sub_g")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 7)
            .await
    );
    down.store(false, Ordering::SeqCst);

    let replay = |extra: &[&str]| {
        let mut args = vec![
            "replay", "--ladder", file, "--from", &from, "--to", &to, "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = hookrelay(&args, &[]);
        assert_eq!(code, Some(0), "{err}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    // The window holds the 15 published in it, not the ones before or after.
    let dry = replay(&["--only-undelivered", "--dry-run"]);
    assert_eq!(dry["read"], 15, "{dry}");
    assert_eq!(dry["matched"], 15, "{dry}");
    assert_eq!(dry["delivered_already"], 5, "{dry}");
    assert_eq!(dry["published"], 10, "{dry}");
    assert_eq!(receiver.delivered_count(), 7, "a dry run publishes nothing");

    let done = replay(&["--only-undelivered", "--tenant", "acme", "--rate", "100/s"]);
    assert_eq!(done["published"], 10, "{done}");
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 17)
            .await
    );
    for id in &acme {
        let got = receiver.records_for(id);
        let ok: Vec<_> = got.iter().filter(|r| r.status == 204).collect();
        assert_eq!(
            ok.len(),
            1,
            "{id} delivered once, under its own id: {got:?}"
        );
        assert_eq!(ok[0].idempotency_key, *id);
    }
    // globex's were delivered already and were not sent again.
    assert_eq!(receiver.records_for("evt_ok_0").len(), 1);

    // Now the attempt log shows every one of them delivered: nothing is left to replay.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = replay(&["--only-undelivered"]);
    assert_eq!(again["published"], 0, "{again}");
    assert_eq!(again["delivered_already"], 15, "{again}");
    worker.stop().await;
}

#[tokio::test]
async fn a_stream_reader_raced_against_timeouts_loses_no_message() {
    const N: usize = 300;
    let t = TestLadder::apply("streams_cancel", &["300ms"], &["300ms"]).await;
    let publisher = t.publisher().await;
    let exchange = t.ladder.attempts_exchange();
    let mut confirms = Vec::new();
    for i in 0..N {
        confirms.push(
            publisher
                .send(
                    &exchange,
                    "delivered.acme",
                    format!("{i}").as_bytes(),
                    lapin::BasicProperties::default(),
                    true,
                )
                .await
                .unwrap(),
        );
    }
    futures_util::future::try_join_all(confirms).await.unwrap();
    let stream = t.ladder.stream(StreamKind::Attempts);
    let mut reader = StreamReader::open(&t.conn, &stream, StreamStart::First, 50)
        .await
        .unwrap();
    let mut offsets = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    // Timeouts short enough to land between taking a message and handing it over.
    while offsets.len() < N && tokio::time::Instant::now() < deadline {
        if let Ok(Some(Ok(m))) =
            tokio::time::timeout(Duration::from_micros(20), reader.next()).await
        {
            offsets.push(m.offset.unwrap());
        }
    }
    reader.close().await;
    assert_eq!(offsets, (0..N as u64).collect::<Vec<_>>());
}

#[tokio::test]
async fn records_the_broker_returns_while_the_log_is_unbound_are_sent_again_once_it_is_bound() {
    // As a broker starting up does: the attempt log's stream is on in the ladder, but the
    // broker routes nothing to it for a while.
    let t = TestLadder::apply("streams-returned", &["300ms"], &["300ms"]).await;
    let attempts = t.ladder.stream(StreamKind::Attempts);
    let exchange = t.ladder.attempts_exchange();
    t.channel
        .queue_unbind(
            attempts.as_str().into(),
            exchange.as_str().into(),
            "#".into(),
            Default::default(),
        )
        .await
        .unwrap();
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let mut off = subscription("sub_off", "acme", &receiver.url("/off"), &s);
    off.enabled = false;
    let worker = RunningWorker::start(
        &t,
        vec![subscription("sub_a", "acme", &receiver.url("/a"), &s), off],
    )
    .await;
    let mut ids = BTreeSet::new();
    for i in 0..20 {
        let id = format!("evt_ret_{i}");
        t.publish(&event(&id, "acme", "sub_a")).await;
        ids.insert(id);
    }
    // A cancellation's record must be stored before its delivery is acked: it waits too.
    t.publish(&event("evt_ret_off", "acme", "sub_off")).await;
    ids.insert("evt_ret_off".into());
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 20)
            .await
    );
    // Not an assertion: time for the batches (5 ms linger) to come back returned. Were the
    // stream bound before, the test would pass without telling anything.
    tokio::time::sleep(Duration::from_secs(1)).await;
    t.channel
        .queue_bind(
            attempts.as_str().into(),
            exchange.as_str().into(),
            "#".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    let records = read_records(&t, &attempts, ids.len(), WAIT).await;
    worker.stop().await;
    let recorded: BTreeSet<String> = records
        .into_iter()
        .filter_map(|(r, _)| r.envelope)
        .collect();
    assert_eq!(recorded, ids, "every record, none given up while unbound");
}
