//! A three-node cluster loses the node that leads the ladder's quorum queues.

use crate::common::node::cluster;
use crate::common::{RunningWorker, TestLadder};
use crate::harness::{
    HeldInTiers, N, account, mixed_subscriptions, publish_load, setup, wait_delivered,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_queue_leaders_node_in_a_cluster_loses_nothing() {
    let nodes = cluster("qq");
    // The ladder is declared through node 0, so its queues' leaders start there; the worker and
    // the producer talk to node 1.
    let declare = nodes[0].config();
    let (t, s, receiver, cancelled) = setup(declare, "cluster").await;
    let api =
        hookrelay::broker::management::Management::new(&nodes[1].config().management.url, "/")
            .unwrap();
    let lane = api.queue(&t.ladder.first_lane()).await.unwrap().unwrap();
    let leader = lane["leader"].as_str().unwrap_or_default().to_owned();
    let members = lane["members"].as_array().map_or(0, Vec::len);
    assert_eq!(members, 3, "quorum queues have a member on each node");
    let victim = nodes.iter().position(|n| n.name == leader).unwrap();
    let survivor = (victim + 1) % 3;
    let mut t = t;
    t.config = nodes[survivor].config();
    let worker =
        RunningWorker::start_with(&t, t.config.clone(), mixed_subscriptions(&receiver, &s)).await;
    let load = tokio::spawn(publish_load(
        t.config.clone(),
        t.ladder.ingress(),
        "cluster",
        N,
    ));
    wait_delivered(&receiver, N / 4).await;
    nodes[victim].kill();
    let published = load.await.unwrap();
    // Accounting reads the sink through the survivor too.
    let view = TestLadder::view(t.ladder.clone(), nodes[survivor].config()).await;
    let a = account(&view, &receiver, &published, &cancelled).await;
    // The one scenario that may count envelopes a tier still holds (see `check_in_cluster`).
    let held = HeldInTiers::measure(&nodes, &view).await;
    worker.stop().await;
    a.check_in_cluster(
        "cluster: queue leader's node killed",
        t.config.worker.in_flight as usize,
        held,
    );
}
