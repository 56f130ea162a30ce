//! A memory alarm blocks publishing, then clears.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::node::Node;
use crate::common::{Counters, wait_until};
use crate::harness::{N, SETTLE, Scenario};
use hookrelay::units::now_ms;

/// How long the alarm is held after the first republish failed under it: several rounds of
/// `worker.requeue_delay` and of the confirm timeout, so a worker that sent a failed
/// republish's original back to its lane would have made the same attempt again meanwhile.
const HOLD: Duration = Duration::from_secs(12);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_blocks_republishes_without_acks_or_repeated_attempts_then_recovers() {
    let node = Node::start("alarm");
    let sc = Scenario::setup(node.config(), "alarm").await;
    // Published before the alarm: the producer would be blocked too.
    let published = sc.start_load().await.unwrap();
    let worker = sc.start_worker().await;
    sc.wait_delivered(N / 10).await;
    node.ctl_ok(&["set_vm_memory_high_watermark", "0.00001"]);
    // The alarm holds until republishes have failed under it (their confirms never came), and
    // then a while longer, on purpose.
    let republish_failures = || {
        worker
            .metrics
            .count("hookrelay_republish_failures_total", &[])
    };
    wait_until(SETTLE, async || republish_failures() > 0).await;
    // From here on no republish can be confirmed until the alarm clears.
    let alarm_from = now_ms();
    tokio::time::sleep(HOLD).await;
    let blocked_failures = republish_failures();
    node.ctl_ok(&["set_vm_memory_high_watermark", "0.4"]);
    let alarm_until = now_ms();
    let view = sc.view(node.config()).await;
    let a = sc.account(&view, &published).await;
    worker.stop().await;
    // Republishes during the alarm were not confirmed: their originals were never acked, and
    // were settled once it cleared.
    assert!(blocked_failures > 0, "republishes waited out the alarm");
    // An attempt whose outcome could not be stored was not made again: while the alarm held
    // (no republish could be confirmed, so no envelope could move on to its next attempt), the
    // endpoint saw each envelope at most once.
    let mut during: HashMap<String, usize> = HashMap::new();
    for r in sc.receiver.records() {
        if (alarm_from..=alarm_until).contains(&r.received_at_ms) {
            *during.entry(r.id).or_default() += 1;
        }
    }
    let repeated: Vec<_> = during.iter().filter(|(_, n)| **n > 1).collect();
    println!(
        "alarm: {} requests while it held, {} envelopes requested more than once",
        during.values().sum::<usize>(),
        repeated.len()
    );
    assert!(
        repeated.is_empty(),
        "envelopes requested again while the alarm held (envelope, requests): {:?}",
        &repeated[..repeated.len().min(10)]
    );
    a.check("memory alarm, then cleared", sc.duplicate_bound(1));
}
