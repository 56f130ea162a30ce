//! Payload filters end to end: written through the API (a bad one refused naming where it is
//! wrong), read by a worker from PostgreSQL, evaluated at fan-out against the real broker: an
//! event a filter excludes is not sent, and the attempt log says so for that subscription.

mod common;

use std::time::Duration;

use hookrelay_tools::receiver::{Receiver, Reply};
use serde_json::{Value, json};

use common::TestLadder;
use common::site::{ACME, Site};

const WAIT: Duration = Duration::from_secs(20);

async fn send(site: &Site, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let answer = site
        .client
        .request(method, format!("{}{path}", site.base))
        .bearer_auth(ACME)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or_default())
}

#[tokio::test]
async fn a_filter_is_checked_when_written_and_shown_as_written() {
    let site = Site::start(None).await;
    let post = reqwest::Method::POST;
    let bad = json!({"url": "https://hooks.acme.example/in",
        "filter": {"$and": [{"data.amount": {"$gt": 100}}, {"data.country": {"$regex": "^D"}}]}});
    let (status, problem) = send(&site, post.clone(), "/v1/subscriptions", bad).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "filter", "{problem}");
    let message = problem["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.starts_with("at $and[1].data.country.$regex: unknown operator"),
        "{message}"
    );
    let mut deep = json!({"a": 1});
    for _ in 0..10 {
        deep = json!({ "$not": deep });
    }
    let (status, problem) = send(
        &site,
        post.clone(),
        "/v1/subscriptions",
        json!({"url": "https://hooks.acme.example/in", "filter": deep}),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert!(problem.to_string().contains("nested deeper"), "{problem}");

    let filter = json!({"data.amount": {"$gte": 100}, "data.country": {"$in": ["DE", "FR"]}});
    let (status, created) = send(
        &site,
        post,
        "/v1/subscriptions",
        json!({"url": "https://hooks.acme.example/in", "filter": filter}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["subscription"]["filter"], filter);
    let id = created["subscription"]["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/subscriptions/{id}");
    let (status, read) = send(&site, reqwest::Method::GET, &path, Value::Null).await;
    assert_eq!(status, 200);
    assert_eq!(read["filter"], filter);
    // A change that breaks it is refused and changes nothing; null removes it.
    let (status, _) = send(
        &site,
        reqwest::Method::PATCH,
        &path,
        json!({"filter": {"data.amount": {"$gt": [1]}}}),
    )
    .await;
    assert_eq!(status, 422);
    let (_, read) = send(&site, reqwest::Method::GET, &path, Value::Null).await;
    assert_eq!(read["filter"], filter);
    let (status, changed) = send(
        &site,
        reqwest::Method::PATCH,
        &path,
        json!({"filter": null}),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed.get("filter"), None, "{changed}");
    site.stop().await;
}

#[tokio::test]
async fn a_fan_out_sends_what_each_filter_lets_through_and_records_what_it_left_out() {
    let t = TestLadder::apply("filters-fan-out", &["300ms"], &["300ms"]).await;
    let site = Site::start_with(
        None,
        Default::default(),
        common::egress::allowing(&["127.0.0.0/8"]),
    )
    .await;
    let receiver = Receiver::start(&[], |_| Reply::Status(204)).await.unwrap();
    let post = reqwest::Method::POST;
    let (status, every) = send(
        &site,
        post.clone(),
        "/v1/subscriptions",
        json!({"url": receiver.url("/every")}),
    )
    .await;
    assert_eq!(status, 201, "{every}");
    let (status, big) = send(
        &site,
        post,
        "/v1/subscriptions",
        json!({"url": receiver.url("/big"),
               "filter": {"$or": [{"amount": {"$gt": 100}}, {"vip": true}]}}),
    )
    .await;
    assert_eq!(status, 201, "{big}");
    let big = big["subscription"]["id"].as_str().unwrap().to_owned();

    let worker = site.worker(&t).await;
    // Two fan-outs and two deliveries; one cancelled for `big`.
    let tail = t.tail_attempts("acme", 5).await;
    for (id, body) in [
        ("evt_small", r#"{"amount": 50}"#),
        ("evt_large", r#"{"amount": 150}"#),
        ("evt_vip", r#"{"amount": 1, "vip": true}"#),
    ] {
        let mut event = common::event(id, "acme", "");
        event.subscription = None;
        event.body = body.as_bytes().to_vec();
        t.publish(&event).await;
    }
    // every: 3; big: evt_large and evt_vip.
    assert!(
        receiver
            .wait_until(WAIT, |r| r.delivered_count() == 5)
            .await,
        "{:?}",
        receiver.delivered()
    );
    let paths: Vec<(String, String)> = receiver
        .records()
        .into_iter()
        .map(|r| {
            (
                r.path.clone(),
                String::from_utf8_lossy(&r.body).into_owned(),
            )
        })
        .collect();
    let to_big: Vec<&String> = paths
        .iter()
        .filter(|(p, _)| p == "/big")
        .map(|(_, b)| b)
        .collect();
    assert_eq!(to_big.len(), 2, "{paths:?}");
    assert!(
        to_big.iter().all(|b| *b != r#"{"amount": 50}"#),
        "{paths:?}"
    );
    let records = tokio::time::timeout(WAIT, tail).await.unwrap().unwrap();
    let left_out: Vec<&hookrelay::observe::events::AttemptRecord> = records
        .iter()
        .filter(|r| r.outcome == "cancelled")
        .collect();
    assert_eq!(left_out.len(), 1, "{records:#?}");
    assert_eq!(left_out[0].event.as_deref(), Some("evt_small"));
    assert_eq!(left_out[0].subscription.as_deref(), Some(big.as_str()));
    assert!(
        left_out[0]
            .error
            .as_deref()
            .is_some_and(|e| e.contains("payload filter")),
        "{records:#?}"
    );
    let cancelled = worker
        .metrics
        .cancellations
        .with_label_values(&["filtered"])
        .get();
    assert_eq!(cancelled, 1);
    worker.stop().await;
    site.stop().await;
}
