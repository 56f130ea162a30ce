//! `hookrelay publish` and the library's `Publisher`: validation before anything is durable,
//! confirmed publishing, and loud failures.

mod common;

use std::process::{Command, Output};

use common::{TestLadder, event, ladder_file};
use hookrelay::broker::publish::PublishError;
use hookrelay::contract::headers::SUBSCRIPTION_HEADER;
use lapin::options::BasicGetOptions;

/// Runs `hookrelay publish` with `args`, adding tenant, type and subscription where `args` has none.
fn publish(ladder: &std::path::Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookrelay"));
    cmd.arg("publish").arg("--ladder").arg(ladder).args(args);
    for (flag, value) in [
        ("--tenant", "acme"),
        ("--type", "order.paid"),
        ("--subscription", "sub_a"),
    ] {
        if !args.contains(&flag) {
            cmd.args([flag, value]);
        }
    }
    cmd.output().unwrap()
}

#[tokio::test]
async fn the_cli_refuses_bad_input_and_publishes_nothing() {
    let t = TestLadder::apply("cli-bad", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let big = dir.path().join("big.json");
    std::fs::write(&big, format!("\"{}\"", "a".repeat(300 * 1024))).unwrap();
    for (args, expected) in [
        (
            vec!["--id", "a.b", "--data", "{}"],
            "message_id \"a.b\" is not an envelope id",
        ),
        (vec!["--id", "ok", "--data", "{nope"], "body is not JSON"),
        (
            vec!["--id", "ok", "--file", big.to_str().unwrap()],
            "over the 262144-byte limit",
        ),
        (
            vec!["--id", "ok", "--data", "{}", "--type", "order paid"],
            "type \"order paid\"",
        ),
        (
            vec!["--id", "ok", "--data", "{}", "--tenant", "ac.me"],
            "tenant \"ac.me\"",
        ),
    ] {
        let out = publish(&ladder, &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("not published"), "{stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
    }
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 0);
}

#[tokio::test]
async fn the_cli_publishes_per_the_contract_and_prints_the_id() {
    let t = TestLadder::apply("cli-ok", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let out = publish(&ladder, &["--id", "evt_cli_1", "--data", r#"{"n":1}"#]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "evt_cli_1");
    // Without --id a fresh id is made and printed.
    let body = dir.path().join("body.json");
    std::fs::write(&body, r#"{"n":2}"#).unwrap();
    let out = publish(&ladder, &["--file", body.to_str().unwrap()]);
    assert!(out.status.success());
    let generated = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(generated.starts_with("evt_"), "{generated}");

    let mut seen = Vec::new();
    while let Some(m) = t
        .channel
        .basic_get(
            t.ladder.first_lane().as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let p = &m.delivery.properties;
        assert_eq!(m.delivery.routing_key.as_str(), "acme");
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.paid");
        assert!(p.timestamp().is_some());
        let sub = p
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .get(SUBSCRIPTION_HEADER)
            .cloned();
        assert_eq!(
            sub,
            Some(lapin::types::AMQPValue::LongString("sub_a".into()))
        );
        seen.push((
            p.message_id().as_ref().unwrap().to_string(),
            m.delivery.data.clone(),
        ));
    }
    assert_eq!(
        seen,
        vec![
            ("evt_cli_1".to_owned(), br#"{"n":1}"#.to_vec()),
            (generated, br#"{"n":2}"#.to_vec())
        ]
    );
}

#[test]
fn the_cli_says_how_to_retry_what_the_broker_did_not_take() {
    // A ladder nobody applied: the event is valid, its ingress exchange does not exist.
    let dir = tempfile::tempdir().unwrap();
    let ladder = dir.path().join("ladder.toml");
    std::fs::write(
        &ladder,
        format!(
            "prefix = \"{}\"\ntiers = [\"1s\"]\nschedule = []\n",
            common::unique("unapplied")
        ),
    )
    .unwrap();
    let out = publish(&ladder, &["--id", "evt_again", "--data", "{}"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not published (the broker may take it later: retry with --id evt_again)"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn publishing_without_the_topology_fails_loudly_and_the_publisher_recovers() {
    let t = TestLadder::apply("missing", &["1s"], &["1s"]).await;
    let publisher = t.publisher().await;
    let e = event("evt_nowhere", "acme", "sub_a");
    // An exchange that does not exist: the broker closes the channel; the error says so.
    let err = publisher
        .publish_event("no-such-exchange", &e, 1024)
        .await
        .unwrap_err();
    assert!(matches!(err, PublishError::Broker(_)), "{err}");
    // A routable exchange whose key leads nowhere: returned, not silently dropped.
    let err = publisher
        .publish(
            &t.ladder.delay_exchange(),
            "retry-9h.acme",
            b"{}",
            e.properties(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, PublishError::Unroutable { .. }), "{err}");
    assert!(err.to_string().contains("NO_ROUTE"), "{err}");
    // The same publisher still works afterwards (a fresh channel).
    t.publish(&e).await;
    assert_eq!(t.depth(&t.ladder.first_lane()).await, 1);
    // Invalid input never reaches the broker.
    let mut bad = e.clone();
    bad.id = "has.dot".into();
    assert!(matches!(
        publisher
            .publish_event(&t.ladder.ingress(), &bad, 1024)
            .await,
        Err(PublishError::Invalid(_))
    ));
}

/// A producer that is not ours, following docs/contract.md with the AMQP types pika and
/// amqplib send (string headers as long strings, a timestamp property).
#[tokio::test]
async fn a_foreign_client_following_the_readme_is_delivered() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    use lapin::types::{AMQPValue, FieldTable};

    let t = TestLadder::apply("foreign", &["1s"], &["1s"]).await;
    let s = common::secret();
    let receiver = common::ok_receiver(&s).await;
    let worker = common::RunningWorker::start(
        &t,
        vec![common::subscription(
            "sub_orders",
            "acme",
            &receiver.url("/"),
            &s,
        )],
    )
    .await;
    let ch = t.conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let mut headers = FieldTable::default();
    headers.insert(
        "x-subscription".into(),
        AMQPValue::LongString("sub_orders".into()),
    );
    let confirm = ch
        .basic_publish(
            t.ladder.ingress().as_str().into(),
            "acme".into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            br#"{"order": 1234, "amount": 990}"#,
            lapin::BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id("ord_1234_paid".into())
                .with_type("order.paid".into())
                .with_timestamp(1_764_687_000)
                .with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.is_ack() && confirm.take_message().is_none());
    assert!(
        receiver
            .wait_until(std::time::Duration::from_secs(10), |r| r.delivered_count()
                == 1)
            .await
    );
    worker.stop().await;
    let record = &receiver.records()[0];
    assert_eq!(record.id, "ord_1234_paid");
    assert_eq!(record.verified_with, vec![true]);
    assert_eq!(&record.body[..], br#"{"order": 1234, "amount": 990}"#);
}

#[tokio::test]
async fn a_return_is_attributed_to_the_message_it_belongs_to_under_concurrency() {
    // The broker confirms many publishes at once and sends a return before the confirm without
    // naming the publish: with many in flight on one channel, a return can arrive with another
    // message's confirm. `publish` must still fail exactly the returned messages.
    let t = TestLadder::apply("returns", &["1s"], &["1s"]).await;
    let publisher = std::sync::Arc::new(t.publisher().await);
    let dead = t.ladder.dead();
    let nowhere = |i: usize| format!("{}.no-such-queue.{i}", t.ladder.prefix);
    let results = futures_util::future::join_all((0..2000).map(|i| {
        let publisher = std::sync::Arc::clone(&publisher);
        let key = if i % 3 == 0 { nowhere(i) } else { dead.clone() };
        async move {
            let e = event(&format!("evt_{i}"), "acme", "sub_a");
            (
                i,
                publisher.publish("", &key, &e.body, e.properties()).await,
            )
        }
    }))
    .await;
    assert_only_returned_fail(&results, nowhere);
    let routed = results.iter().filter(|(i, _)| i % 3 != 0).count() as u32;
    assert_eq!(t.depth(&dead).await, routed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_return_is_attributed_to_its_message_when_publishes_race_on_many_threads() {
    // Publishes handed over from several threads at once: while one message is still being
    // written, others on its channel are confirmed, and a return can come attached to the
    // confirm of a message whose publish has not finished handing over.
    let t = TestLadder::apply("returns-threads", &["1s"], &["1s"]).await;
    let publisher = std::sync::Arc::new(t.publisher().await);
    let dead = t.ladder.dead();
    let prefix = t.ladder.prefix.clone();
    let nowhere = move |i: usize| format!("{prefix}.no-such-queue.{i}");
    let tasks: Vec<_> = (0..4000)
        .map(|i| {
            let publisher = std::sync::Arc::clone(&publisher);
            let key = if i % 3 == 0 { nowhere(i) } else { dead.clone() };
            tokio::spawn(async move {
                let e = event(&format!("evt_{i}"), "acme", "sub_a");
                (
                    i,
                    publisher.publish("", &key, &e.body, e.properties()).await,
                )
            })
        })
        .collect();
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.unwrap());
    }
    assert_only_returned_fail(&results, &nowhere);
    let routed = results.iter().filter(|(i, _)| i % 3 != 0).count() as u32;
    assert_eq!(t.depth(&dead).await, routed);
}

#[tokio::test]
async fn sends_started_together_and_finished_out_of_turn_each_get_their_own_return() {
    // 50 unroutable sends on `send`'s one channel, each polled once and left, then finished
    // one by one, the first alone for a while: however that interleaves with the broker's
    // returns and confirms, each is settled, once, with its own return.
    let t = TestLadder::apply("returns-held", &["1s"], &["1s"]).await;
    let publisher = t.publisher().await;
    let dead = t.ladder.dead();
    // Opens `send`'s channel, so the sends below do not wait for it.
    let warm = event("evt_warm", "acme", "sub_a");
    let confirm = publisher
        .send("", &dead, &warm.body, warm.properties(), true)
        .await
        .unwrap();
    confirm.await.unwrap();
    let nowhere = |i: usize| format!("{}.no-such-queue.{i}", t.ladder.prefix);
    let events: Vec<_> = (0..50)
        .map(|i| (nowhere(i), event(&format!("evt_{i}"), "acme", "sub_a")))
        .collect();
    let mut sends: Vec<_> = events
        .iter()
        .map(|(key, e)| Box::pin(publisher.send("", key, &e.body, e.properties(), true)))
        .collect();
    // One step each (a send whose write is done already is done).
    let handed: Vec<_> = tokio::task::unconstrained(async {
        let mut handed = Vec::new();
        for send in &mut sends {
            handed.push(match futures_util::poll!(send.as_mut()) {
                std::task::Poll::Ready(outcome) => Some(outcome.unwrap()),
                std::task::Poll::Pending => None,
            });
        }
        handed
    })
    .await;
    // Whatever was handed over is written, returned and confirmed meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let mut outcomes = Vec::new();
    for (i, (send, handed)) in sends.into_iter().zip(handed).enumerate() {
        let confirm = match handed {
            Some(confirm) => confirm,
            None => send.await.unwrap(),
        };
        outcomes.push(tokio::spawn(confirm));
        if i == 0 {
            // The first alone for a while, before any other finishes.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    }
    let mut results = Vec::new();
    for (i, outcome) in outcomes.into_iter().enumerate() {
        results.push((i, outcome.await.unwrap()));
    }
    for (i, result) in &results {
        assert!(
            matches!(result, Err(PublishError::Unroutable { routing_key, .. }) if *routing_key == nowhere(*i)),
            "{i}: {result:?}"
        );
    }
}

/// Every third message (`i % 3 == 0`) went to a key nothing is bound to: exactly those failed,
/// each as unroutable with its own routing key.
fn assert_only_returned_fail(
    results: &[(usize, Result<(), PublishError>)],
    nowhere: impl Fn(usize) -> String,
) {
    for (i, result) in results {
        if i % 3 == 0 {
            assert!(
                matches!(result, Err(PublishError::Unroutable { routing_key, .. }) if *routing_key == nowhere(*i)),
                "{i}: {result:?}"
            );
        } else {
            assert!(result.is_ok(), "{i}: {result:?}");
        }
    }
}

#[tokio::test]
async fn a_return_is_attributed_to_its_message_among_many_in_flight_on_one_channel() {
    // `send` keeps every message in flight on one channel, so the broker's confirms cover many
    // messages at once and a return arrives beside other messages' confirms.
    let t = TestLadder::apply("returns-pipelined", &["1s"], &["1s"]).await;
    let publisher = t.publisher().await;
    let dead = t.ladder.dead();
    let nowhere = |i: usize| format!("{}.no-such-queue.{i}", t.ladder.prefix);
    let mut confirms = Vec::new();
    for i in 0..3000 {
        let key = if i % 3 == 0 { nowhere(i) } else { dead.clone() };
        let e = event(&format!("evt_{i}"), "acme", "sub_a");
        let confirm = publisher
            .send("", &key, &e.body, e.properties(), true)
            .await
            .unwrap();
        confirms.push(async move { (i, confirm.await) });
    }
    let results = futures_util::future::join_all(confirms).await;
    assert_only_returned_fail(&results, nowhere);
    let routed = results.iter().filter(|(i, _)| i % 3 != 0).count() as u32;
    assert_eq!(t.depth(&dead).await, routed);
}

/// The `traceparent` header of each message on the first lane, in order.
async fn traceparents(t: &TestLadder) -> Vec<Option<String>> {
    t.take_all(&t.ladder.first_lane())
        .await
        .iter()
        .map(|m| {
            hookrelay::contract::headers::read_str_header(&m.delivery.properties, "traceparent")
        })
        .collect()
}

#[tokio::test]
async fn the_cli_carries_a_given_traceparent_and_starts_a_trace_when_traces_are_on() {
    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let t = TestLadder::apply("cli-trace", &["1s"], &["1s"]).await;
    let dir = tempfile::tempdir().unwrap();
    let ladder = ladder_file(&t, &dir);
    let data = ["--data", r#"{"n":1}"#];
    // Traces off: the given traceparent goes as it is, and none is made up.
    let out = publish(&ladder, &[&data[..], &["--traceparent", GIVEN]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(publish(&ladder, &data).status.success());
    assert!(
        !publish(
            &ladder,
            &[&data[..], &["--traceparent", "00-nope"]].concat()
        )
        .status
        .success()
    );
    assert_eq!(traceparents(&t).await, vec![Some(GIVEN.to_owned()), None]);

    // Traces on (a collector that is not there: publishing does not wait for it).
    let traced = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hookrelay"));
        cmd.arg("publish")
            .arg("--ladder")
            .arg(&ladder)
            .args([
                "--tenant",
                "acme",
                "--type",
                "order.paid",
                "--subscription",
                "sub_a",
            ])
            .args(data)
            .args(extra)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    traced(&["--traceparent", GIVEN]);
    traced(&[]);
    let seen = traceparents(&t).await;
    assert_eq!(seen.len(), 2);
    let child: Vec<&str> = seen[0].as_deref().unwrap().split('-').collect();
    // The producer's trace, with the publish span as the parent of what follows.
    assert_eq!(child[1], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_ne!(child[2], "00f067aa0ba902b7");
    let started = seen[1].as_deref().expect("a trace started");
    assert!(
        hookrelay::contract::trace_context::parse_traceparent(started).is_some(),
        "{started}"
    );
}
