//! What hookrelay makes of the broker's release (`broker::compat`): `topology plan` and
//! `status` name the broker and its metadata store, and warn about what RabbitMQ 4 changed
//! where it matters. `make test` runs this file on RabbitMQ 4 (`rabbitmq/v4`): per-queue
//! consumer timeouts, which one test sets, exist from 3.12.

mod common;

use std::time::Duration;

use common::{RunningWorker, TestLadder, hookrelay, ladder_file, management, ok_receiver, secret};
use hookrelay::broker::management::Policy;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn plan_and_status_name_the_broker_and_its_metadata_store() {
    let t = TestLadder::apply("brokerline", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let version = management(&t.config).broker_version().await.unwrap();
    let (code, out, err) = hookrelay(&["topology", "plan", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    let line = format!("Broker: RabbitMQ {version}, metadata in ");
    assert!(out.starts_with(&line), "{out}");
    assert!(
        out.contains("metadata in Mnesia.") || out.contains("metadata in Khepri."),
        "{out}"
    );
    assert!(!out.contains("Warning"), "{out}");
    let (code, out, err) = hookrelay(&["status", "--ladder", ladder], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(&format!("(RabbitMQ {version}, metadata in")),
        "{out}"
    );
}

/// RabbitMQ reports the consumer timeout it applies to each consumer (from 3.12); one shorter
/// than a delivery's lease would close a worker's channel mid-attempt. Here a policy on the
/// test's own lanes sets 5 s, below the lease of `status`'s (default) configuration.
#[tokio::test]
async fn a_consumer_timeout_shorter_than_the_lease_is_a_warning() {
    let t = TestLadder::apply("shortlease", &["1s"], &["1s"]).await;
    let api = management(&t.config);
    let policy = format!("{}.short-lease", t.ladder.prefix);
    api.put_policy(
        &policy,
        &Policy {
            pattern: format!("^{}\\.ready\\.", t.ladder.prefix.replace('.', "\\.")),
            apply_to: "queues".into(),
            // Above the ladder's own, which it replaces on the lanes for this test.
            priority: 100,
            definition: [("consumer-timeout".to_owned(), serde_json::json!(5000))]
                .into_iter()
                .collect(),
        },
    )
    .await
    .unwrap();
    let s = secret();
    let receiver = ok_receiver(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let ladder = ladder.to_str().unwrap();
    let mut out = String::new();
    let warned = common::wait_until(WAIT, async || {
        (_, out, _) = hookrelay(&["status", "--ladder", ladder], &[]);
        out.contains("consumer_timeout for hookrelay's consumers is 5s")
    })
    .await;
    worker.stop().await;
    api.delete_policy(&policy).await.unwrap();
    assert!(warned, "{out}");
    assert!(out.contains("Warning: "), "{out}");
}
