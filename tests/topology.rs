//! `topology apply | plan | export` against the real broker.

mod common;

use std::process::Command;

use common::{TestLadder, management};
use hookrelay::broker::drift::Drift;
use hookrelay::contract::ladder::{Ladder, QueueType};
use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};

#[tokio::test]
async fn apply_is_idempotent_and_plan_sees_no_drift() {
    // A ladder applied before deferral queues existed: the same ladder with them is drift,
    // the deferral queues missing, until apply declares them.
    let before = Ladder::build(
        &common::unique("apply"),
        QueueType::Quorum,
        &["1s", "5s"],
        &["1s", "5s", "5s"],
    )
    .unwrap();
    let mut t = TestLadder::apply_ladder(
        common::config(),
        before.clone().with_deferrals(&[]).unwrap(),
    )
    .await;
    let api = management(&t.config);
    let drift = before.objects().diff(&api.objects().await.unwrap());
    let missing: Vec<String> = drift.iter().map(ToString::to_string).collect();
    // Each: its queue, its exchange, and its bindings from that exchange and the delay exchange.
    assert_eq!(missing.len(), 4 * before.deferrals.len(), "{missing:#?}");
    for q in before.deferrals.iter().map(|d| &d.name) {
        for object in [
            format!("missing: queue {}.{q}", before.prefix),
            format!("missing: exchange {}.delay.{q}", before.prefix),
        ] {
            assert!(missing.contains(&object), "{missing:#?}");
        }
    }
    t.ladder = before;
    // Apply declares them; a second apply changes nothing and does not fail.
    t.ladder.objects().apply(&t.channel).await.unwrap();
    let applied = t.ladder.objects().apply(&t.channel).await.unwrap();
    assert_eq!(
        (applied.exchanges, applied.queues, applied.bindings),
        (13, 11, 16),
        "2 tiers and 4 deferral queues, each with an exchange of its own and bound to it and to \
         the delay exchange; the two streams, bound to the ingress alternate and the attempts \
         exchange"
    );
    let api = management(&t.config);
    let objects = api.objects().await.unwrap();
    let topology = t.ladder.objects();
    assert_eq!(topology.diff(&objects), vec![]);
    assert!(topology.extras(&t.ladder, &objects).is_empty());

    // The broker sees what the ladder says: TTL, dead-letter target, at-least-once.
    let tier = api
        .queue(&t.ladder.tier_queue(t.ladder.tier_at(0).unwrap()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tier.arguments["x-message-ttl"], 1000);
    assert_eq!(
        tier.arguments["x-dead-letter-exchange"],
        t.ladder.promote_exchange()
    );
    assert_eq!(tier.arguments["x-dead-letter-strategy"], "at-least-once");
    assert_eq!(tier.queue_type, "quorum");
    let defer = api
        .queue(&t.ladder.tier_queue(t.ladder.deferral_at(0).unwrap()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(defer.arguments["x-message-ttl"], 250);
    assert_eq!(
        defer.arguments["x-dead-letter-exchange"],
        t.ladder.promote_exchange()
    );
    assert_eq!(defer.queue_type, "quorum");
}

#[tokio::test]
async fn plan_names_each_difference() {
    let t = TestLadder::apply("drift", &["1s", "5s"], &["1s", "5s"]).await;
    // Someone deletes a tier and re-creates it by hand with another TTL; someone removes the sink.
    let tier = t.ladder.tier_queue(t.ladder.tier_at(1).unwrap());
    t.channel
        .queue_delete(tier.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(60_000));
    t.channel
        .queue_declare(
            tier.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .unwrap();
    t.channel
        .queue_delete(
            t.ladder.dead().as_str().into(),
            QueueDeleteOptions::default(),
        )
        .await
        .unwrap();

    let objects = management(&t.config).objects().await.unwrap();
    let drift = t.ladder.objects().diff(&objects);
    let shown: Vec<String> = drift.iter().map(ToString::to_string).collect();
    assert!(
        drift.contains(&Drift::Missing(format!("queue {}", t.ladder.dead()))),
        "{shown:#?}"
    );
    assert!(
        shown.contains(&format!(
            "differs: queue {tier}: argument x-message-ttl is 60000 on the broker, the ladder says 5000"
        )),
        "{shown:#?}"
    );
    assert!(
        shown.iter().any(|s| s.contains(&format!(
            "queue {tier}: argument x-dead-letter-exchange is (absent)"
        ))),
        "{shown:#?}"
    );

    // The command line says the same and exits 3.
    let dir = tempfile::tempdir().unwrap();
    let ladder_file = common::ladder_file(&t, &dir);
    let out = Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .args(["topology", "plan", "--ladder"])
        .arg(&ladder_file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(
        stdout.contains(&format!("missing: queue {}", t.ladder.dead())),
        "{stdout}"
    );
    assert!(stdout.contains("x-message-ttl is 60000"), "{stdout}");

    // Applying over the conflicting queue is refused with a pointer to `plan`.
    let err = t.ladder.objects().apply(&t.channel).await.unwrap_err();
    assert!(err.to_string().contains("topology plan"), "{err}");
}

#[tokio::test]
async fn exported_definitions_import_into_a_vhost() {
    let t = TestLadder::apply_typed("export", QueueType::Classic, &["1s"], &["1s"]).await;
    let api = management(&t.config);
    let vhost = common::unique("vhost");
    api.create_vhost(&vhost).await.unwrap();
    let result = async {
        let definitions = t.ladder.objects().export(&vhost);
        let scoped =
            hookrelay::broker::management::Management::new(&t.config.management.url, &vhost)?;
        scoped.import_definitions(&definitions).await?;
        scoped.objects().await
    }
    .await;
    api.delete_vhost(&vhost).await.unwrap();
    let objects = result.unwrap();
    assert_eq!(t.ladder.objects().diff(&objects), vec![]);
}

#[test]
fn export_command_prints_the_shipped_definitions() {
    let out = Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["topology", "export"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/rabbitmq/definitions.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(printed, shipped);
}

/// RabbitMQ 4 gives quorum queues a delivery limit of 20 when none is set; lanes (a failed
/// republish returns the delivery) and the dead sink (a redrive pass returns what it keeps) are
/// requeued on purpose, so the ladder sets a limit of its own on them, by policy: a queue
/// argument added to an existing queue would make the broker refuse the declaration (406).
#[tokio::test]
async fn queues_that_are_requeued_get_an_explicit_delivery_limit_and_plan_checks_it() {
    let t = TestLadder::apply("limit", &["1s"], &["1s"]).await;
    let api = management(&t.config);
    let policy = format!("{}.delivery-limit", t.ladder.prefix);
    // The management API shows what applies to a queue some seconds after a change.
    let limited = async |queue: &str| {
        common::wait_until(std::time::Duration::from_secs(20), async || {
            api.queue(queue).await.unwrap().is_some_and(|q| {
                q.policy.as_deref() == Some(policy.as_str())
                    && q.effective_policy_definition
                        .get("delivery-limit")
                        .and_then(|v| v.as_i64())
                        .is_some_and(|n| n > 1_000_000)
            })
        })
        .await
    };
    for queue in [
        t.ladder.first_lane(),
        t.ladder.retry_lane(),
        t.ladder.dead(),
    ] {
        assert!(
            limited(&queue).await,
            "{queue} has the ladder's delivery limit"
        );
    }

    // Without the policy, plan says so; apply puts it back over the existing queues.
    api.delete_policy(&policy).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ladder_file = common::ladder_file(&t, &dir);
    let hookrelay = |command: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_hookrelay"))
            .args(["topology", command, "--ladder"])
            .arg(&ladder_file)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, _) = hookrelay("plan");
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains(&format!("missing: policy {policy}")), "{out}");
    let (code, out, err) = hookrelay("apply");
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, _) = hookrelay("plan");
    assert_eq!(code, Some(0), "{out}");
    assert!(limited(&t.ladder.first_lane()).await);
}

/// RabbitMQ 3.10 answers `GET /api/queues/<vhost>` with HTTP 500 when a stream is listed in the
/// instant between its declaration and its leader starting (`rabbit_amqqueue_process:format` on
/// a pid of `none`). `status`, `plan` and the worker's depth metrics read that list on brokers
/// where other clients declare and delete streams: a transient 500 must not fail them.
#[tokio::test]
async fn the_queue_list_is_read_while_other_clients_declare_and_delete_queues() {
    let config = common::config();
    let api = management(&config);
    let vhost = common::unique("vhost");
    api.create_vhost(&vhost).await.unwrap();
    let mut uri: lapin::uri::AMQPUri = config.amqp.url.expose().parse().unwrap();
    uri.vhost = vhost.clone();
    let conn = lapin::Connection::connect_uri(uri, Default::default())
        .await
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut churners = Vec::new();
    for c in 0..2 {
        let channel = conn.create_channel().await.unwrap();
        let stop = stop.clone();
        churners.push(tokio::spawn(async move {
            let mut cycles = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let name = format!("stream-{c}-{}", cycles % 4);
                let mut stream = FieldTable::default();
                stream.insert(
                    "x-queue-type".into(),
                    AMQPValue::LongString("stream".into()),
                );
                channel
                    .queue_declare(
                        name.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        stream,
                    )
                    .await
                    .unwrap();
                channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await
                    .unwrap();
                cycles += 1;
                // Busier than any real neighbour: ten streams a second from each of two clients.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            cycles
        }));
    }
    let scoped =
        hookrelay::broker::management::Management::new(&config.management.url, &vhost).unwrap();
    let mut failures = Vec::new();
    let mut listings = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < until {
        if let Err(e) = scoped.queues().await {
            failures.push(e.to_string());
        }
        listings += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut cycles = 0;
    for churner in churners {
        cycles += churner.await.unwrap();
    }
    let _ = conn.close(0, "done".into()).await;
    api.delete_vhost(&vhost).await.unwrap();
    assert!(cycles > 0, "the other clients declared and deleted queues");
    assert!(
        failures.is_empty(),
        "{} of {listings} listings failed while {cycles} queues came and went, the first: {}",
        failures.len(),
        failures.first().map_or("", String::as_str)
    );
}
