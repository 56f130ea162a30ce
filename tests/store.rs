//! The PostgreSQL subscription store on a real server: migrations, import and export, workers
//! that follow changes, sealed secrets, and delivery going on while the database is away.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pg::{PgNode, TestDb};
use common::{Counters, RunningWorker, SubsFile, TestLadder, event, secret, wait_until};
use hookrelay::store::PgStore;
use hookrelay::store::postgres::StoreError;
use hookrelay::store::transfer;
use hookrelay::subscriptions::seal::{Binding, Keyring, generate_key};
use hookrelay::subscriptions::{SealedSecret, SecretRef, SecretSpec, Subscription, Subscriptions};
use hookrelay_tools::receiver::{Receiver, Reply};

const WAIT: Duration = Duration::from_secs(20);

/// Writes `sub` into the store as the importer does.
async fn put(store: &PgStore, sub: &Subscription) {
    let (now, _) = store.load_all().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    store
        .put_from_file(&mut tx, sub, now.get(&sub.id).map(AsRef::as_ref))
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// A ladder, two endpoints, subscription `sub` of acme pointing at the first, and a worker
/// following the store, reading it whole every `resync`.
struct Repointable {
    t: TestLadder,
    first: Receiver,
    second: Receiver,
    w: RunningWorker,
    _secret: common::Secret,
}

async fn repointable(name: &str, store: &PgStore, resync: Duration) -> Repointable {
    let t = TestLadder::apply(name, &["1s"], &["1s", "1s"]).await;
    let s = secret();
    let first = common::ok_receiver(&s).await;
    let second = common::ok_receiver(&s).await;
    put(
        store,
        &common::subscription("sub", "acme", &first.url("/"), &s),
    )
    .await;
    let mut config = t.config.clone();
    config.store.resync = resync;
    let w = RunningWorker::start_following(&t, config, store.clone(), Keyring::empty()).await;
    Repointable {
        t,
        first,
        second,
        w,
        _secret: s,
    }
}

#[tokio::test]
async fn migrations_apply_once_and_a_store_without_them_is_refused_with_what_to_do() {
    let db = TestDb::create().await;
    let store = PgStore::connect(&db.url, Duration::from_secs(5))
        .await
        .unwrap();
    let err = store.check_schema().await.unwrap_err();
    assert!(matches!(err, StoreError::Behind { .. }), "{err}");
    assert!(err.to_string().contains("hookrelay store migrate"), "{err}");

    let (code, out, err) = common::hookrelay(&["store", "migrate", "--store", &db.url], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("applied 1 subscriptions"), "{out}");
    let (code, out, _) = common::hookrelay(&["store", "migrate", "--store", &db.url], &[]);
    assert_eq!(code, Some(0));
    assert!(out.contains("nothing to apply"), "{out}");
    store.check_schema().await.unwrap();
    // The password is never shown.
    assert!(!out.contains(":postgres@"), "{out}");

    let (code, out, _) = common::hookrelay(&["store", "status", "--store", &db.url], &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("subscriptions:  0"), "{out}");
}

#[tokio::test]
async fn import_is_idempotent_and_export_writes_the_same_subscriptions_back() {
    let db = TestDb::create().await;
    let store = db.store().await;
    let text = r#"
[[subscription]]
id = "a"
tenant = "acme"
url = "https://hooks.example.com/a"
event_types = ["order.*", "invoice.paid"]
secrets = ["env:A_NEW", { ref = "env:A_OLD", expires = "2030-01-31T00:00:00Z" }]
rate = "50/s"
max_concurrent = 8

[[subscription]]
id = "b"
tenant = "acme"
url = "https://hooks.example.com/b"
secrets = ["file:/run/secrets/b"]
paused = true

[[subscription]]
id = "c"
tenant = "globex"
url = "https://globex.example/hook"
secrets = ["env:C"]
enabled = false
"#;
    let file = SubsFile::new(text);
    let (code, out, err) = common::hookrelay(
        &[
            "subscriptions",
            "import",
            file.path.to_str().unwrap(),
            "--store",
            &db.url,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("3 created, 0 updated, 0 unchanged"), "{out}");

    let parsed = Subscriptions::load(&file.path).unwrap();
    let again = transfer::import(&store, &parsed, || {}).await.unwrap();
    assert_eq!((again.created, again.updated, again.unchanged), (0, 0, 3));

    // Headers and endpoint authentication are imported with their references, and read back
    // by a worker as the file says them.
    let with_auth = format!(
        "{text}\n[[subscription]]\nid = \"d\"\ntenant = \"acme\"\nurl = \"https://hooks.example.com/d\"\n\
         secrets = [\"env:D\"]\ntrace_context = true\nheaders = {{ \"X-Team\" = \"orders\", \"X-Key\" = {{ secret = \"env:D_KEY\" }} }}\n\
         tls = {{ cert = \"file:/run/d.pem\", key = \"file:/run/d.key\" }}\n\
         [subscription.oauth2]\ntoken_url = \"https://idp.example.com/token\"\nclient_id = \"d\"\n\
         client_secret = \"env:D_OAUTH\"\nscope = \"hooks\"\n\
         [[subscription]]\nid = \"e\"\ntenant = \"acme\"\nurl = \"amqps://mq.example.com/orders\"\n\
         secrets = [\"env:E\"]\nbasic_auth = {{ username = \"acme\", password = \"env:E_MQ\" }}\n\
         amqp = {{ exchange = \"webhooks.in\", routing_key = \"acme\" }}\n"
    );
    let with_auth = Subscriptions::parse("with-auth.toml", &with_auth).unwrap();
    let report = transfer::import(&store, &with_auth, || {}).await.unwrap();
    assert_eq!((report.created, report.unchanged), (2, 3));
    let (stored, _) = store.load_all().await.unwrap();
    assert_eq!(stored.get("d"), with_auth.get("d"));
    assert!(stored.get("d").unwrap().trace_context);
    // An AMQP destination, its exchange and login kept with the other request settings.
    assert_eq!(stored.get("e"), with_auth.get("e"));
    assert!(stored.get("e").unwrap().amqp.is_some());
    let again = transfer::import(&store, &with_auth, || {}).await.unwrap();
    assert_eq!(again.unchanged, 5, "importing it twice changes nothing");
    let exported = transfer::export(&store, &Keyring::empty(), None)
        .await
        .unwrap();
    let round = Subscriptions::parse("exported.toml", &exported).unwrap();
    assert_eq!(round.get("d"), with_auth.get("d"), "{exported}");
    assert_eq!(round.get("e"), with_auth.get("e"), "{exported}");
    sqlx::query("DELETE FROM subscriptions WHERE id IN ('d', 'e')")
        .execute(store.pool())
        .await
        .unwrap();

    let (stored, problems) = store.load_all().await.unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    for sub in parsed.iter() {
        assert_eq!(stored.get(&sub.id).map(AsRef::as_ref), Some(sub.as_ref()));
    }

    // One change: one update, the rest untouched.
    file.write(&text.replace(
        "https://hooks.example.com/b",
        "https://hooks.example.com/b2",
    ));
    let changed = Subscriptions::load(&file.path).unwrap();
    let report = transfer::import(&store, &changed, || {}).await.unwrap();
    assert_eq!(
        (report.created, report.updated, report.unchanged),
        (0, 1, 2)
    );

    let exported = transfer::export(&store, &Keyring::empty(), None)
        .await
        .unwrap();
    let back = Subscriptions::parse("export", &exported).unwrap();
    assert_eq!(back.len(), 3);
    for sub in changed.iter() {
        assert_eq!(
            back.get(&sub.id).map(AsRef::as_ref),
            Some(sub.as_ref()),
            "{exported}"
        );
    }

    // An invalid file imports nothing.
    let bad = SubsFile::new(
        "[[subscription]]\nid = \"d\"\ntenant = \"acme\"\nurl = \"ftp://x\"\nsecrets = [\"env:D\"]\n",
    );
    let (code, _, err) = common::hookrelay(
        &[
            "subscriptions",
            "import",
            bad.path.to_str().unwrap(),
            "--store",
            &db.url,
        ],
        &[],
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains("nothing imported") && err.contains("url"),
        "{err}"
    );
    assert_eq!(store.load_all().await.unwrap().0.len(), 3);
}

#[tokio::test]
async fn sealed_secrets_sign_deliveries_and_export_refuses_them_without_a_secrets_dir() {
    let db = TestDb::create().await;
    let store = db.store().await;
    let key = generate_key();
    let ring = Keyring::from_base64(&[&key]).unwrap();
    let whsec = hookrelay::contract::signing::generate_secret();
    let t = TestLadder::apply("store-sealed", &["1s"], &["1s"]).await;
    let receiver = Receiver::start(std::slice::from_ref(&whsec), |_| Reply::Status(204))
        .await
        .unwrap();
    let mut sub = Subscription::new(
        "sealed",
        "acme",
        receiver.url("/").parse().unwrap(),
        SecretRef::Env("UNUSED".into()),
    );
    let binding = Binding::new("acme", "sealed", "signing");
    sub.secrets = vec![SecretSpec::new(SecretRef::Sealed(SealedSecret {
        sealed: Arc::from(ring.seal(&binding, whsec.as_bytes()).unwrap()),
        binding,
    }))];
    put(&store, &sub).await;

    let w = RunningWorker::start_following(
        &t,
        t.config.clone(),
        store.clone(),
        Keyring::from_base64(&[&key]).unwrap(),
    )
    .await;
    t.publish(&event("evt_sealed", "acme", "sealed")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    w.stop().await;

    let err = transfer::export(&store, &ring, None).await.unwrap_err();
    assert!(err.to_string().contains("--secrets-dir"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let text = transfer::export(&store, &ring, Some(dir.path()))
        .await
        .unwrap();
    assert!(!text.contains(&whsec), "the file holds references only");
    let back = Subscriptions::parse("export", &text).unwrap();
    let SecretRef::File(path) = &back.get("sealed").unwrap().secrets[0].reference else {
        panic!("{text}");
    };
    assert_eq!(std::fs::read_to_string(path).unwrap().trim(), whsec);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}

#[tokio::test]
async fn a_worker_sees_each_change_of_the_store_without_a_restart() {
    let db = TestDb::create().await;
    let store = db.store().await;
    // No periodic full read within the test: only the notification can bring a change.
    let Repointable {
        t,
        first,
        second,
        w,
        _secret: _kept,
    } = repointable("store-follow", &store, Duration::from_secs(600)).await;

    // Under load: a backlog being delivered while the subscription is repointed.
    const LOAD: usize = 2_000;
    t.publish_all((0..LOAD).map(|i| event(&format!("evt_load{i}"), "acme", "sub")))
        .await;
    assert!(first.wait_until(WAIT, |r| r.delivered_count() >= 100).await);

    // Repointed: the next delivery goes to the new URL.
    let changes = |w: &RunningWorker| {
        w.metrics
            .count("hookrelay_subscription_store_changes_total", &[])
    };
    let before = changes(&w);
    let started = Instant::now();
    sqlx::query("UPDATE subscriptions SET url = $1 WHERE id = 'sub'")
        .bind(second.url("/"))
        .execute(store.pool())
        .await
        .unwrap();
    assert!(wait_until(WAIT, async || changes(&w) > before).await);
    let seen_after = started.elapsed();
    // The figure against the 1 s target comes from the benchmark (docs/performance.md); here,
    // only that a notification brought it, far sooner than any resync.
    eprintln!(
        "change in force after {seen_after:?}, with {} of {LOAD} delivered",
        first.delivered_count()
    );
    assert!(seen_after < Duration::from_secs(10), "{seen_after:?}");
    // Every envelope of the backlog is delivered once, to one URL or the other.
    assert!(
        wait_until(WAIT, async || {
            first.delivered_count() + second.delivered_count() == LOAD
        })
        .await
    );
    let to_first = first.delivered_count();
    t.publish(&event("evt_2", "acme", "sub")).await;
    assert!(
        second
            .wait_until(WAIT, |r| r.delivered_count() == LOAD - to_first + 1)
            .await
    );
    assert_eq!(first.delivered_count(), to_first);
    assert_eq!(first.duplicates() + second.duplicates(), 0);

    // Paused: parked, not attempted.
    let before = changes(&w);
    sqlx::query("UPDATE subscriptions SET paused = true WHERE id = 'sub'")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(wait_until(WAIT, async || changes(&w) > before).await);
    t.publish(&event("evt_3", "acme", "sub")).await;
    let parking = t.ladder.paused_queue("sub");
    assert!(wait_until(WAIT, async || t.depth_if_exists(&parking).await == 1).await);
    let sent = second.request_count();

    // Deleted: a new event for it is dead-lettered as for an unknown subscription, not sent.
    let before = changes(&w);
    sqlx::query("DELETE FROM subscriptions WHERE id = 'sub'")
        .execute(store.pool())
        .await
        .unwrap();
    assert!(wait_until(WAIT, async || changes(&w) > before).await);
    t.publish(&event("evt_4", "acme", "sub")).await;
    assert!(
        wait_until(WAIT, async || {
            w.metrics
                .count("hookrelay_outcomes_total", &[("outcome", "invalid")])
                >= 1
        })
        .await
    );
    assert_eq!(second.request_count(), sent);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_go_on_while_the_store_is_down_and_changes_resume_when_it_returns() {
    let node = PgNode::started().await;
    let db = TestDb::create_on(&node.url()).await;
    let store = db.store().await;
    let Repointable {
        t,
        first,
        second,
        w,
        _secret: _kept,
    } = repointable("store-down", &store, Duration::from_secs(2)).await;
    let up = |w: &RunningWorker| {
        w.metrics
            .registry
            .gather()
            .iter()
            .find(|f| f.name() == "hookrelay_subscription_store_up")
            .map(|f| f.get_metric()[0].get_gauge().value())
    };
    assert_eq!(up(&w), Some(1.0));

    // The database goes away under load.
    t.publish_all((0..100).map(|i| event(&format!("evt_a{i}"), "acme", "sub")))
        .await;
    let n = Arc::clone(&node);
    tokio::task::spawn_blocking(move || n.stop()).await.unwrap();
    t.publish_all((0..100).map(|i| event(&format!("evt_b{i}"), "acme", "sub")))
        .await;
    assert!(
        first.wait_until(WAIT, |r| r.delivered_count() == 200).await,
        "{}",
        first.delivered_count()
    );
    assert!(
        wait_until(WAIT, async || up(&w) == Some(0.0)).await,
        "the store's absence is reported"
    );
    let readyz = reqwest::get(format!("http://{}/readyz", w.vitals.unwrap()))
        .await
        .unwrap();
    assert_eq!(readyz.status(), 200);
    let detail = readyz.text().await.unwrap();
    assert!(
        detail.contains("subscription store unreachable"),
        "{detail}"
    );

    // Back: a change made after is in force without a restart.
    let n = Arc::clone(&node);
    tokio::task::spawn_blocking(move || n.resume())
        .await
        .unwrap();
    assert!(wait_until(WAIT, async || up(&w) == Some(1.0)).await);
    sqlx::query("UPDATE subscriptions SET url = $1 WHERE id = 'sub'")
        .bind(second.url("/"))
        .execute(store.pool())
        .await
        .unwrap();
    // Until the change is in force, events still go to the first URL; none is lost.
    let mut after = 0;
    let repointed = wait_until(WAIT, async || {
        after += 1;
        t.publish(&event(&format!("evt_after{after}"), "acme", "sub"))
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        second.delivered_count() >= 1
    })
    .await;
    assert!(repointed, "the change made after the outage is in force");
    assert!(
        wait_until(WAIT, async || {
            first.delivered_count() + second.delivered_count() == 200 + after
        })
        .await,
        "lost 0: {} + {} of {}",
        first.delivered_count(),
        second.delivered_count(),
        200 + after
    );
    assert_eq!(first.duplicates() + second.duplicates(), 0);
    w.stop().await;
    drop(store);
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_the_store_cannot_serve_waits_in_a_tier_and_holds_no_slot() {
    let node = PgNode::started().await;
    let db = TestDb::create_on(&node.url()).await;
    let store = db.store().await;
    let t = TestLadder::apply("store-miss-slot", &["1s"], &["1s", "1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    for (id, tenant) in [("held", "acme"), ("f0", "fan"), ("f1", "fan")] {
        put(
            &store,
            &common::subscription(id, tenant, &receiver.url("/"), &s),
        )
        .await;
    }
    let mut config = t.config.clone();
    config.store.resync = Duration::from_secs(600);
    // One slot on the first-attempt lane: whatever holds it holds the lane.
    config.worker.in_flight = 2;
    let w = RunningWorker::start_cached(&t, config, store.clone(), Keyring::empty()).await;
    t.publish(&event("evt_warm", "acme", "held")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );

    // The store goes away: the fan-out's tenant is not held, `held` is.
    let n = Arc::clone(&node);
    tokio::task::spawn_blocking(move || n.stop()).await.unwrap();
    let mut fan = event("evt_fan", "fan", "f0");
    fan.subscription = None;
    t.publish(&fan).await;
    t.publish(&event("evt_behind", "acme", "held")).await;
    // The event behind the fan-out gets the lane's only slot while the store is still down:
    // the fan-out waits in a tier, not in the slot.
    assert!(
        receiver
            .wait_until(WAIT, |r| !r.records_for("evt_behind").is_empty())
            .await,
        "the event behind a fan-out the store cannot serve is delivered while the store is down"
    );
    assert!(
        w.metrics.count(
            "hookrelay_subscription_lookups_total",
            &[("kind", "tenant"), ("result", "failed")]
        ) >= 1
    );
    assert!(
        w.metrics
            .count("hookrelay_outcomes_total", &[("outcome", "retried")])
            >= 1,
        "the fan-out was deferred into a tier"
    );
    assert_eq!(receiver.delivered_count(), 2);

    // Back: the deferred event fans out from the retry lane, once per subscription, under
    // the ids its fan-out always gives.
    let n = Arc::clone(&node);
    tokio::task::spawn_blocking(move || n.resume())
        .await
        .unwrap();
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 4)
            .await,
        "{:?}",
        receiver.delivered()
    );
    for sub in ["f0", "f1"] {
        let id = hookrelay::contract::envelope::derived_id("evt_fan", sub).to_string();
        assert_eq!(receiver.records_for(&id).len(), 1, "{sub}");
    }
    assert_eq!(receiver.duplicates(), 0);
    w.stop().await;
    drop(store);
    drop(db);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_reads_while_every_connection_of_the_followers_pool_is_taken() {
    let db = TestDb::create().await;
    let store = db.store().await;
    let t = TestLadder::apply("store-lookup-pool", &["1s"], &["1s", "1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    put(
        &store,
        &common::subscription("sub", "acme", &receiver.url("/"), &s),
    )
    .await;
    let mut config = t.config.clone();
    config.store.resync = Duration::from_secs(600);
    let w = RunningWorker::start_cached(&t, config, store.clone(), Keyring::empty()).await;
    // The follower's pool (the worker's store is a clone of this one) fully taken: its
    // listener keeps one, this test the others, as a burst of change reads or a full read
    // would.
    let pool = store.pool();
    let most = pool.options().get_max_connections();
    let mut taken = Vec::new();
    while pool.size() < most || pool.num_idle() > 0 {
        taken.push(pool.acquire().await.unwrap());
    }
    t.publish(&event("evt_1", "acme", "sub")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await,
        "a subscription not held is read while the follower's pool is taken ({} of {most} \
         held here)",
        taken.len()
    );
    drop(taken);
    w.stop().await;
}

#[tokio::test]
async fn an_endpoint_failing_for_disable_after_has_its_subscriptions_disabled_and_parked() {
    let db = TestDb::create().await;
    let store = db.store().await;
    let t = TestLadder::apply("store-disable", &["1s"], &["1s"; 30]).await;
    let events = t.keep_all(t.ladder.events_exchange().as_str()).await;
    let s = secret();
    let failing = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(503))
        .await
        .unwrap();
    let healthy = common::ok_receiver(&s).await;
    put(
        &store,
        &common::subscription("down", "acme", &failing.url("/hook"), &s),
    )
    .await;
    put(
        &store,
        &common::subscription("other", "acme", &healthy.url("/hook"), &s),
    )
    .await;
    let mut config = t.config.clone();
    config.endpoints.breaker_failures = 1;
    config.endpoints.breaker_cooldown = Duration::from_millis(300);
    config.endpoints.quarantine_after = Duration::from_millis(500);
    config.endpoints.disable_after = Duration::from_secs(2);
    let w = RunningWorker::start_following(&t, config, store.clone(), Keyring::empty()).await;
    t.publish(&event("evt_down", "acme", "down")).await;
    t.publish(&event("evt_other", "acme", "other")).await;

    let reason = async || -> Option<(bool, Option<String>)> {
        sqlx::query_as("SELECT paused, disabled_reason FROM subscriptions WHERE id = 'down'")
            .fetch_optional(store.pool())
            .await
            .unwrap()
    };
    assert!(
        wait_until(WAIT, async || reason()
            .await
            .is_some_and(|(paused, _)| paused))
        .await,
        "the failing endpoint's subscription is disabled"
    );
    let (_, why) = reason().await.unwrap();
    assert!(
        why.as_deref().unwrap_or_default().contains("disable_after"),
        "{why:?}"
    );
    // Its envelope waits in its parking queue, not cancelled, not dead-lettered.
    let parking = t.ladder.paused_queue("down");
    assert!(wait_until(WAIT, async || t.depth_if_exists(&parking).await == 1).await);
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
    // The other endpoint was never touched.
    assert_eq!(healthy.delivered_count(), 1);
    let other: bool = sqlx::query_scalar("SELECT paused FROM subscriptions WHERE id = 'other'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(!other);
    // Announced once, with the reason.
    let mut announced = Vec::new();
    wait_until(WAIT, async || {
        while let Some(m) = t
            .channel
            .basic_get(
                events.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            let e: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
            if e["event"] == "subscription.disabled" {
                announced.push(e);
            }
        }
        !announced.is_empty()
    })
    .await;
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert_eq!(announced[0]["subscription"], "down");
    assert_eq!(announced[0]["reason"], "endpoint_failing");
    w.stop().await;
}

#[tokio::test]
async fn the_worker_command_runs_on_the_store_and_pause_and_resume_write_it() {
    let db = TestDb::create().await;
    let t = TestLadder::apply("store-cli", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    let url = std::path::PathBuf::from(&db.url);

    // Not migrated: the worker refuses, saying what to run.
    let out = common::worker_process("unmigrated", &ladder, &url)
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hookrelay store migrate"), "{err}");
    assert!(!err.contains(":postgres@"), "no password in errors: {err}");

    let store = db.store().await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    put(
        &store,
        &common::subscription("sub_a", "acme", &receiver.url("/"), &s),
    )
    .await;
    let mut child = common::worker_process(&format!("{} cli", t.ladder.prefix), &ladder, &url)
        .spawn()
        .unwrap();
    t.publish(&event("evt_1", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );

    let ladder_arg = ladder.to_str().unwrap();
    let (code, out, err) =
        common::hookrelay(&["subscriptions", "pause", "sub_a", "--file", &db.url], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let paused: bool = sqlx::query_scalar("SELECT paused FROM subscriptions WHERE id = 'sub_a'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(paused);
    // Seen by the worker within its notification: the next event parks.
    tokio::time::sleep(Duration::from_secs(1)).await;
    t.publish(&event("evt_2", "acme", "sub_a")).await;
    let parking = t.ladder.paused_queue("sub_a");
    assert!(wait_until(WAIT, async || t.depth_if_exists(&parking).await == 1).await);
    assert_eq!(receiver.delivered_count(), 1);

    let (code, out, err) = common::hookrelay(
        &[
            "subscriptions",
            "resume",
            "sub_a",
            "--file",
            &db.url,
            "--ladder",
            ladder_arg,
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 parked delivery(ies) returned"), "{out}");
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    assert_eq!(receiver.duplicates(), 0);
    let _ = child.kill().await;
}

#[tokio::test]
async fn an_old_form_sealed_value_still_opens_and_reseal_upgrades_every_one() {
    use base64::Engine;
    let db = TestDb::create().await;
    let store = db.store().await;
    let (old_key, new_key) = (generate_key(), generate_key());
    let whsec = hookrelay::contract::signing::generate_secret();
    let pool = store.pool();
    sqlx::query(
        "INSERT INTO subscriptions (id, tenant, url, request) VALUES ('legacy', 'acme', \
         'https://hooks.acme.example/in', '{\"basic_auth\": {\"username\": \"u\"}}')",
    )
    .execute(pool)
    .await
    .unwrap();
    // The signing secret under the old key; the password already under the new one, yet in the
    // old form.
    let signing = common::seal_old_form(&old_key, "legacy", whsec.as_bytes());
    for (purpose, sealed) in [
        ("signing", signing.clone()),
        (
            "basic_auth.password",
            common::seal_old_form(&new_key, "legacy", b"hunter2"),
        ),
    ] {
        sqlx::query(
            "INSERT INTO subscription_secrets (subscription_id, purpose, sealed) \
             VALUES ('legacy', $1, $2)",
        )
        .bind(purpose)
        .bind(sealed)
        .execute(pool)
        .await
        .unwrap();
    }
    // A create answer remembered with its secret sealed in it, as the API kept them.
    let remembered = serde_json::json!({
        "subscription": { "id": "legacy", "tenant": "acme" },
        "sealed_secret": base64::engine::general_purpose::STANDARD.encode(&signing),
    });
    sqlx::query(
        "INSERT INTO idempotency_keys (scope, key, request_hash, status, body) \
         VALUES ('tenant:acme', 'k', '\\x00', 201, $1)",
    )
    .bind(&remembered)
    .execute(pool)
    .await
    .unwrap();

    // Both open as they are, with a ring that holds both keys.
    let problems = |keys: &[&String]| {
        let ring = Arc::new(Keyring::from_base64(keys).unwrap());
        let store = store.clone();
        async move {
            let (subs, rows) = store.load_all().await.unwrap();
            assert!(rows.is_empty(), "{rows:?}");
            let secrets =
                hookrelay::subscriptions::SecretStore::new(Duration::ZERO).with_keyring(ring);
            let sub = subs.get("legacy").unwrap();
            assert_eq!(sub.basic_auth.as_ref().unwrap().username, "u");
            secrets
                .problems_of(sub)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(problems(&[&new_key, &old_key]).await, Vec::<String>::new());

    // `store reseal` seals every one again with the first key, in the new form, and the
    // remembered answer refers to the secret's row instead of holding it.
    let env = [
        ("HOOKRELAY_STORE_KEYS", "env:NEW_KEY,env:OLD_KEY"),
        ("NEW_KEY", new_key.as_str()),
        ("OLD_KEY", old_key.as_str()),
    ];
    let (code, out, err) = common::hookrelay(&["store", "reseal", "--store", &db.url], &env);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("2 secret(s) sealed again"), "{out}");
    let forms: Vec<i32> =
        sqlx::query_scalar("SELECT get_byte(sealed, 0) FROM subscription_secrets")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(forms, [2, 2]);
    let body: serde_json::Value = sqlx::query_scalar("SELECT body FROM idempotency_keys")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(body.get("sealed_secret"), None, "{body}");
    let signing_row: i64 =
        sqlx::query_scalar("SELECT position FROM subscription_secrets WHERE purpose = 'signing'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(body["secret_position"], signing_row, "{body}");
    assert_eq!(body["subscription"]["id"], "legacy");
    // The old key can go; and a second run has nothing to do.
    assert_eq!(problems(&[&new_key]).await, Vec::<String>::new());
    let (code, out, _) = common::hookrelay(&["store", "reseal", "--store", &db.url], &env);
    assert_eq!(code, Some(0));
    assert!(out.contains(" 0 secret(s) sealed again"), "{out}");

    // Now bound to its field: the signing secret as the password does not open.
    sqlx::query(
        "UPDATE subscription_secrets SET sealed = (SELECT sealed FROM subscription_secrets \
         WHERE purpose = 'signing') WHERE purpose = 'basic_auth.password'",
    )
    .execute(pool)
    .await
    .unwrap();
    let found = problems(&[&new_key]).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("does not open"), "{found:?}");
}

/// A storm of changes to one subscription, each sealing its three header secrets anew and
/// moving it to another path, cap and rate: the worker keeps only what the version in force
/// uses, not every version it has seen.
#[tokio::test]
async fn a_storm_of_changes_leaves_the_worker_only_what_is_in_force() {
    use hookrelay::store::request::header_purpose;
    use hookrelay::subscriptions::{ExtraHeader, HeaderValueSpec};

    let db = TestDb::create().await;
    let store = db.store().await;
    let key = generate_key();
    let ring = Keyring::from_base64(&[&key]).unwrap();
    let t = TestLadder::apply("store-storm", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let version = |n: usize| {
        let mut sub = common::subscription("storm", "acme", &receiver.url(&format!("/v{n}")), &s);
        sub.max_concurrent = Some(5 + u32::try_from(n).unwrap());
        sub.rate = Some(format!("{}/s", 100 + n).parse().unwrap());
        sub.headers = (0..3)
            .map(|h| {
                let name = format!("x-key-{h}");
                let binding = Binding::new("acme", "storm", &header_purpose(&name));
                let value = format!("{n}-{h}-").repeat(200);
                let sealed = Arc::from(ring.seal(&binding, value.as_bytes()).unwrap());
                ExtraHeader {
                    name,
                    value: HeaderValueSpec::Secret(SecretRef::Sealed(SealedSecret {
                        binding,
                        sealed,
                    })),
                }
            })
            .collect();
        sub
    };
    put(&store, &version(0)).await;
    let mut config = t.config.clone();
    config.store.resync = Duration::from_secs(600);
    let opens = Keyring::from_base64(&[&key]).unwrap();
    let w = RunningWorker::start_following(&t, config, store.clone(), opens).await;

    const VERSIONS: usize = 40;
    for n in 1..=VERSIONS {
        put(&store, &version(n)).await;
        t.publish(&event(&format!("evt_storm{n}"), "acme", "storm"))
            .await;
        assert!(
            receiver
                .wait_until(WAIT, |r| r.delivered_count() == n)
                .await
        );
    }
    let entries = |cache: &str| w.metrics.cache_entries.with_label_values(&[cache]).get();
    let caches = [
        "secret_texts",
        "endpoint_health",
        "endpoint_limits",
        "endpoint_rates",
    ];
    // What the version in force uses, once a sweep has looked (an unswept gauge is 0, so the
    // three secrets say it did). Its one endpoint has a health entry only once it was tried:
    // under load the last deliveries may all have gone out under an earlier version's URL.
    let settled = wait_until(WAIT, async || {
        entries("secret_texts") == 3
            && caches[1..].iter().all(|c| entries(c) <= 1)
            && entries("host_limits") <= 1
    })
    .await;
    let seen: Vec<_> = caches
        .iter()
        .chain(&["host_limits", "lane_limits", "secrets"])
        .map(|c| (*c, entries(c)))
        .collect();
    assert!(
        settled,
        "after {VERSIONS} versions the worker keeps {seen:?}; the version in force uses 3 \
         header secrets and one endpoint"
    );
    w.stop().await;
}

/// A worker following the store learns of catalog changes within `catalog.refresh`: a type
/// written `enforce` dead-letters an invalid payload; switched to `off`, the same is delivered.
#[tokio::test]
async fn a_following_worker_validates_against_the_catalog_as_it_changes() {
    use hookrelay::catalog::ValidationMode;
    use hookrelay::delivery::worker::{CatalogSource, WorkerSetup};
    use hookrelay::store::catalog::{EventTypeWrite, put as put_type};
    use hookrelay::subscriptions::{LiveSubscriptions, SecretStore};

    let db = TestDb::create().await;
    let store = db.store().await;
    let t = TestLadder::apply("catalog-follow", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    put(
        &store,
        &common::subscription("sub", "acme", &receiver.url("/"), &s),
    )
    .await;
    let schema = serde_json::json!({"type": "object", "required": ["amount"]});
    let example = serde_json::json!({"amount": 1});
    let write = |mode| EventTypeWrite {
        name: "order.paid",
        description: "",
        mode,
        deprecated: false,
        schema: &schema,
        example: &example,
    };
    put_type(store.pool(), &write(ValidationMode::Enforce))
        .await
        .unwrap();

    let mut config = t.config.clone();
    config.catalog.refresh = Duration::from_millis(200);
    let mut opened = hookrelay::store::follow::Opened::open(store.clone())
        .await
        .unwrap();
    let first = std::mem::take(&mut opened.first);
    let mut setup = WorkerSetup::new(config, t.ladder.clone(), LiveSubscriptions::followed(first));
    setup.store = Some(opened.following());
    setup.catalog_source = CatalogSource::Postgres(store.clone());
    // Read at start, as `hookrelay worker` does.
    let types = setup.catalog_source.read().await.unwrap();
    setup.catalog = Arc::new(hookrelay::catalog::LiveCatalog::new(
        hookrelay::delivery::worker::catalog::compile(&types, ValidationMode::Off),
    ));
    setup.secrets = SecretStore::new(Duration::from_millis(100));
    let w = RunningWorker::launch(&t, setup).await;

    let mut bad = event("evt_bad_1", "acme", "sub");
    bad.body = br#"{"total":1}"#.to_vec();
    t.publish(&bad).await;
    assert!(
        t.wait_dead(1, WAIT).await,
        "enforced once the worker read it"
    );
    assert_eq!(receiver.request_count(), 0);

    put_type(store.pool(), &write(ValidationMode::Off))
        .await
        .unwrap();
    // The change is in force within a refresh or two; events published before may still be
    // refused, so publish until one goes through.
    let mut n = 1;
    let delivered = wait_until(WAIT, async || {
        n += 1;
        let mut again = event(&format!("evt_bad_{n}"), "acme", "sub");
        again.body = br#"{"total":1}"#.to_vec();
        t.publish(&again).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        receiver.request_count() > 0
    })
    .await;
    assert!(delivered, "validation off after the change");
    w.stop().await;
}

/// Every worker's follower has read the store since `since` (Unix seconds): a change
/// committed before it is in force in each, whether it held the subscription or not.
async fn followed_since(workers: &[&RunningWorker], since: f64) -> bool {
    wait_until(WAIT, async || {
        workers
            .iter()
            .all(|w| w.metrics.subscription_store_synced.get() > since)
    })
    .await
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_holding_less_than_its_working_set_sees_every_change() {
    // Tenant `hot`: h0..h3, in use, within the per-tenant bound (held); `bg`: b0..b35, the
    // background, which evicts only its own; `fan`: f0..f2, fanned out to.
    const BG: usize = 36;
    let db = TestDb::create().await;
    let store = db.store().await;
    let t = TestLadder::apply("store-cache", &["1s"], &["1s", "1s"]).await;
    let (s1, s2) = (secret(), secret());
    // No verification at the endpoints: which secret signed is checked here, per record.
    let old = Receiver::start(&[], |_| Reply::Status(204)).await.unwrap();
    let new = Receiver::start(&[], |_| Reply::Status(204)).await.unwrap();
    let subs = (0..4)
        .map(|i| (format!("h{i}"), "hot"))
        .chain((0..BG).map(|i| (format!("b{i}"), "bg")))
        .chain((0..3).map(|i| (format!("f{i}"), "fan")));
    for (id, tenant) in subs {
        put(
            &store,
            &common::subscription(&id, tenant, &old.url("/"), &s1),
        )
        .await;
    }
    let mut config = t.config.clone();
    config.store.resync = Duration::from_secs(600);
    config.store.cache_entries = 12;
    config.store.cache_per_tenant = 4;
    let w1 = RunningWorker::start_cached(&t, config.clone(), store.clone(), Keyring::empty()).await;
    let w2 = RunningWorker::start_cached(&t, config, store.clone(), Keyring::empty()).await;
    let fleet = [&w1, &w2];

    // A working set of 43 subscriptions through caches of 12: everything delivered once.
    let mut events = Vec::new();
    for round in 0..5 {
        for i in 0..BG {
            events.push(event(&format!("evt_{round}_b{i}"), "bg", &format!("b{i}")));
            let h = i % 4;
            events.push(event(
                &format!("evt_{round}_{i}_h{h}"),
                "hot",
                &format!("h{h}"),
            ));
        }
        let mut fan = event(&format!("fan_{round}"), "fan", "f0");
        fan.subscription = None;
        events.push(fan);
    }
    let expected = 5 * (2 * BG + 3);
    t.publish_all(events).await;
    assert!(
        old.wait_until(WAIT, |r| r.delivered_count() == expected)
            .await
    );
    let lookups = |result: &str| -> u64 {
        fleet
            .iter()
            .map(|w| {
                w.metrics.count(
                    "hookrelay_subscription_lookups_total",
                    &[("result", result)],
                )
            })
            .sum()
    };
    assert!(
        lookups("miss") > BG as u64,
        "misses {} for {BG} background subscriptions: the caches are smaller than the working set",
        lookups("miss")
    );
    assert!(lookups("hit") > 0);
    // A miss the store did not answer in time was deferred, and delivered all the same.
    eprintln!("lookups failed (deferred): {}", lookups("failed"));

    // Changes while the fleet delivers to the background: h0 (held) and b0 (evicted, or never
    // held) repointed, h1 paused, h2 deleted, h3's secret rotated.
    let background = (0..200).map(|k| {
        let i = 1 + k % (BG - 1);
        event(&format!("bg_{k}"), "bg", &format!("b{i}"))
    });
    let publishing = {
        let t = &t;
        async move { t.publish_all(background).await }
    };
    let changing = async {
        // One row at a time, each followed by every worker before the next: the read that
        // follows a commit can only be the one its notification asked for.
        let new_url = new.url("/");
        let rotated_ref = s2.reference.to_string();
        let changes: [(&str, Option<&str>); 5] = [
            (
                "UPDATE subscriptions SET url = $1 WHERE id = 'h0'",
                Some(&new_url),
            ),
            (
                "UPDATE subscriptions SET url = $1 WHERE id = 'b0'",
                Some(&new_url),
            ),
            (
                "UPDATE subscriptions SET paused = true WHERE id = 'h1'",
                None,
            ),
            ("DELETE FROM subscriptions WHERE id = 'h2'", None),
            (
                "UPDATE subscription_secrets SET reference = $1 WHERE subscription_id = 'h3'",
                Some(&rotated_ref),
            ),
        ];
        let mut followed = true;
        for (sql, bind) in changes {
            let mut query = sqlx::query(sql);
            if let Some(value) = bind {
                query = query.bind(value);
            }
            let since = unix_now();
            query.execute(store.pool()).await.unwrap();
            followed &= followed_since(&fleet, since).await;
        }
        followed
    };
    let ((), followed) = tokio::join!(publishing, changing);
    assert!(followed, "every worker followed the changes");

    // Each change is in force in both workers, whichever of them holds what.
    let before_new = new.delivered_count();
    let targets = [
        ("h0", "hot"),
        ("b0", "bg"),
        ("h1", "hot"),
        ("h2", "hot"),
        ("h3", "hot"),
    ];
    let after: Vec<_> = (0..10)
        .flat_map(|k| {
            targets
                .iter()
                .map(move |(id, tenant)| event(&format!("after_{k}_{id}"), tenant, id))
        })
        .collect();
    t.publish_all(after).await;
    assert!(
        new.wait_until(WAIT, |r| r.delivered_count() == before_new + 20)
            .await
    );
    let parking = t.ladder.paused_queue("h1");
    assert!(wait_until(WAIT, async || t.depth_if_exists(&parking).await == 10).await);
    assert!(
        wait_until(WAIT, async || {
            fleet
                .iter()
                .map(|w| {
                    w.metrics
                        .count("hookrelay_outcomes_total", &[("outcome", "invalid")])
                })
                .sum::<u64>()
                >= 10
        })
        .await
    );
    assert!(
        old.wait_until(WAIT, |r| r.delivered_count() == expected + 200 + 10)
            .await
    );
    let rotated = standardwebhooks::Webhook::new(&s2.whsec).unwrap();
    for k in 0..10 {
        let records = old.records_for(&format!("after_{k}_h3"));
        assert!(!records.is_empty(), "after_{k}_h3 delivered");
        for r in records {
            rotated
                .verify(&r.body, &r.headers)
                .expect("signed with the rotated secret");
        }
        for id in ["h0", "b0", "h1", "h2"] {
            assert!(
                old.records_for(&format!("after_{k}_{id}")).is_empty(),
                "after_{k}_{id}"
            );
        }
    }
    assert_eq!(old.duplicates() + new.duplicates(), 0);
    w1.stop().await;
    w2.stop().await;
}
