//! A memory alarm blocks publishing, then clears.

use crate::common::node::Node;
use crate::common::{Counters, wait_until};
use crate::harness::{N, SETTLE, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_blocks_republishes_without_acks_then_recovers() {
    let node = Node::start("alarm");
    let sc = Scenario::setup(node.config(), "alarm").await;
    // Published before the alarm: the producer would be blocked too.
    let published = sc.start_load().await.unwrap();
    let worker = sc.start_worker().await;
    sc.wait_delivered(N / 10).await;
    node.ctl_ok(&["set_vm_memory_high_watermark", "0.00001"]);
    // The alarm holds until republishes have failed under it (their confirms never came).
    let republish_failures = || {
        worker
            .metrics
            .count("hookrelay_republish_failures_total", &[])
    };
    wait_until(SETTLE, async || republish_failures() > 0).await;
    let blocked_failures = republish_failures();
    node.ctl_ok(&["set_vm_memory_high_watermark", "0.4"]);
    let view = sc.view(node.config()).await;
    let a = sc.account(&view, &published).await;
    worker.stop().await;
    // Republishes during the alarm were not confirmed: their originals went back to the lanes
    // (counted as failures, never acked) and were delivered once it cleared.
    assert!(blocked_failures > 0, "republishes waited out the alarm");
    a.check(
        "memory alarm, then cleared",
        sc.t.config.worker.in_flight as usize,
    );
}
