//! Subscriptions that change while envelopes wait in the tiers, fan-out, 410 Gone and secret
//! rotation, on the real broker with a subscriptions file the worker keeps reading.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{
    Counters, RunningWorker, SubsFile, TestLadder, secret, subscription_toml, wait_until,
};
use hookrelay::contract::envelope::{NewEvent, derived_id};
use hookrelay::contract::headers;
use hookrelay::delivery::worker::WorkerSetup;
use hookrelay::subscriptions::LiveSubscriptions;
use hookrelay_tools::receiver::{Receiver, Reply};
use lapin::options::BasicGetOptions;

const WAIT: Duration = Duration::from_secs(20);

/// One `[[subscription]]` table of tenant `acme`.
fn entry(id: &str, url: &str, secrets: &str, extra: &str) -> String {
    subscription_toml(id, "acme", url, secrets, extra)
}

async fn start(t: &TestLadder, file: &SubsFile) -> RunningWorker {
    RunningWorker::start_from_file(t, file).await
}

/// A queue bound to every operational event of the ladder.
async fn events_queue(t: &TestLadder) -> String {
    t.keep_all(t.ladder.events_exchange().as_str()).await
}

/// Up to `n` operational events, as many as arrive within `WAIT`.
async fn take_events(t: &TestLadder, queue: &str, n: usize) -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    wait_until(WAIT, async || {
        while out.len() < n
            && let Some(m) = t
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap()
        {
            out.push((
                m.delivery.routing_key.to_string(),
                serde_json::from_slice(&m.delivery.data).unwrap(),
            ));
        }
        out.len() >= n
    })
    .await;
    out
}

/// Waits until the worker has looked at a changed subscriptions file with `result` (`applied`,
/// `refused`).
async fn wait_reload(w: &RunningWorker, result: &str) -> bool {
    wait_until(WAIT, async || {
        w.metrics.count(
            "hookrelay_subscription_reloads_total",
            &[("result", result)],
        ) >= 1
    })
    .await
}

#[tokio::test]
async fn changes_under_a_backlog_apply_at_the_next_attempt() {
    let t = TestLadder::apply("changes", &["1s"], &["1s", "1s"]).await;
    let s = secret();
    let first = common::failing_first_attempts(&s).await;
    let second = common::ok_receiver(&s).await;
    let a = first.url("/");
    let secrets = s.file_ref();
    let file = SubsFile::new(
        &[
            entry("sub_del", &a, &secrets, ""),
            entry("sub_dis", &a, &secrets, ""),
            entry("sub_move", &a, &secrets, ""),
            entry("sub_filter", &a, &secrets, "event_types = [\"order.*\"]"),
        ]
        .concat(),
    );
    let events = events_queue(&t).await;
    let worker = start(&t, &file).await;
    for sub in ["sub_del", "sub_dis", "sub_move", "sub_filter"] {
        let e = common::event(&format!("evt_{sub}"), "acme", sub);
        t.publish(&e).await;
    }
    // Every first attempt fails; the four envelopes now wait in the 1 s tier.
    assert!(first.wait_until(WAIT, |r| r.request_count() == 4).await);
    file.write(
        &[
            entry("sub_dis", &a, &secrets, "enabled = false"),
            entry("sub_move", &second.url("/moved"), &secrets, ""),
            entry("sub_filter", &a, &secrets, "event_types = [\"invoice.*\"]"),
        ]
        .concat(),
    );
    assert!(wait_reload(&worker, "applied").await);

    // The repointed one reaches the new URL on its second attempt, with the same id.
    assert!(second.wait_until(WAIT, |r| r.delivered_count() == 1).await);
    let moved = &second.records()[0];
    assert_eq!(
        (moved.id.as_str(), moved.attempt, moved.path.as_str()),
        ("evt_sub_move", 2, "/moved")
    );
    // The other three end as cancelled with their reasons, announced, never dead-lettered.
    let announced = take_events(&t, &events, 3).await;
    let metrics = worker.metrics.clone();
    worker.stop().await;
    let mut reasons: BTreeMap<String, String> = BTreeMap::new();
    for (key, body) in &announced {
        assert_eq!(key, "delivery.cancelled");
        assert_eq!(body["tenant"], "acme");
        assert!(body["at"].as_str().is_some());
        reasons.insert(
            body["envelope"].as_str().unwrap().to_owned(),
            body["reason"].as_str().unwrap().to_owned(),
        );
    }
    assert_eq!(
        reasons,
        BTreeMap::from([
            ("evt_sub_del".to_owned(), "deleted".to_owned()),
            ("evt_sub_dis".to_owned(), "disabled".to_owned()),
            ("evt_sub_filter".to_owned(), "filtered".to_owned()),
        ])
    );
    for reason in ["deleted", "disabled", "filtered"] {
        assert_eq!(
            metrics.count("hookrelay_cancellations_total", &[("reason", reason)]),
            1
        );
    }
    assert_eq!(first.request_count(), 4, "nothing more went to the old URL");
    assert_eq!(t.depth(&t.ladder.dead()).await, 0);
}

