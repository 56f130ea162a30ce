//! The operator tools killed mid-pass: `redrive` and `tier release` republish each message they
//! move (confirmed) before acking it, and hold what stays unacked, so a SIGKILL at any moment
//! loses nothing and duplicates at most the one message between its confirm and its ack. Run
//! again, each finishes the job.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{self, RunningWorker, TestLadder, event, secret, subscription, wait_until};

const WAIT: Duration = Duration::from_secs(60);

/// The hookrelay command line, as a process of its own the test can kill.
fn cli(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"));
    command
        .args(args)
        .env("HOOKRELAY_LOG_LEVEL", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs the command line to its end: (exit code, stdout, stderr).
async fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Starts `args`, waits until `midway` holds, and kills the process with SIGKILL; it must still
/// have been running (else the kill proves nothing).
async fn kill_midway(args: &[&str], midway: impl AsyncFn() -> bool) {
    let mut child = cli(args).spawn().unwrap();
    assert!(wait_until(WAIT, midway).await, "the pass got under way");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the pass was still running when killed"
    );
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_killed_mid_pass_loses_nothing() {
    const M: usize = 200;
    // One attempt per envelope: 400 is rejected, 500 exhausted at once.
    let t = TestLadder::apply("redrivekill", &["200ms"], &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let s = secret();
    let (receiver, healthy) = common::failing_until_healthy(&s, "rej").await;
    let subs = vec![subscription("sub_a", "acme", &receiver.url("/"), &s)];
    let worker = RunningWorker::start(&t, subs.clone()).await;
    let id = |i: usize| {
        if i.is_multiple_of(2) {
            format!("evt_rej_{i:04}")
        } else {
            format!("evt_fail_{i:04}")
        }
    };
    t.publish_all((0..M).map(|i| event(&id(i), "acme", "sub_a")))
        .await;
    assert!(t.wait_dead(M as u32, WAIT).await);
    worker.stop().await;
    let before = receiver.request_count();

    // The rejected half goes back through the ingress; the exhausted half stays, held by the pass.
    healthy.store(true, Ordering::SeqCst);
    let worker = RunningWorker::start(&t, subs).await;
    let delivered = || receiver.delivered_count();
    kill_midway(
        &[
            "redrive", "--reason", "rejected", "--rate", "40/s", "--ladder", ladder,
        ],
        async || delivered() >= M / 6,
    )
    .await;
    let at_kill = delivered();
    let (code, out, err) = run(&["redrive", "--reason", "rejected", "--ladder", ladder]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == M / 2)
            .await,
        "every rejected envelope delivered ({} of {})",
        delivered(),
        M / 2
    );
    // Whatever the redrive sent is delivered by now; give a duplicate the time to arrive too.
    assert!(wait_until(WAIT, async || t.depth(&t.ladder.first_lane()).await == 0).await);
    worker.stop().await;

    let dead = t.drain_dead().await;
    let mut kept = common::message_ids(&dead);
    kept.sort();
    let fails: Vec<String> = (0..M).filter(|i| !i.is_multiple_of(2)).map(id).collect();
    assert_eq!(
        kept, fails,
        "the exhausted half is still in the sink, once each"
    );
    let duplicates = receiver.duplicates();
    println!(
        "FAULT-TABLE | {} | redrive kill -9 mid-pass: {at_kill} of {} delivered at the kill, lost 0, \
         duplicates {duplicates}, requests {}",
        crate::harness::broker(&t.config).await,
        M / 2,
        receiver.request_count() - before
    );
    assert!(
        duplicates <= 1,
        "at most the message between confirm and ack: {duplicates}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_release_killed_mid_pass_loses_nothing() {
    const M: usize = 150;
    let mut t = TestLadder::apply("releasekill", &["1s"], &["1s"]).await;
    // Every first attempt is made: none of the burst is deferred for a full endpoint cap.
    t.config.endpoints.max_concurrent = M as u32;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let tier = t.ladder.tier_at(0).unwrap();
    let parking = t.ladder.held_queue(tier);
    t.owns_queue(&parking);
    let (code, _, err) = run(&["tier", "hold", "retry-1s", "--ladder", ladder]).await;
    assert_eq!(code, Some(0), "{err}");

    let s = secret();
    let receiver = common::failing_first_attempts(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    t.publish_all((0..M).map(|i| event(&format!("evt_{i:04}"), "acme", "sub_a")))
        .await;
    assert!(wait_until(WAIT, async || t.depth(&parking).await >= M as u32).await);
    assert_eq!(
        receiver.request_count(),
        M,
        "every first attempt failed, nothing promoted"
    );

    let delivered = || receiver.delivered_count();
    kill_midway(
        &[
            "tier", "release", "retry-1s", "--rate", "40/s", "--ladder", ladder,
        ],
        async || delivered() >= M / 3,
    )
    .await;
    let at_kill = delivered();
    let (code, out, err) = run(&["tier", "release", "retry-1s", "--ladder", ladder]).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == M)
            .await,
        "every envelope delivered ({} of {M})",
        delivered()
    );
    assert!(wait_until(WAIT, async || t.depth(&t.ladder.retry_lane()).await == 0).await);
    worker.stop().await;
    let (_, out, _) = run(&["tier", "status", "--json", "--ladder", ladder]).await;
    let states: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(states[0]["held"], false);
    assert!(states[0]["parked"].is_null(), "the parking queue is gone");
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
    let duplicates = receiver.duplicates();
    println!(
        "FAULT-TABLE | {} | tier release kill -9 mid-pass: {at_kill} of {M} delivered at the kill, lost 0, \
         duplicates {duplicates}, requests {}",
        crate::harness::broker(&t.config).await,
        receiver.request_count()
    );
    assert!(
        duplicates <= 1,
        "at most the message between confirm and ack: {duplicates}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_killed_mid_pass_loses_nothing() {
    use crate::common::Counters;
    const M: usize = 150;
    let t = TestLadder::apply("resumekill", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let parking = t.ladder.paused_queue("sub_a");
    t.owns_queue(&parking);
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let entry = |extra: &str| {
        common::subscription_toml("sub_a", "acme", &receiver.url("/"), &s.file_ref(), extra)
    };
    let file = common::SubsFile::new(&entry("paused = true"));
    let subs = file.path.to_str().unwrap();
    let worker = RunningWorker::start_from_file(&t, &file).await;
    t.publish_all((0..M).map(|i| event(&format!("evt_{i:04}"), "acme", "sub_a")))
        .await;
    assert!(wait_until(WAIT, async || t.depth_if_exists(&parking).await >= M as u32).await);
    assert_eq!(
        receiver.request_count(),
        0,
        "nothing attempted while paused"
    );
    file.write(&entry(""));
    assert!(
        wait_until(WAIT, async || {
            worker.metrics.count(
                "hookrelay_subscription_reloads_total",
                &[("result", "applied")],
            ) >= 1
        })
        .await
    );

    let delivered = || receiver.delivered_count();
    kill_midway(
        &[
            "subscriptions",
            "resume",
            "sub_a",
            "--rate",
            "40/s",
            "--ladder",
            ladder,
            "--file",
            subs,
        ],
        async || delivered() >= M / 3,
    )
    .await;
    let at_kill = delivered();
    let (code, out, err) = run(&[
        "subscriptions",
        "resume",
        "sub_a",
        "--ladder",
        ladder,
        "--file",
        subs,
    ])
    .await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == M)
            .await,
        "every envelope delivered ({} of {M})",
        delivered()
    );
    assert!(wait_until(WAIT, async || t.depth(&t.ladder.first_lane()).await == 0).await);
    worker.stop().await;
    assert!(!t.queue_exists(&parking).await, "the parking queue is gone");
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
    let duplicates = receiver.duplicates();
    println!(
        "FAULT-TABLE | {} | subscriptions resume kill -9 mid-pass: {at_kill} of {M} delivered at the kill, \
         lost 0, duplicates {duplicates}, requests {}",
        crate::harness::broker(&t.config).await,
        receiver.request_count()
    );
    assert!(
        receiver.records().iter().all(|r| r.attempt == 1),
        "parking charged no attempt"
    );
    assert!(
        duplicates <= 1,
        "at most the message between confirm and ack: {duplicates}"
    );
}
