//! Sharded shared lanes on the real broker (the `rabbitmq_consistent_hash_exchange` plugin):
//! a tenant's first attempts always land in one shard and its retries come back to the retry
//! shard of the same index; the shards share one budget; going from 1 to 4 shards under load
//! loses nothing.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{
    RunningWorker, TestLadder, config, event, hookrelay, ladder_file, secret, subscription, unique,
    wait_until,
};
use hookrelay::contract::headers;
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay_tools::receiver::{Incoming, Receiver, Reply};

const WAIT: Duration = Duration::from_secs(60);

fn slow(_: &Incoming<'_>) -> Reply {
    Reply::Slow(Duration::from_millis(300), 200)
}

async fn sharded(name: &str, shards: u16, config: hookrelay::config::Config) -> TestLadder {
    let ladder = Ladder::build(&unique(name), QueueType::Quorum, &["300ms"], &["300ms"; 3])
        .unwrap()
        .with_shards(shards)
        .unwrap();
    TestLadder::apply_ladder(config, ladder).await
}

/// Takes every message out of `queue`: (routing key, shard header) of each.
async fn drain(t: &TestLadder, queue: &str) -> Vec<(String, Option<String>)> {
    t.take_all(queue)
        .await
        .iter()
        .map(|m| {
            (
                m.delivery.routing_key.to_string(),
                headers::read_str_header(&m.delivery.properties, headers::SHARD_HEADER),
            )
        })
        .collect()
}

/// One tenant per shard, from `t-0`, `t-1`, ...
async fn one_tenant_per_shard(t: &TestLadder) -> Vec<String> {
    let candidates: Vec<String> = (0..40).map(|i| format!("tenant-{i}")).collect();
    let shards = t.shard_of(&candidates).await;
    let mut picked: BTreeMap<u16, String> = BTreeMap::new();
    for (tenant, shard) in shards {
        picked.entry(shard).or_insert(tenant);
    }
    assert_eq!(
        picked.len(),
        usize::from(t.ladder.shards),
        "40 tenants cover every shard"
    );
    picked.into_values().collect()
}

#[tokio::test]
async fn a_tenant_stays_in_its_shard_and_its_retries_return_to_the_same_index() {
    let t = sharded("shards", 4, config()).await;
    // Without a worker: every tenant's events land in one shard, twice the same.
    let tenants: Vec<String> = (0..24).map(|i| format!("acme-{i}")).collect();
    let first = t.shard_of(&tenants).await;
    let again = t.shard_of(&tenants).await;
    assert_eq!(first, again, "the hash of a tenant does not change");
    let used: BTreeSet<u16> = first.values().copied().collect();
    assert!(
        used.len() >= 3,
        "24 tenants spread over the shards: {first:?}"
    );

    // Retry copies as the worker publishes them (into a tier or a deferral queue, marked with
    // their shard) come back to the retry shard of that index once the TTL runs out; a copy
    // without the mark, or naming a shard this ladder does not have, goes to shard 0, never
    // nowhere.
    let publisher = t.publisher().await;
    let waits = [
        t.ladder.tier_at(0).unwrap(),
        t.ladder.deferral_at(0).unwrap(),
    ];
    let copies: Vec<(String, Option<u16>)> = first
        .iter()
        .map(|(tenant, shard)| (tenant.clone(), Some(*shard)))
        .chain([("nomark".to_owned(), None), ("gone".to_owned(), Some(9))])
        .collect();
    for (i, (tenant, shard)) in copies.iter().enumerate() {
        let tier = waits[i % waits.len()];
        let e = event(&format!("evt_retry_{tenant}"), tenant, "sub");
        let props =
            headers::retry_properties(&e.properties(), tenant, 1, 0, "HTTP 503", None, None);
        let props = headers::with_shard(props, *shard);
        publisher
            .publish(
                &t.ladder.delay_exchange(),
                &t.ladder.tier_routing_key(tier, tenant),
                &e.body,
                props,
            )
            .await
            .unwrap();
    }
    let retry_shards: Vec<String> = (0..4).map(|i| t.ladder.retry_shard(i)).collect();
    assert!(
        wait_until(WAIT, async || {
            let mut n = 0;
            for q in &retry_shards {
                n += t.depth(q).await;
            }
            n as usize == copies.len()
        })
        .await,
        "every retry copy reached a retry shard"
    );
    for (i, q) in retry_shards.iter().enumerate() {
        for (key, _) in drain(&t, q).await {
            let tenant = key.rsplit('.').next().unwrap().to_owned();
            let want = match first.get(&tenant) {
                Some(shard) => usize::from(*shard),
                None => 0,
            };
            assert_eq!(i, want, "{tenant}'s retry came back to retry shard {i}");
        }
    }

    // With a worker: a first attempt that fails is retried from the retry shard of its index.
    let tenants = one_tenant_per_shard(&t).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| {
        if req.attempt == 1 {
            Reply::Status(503)
        } else {
            Reply::Status(200)
        }
    })
    .await
    .unwrap();
    let subs = tenants
        .iter()
        .map(|tenant| subscription(&format!("sub_{tenant}"), tenant, &receiver.url("/"), &s))
        .collect();
    let mut tails = Vec::new();
    for tenant in &tenants {
        tails.push(t.tail_attempts(tenant, 2).await);
    }
    let worker = RunningWorker::start(&t, subs).await;
    t.publish_all(
        tenants
            .iter()
            .map(|tenant| event(&format!("evt_{tenant}"), tenant, &format!("sub_{tenant}"))),
    )
    .await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 4)
            .await
    );
    for (i, tail) in tails.into_iter().enumerate() {
        let records = tokio::time::timeout(WAIT, tail).await.unwrap().unwrap();
        let lanes: Vec<(String, String)> = records
            .iter()
            .map(|r| (r.outcome.clone(), r.lane.clone()))
            .collect();
        let i = u16::try_from(i).unwrap();
        assert_eq!(
            lanes,
            [
                ("retried".to_owned(), t.ladder.first_shard(i)),
                ("delivered".to_owned(), t.ladder.retry_shard(i)),
            ]
        );
    }
    worker.stop().await;
}

