//! A three-node cluster loses the node that leads the ladder's quorum queues.

use crate::common::management;
use crate::common::node::cluster;
use crate::harness::{HeldInTiers, N, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_queue_leaders_node_in_a_cluster_loses_nothing() {
    let nodes = cluster("qq");
    // The ladder is declared through node 0, so its queues' leaders start there; the worker and
    // the producer talk to node 1.
    let mut sc = Scenario::setup(nodes[0].config(), "cluster").await;
    let api = management(&nodes[1].config());
    let lane = api.queue(&sc.t.ladder.first_lane()).await.unwrap().unwrap();
    let leader = lane.leader.unwrap_or_default();
    let members = lane.members.len();
    assert_eq!(members, 3, "quorum queues have a member on each node");
    let victim = nodes.iter().position(|n| n.name == leader).unwrap();
    let survivor = (victim + 1) % 3;
    sc.t.config = nodes[survivor].config();
    let worker = sc.start_worker().await;
    let load = sc.start_load();
    sc.wait_delivered(N / 4).await;
    nodes[victim].kill();
    let published = load.await.unwrap();
    // Accounting reads the sink through the survivor too.
    let view = sc.view(nodes[survivor].config()).await;
    let a = sc.account(&view, &published).await;
    // The one scenario that may count envelopes a tier still holds (see `check_in_cluster`).
    let held = HeldInTiers::measure(&nodes, &view).await;
    worker.stop().await;
    a.check_in_cluster(
        "cluster: queue leader's node killed",
        sc.t.config.worker.in_flight as usize,
        held,
    );
}
