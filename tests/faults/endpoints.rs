//! Endpoints that refuse, hang, trickle, reset, send a huge body, or storm with 503s.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{self, Counters, RunningWorker, TestLadder, secret, subscription, wait_until};
use crate::harness::SETTLE;
use hookrelay::contract::headers;
use hookrelay_tools::receiver::{Receiver, Reply};
use lapin::options::BasicGetOptions;

/// A TCP endpoint that misbehaves in one way per path.
async fn faulty_endpoint() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let mut read = 0;
                // Enough to see the request line.
                while read < 16
                    && let Ok(n) = socket.read(&mut buf[read..]).await
                {
                    if n == 0 {
                        return;
                    }
                    read += n;
                }
                let head = String::from_utf8_lossy(&buf[..read]).into_owned();
                // The sleeps are the misbehaviour: a hang, a trickle.
                if head.starts_with("POST /hang") {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                } else if head.starts_with("POST /trickle") {
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
                        .await;
                    for _ in 0..100 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if socket.write_all(b"x").await.is_err() {
                            return;
                        }
                    }
                } else if head.starts_with("POST /reset") {
                    // A zero linger resets the connection at once; it does not block on drop.
                    #[allow(deprecated)]
                    let _ = socket.set_linger(Some(Duration::ZERO));
                    drop(socket);
                } else if head.starts_with("POST /huge") {
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 104857600\r\n\r\n")
                        .await;
                    let chunk = vec![b'x'; 64 * 1024];
                    for _ in 0..1600 {
                        if socket.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_faults_end_per_the_schedule_without_a_retry_storm() {
    const EACH: usize = 200;
    let t = TestLadder::apply("endpoints", &["300ms", "2s"], &["300ms", "2s", "2s"]).await;
    let s = secret();
    // One faulty server per kind: each is an endpoint of its own, with its own concurrency cap.
    let mut faulty = HashMap::new();
    for kind in ["hang", "trickle", "reset", "huge"] {
        faulty.insert(kind, faulty_endpoint().await);
    }
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // A 503 storm for 1.5 s from the first request on, then recovery.
    let storm_began = Arc::new(std::sync::OnceLock::<Instant>::new());
    let began = Arc::clone(&storm_began);
    let storm = Receiver::start(std::slice::from_ref(&s.whsec), move |_| {
        if began.get_or_init(Instant::now).elapsed() < Duration::from_millis(1500) {
            Reply::Status(503)
        } else {
            Reply::Status(200)
        }
    })
    .await
    .unwrap();
    let log = t.attempt_log_queue("all", "#").await;
    let url = |kind: &str| format!("http://{}/{kind}", faulty[kind]);
    let subs = vec![
        subscription("sub_refused", "acme", &format!("http://{refused}/"), &s),
        subscription("sub_hang", "acme", &url("hang"), &s),
        subscription("sub_trickle", "acme", &url("trickle"), &s),
        subscription("sub_reset", "acme", &url("reset"), &s),
        subscription("sub_huge", "acme", &url("huge"), &s),
        subscription("sub_storm", "acme", &storm.url("/"), &s),
    ];
    let worker = RunningWorker::start(&t, subs).await;
    let publisher = t.publisher().await;
    let kinds = ["storm", "refused", "hang", "trickle", "reset", "huge"];
    let mut published = Vec::new();
    for kind in kinds {
        for i in 0..EACH {
            let e = common::event(&format!("{kind}_{i:03}"), "acme", &format!("sub_{kind}"));
            publisher
                .publish_event(&t.ladder.ingress(), &e, 4096)
                .await
                .unwrap();
            published.push(e.id);
        }
    }
    // 4 kinds that never succeed die after 4 attempts; huge and storm are delivered.
    // Wait for every failing envelope by id: a dead letter stored twice must not count twice.
    let mut dead = Vec::new();
    let mut dead_ids = HashSet::new();
    wait_until(SETTLE, async || {
        for m in t.drain_dead().await {
            dead_ids.insert(
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .unwrap()
                    .to_string(),
            );
            dead.push(m);
        }
        dead_ids.len() >= 4 * EACH
    })
    .await;
    assert_eq!(dead_ids.len(), 4 * EACH);
    assert!(
        storm
            .wait_until(SETTLE, |r| r.delivered_count() == EACH)
            .await
    );
    let m = worker.metrics.clone();
    let mut attempts: HashMap<String, Vec<String>> = HashMap::new();
    let read_log = async |attempts: &mut HashMap<String, Vec<String>>| {
        while let Some(msg) = t
            .channel
            .basic_get(log.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            for r in
                hookrelay::observe::events::AttemptRecord::read_message(&msg.delivery.data).unwrap()
            {
                // A deferral (the endpoint's cap was full) made no request and is no attempt: its
                // record says attempt 0.
                if r.attempt == 0 {
                    continue;
                }
                attempts
                    .entry(r.envelope.unwrap())
                    .or_default()
                    .push(r.outcome);
            }
        }
    };
    // A dead letter whose confirm came late was also returned to its lane and is attempted
    // again: wait until every envelope's terminal record is in the log before stopping.
    let terminal = |attempts: &HashMap<String, Vec<String>>| {
        attempts
            .values()
            .filter(|o| {
                o.last()
                    .is_some_and(|l| l == "exhausted" || l == "delivered")
            })
            .count()
    };
    wait_until(SETTLE, async || {
        read_log(&mut attempts).await;
        terminal(&attempts) >= 6 * EACH
    })
    .await;
    // Then until nothing waits in a lane or a tier for another attempt.
    let queues: Vec<String> = [t.ladder.first_lane(), t.ladder.retry_lane()]
        .into_iter()
        .chain(t.ladder.tier_ids().map(|i| t.ladder.tier_queue(i)))
        .collect();
    wait_until(SETTLE, async || {
        for queue in &queues {
            if t.depth(queue).await > 0 {
                return false;
            }
        }
        true
    })
    .await;
    worker.stop().await;
    read_log(&mut attempts).await;
    dead.extend(t.drain_dead().await);
    let diagnosis = format!(
        "republish failures {}, notices failed {}, notices dropped {}",
        m.count("hookrelay_republish_failures_total", &[]),
        m.count("hookrelay_notices_failed_total", &[]),
        m.count("hookrelay_notices_dropped_total", &[]),
    );
    for kind in ["refused", "hang", "trickle", "reset"] {
        for i in 0..EACH {
            let id = format!("{kind}_{i:03}");
            // Exactly the ladder: three retries, then exhausted. No more, no fewer.
            assert_eq!(
                attempts[&id],
                ["retried", "retried", "retried", "exhausted"],
                "{id} ({diagnosis})"
            );
        }
    }
    let reasons: HashSet<String> = dead
        .iter()
        .map(|m| headers::read_str_header(&m.delivery.properties, headers::REASON_HEADER).unwrap())
        .collect();
    assert_eq!(reasons, HashSet::from(["exhausted".to_owned()]));
    for i in 0..EACH {
        assert_eq!(
            attempts[&format!("huge_{i:03}")],
            ["delivered"],
            "a huge body is read up to the cap"
        );
        // Through the storm within the ladder, never more attempts than it allows.
        let storm_attempts = &attempts[&format!("storm_{i:03}")];
        assert!(storm_attempts.len() <= 4, "{storm_attempts:?}");
        assert_eq!(storm_attempts.last().unwrap(), "delivered");
        assert_eq!(
            attempts[&format!("storm_{i:03}")].last().unwrap(),
            "delivered"
        );
    }
    assert_eq!(
        m.count("hookrelay_outcomes_total", &[("outcome", "exhausted")]),
        4 * EACH as u64
    );
    let stormed = (0..EACH)
        .filter(|i| attempts[&format!("storm_{i:03}")].len() > 1)
        .count();
    assert!(stormed > 0, "the storm made retries");
    // A dead letter can be stored twice when its confirm is late under load (the original then
    // returns to its lane and is dead-lettered again): counted as a duplicate, never a loss.
    let unique_dead: HashSet<String> = dead
        .iter()
        .map(|m| {
            m.delivery
                .properties
                .message_id()
                .as_ref()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(unique_dead.len(), 4 * EACH);
    // The account, from the attempt log's last record of each envelope and the dead sink.
    let ended = |outcome: &str| {
        published
            .iter()
            .filter(|id| {
                attempts
                    .get(*id)
                    .and_then(|o| o.last())
                    .is_some_and(|l| l == outcome)
            })
            .count()
    };
    let delivered = ended("delivered");
    let cancelled = ended("cancelled");
    let lost = published
        .iter()
        .filter(|id| {
            !unique_dead.contains(*id)
                && !attempts
                    .get(*id)
                    .and_then(|o| o.last())
                    .is_some_and(|l| l == "delivered" || l == "cancelled")
        })
        .count();
    println!(
        "FAULT-TABLE | {} | endpoint faults (refused, hang, trickle, reset, huge, 503 storm) | published {} | delivered {delivered} | dead {} | cancelled {cancelled} | lost {lost} | duplicated {} |",
        crate::harness::broker(&t.config).await,
        published.len(),
        unique_dead.len(),
        storm.duplicates() + dead.len() - unique_dead.len()
    );
}
