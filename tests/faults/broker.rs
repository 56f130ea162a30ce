//! The broker goes away under load: its application stops and starts, its node restarts, its
//! connections are cut.

use std::time::Duration;

use crate::common::node::Node;
use crate::common::{Counters, RunningWorker, TestLadder};
use crate::harness::{N, account, mixed_subscriptions, publish_load, setup, wait_delivered};

// One thread on purpose: `rabbitmqctl` blocks it, so the producer's work is in flight, unpolled,
// when the broker drops the connection. That once left a channel open lapin 4.12 never
// completed, and this test hung for good; the publisher's deadlines now bound such waits.
#[tokio::test]
async fn broker_app_restart_under_load_loses_nothing() {
    let node = Node::start("app");
    let (t, s, receiver, cancelled) = setup(node.config(), "app").await;
    let worker =
        RunningWorker::start_with(&t, t.config.clone(), mixed_subscriptions(&receiver, &s)).await;
    let load = tokio::spawn(publish_load(t.config.clone(), t.ladder.ingress(), "app", N));
    wait_delivered(&receiver, N / 4).await;
    node.ctl_ok(&["stop_app"]);
    // The outage itself: the broker stays away for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.ctl_ok(&["start_app"]);
    let published = load.await.unwrap();
    // The test's own connection did not survive the fault; account through a fresh one.
    let view = TestLadder::view(t.ladder.clone(), t.config.clone()).await;
    let a = account(&view, &receiver, &published, &cancelled).await;
    let reconnects = worker.metrics.count("hookrelay_reconnects_total", &[]);
    worker.stop().await;
    assert!(reconnects >= 1, "the worker reconnected");
    // At most what was in flight when the broker went away is delivered again.
    a.check(
        "broker stop_app/start_app",
        t.config.worker.in_flight as usize,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_node_restart_under_load_loses_nothing() {
    let node = Node::start("node");
    let (t, s, receiver, cancelled) = setup(node.config(), "node").await;
    let worker =
        RunningWorker::start_with(&t, t.config.clone(), mixed_subscriptions(&receiver, &s)).await;
    let load = tokio::spawn(publish_load(
        t.config.clone(),
        t.ladder.ingress(),
        "node",
        N,
    ));
    wait_delivered(&receiver, N / 4).await;
    node.stop();
    // The outage itself: the node stays down for a while.
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.boot();
    let published = load.await.unwrap();
    // The test's own connection did not survive the fault; account through a fresh one.
    let view = TestLadder::view(t.ladder.clone(), t.config.clone()).await;
    let a = account(&view, &receiver, &published, &cancelled).await;
    worker.stop().await;
    a.check("broker node stop/start", t.config.worker.in_flight as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_repeatedly_lose_nothing() {
    let node = Node::start("cut");
    let (t, s, receiver, cancelled) = setup(node.config(), "cut").await;
    let worker =
        RunningWorker::start_with(&t, t.config.clone(), mixed_subscriptions(&receiver, &s)).await;
    let load = tokio::spawn(publish_load(t.config.clone(), t.ladder.ingress(), "cut", N));
    for round in 1..=3 {
        wait_delivered(&receiver, round * N / 5).await;
        node.ctl_ok(&["close_all_connections", "fault test"]);
    }
    let published = load.await.unwrap();
    // The test's own connection did not survive the fault; account through a fresh one.
    let view = TestLadder::view(t.ladder.clone(), t.config.clone()).await;
    let a = account(&view, &receiver, &published, &cancelled).await;
    let reconnects = worker.metrics.count("hookrelay_reconnects_total", &[]);
    worker.stop().await;
    assert!(reconnects >= 3, "reconnected after each cut ({reconnects})");
    a.check(
        "close_all_connections x3",
        3 * t.config.worker.in_flight as usize,
    );
}