#[tokio::test]
async fn shards_share_one_budget_and_a_lone_busy_shard_gets_more_than_its_even_share() {
    let mut config = config();
    config.worker.in_flight = 10;
    config.worker.retry_share = 0.2; // 8 for first attempts (4 per shard's prefetch), 2 retries
    // The tenants share one endpoint, which would otherwise hold one slot of a shard's 4.
    config.endpoints.lane_share = 1.0;
    let t = sharded("budget", 4, config.clone()).await;
    let tenants = one_tenant_per_shard(&t).await;
    // A fifth tenant, in the first one's shard, for the lone busy shard.
    let probe: Vec<String> = (0..40).map(|i| format!("solo-{i}")).collect();
    let shard_of_first = t.shard_of(&tenants[..1]).await[&tenants[0]];
    let solo = t
        .shard_of(&probe)
        .await
        .into_iter()
        .find(|(_, shard)| *shard == shard_of_first)
        .map(|(tenant, _)| tenant)
        .unwrap();

    let s = secret();
    let all = Receiver::start(std::slice::from_ref(&s.whsec), slow)
        .await
        .unwrap();
    let lone = Receiver::start(std::slice::from_ref(&s.whsec), slow)
        .await
        .unwrap();
    let mut subs: Vec<_> = tenants
        .iter()
        .map(|tenant| subscription(&format!("sub_{tenant}"), tenant, &all.url("/"), &s))
        .collect();
    subs.push(subscription("sub_solo", &solo, &lone.url("/"), &s));
    let worker = RunningWorker::start_with(&t, config, subs).await;

    // Every shard busy: the endpoint never sees more than the budget (8) at once, and sees it.
    t.publish_all(tenants.iter().flat_map(|tenant| {
        (0..30).map(move |i| {
            event(
                &format!("evt_{tenant}_{i}"),
                tenant,
                &format!("sub_{tenant}"),
            )
        })
    }))
    .await;
    assert!(all.wait_until(WAIT, |r| r.delivered_count() == 120).await);
    let busy = all.max_in_flight();
    assert!(busy <= 8, "in flight {busy} beyond the budget of 8");
    assert!(busy >= 6, "the budget is used: {busy} at once");

    // One shard busy alone: more than its even share (8 / 4 = 2) at once, up to its prefetch.
    t.publish_all((0..30).map(|i| event(&format!("evt_solo_{i}"), &solo, "sub_solo")))
        .await;
    assert!(lone.wait_until(WAIT, |r| r.delivered_count() == 30).await);
    let alone = lone.max_in_flight();
    eprintln!(
        "budget 8 over 4 shards: {busy} at once with every shard busy, {alone} from a lone shard"
    );
    assert!(alone > 2 && alone <= 4, "a lone shard had {alone} at once");
    worker.stop().await;
    assert_eq!(all.duplicates() + lone.duplicates(), 0);
}

