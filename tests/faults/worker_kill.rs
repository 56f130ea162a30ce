//! The worker process is killed mid-load and started again.

use crate::common;
use crate::harness::{N, Records, Scenario};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_load_loses_nothing() {
    // The worker is a process of its own, killed with SIGKILL; the shared broker is untouched.
    let sc = Scenario::setup(common::config(), "kill").await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = common::ladder_file(&sc.t, &dir);
    let subs = sc.subscriptions_file();
    const IN_FLIGHT: &str = "200";
    let name = format!("{} worker", sc.t.ladder.prefix);
    let spawn = || {
        common::worker_process(&name, &ladder, &subs.path)
            .env("HOOKRELAY_WORKER_IN_FLIGHT", IN_FLIGHT)
            .spawn()
            .unwrap()
    };
    let mut first = spawn();
    let load = sc.start_load();
    sc.wait_delivered(N / 3).await;
    first.start_kill().unwrap();
    let _ = first.wait().await;
    let mut second = spawn();
    let published = load.await.unwrap();
    let a = sc.account(&sc.t, &published).await;
    Records::wait(&sc.t, &sc.receiver).await;
    // The second worker stops as it is told to (SIGTERM), so the records it holds leave: only
    // the first one's kill is under test.
    let pid = second.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let _ = second.wait().await;
    // Only what the killed worker had in flight (its prefetch) can be delivered twice, and the
    // endpoint saw each duplicate with its envelope's own webhook-id.
    a.check("worker kill -9 and restart", IN_FLIGHT.parse().unwrap());
    for r in sc.receiver.records() {
        assert_eq!(r.id, r.idempotency_key);
    }
    // A delivery is acked only once its record is stored: the killed worker's unrecorded
    // deliveries were still unacked, and the second worker delivered and recorded them.
    Records::read(&sc.t)
        .await
        .check("worker kill -9 and restart", &sc.receiver);
}