#[tokio::test]
async fn a_refused_file_keeps_the_last_good_version_and_sighup_reloads_at_once() {
    let t = TestLadder::apply("reload", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let secrets = s.file_ref();
    let good = entry("sub_a", &receiver.url("/one"), &secrets, "");
    let file = SubsFile::new(&good);
    let events = events_queue(&t).await;
    // Polling only once an hour: what happens below is SIGHUP's doing.
    let mut config = t.config.clone();
    config.reload.interval = Duration::from_secs(3600);
    let live = LiveSubscriptions::from_file(&file.path).unwrap();
    let worker =
        RunningWorker::start_setup(&t, WorkerSetup::new(config, t.ladder.clone(), live)).await;
    let hup = || {
        let ok = std::process::Command::new("kill")
            .args(["-HUP", &std::process::id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    };

    file.write("[[subscription]]\nid = \"sub_a\"\nurl = 5\n");
    hup();
    assert!(wait_reload(&worker, "refused").await);
    let announced = take_events(&t, &events, 1).await;
    assert_eq!(announced[0].0, "subscriptions.reload_failed");
    assert!(
        announced[0].1["detail"].as_str().unwrap().contains("url"),
        "{}",
        announced[0].1
    );

    // The last good version is still in force.
    t.publish(&common::event("evt_1", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );

    // A valid change goes into force on SIGHUP.
    file.write(&entry("sub_a", &receiver.url("/two"), &secrets, ""));
    hup();
    assert!(wait_reload(&worker, "applied").await);
    t.publish(&common::event("evt_2", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    worker.stop().await;
    let paths: Vec<_> = receiver.records().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/one", "/two"]);
}

#[tokio::test]
async fn gone_stops_retries_and_is_announced() {
    let t = TestLadder::apply("gone", &["300ms"], &["300ms", "300ms"]).await;
    let s = secret();
    let receiver = Receiver::start(std::slice::from_ref(&s.whsec), |_| Reply::Status(410))
        .await
        .unwrap();
    let file = SubsFile::new(&entry("sub_a", &receiver.url("/"), &s.file_ref(), ""));
    let events = events_queue(&t).await;
    let worker = start(&t, &file).await;
    t.publish(&common::event("evt_gone", "acme", "sub_a")).await;
    assert!(t.wait_dead(1, WAIT).await);
    let announced = take_events(&t, &events, 1).await;
    worker.stop().await;
    assert_eq!(receiver.request_count(), 1, "no retry after 410");
    let dead = t.drain_dead().await;
    let p = &dead[0].delivery.properties;
    assert_eq!(
        headers::read_str_header(p, headers::REASON_HEADER).as_deref(),
        Some("gone")
    );
    assert_eq!(announced[0].0, "subscription.gone");
    assert_eq!(announced[0].1["subscription"], "sub_a");
    assert_eq!(announced[0].1["envelope"], "evt_gone");
}

#[tokio::test]
async fn an_event_without_subscription_fans_out_with_derived_ids() {
    let t = TestLadder::apply("fanout", &["1s"], &["1s"]).await;
    let s = secret();
    let receiver = common::ok_receiver(&s).await;
    let secrets = s.file_ref();
    let text = [
        entry(
            "sub_a",
            &receiver.url("/a"),
            &secrets,
            "event_types = [\"order.*\"]",
        ),
        entry("sub_b", &receiver.url("/b"), &secrets, ""),
        entry(
            "sub_c",
            &receiver.url("/c"),
            &secrets,
            "event_types = [\"invoice.*\"]",
        ),
        entry("sub_d", &receiver.url("/d"), &secrets, "enabled = false"),
        subscription_toml("sub_other", "globex", &receiver.url("/x"), &secrets, ""),
    ]
    .concat();
    let file = SubsFile::new(&text);
    let events = events_queue(&t).await;
    let worker = start(&t, &file).await;
    let event = NewEvent {
        subscription: None,
        ..common::event("evt_fan", "acme", "unused")
    };
    t.publish(&event).await;
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 2)
            .await
    );
    // The same event again, as a redelivery would bring it: the same two ids, nothing new.
    t.publish(&event).await;
    assert!(receiver.wait_until(WAIT, |r| r.request_count() == 4).await);
    // An event no subscription receives is cancelled as filtered.
    let lonely = NewEvent {
        subscription: None,
        event_type: "shipment.sent".into(),
        ..common::event("evt_lonely", "initech", "unused")
    };
    t.publish(&lonely).await;
    let announced = take_events(&t, &events, 1).await;
    // A deliberate pause: anything more the endpoint would wrongly get has time to arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.stop().await;

    let mut by_path: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in receiver.records() {
        assert_eq!(r.id, r.idempotency_key);
        assert_eq!(r.verified_with, vec![true]);
        by_path.entry(r.path).or_default().insert(r.id);
    }
    assert_eq!(
        by_path,
        BTreeMap::from([
            (
                "/a".to_owned(),
                BTreeSet::from([derived_id("evt_fan", "sub_a").to_string()])
            ),
            (
                "/b".to_owned(),
                BTreeSet::from([derived_id("evt_fan", "sub_b").to_string()])
            ),
        ])
    );
    assert_eq!(receiver.request_count(), 4);
    assert_eq!(announced[0].0, "delivery.cancelled");
    assert_eq!(announced[0].1["envelope"], "evt_lonely");
    assert_eq!(announced[0].1["reason"], "filtered");
}

#[tokio::test]
async fn rotating_secrets_while_an_envelope_waits_signs_with_old_and_new() {
    let t = TestLadder::apply("rotate", &["1s"], &["1s", "1s"]).await;
    let old = secret();
    let new = secret();
    // The endpoint verifies with both secrets independently: verified_with = [old, new].
    let receiver = Receiver::start(&[old.whsec.clone(), new.whsec.clone()], |req| {
        match req.attempt {
            1 | 2 => Reply::Status(503),
            _ => Reply::Status(200),
        }
    })
    .await
    .unwrap();
    let url = receiver.url("/");
    let file = SubsFile::new(&entry("sub_a", &url, &old.file_ref(), ""));
    let worker = start(&t, &file).await;
    t.publish(&common::event("evt_rot", "acme", "sub_a")).await;
    assert!(receiver.wait_until(WAIT, |r| r.request_count() == 1).await);
    // While it waits in the tier: the new secret first, the old one still valid.
    file.write(&entry(
        "sub_a",
        &url,
        &format!("{}, {}", new.file_ref(), old.file_ref()),
        "",
    ));
    assert!(receiver.wait_until(WAIT, |r| r.request_count() == 2).await);
    // Then the old one expires.
    file.write(&entry(
        "sub_a",
        &url,
        &format!(
            "{}, {{ ref = {}, expires = \"2001-01-01T00:00:00Z\" }}",
            new.file_ref(),
            old.file_ref()
        ),
        "",
    ));
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 1)
            .await
    );
    worker.stop().await;
    let seen: Vec<(u32, Vec<bool>)> = receiver
        .records()
        .iter()
        .map(|r| (r.attempt, r.verified_with.clone()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (1, vec![true, false]),
            (2, vec![true, true]),
            (3, vec![false, true])
        ]
    );
}

#[test]
fn subscriptions_check_explains_each_problem() {
    let good = SubsFile::new(&entry(
        "sub_a",
        "https://a.example/",
        "\"env:HOOKRELAY_TEST_UNSET\"",
        "",
    ));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .args(["subscriptions", "check"])
        .arg(&good.path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("1 subscription(s), valid"), "{stdout}");
    assert!(
        stdout.contains("note: subscription sub_a: secret env:HOOKRELAY_TEST_UNSET"),
        "{stdout}"
    );

    let bad = SubsFile::new(&entry("a.b", "gopher://x", "\"whsec_abc\"", ""));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .args(["subscriptions", "check"])
        .arg(&bad.path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let path = bad.path.display().to_string();
    assert!(
        stdout.contains(&format!("{path}:2: id: \"a.b\": expected 1 to 128 letters")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{path}:4: url: \"gopher://x\": expected an http://, https://, amqp:// or amqps:// URL"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{path}:5: secrets: secrets are references, never the secret itself"
        )),
        "{stdout}"
    );
    assert!(stdout.contains("3 problem(s)"), "{stdout}");
}
