//! The worker process is killed mid-load and started again.

use crate::common;
use crate::harness::{N, account, publish_load, setup, wait_delivered};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_load_loses_nothing() {
    // The worker is a process of its own, killed with SIGKILL; the shared broker is untouched.
    let (t, s, receiver, cancelled) = setup(common::config(), "kill").await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&t, &dir);
    let subs = dir.path().join("subs.toml");
    let reference = match &s.reference {
        hookrelay::delivery::subscriptions::SecretRef::File(p) => p.display().to_string(),
        other => panic!("{other:?}"),
    };
    std::fs::write(
        &subs,
        format!(
            "[[subscription]]\nid = \"sub_on\"\ntenant = \"acme\"\nurl = \"{}\"\nsecrets = [\"file:{reference}\"]\n\n\
             [[subscription]]\nid = \"sub_off\"\ntenant = \"acme\"\nurl = \"{}\"\nenabled = false\nsecrets = [\"file:{reference}\"]\n",
            receiver.url("/"),
            receiver.url("/off")
        ),
    )
    .unwrap();
    const IN_FLIGHT: &str = "200";
    let spawn = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
            .args(["worker", "--name", &format!("{} worker", t.ladder.prefix)])
            .env("HOOKRELAY_LADDER", &ladder)
            .env("HOOKRELAY_SUBSCRIPTIONS", &subs)
            .env("HOOKRELAY_EGRESS_ALLOW", "127.0.0.0/8")
            .env("HOOKRELAY_METRICS_LISTEN", "")
            .env("HOOKRELAY_WORKER_IN_FLIGHT", IN_FLIGHT)
            .env("HOOKRELAY_LOG_LEVEL", "error")
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    let load = tokio::spawn(publish_load(
        t.config.clone(),
        t.ladder.ingress(),
        "kill",
        N,
    ));
    wait_delivered(&receiver, N / 3).await;
    first.start_kill().unwrap();
    let _ = first.wait().await;
    let mut second = spawn();
    let published = load.await.unwrap();
    let a = account(&t, &receiver, &published, &cancelled).await;
    second.start_kill().unwrap();
    let _ = second.wait().await;
    // Only what the killed worker had in flight (its prefetch) can be delivered twice, and the
    // endpoint saw each duplicate with its envelope's own webhook-id.
    a.check("worker kill -9 and restart", IN_FLIGHT.parse().unwrap());
    for r in receiver.records() {
        assert_eq!(r.id, r.idempotency_key);
    }
}
