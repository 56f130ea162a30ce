//! The broker's refusals, provoked on the real broker, as hookrelay classifies them: by reply
//! code, whatever the reply text says.

mod common;

use hookrelay::broker::error::{Refusal, refused};
use hookrelay::contract::ladder::{Ladder, QueueType};
use hookrelay::delivery::worker::{Worker, WorkerSetup};
use hookrelay::subscriptions::{LiveSubscriptions, Subscriptions};
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};

fn ttl(ms: i64) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms));
    args
}

/// Declares `name` exclusive on a channel of its own: the broker removes it with `conn`, also
/// when the test panics.
async fn declare(conn: &lapin::Connection, name: &str, args: FieldTable) -> lapin::Result<()> {
    let ch = conn.create_channel().await?;
    let exclusive = QueueDeclareOptions {
        exclusive: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare(name.into(), exclusive, args).await?;
    Ok(())
}

#[tokio::test]
async fn each_refusal_is_told_by_its_code() {
    let config = common::config();
    let owner = common::connect(&config).await;
    let other = common::connect(&config).await;
    let queue = common::unique("refusal");
    declare(&owner, &queue, ttl(1000)).await.unwrap();

    let other_arguments = declare(&owner, &queue, ttl(2000)).await.unwrap_err();
    assert_eq!(
        refused(&other_arguments),
        Some(Refusal::PreconditionFailed),
        "{other_arguments}"
    );
    let someone_elses = declare(&other, &queue, ttl(1000)).await.unwrap_err();
    assert_eq!(
        refused(&someone_elses),
        Some(Refusal::ResourceLocked),
        "{someone_elses}"
    );
    let reserved = declare(&owner, &format!("amq.{queue}"), FieldTable::default())
        .await
        .unwrap_err();
    assert_eq!(
        refused(&reserved),
        Some(Refusal::AccessRefused),
        "{reserved}"
    );
    let ch = owner.create_channel().await.unwrap();
    let missing = ch
        .basic_consume(
            format!("{queue}.missing").as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(refused(&missing), Some(Refusal::NotFound), "{missing}");

    let ch = owner.create_channel().await.unwrap();
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let _ = other.close(200, "done".into()).await;
    let _ = owner.close(200, "done".into()).await;
}

#[tokio::test]
async fn a_worker_on_a_ladder_nobody_applied_says_to_apply_it() {
    // Nothing is declared under this prefix, so there is nothing to remove.
    let ladder = Ladder::build(
        &common::unique("unapplied"),
        QueueType::Quorum,
        &["1s"],
        &["1s"],
    )
    .unwrap();
    let err = worker_error(common::config(), ladder, "unapplied worker").await;
    assert!(
        err.contains("the topology is missing: run `hookrelay topology apply`"),
        "{err}"
    );
}

#[tokio::test]
async fn a_worker_on_a_ladder_whose_tier_has_no_exchange_of_its_own_says_to_apply_it() {
    // As a ladder applied by an earlier version: the tier, bound to the delay exchange, but not
    // the exchange of its own the worker publishes retries into.
    let t = common::TestLadder::apply("oldladder", &["1s"], &["1s"]).await;
    let tier = t.ladder.tier_at(0).unwrap();
    let exchange = t.ladder.tier_exchange(tier);
    t.channel
        .exchange_delete(exchange.as_str().into(), Default::default())
        .await
        .unwrap();
    let err = worker_error(t.config.clone(), t.ladder.clone(), "oldladder worker").await;
    assert!(
        err.contains(&format!("exchange {exchange} does not exist")),
        "{err}"
    );
    assert!(err.contains("run `hookrelay topology apply`"), "{err}");
    // Applying again declares it: nothing is left missing.
    t.ladder.objects().apply(&t.channel).await.unwrap();
    let api = common::management(&t.config);
    let objects = api.objects().await.unwrap();
    assert_eq!(t.ladder.objects().diff(&objects), vec![]);
}

/// Why a worker on `ladder`, with no subscriptions, stops: its session's error.
async fn worker_error(config: hookrelay::config::Config, ladder: Ladder, name: &str) -> String {
    let subscriptions = LiveSubscriptions::fixed(Subscriptions::from_list(vec![]));
    let mut setup = WorkerSetup::new(config, ladder, subscriptions);
    setup.name = common::unique(name);
    let worker = Worker::start(setup).await.unwrap();
    worker
        .run(std::future::pending::<()>())
        .await
        .unwrap_err()
        .to_string()
}
