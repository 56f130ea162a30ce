//! A memory alarm blocks publishing, then clears.

use crate::common::node::Node;
use crate::common::{Counters, RunningWorker, TestLadder, wait_until};
use crate::harness::{
    N, SETTLE, account, mixed_subscriptions, publish_load, setup, wait_delivered,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_blocks_republishes_without_acks_then_recovers() {
    let node = Node::start("alarm");
    let (t, s, receiver, cancelled) = setup(node.config(), "alarm").await;
    // Published before the alarm: the producer would be blocked too.
    let published = publish_load(t.config.clone(), t.ladder.ingress(), "alarm", N).await;
    let worker =
        RunningWorker::start_with(&t, t.config.clone(), mixed_subscriptions(&receiver, &s)).await;
    wait_delivered(&receiver, N / 10).await;
    node.ctl_ok(&["set_vm_memory_high_watermark", "0.00001"]);
    // The alarm holds until republishes have failed under it (their confirms never came).
    wait_until(SETTLE, async || {
        worker
            .metrics
            .count("hookrelay_republish_failures_total", &[])
            > 0
    })
    .await;
    let blocked_failures = worker
        .metrics
        .count("hookrelay_republish_failures_total", &[]);
    node.ctl_ok(&["set_vm_memory_high_watermark", "0.4"]);
    // The test's own connection did not survive the fault; account through a fresh one.
    let view = TestLadder::view(t.ladder.clone(), t.config.clone()).await;
    let a = account(&view, &receiver, &published, &cancelled).await;
    worker.stop().await;
    // Republishes during the alarm were not confirmed: their originals went back to the lanes
    // (counted as failures, never acked) and were delivered once it cleared.
    assert!(blocked_failures > 0, "republishes waited out the alarm");
    a.check(
        "memory alarm, then cleared",
        t.config.worker.in_flight as usize,
    );
}