#[tokio::test]
async fn going_from_one_to_four_shards_under_load_loses_nothing() {
    let mut t = TestLadder::apply("reshard", &["300ms"], &["300ms"; 3]).await;
    let (old_first, old_retry) = (t.ladder.first_lane(), t.ladder.retry_lane());
    t.owns_queue(&old_first);
    t.owns_queue(&old_retry);
    let s = secret();
    // Every tenth event fails its first attempt: retries are in the tiers across the change.
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |req| {
        if req.attempt == 1 && req.id.ends_with('7') {
            Reply::Status(503)
        } else {
            Reply::Slow(Duration::from_millis(5), 200)
        }
    })
    .await
    .unwrap();
    let tenants: Vec<String> = (0..12).map(|i| format!("ten-{i}")).collect();
    let subs: Vec<_> = tenants
        .iter()
        .map(|tenant| subscription(&format!("sub_{tenant}"), tenant, &receiver.url("/"), &s))
        .collect();
    let worker = RunningWorker::start(&t, subs.clone()).await;

    const TOTAL: usize = 1200;
    let events: Vec<_> = (0..TOTAL)
        .map(|i| {
            let tenant = &tenants[i % tenants.len()];
            event(&format!("evt_{i:04}"), tenant, &format!("sub_{tenant}"))
        })
        .collect();
    let published = Arc::new(AtomicUsize::new(0));
    let load = {
        let t_ladder = t.ladder.clone();
        let config = t.config.clone();
        let published = Arc::clone(&published);
        tokio::spawn(async move {
            let view = TestLadder::view(t_ladder, config).await;
            for chunk in events.chunks(20) {
                view.publish_all(chunk.to_vec()).await;
                published.fetch_add(chunk.len(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // A third in, the ladder gets 4 shards while the (unsharded) worker runs.
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() >= TOTAL / 3)
            .await
    );
    let at_apply = published.load(Ordering::SeqCst);
    let sharded = t.ladder.clone().with_shards(4).unwrap();
    let dir = tempfile::tempdir().unwrap();
    t.ladder = sharded.clone();
    let file = ladder_file(&t, &dir);
    let (code, out, err) = hookrelay(
        &["topology", "apply", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        at_apply < TOTAL && published.load(Ordering::SeqCst) < TOTAL,
        "still publishing across the change"
    );
    assert!(
        out.contains(&format!(
            "Shared lane {old_first} is not one of the ladder's 4 shard(s)"
        )),
        "{out}"
    );
    // The plan lists the old lanes as retired and sees no drift.
    let (code, out, _) = hookrelay(
        &["topology", "plan", "--ladder", file.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("not in ladder: queue {old_first} (a retired lane")),
        "{out}"
    );

    // Two thirds in, the worker is replaced by one with the sharded ladder (a rolling restart).
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() >= 2 * TOTAL / 3)
            .await
    );
    let at_restart = published.load(Ordering::SeqCst);
    worker.stop().await;
    let worker = RunningWorker::start(&t, subs).await;
    load.await.unwrap();
    assert!(
        at_restart < TOTAL,
        "still publishing when the worker was replaced ({at_restart} of {TOTAL})"
    );
    let delivered = receiver
        .wait_until(WAIT, |r| r.delivered_count() == TOTAL)
        .await;
    worker.stop().await;
    assert!(
        delivered,
        "lost {} of {TOTAL}",
        TOTAL - receiver.delivered_count()
    );
    // The old lanes took nothing after the change and were drained.
    assert_eq!(t.depth(&old_first).await, 0);
    assert_eq!(t.depth(&old_retry).await, 0);
    for i in 0..4 {
        assert_eq!(t.depth(&sharded.first_shard(i)).await, 0);
    }
    assert_eq!(t.drain_dead().await.len(), 0, "nothing dead-lettered");
    eprintln!(
        "resharding under load: {TOTAL} published ({at_apply} before the apply, {at_restart} before \
         the restart), {} delivered, {} duplicate deliveries, lost 0",
        receiver.delivered_count(),
        receiver.duplicates()
    );
}

/// `topology apply`'s steps, as the command takes them: declare, then unbind what is stale.
async fn apply_and_unbind(t: &TestLadder) -> usize {
    let topology = t.ladder.objects();
    topology.apply(&t.channel).await.unwrap();
    let api = common::management(&t.config);
    let stale = topology.stale_bindings(&t.ladder, &api.objects().await.unwrap());
    for b in &stale {
        b.unbind(&t.channel).await.unwrap();
    }
    stale.len()
}

#[tokio::test]
async fn shrinking_the_shards_and_going_back_to_one_unbinds_what_the_ladder_left() {
    let mut t = sharded("shrink", 4, config()).await;
    let four = t.ladder.clone();
    for i in 0..4 {
        t.owns_queue(&four.first_shard(i));
        t.owns_queue(&four.retry_shard(i));
    }
    t.ladder = four.clone().with_shards(2).unwrap();
    assert_eq!(
        apply_and_unbind(&t).await,
        4,
        "shards 2 and 3, first and retry"
    );
    let api = common::management(&t.config);
    let objects = api.objects().await.unwrap();
    assert_eq!(t.ladder.objects().diff(&objects), vec![]);
    let extras = t.ladder.objects().extras(&t.ladder, &objects);
    assert!(
        extras.contains(&format!("queue {}", four.first_shard(3))),
        "{extras:?}"
    );
    let tenants: Vec<String> = (0..16).map(|i| format!("acme-{i}")).collect();
    let placed = t.shard_of(&tenants).await;
    assert!(placed.values().all(|i| *i < 2), "{placed:?}");
    for i in 2..4 {
        assert_eq!(
            t.depth(&four.first_shard(i)).await,
            0,
            "an unbound shard took none"
        );
    }

    // Back to one shard: the unsharded lanes take everything, the shard exchanges nothing.
    t.ladder = four.clone().with_shards(1).unwrap();
    assert_eq!(apply_and_unbind(&t).await, 2 + 2 + 2 + 1);
    t.publish_all(
        tenants
            .iter()
            .map(|tenant| event(&format!("evt_{tenant}"), tenant, "sub")),
    )
    .await;
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 16);
    for i in 0..4 {
        assert_eq!(t.depth(&four.first_shard(i)).await, 0);
    }
    // The shard exchanges are no longer the ladder's: remove them with it.
    for x in [
        four.ingress_shards(),
        four.promote_shards(),
        four.promote_unmatched(),
    ] {
        t.channel
            .exchange_delete(x.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn status_shows_the_depth_and_leader_of_each_shard() {
    let t = sharded("status", 3, config()).await;
    let tenants = one_tenant_per_shard(&t).await;
    // Shard i holds i + 1 first attempts (nobody consumes).
    t.publish_all(tenants.iter().enumerate().flat_map(|(i, tenant)| {
        (0..=i).map(move |k| event(&format!("evt_{tenant}_{k}"), tenant, "sub"))
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    // The management API's figures lag by its statistics interval.
    let mut table = String::new();
    let counted = wait_until(WAIT, async || {
        let (code, out, err) = hookrelay(&["status", "--ladder", ladder], &[]);
        assert_eq!(code, Some(0), "{err}");
        table = out;
        (0..3).all(|i| {
            table.lines().any(|line| {
                let cells: Vec<&str> = line.split_whitespace().collect();
                cells.len() >= 7 && cells[0] == format!("s{i}") && cells[1] == (i + 1).to_string()
            })
        })
    })
    .await;
    assert!(
        counted,
        "a row per shard with its ready first attempts:\n{table}"
    );
    assert!(table.contains("Shards (3 first/retry pairs"), "{table}");
    // The leader as the broker names it (`rabbit@host` on a default node; any name elsewhere).
    let leader = common::management(&t.config)
        .queue(&t.ladder.first_shard(0))
        .await
        .unwrap()
        .and_then(|q| q.leader)
        .expect("a quorum shard has a leader");
    assert!(
        table.contains(&leader),
        "each shard names its leader ({leader}):\n{table}"
    );
    assert!(table.contains("Hottest tenants: not shown"), "{table}");
    let (_, json, _) = hookrelay(&["status", "--json", "--ladder", ladder], &[]);
    let rows: Vec<serde_json::Value> = serde_json::from_str(json.trim()).unwrap();
    let shards: Vec<(String, u64)> = rows
        .iter()
        .filter_map(|r| Some((r["queue"].as_str()?.to_owned(), r["shard"].as_u64()?)))
        .collect();
    assert_eq!(
        shards.len(),
        6,
        "each shard's two lanes carry its index: {shards:?}"
    );
    assert!(shards.contains(&(t.ladder.retry_shard(2), 2)));
}
