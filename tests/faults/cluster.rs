//! A three-node cluster runs a sharded ladder and loses a node that leads some of its shards.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::management;
use crate::common::node::cluster;
use crate::harness::{HeldInTiers, N, Scenario, tenant_of};
use hookrelay::delivery::worker::shard_prefetch;

/// One shard per node, so balanced placement can put a leader on each.
const SHARDS: u16 = 3;

/// Deliveries beyond what the worker already held (a shard's prefetch) that each tenant of a
/// shard led elsewhere must get while the node is down.
const KEPT_DELIVERING: usize = 10;

/// One sharded run stands for the cluster: it loses the node leading the tiers, the sink and
/// some shards (as the unsharded run lost the node leading everything), and shows what sharding
/// adds, the shards led elsewhere going on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_node_that_leads_shards_loses_nothing_and_the_other_shards_keep_delivering() {
    let nodes = cluster("qq");
    // The ladder is declared through node 0: the tiers and the sink lead there (client-local),
    // the shard lanes where the ladder's policy places them (balanced). The worker and the
    // producer talk to a node that stays up.
    let mut sc = Scenario::setup_sharded(nodes[0].config(), "cluster", SHARDS).await;
    let api = management(&nodes[1].config());
    let mut leader_of = BTreeMap::new();
    for shard in 0..SHARDS {
        let lane = api
            .queue(&sc.t.ladder.first_shard(shard))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            lane.members.len(),
            3,
            "quorum queues have a member on each node"
        );
        let leader = lane.leader.unwrap_or_default();
        leader_of.insert(shard, nodes.iter().position(|n| n.name == leader).unwrap());
    }
    let leading: BTreeSet<usize> = leader_of.values().copied().collect();
    eprintln!("first-attempt shard leaders (shard -> node): {leader_of:?}");
    assert!(
        leading.len() > 1,
        "shard leaders are spread over the cluster: {leader_of:?}"
    );
    // Node 0 if it leads a shard (it leads the tiers too), else the leader of shard 0.
    let victim = if leading.contains(&0) {
        0
    } else {
        leader_of[&0]
    };
    let survivor = (victim + 1) % 3;
    // `tenants` is in shard order, one per shard.
    let elsewhere: Vec<String> = (0..SHARDS)
        .filter(|shard| leader_of[shard] != victim)
        .map(|shard| sc.tenants[usize::from(shard)].clone())
        .collect();
    sc.t.config = nodes[survivor].config();
    // What the worker may have been handed already does not count as going on.
    let (first_budget, _) = sc.t.config.worker.split(sc.t.config.worker.in_flight);
    let more = usize::from(shard_prefetch(first_budget, SHARDS)) + KEPT_DELIVERING;
    let worker = sc.start_worker().await;
    let load = sc.start_load();
    sc.wait_delivered(N / 4).await;
    let by_tenant = |delivered: &std::collections::HashMap<String, u32>| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for id in delivered.keys() {
            *counts
                .entry(tenant_of(id, &sc.tenants).to_owned())
                .or_default() += 1;
        }
        counts
    };
    let before = by_tenant(&sc.receiver.delivered());
    nodes[victim].kill();
    let killed = Instant::now();
    // The shards led by the nodes still up go on delivering while the node stays down.
    let kept = sc
        .receiver
        .wait_until(Duration::from_secs(60), |r| {
            let now = by_tenant(&r.delivered());
            elsewhere.iter().all(|tenant| {
                now.get(tenant).copied().unwrap_or(0)
                    >= before.get(tenant).copied().unwrap_or(0) + more
            })
        })
        .await;
    eprintln!(
        "tenants of shards led elsewhere ({elsewhere:?}) got {more} more deliveries each \
         (a shard's prefetch and {KEPT_DELIVERING}) within {:.1?} of the kill: {kept}",
        killed.elapsed()
    );
    assert!(
        kept,
        "shards led elsewhere kept delivering while node {victim} was down"
    );
    let published = load.await.unwrap();
    // Accounting reads the sink through the survivor too.
    let view = sc.view(nodes[survivor].config()).await;
    let a = sc.account(&view, &published).await;
    // The one scenario that may count envelopes a tier still holds (see `check_in_cluster`).
    let held = HeldInTiers::measure(&nodes, &view).await;
    worker.stop().await;
    let led = leader_of.values().filter(|n| **n == victim).count();
    let scenario = format!("cluster: node leading {led} of {SHARDS} shards killed");
    // RabbitMQ 4 has the fix for the tiers' stranded dead letters (see `check_in_cluster`):
    // there nothing may be held.
    if a.broker_major() >= 4 {
        a.check(&scenario, sc.duplicate_bound(1));
    } else {
        a.check_in_cluster(&scenario, sc.duplicate_bound(1), held);
    }
}
