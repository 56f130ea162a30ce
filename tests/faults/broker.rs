//! The broker goes away under load: its application stops and starts, its node restarts, its
//! connections are cut.

use std::time::Duration;

use crate::common::Counters;
use crate::common::node::Node;
use crate::harness::{N, Records, Scenario};

// One thread on purpose: `rabbitmqctl` blocks it, so the producer's work is in flight, unpolled,
// when the broker drops the connection. That once left a channel open lapin 4.12 never
// completed, and this test hung for good; the publisher's deadlines now bound such waits.
#[tokio::test]
async fn broker_app_restart_under_load_loses_nothing() {
    let node = Node::start("app");
    let sc = Scenario::setup(node.config(), "app").await;
    let worker = sc.start_worker().await;
    let load = sc.start_load();
    sc.wait_delivered(N / 4).await;
    node.ctl_ok(&["stop_app"]);
    // The outage itself: the broker stays away for a while.
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.ctl_ok(&["start_app"]);
    let published = load.await.unwrap();
    let view = sc.view(node.config()).await;
    let a = sc.account(&view, &published).await;
    let reconnects = worker.metrics.count("hookrelay_reconnects_total", &[]);
    let notices = ["dropped", "unroutable", "failed"].map(|k| {
        worker
            .metrics
            .count(&format!("hookrelay_notices_{k}_total"), &[])
    });
    println!("NOTICES | dropped, unroutable, failed: {notices:?}");
    worker.stop().await;
    assert!(reconnects >= 1, "the worker reconnected");
    // At most what was in flight when the broker went away (worker and producer) is delivered
    // again.
    a.check("broker stop_app/start_app", sc.duplicate_bound(1));
    // The attempt records of batches the broker did not take were sent again.
    Records::read(&view)
        .await
        .check("broker stop_app/start_app", &sc.receiver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_node_restart_under_load_loses_nothing() {
    let node = Node::start("node");
    let sc = Scenario::setup(node.config(), "node").await;
    let worker = sc.start_worker().await;
    let load = sc.start_load();
    sc.wait_delivered(N / 4).await;
    node.stop();
    // The outage itself: the node stays down for a while.
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.boot();
    let published = load.await.unwrap();
    let view = sc.view(node.config()).await;
    let a = sc.account(&view, &published).await;
    worker.stop().await;
    a.check("broker node stop/start", sc.duplicate_bound(1));
    Records::read(&view)
        .await
        .check("broker node stop/start", &sc.receiver);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_repeatedly_lose_nothing() {
    let node = Node::start("cut");
    let sc = Scenario::setup(node.config(), "cut").await;
    let worker = sc.start_worker().await;
    let load = sc.start_load();
    for round in 1..=3 {
        sc.wait_delivered(round * N / 5).await;
        node.ctl_ok(&["close_all_connections", "fault test"]);
    }
    let published = load.await.unwrap();
    let view = sc.view(node.config()).await;
    let a = sc.account(&view, &published).await;
    let reconnects = worker.metrics.count("hookrelay_reconnects_total", &[]);
    worker.stop().await;
    assert!(reconnects >= 3, "reconnected after each cut ({reconnects})");
    a.check("close_all_connections x3", sc.duplicate_bound(3));
}
