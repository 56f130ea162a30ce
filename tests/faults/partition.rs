//! A network partition, not a stop: three RabbitMQ nodes, each in a network namespace of the
//! test's own (`net`), clustered with `pause_minority`, a quorum ladder. While events flow and
//! retries promote, the node the worker is connected to (it leads the tiers, the sink and the
//! lanes: the ladder was declared through it) is cut off from the others and from the worker
//! for 30 s, then healed. Needs root (namespaces) and a RabbitMQ 4 install
//! (`TEST_RABBITMQ_ROOT`, see `rabbitmq/v4`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::node::Node;
use crate::common::{self, Counters};
use crate::harness::{N, SETTLE, Scenario, rabbitmq_4};
use crate::net::Net;
use hookrelay::units::now_ms;
use hookrelay_tools::node::{Install, cluster_on};

/// How long the worker's node is cut off.
const CUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_of_the_workers_node_loses_nothing_and_delivery_resumes_after_healing() {
    let install = Install::from_env();
    let version = rabbitmq_4(&install, "the partition scenario");
    // Dropped last: the nodes stop before their namespaces go.
    let net = Net::new(3);
    // A node notices a lost peer after `net_ticktime` (60 s by default, longer than the cut):
    // 10 s lets the cut node see that it is in the minority, and pause, within the cut.
    let nodes: Vec<Node> = cluster_on(
        "part",
        "cluster_partition_handling = pause_minority\nnet_ticktime = 10\n",
        &install,
        &net.hosts(),
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .into_iter()
    .map(Node::from)
    .collect();
    let sc = Scenario::setup(nodes[0].config(), "partition").await;
    let worker = sc.start_worker().await;
    // The producer publishes through a node of the majority, so events go on arriving during
    // the cut.
    let load = sc.start_load_via(nodes[1].config());
    sc.wait_delivered(N / 4).await;

    let at_cut = sc.receiver.delivered_count();
    let cut_ms = now_ms();
    net.cut(0);
    tokio::time::sleep(CUT).await;
    let at_heal = sc.receiver.delivered_count();
    let heal_ms = now_ms();
    net.heal(0);
    let healed = Instant::now();
    // Delivery resumes: the worker's node rejoins (pause_minority restarts it) and the worker
    // reconnects to it. Each step's time after healing, for the note.
    let api = common::management(&nodes[0].config());
    let reconnects_at_heal = worker.metrics.count("hookrelay_reconnects_total", &[]);
    let (mut node_back, mut reconnected, mut resumed) = (None, None, None);
    while healed.elapsed() < SETTLE && resumed.is_none() {
        if node_back.is_none() && api.broker_version().await.is_ok() {
            node_back = Some(healed.elapsed());
        }
        if reconnected.is_none()
            && worker.metrics.count("hookrelay_reconnects_total", &[]) > reconnects_at_heal
        {
            reconnected = Some(healed.elapsed());
        }
        if sc.receiver.delivered_count() > at_heal {
            resumed = Some(healed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resumed_after = resumed.expect("deliveries resumed after healing");

    let published = load.await.unwrap();
    let view = sc.view(nodes[1].config()).await;
    let a = sc.account(&view, &published).await;
    let reconnects = worker.metrics.count("hookrelay_reconnects_total", &[]);
    worker.stop().await;
    // Each envelope answered 2xx more than once, by when its first 2xx came.
    let mut first_ok: HashMap<String, (u64, u32)> = HashMap::new();
    let mut again = Vec::new();
    for r in sc.receiver.records() {
        if (200..300).contains(&r.status) {
            match first_ok.get(&r.id) {
                None => {
                    first_ok.insert(r.id.clone(), (r.received_at_ms, r.attempt));
                }
                Some(&(first, attempt)) => again.push((r.id, first, attempt, r.attempt)),
            }
        }
    }
    let before_cut = again.iter().filter(|d| d.1 < cut_ms).count();
    let during_cut = again
        .iter()
        .filter(|d| (cut_ms..heal_ms).contains(&d.1))
        .count();
    let after_heal = again.len() - before_cut - during_cut;
    println!(
        "PARTITION duplicates | first delivered before the cut {before_cut} | during it {during_cut} | \
         after healing {after_heal} | same attempt number {} |",
        again.iter().filter(|d| d.2 == d.3).count()
    );
    println!(
        "PARTITION | {version} | cut {CUT:?} | delivered before the cut {at_cut} | delivered during the cut {} | \
         after healing: node answers again {node_back:.1?}, worker reconnected {reconnected:.1?}, \
         first delivery {resumed_after:.1?} | worker reconnects {reconnects} |",
        at_heal - at_cut
    );
    // What the worker held at the cut may be delivered again: it could not ack it.
    a.check(
        "partition: the worker's node cut off 30 s, pause_minority",
        sc.duplicate_bound(1),
    );
    drop(nodes);
    drop(net);
}
