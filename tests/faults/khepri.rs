//! RabbitMQ 4 with Khepri as its metadata store (`rabbitmqctl enable_feature_flag --opt-in khepri_db`):
//! the command line applies and plans the ladder, holds and releases a tier, and a node restart
//! under load loses nothing, with the ladder intact after it. Run on a RabbitMQ 4 install
//! (`TEST_RABBITMQ_ROOT`, see `rabbitmq/v4`); 3.x has no Khepri.

use std::time::Duration;

use crate::common::node::Node;
use crate::common::{self, hookrelay, kit};
use crate::harness::{N, Scenario, rabbitmq_4};
use hookrelay_tools::node::Install;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_khepri_the_ladder_applies_plans_holds_releases_and_survives_a_node_restart() {
    rabbitmq_4(&Install::from_env(), "the Khepri scenario");
    let node = Node::start("khepri");
    // 4.0 asks for an explicit opt-in: Khepri was not yet the default there.
    node.ctl_ok(&["enable_feature_flag", "--opt-in", "khepri_db"]);
    let config = node.config();
    let api = common::management(&config);
    assert_eq!(
        api.feature_flag("khepri_db").await.unwrap().as_deref(),
        Some("enabled"),
        "the node keeps its metadata in Khepri"
    );

    let ladder = Scenario::ladder("khepri");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ladder.toml");
    std::fs::write(&file, kit::ladder_toml(&ladder)).unwrap();
    let file = file.to_str().unwrap();
    let amqp = node.amqp_url();
    let mgmt = node.mgmt_url();
    let env = [
        ("HOOKRELAY_AMQP_URL", amqp.as_str()),
        ("HOOKRELAY_MANAGEMENT_URL", mgmt.as_str()),
    ];
    let cli = |args: &[&str]| hookrelay(args, &env);
    let plan = || {
        let (code, out, err) = cli(&["topology", "plan", "--ladder", file]);
        assert_eq!(code, Some(0), "no drift on Khepri: {out}{err}");
        assert!(out.contains("No drift"), "{out}");
    };

    let (code, out, err) = cli(&["topology", "apply", "--ladder", file]);
    assert_eq!(code, Some(0), "{out}{err}");
    plan();
    let (code, out, err) = cli(&["tier", "hold", "retry-1s", "--ladder", file]);
    assert_eq!(code, Some(0), "{out}{err}");
    let held = || {
        let (_, out, _) = cli(&["tier", "status", "--json", "--ladder", file]);
        let states: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        states
            .iter()
            .any(|s| s["tier"] == "retry-1s" && s["held"] == true)
    };
    assert!(held(), "held on Khepri");
    let (code, out, err) = cli(&["tier", "release", "retry-1s", "--ladder", file]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!held(), "released on Khepri");

    // Under load, with retries going through the tiers, the node restarts.
    let sc = Scenario::setup_ladder(config.clone(), "khepri", ladder).await;
    let worker = sc.start_worker().await;
    let load = sc.start_load();
    sc.wait_delivered(N / 4).await;
    node.stop();
    tokio::time::sleep(Duration::from_secs(1)).await;
    node.boot();
    plan();
    let published = load.await.unwrap();
    let view = sc.view(node.config()).await;
    let a = sc.account(&view, &published).await;
    worker.stop().await;
    a.check(
        "Khepri: apply, plan, hold, release, node stop/start",
        sc.duplicate_bound(1),
    );
    assert_eq!(
        api.feature_flag("khepri_db").await.unwrap().as_deref(),
        Some("enabled"),
        "still on Khepri after the restart"
    );
}
