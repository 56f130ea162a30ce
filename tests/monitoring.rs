//! The monitoring kit matches the code: every PromQL expression of the Grafana dashboard and of
//! the alert rules names only series a worker or `hookrelay history` exports, with labels they
//! set; the dashboard is ready to provision; promtool accepts the rules and their unit tests; and
//! the counters the dashboard adds (confirmed republishes) count on the real broker.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::{Counters, RunningWorker, TestLadder, event, secret};
use hookrelay::history::HistoryMetrics;
use hookrelay::observe::metrics::{Metrics, metric_names};
use prometheus::core::Collector;
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, LabelModifier, VectorSelector};
use serde_json::Value;

const DASHBOARD: &str = include_str!("../monitoring/grafana/dashboards/hookrelay.json");
const ALERTS: &str = include_str!("../monitoring/alerts.yml");
/// Labels Prometheus gives every series it scrapes, whatever the exporter set.
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// Label names by series name, as a text exposition shows them (so a histogram is its
/// `_bucket`, `_sum` and `_count` series, and `le` is a label of the first alone).
type Exported = BTreeMap<String, BTreeSet<String>>;

/// Gives every labelled metric of a vector one child, so the registry exposes it.
macro_rules! touch {
    ($($vec:expr),+ $(,)?) => {$(
        let n = $vec.desc()[0].variable_labels.len();
        $vec.with_label_values(&vec!["x"; n]);
    )+};
}

/// The series of a text exposition, with their label names.
fn series_of(text: &str) -> Exported {
    let mut out = Exported::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_owned()).or_default();
        if let Some(body) = line[name_end..].strip_prefix('{') {
            // Our values are plain ("x"): each pair is name="value".
            let body = &body[..body.find('}').expect("a closed label set")];
            for pair in body.split(',').filter(|p| !p.is_empty()) {
                labels.insert(pair.split('=').next().unwrap().to_owned());
            }
        }
    }
    out
}

/// What a worker and `hookrelay history` export, read from their registries' text exposition
/// once every labelled metric has a child.
fn exported() -> Exported {
    let m = Metrics::new();
    touch!(
        m.outcomes,
        m.retries,
        m.rejections,
        m.cancellations,
        m.deferrals,
        m.oauth_tokens,
        m.attempt_seconds,
        m.in_flight,
        m.oldest_ready_age,
        m.promotions,
        m.promotion_lag,
        m.queue_ready,
        m.queue_unacked,
        m.queue_consumers,
        m.republish_failures,
        m.republishes,
        m.subscription_reloads,
        m.endpoint_quarantined,
        m.cache_entries,
        m.trace_spans_dropped,
        m.schema_invalid,
        m.subscription_lookups,
        m.subscription_miss_seconds,
    );
    let h = HistoryMetrics::new();
    touch!(h.records, h.skipped, h.batches, h.offset, h.lag, h.delay);
    let history = prometheus::TextEncoder::new()
        .encode_to_string(&h.registry.gather())
        .unwrap();
    let mut all = series_of(&m.render());
    all.extend(series_of(&history));
    // Prometheus's own series for each scrape target (`up{job="hookrelay-history"}`).
    all.insert("up".into(), BTreeSet::new());
    all
}

#[test]
fn the_exposition_holds_every_registered_metric() {
    let series = exported();
    let mut names = metric_names();
    names.extend(HistoryMetrics::new().names());
    for name in names {
        let shown = ["", "_bucket", "_count"]
            .iter()
            .any(|suffix| series.contains_key(&format!("{name}{suffix}")));
        assert!(shown, "{name} is registered but not touched in exported()");
    }
}

/// Where an expression came from, and its text.
struct Query {
    place: String,
    expr: String,
}

/// Every `expr` of the alert rules.
fn alert_queries() -> Vec<Query> {
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(ALERTS).unwrap();
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            out.push(Query {
                place: format!("alerts.yml {}", rule["alert"].as_str().unwrap()),
                expr: rule["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    out
}

/// The panels of a dashboard, those inside rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().unwrap() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// Every target `expr` of the dashboard's panels, with Grafana's interval variables replaced
/// by a duration (label variables sit inside matcher strings and parse as they are).
fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in panels(dashboard) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            let expr = ["$__rate_interval", "$__interval", "$__range"]
                .iter()
                .fold(expr.to_owned(), |e, var| e.replace(var, "5m"));
            out.push(Query {
                place: format!("dashboard panel {:?}", p["title"].as_str().unwrap()),
                expr,
            });
        }
    }
    out
}

/// What is wrong with the metrics and labels `expr` names, one line each.
fn problems(exported: &Exported, query: &Query) -> Vec<String> {
    let mut out = Vec::new();
    match parser::parse(&query.expr) {
        Ok(ast) => {
            labels_of(&ast, exported, &mut out);
        }
        Err(e) => out.push(format!("does not parse: {e}")),
    }
    out.into_iter()
        .map(|p| format!("{}: {p} in `{}`", query.place, query.expr))
        .collect()
}

/// The label names the series of `expr` can carry (`None` for a scalar or a string), checking
/// on the way every selector, every matcher and every `by`, `without`, `on`, `ignoring` and
/// `group_*` label against what is exported.
fn labels_of(expr: &Expr, exported: &Exported, out: &mut Vec<String>) -> Option<BTreeSet<String>> {
    let check = |names: &[String], within: &BTreeSet<String>, what: &str, out: &mut Vec<String>| {
        for name in names {
            if !within.contains(name) {
                out.push(format!("{what} label `{name}` is on none of its series"));
            }
        }
    };
    match expr {
        Expr::VectorSelector(vs) => Some(selector(vs, exported, out)),
        Expr::MatrixSelector(ms) => Some(selector(&ms.vs, exported, out)),
        Expr::Paren(p) => labels_of(&p.expr, exported, out),
        Expr::Unary(u) => labels_of(&u.expr, exported, out),
        Expr::Subquery(s) => labels_of(&s.expr, exported, out),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => None,
        Expr::Aggregate(a) => {
            if let Some(param) = &a.param {
                labels_of(param, exported, out);
            }
            let inner = labels_of(&a.expr, exported, out).unwrap_or_default();
            Some(match &a.modifier {
                Some(LabelModifier::Include(by)) => {
                    check(&by.labels, &inner, "by", out);
                    by.labels.iter().cloned().collect()
                }
                Some(LabelModifier::Exclude(without)) => {
                    check(&without.labels, &inner, "without", out);
                    let without: BTreeSet<_> = without.labels.iter().cloned().collect();
                    inner.difference(&without).cloned().collect()
                }
                None => BTreeSet::new(),
            })
        }
        Expr::Binary(b) => {
            let lhs = labels_of(&b.lhs, exported, out);
            let rhs = labels_of(&b.rhs, exported, out);
            if let Some(modifier) = &b.modifier {
                if let Some(matching) = &modifier.matching {
                    // Matching on a label needs it on both sides.
                    for side in [&lhs, &rhs].into_iter().flatten() {
                        check(&matching.labels().labels, side, "on/ignoring", out);
                    }
                }
                if let Some(group) = modifier.card.labels() {
                    let both = lhs.iter().chain(&rhs).flatten().cloned().collect();
                    check(&group.labels, &both, "group", out);
                }
            }
            match (lhs, rhs) {
                (None, None) => None,
                (l, r) => Some(l.into_iter().chain(r).flatten().collect()),
            }
        }
        Expr::Call(call) => {
            let args: Vec<_> = (call.args.args.iter())
                .map(|a| labels_of(a, exported, out))
                .collect();
            let string_arg = |i: usize| match call.args.args.get(i).map(|a| &**a) {
                Some(Expr::StringLiteral(s)) => s.val.clone(),
                _ => String::new(),
            };
            let vector = args.iter().flatten().next().cloned();
            match call.func.name {
                "histogram_quantile" => {
                    let mut v = vector.unwrap_or_default();
                    if !v.remove("le") {
                        out.push("histogram_quantile over series without `le`".into());
                    }
                    Some(v)
                }
                "label_replace" | "label_join" => {
                    let mut v = vector.unwrap_or_default();
                    let sources: Vec<String> = if call.func.name == "label_replace" {
                        vec![string_arg(3)]
                    } else {
                        (3..call.args.args.len()).map(string_arg).collect()
                    };
                    let sources: Vec<String> =
                        sources.into_iter().filter(|s| !s.is_empty()).collect();
                    check(&sources, &v, call.func.name, out);
                    v.insert(string_arg(1));
                    Some(v)
                }
                _ => vector,
            }
        }
    }
}

/// Checks one selector: its metric is exported, and each matcher names a label it carries.
fn selector(vs: &VectorSelector, exported: &Exported, out: &mut Vec<String>) -> BTreeSet<String> {
    let mut name = vs.name.clone();
    let matchers = vs
        .matchers
        .matchers
        .iter()
        .chain(vs.matchers.or_matchers.iter().flatten());
    for m in matchers.clone() {
        if m.name == "__name__" {
            match m.op {
                MatchOp::Equal => name = Some(m.value.clone()),
                _ => out.push("a regular expression on __name__ cannot be checked".into()),
            }
        }
    }
    let Some(name) = name else {
        out.push("a selector without a metric name".into());
        return BTreeSet::new();
    };
    let Some(labels) = exported.get(&name) else {
        out.push(format!("`{name}` is not a series hookrelay exports"));
        return BTreeSet::new();
    };
    let mut labels = labels.clone();
    labels.extend(TARGET_LABELS.map(String::from));
    for m in matchers.filter(|m| m.name != "__name__") {
        if !labels.contains(&m.name) {
            out.push(format!("`{name}` has no label `{}`", m.name));
        }
    }
    labels
}

/// Grafana's `label_values(metric, label)` variable queries: the metric is exported and sets the
/// label.
fn variable_problems(exported: &Exported, dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let query = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap();
        let name = v["name"].as_str().unwrap();
        let Some(args) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
        else {
            out.push(format!(
                "variable {name}: {query} is not label_values(metric, label)"
            ));
            continue;
        };
        let (metric, label) = args.split_once(',').unwrap();
        let (metric, label) = (metric.trim(), label.trim());
        match exported.get(metric) {
            None => out.push(format!("variable {name}: `{metric}` is not exported")),
            Some(labels) if !labels.contains(label) && !TARGET_LABELS.contains(&label) => {
                out.push(format!(
                    "variable {name}: `{metric}` has no label `{label}`"
                ));
            }
            Some(_) => {}
        }
    }
    out
}

#[test]
fn every_dashboard_and_alert_expression_names_exported_metrics_and_labels() {
    let exported = exported();
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let mut queries = alert_queries();
    queries.extend(dashboard_queries(&dashboard));
    assert!(queries.len() > 50, "{} expressions", queries.len());
    let mut found: Vec<String> = queries
        .iter()
        .flat_map(|q| problems(&exported, q))
        .collect();
    found.extend(variable_problems(&exported, &dashboard));
    assert!(found.is_empty(), "\n{}", found.join("\n"));
    // The panels the dashboard promises: each metric is queried somewhere.
    let text: String = dashboard_queries(&dashboard)
        .iter()
        .map(|q| q.expr.clone() + "\n")
        .collect();
    for metric in [
        "hookrelay_outcomes_total",
        "hookrelay_retries_total",
        "hookrelay_deferrals_total",
        "hookrelay_oldest_ready_age_seconds",
        "hookrelay_promotion_lag_seconds_bucket",
        "hookrelay_endpoints_open",
        "hookrelay_endpoints_quarantined",
        "hookrelay_fleet_workers",
        "hookrelay_republishes_total",
        "hookrelay_republish_failures_total",
        "hookrelay_history_lag_seconds",
    ] {
        assert!(text.contains(metric), "no panel shows {metric}");
    }
}

/// The checker itself catches a misspelt metric, a label a metric lacks, a `by` label no series
/// carries and a bare histogram name, so the test above cannot pass by checking nothing.
#[test]
fn a_misnamed_metric_or_label_is_caught() {
    let exported = exported();
    for (expr, says) in [
        (
            "rate(hookrelay_outcome_total[5m])",
            "`hookrelay_outcome_total` is not",
        ),
        (
            "hookrelay_outcomes_total{tier=\"retry-10s\"}",
            "has no label `tier`",
        ),
        (
            "sum by (tier) (rate(hookrelay_outcomes_total[5m]))",
            "by label `tier`",
        ),
        (
            "hookrelay_attempt_duration_seconds",
            "`hookrelay_attempt_duration_seconds` is not",
        ),
        (
            "histogram_quantile(0.9, sum by (lane) (rate(hookrelay_attempt_duration_seconds_bucket[5m])))",
            "without `le`",
        ),
        (
            "hookrelay_consuming == 0 unless on(lane) hookrelay_broker_stats_up == 0",
            "on/ignoring label `lane`",
        ),
    ] {
        let query = Query {
            place: "self-test".into(),
            expr: expr.into(),
        };
        let found = problems(&exported, &query);
        assert!(found.iter().any(|p| p.contains(says)), "{expr}: {found:?}");
    }
    let good = Query {
        place: "self-test".into(),
        expr: "histogram_quantile(0.99, sum by (tier, le) (rate(hookrelay_promotion_lag_seconds_bucket{instance=\"w\"}[5m])))".into(),
    };
    assert_eq!(problems(&exported, &good), Vec::<String>::new());
}

#[test]
fn the_dashboard_is_ready_to_provision() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    assert_eq!(dashboard["uid"], "hookrelay");
    assert!(
        dashboard["id"].is_null(),
        "an id would clash across Grafanas"
    );
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "instance", "lane", "tier"]);
    let mut ids = BTreeSet::new();
    for p in panels(&dashboard) {
        let title = p["title"].as_str().unwrap();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "{title}: id reused");
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "{title} is wider than the dashboard");
        if p["type"] == "row" {
            continue;
        }
        assert!(
            p["description"].as_str().is_some_and(|d| !d.is_empty()),
            "{title}"
        );
        // Every query goes to the data source the variable picks, none to a fixed one.
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        for t in p["targets"].as_array().unwrap() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("monitoring/grafana/provisioning");
    let read = |path: &str| -> serde_yaml_ng::Value {
        serde_yaml_ng::from_str(&std::fs::read_to_string(root.join(path)).unwrap()).unwrap()
    };
    let providers = read("dashboards/hookrelay.yml");
    assert_eq!(providers["providers"][0]["type"], "file");
    assert!(
        providers["providers"][0]["options"]["path"]
            .as_str()
            .is_some()
    );
    let sources = read("datasources/hookrelay.yml");
    assert_eq!(sources["datasources"][0]["type"], "prometheus");
}

/// Runs promtool in the repository root; fails, saying how to get it, when it is missing.
fn promtool(args: &[&str]) -> String {
    let output = std::process::Command::new("promtool")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool cannot be run ({e}): run monitoring/up (make test does) to install it")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn promtool_accepts_the_rules_their_unit_tests_and_the_scrape_config() {
    let checked = promtool(&["check", "rules", "monitoring/alerts.yml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "monitoring/alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
    promtool(&["check", "config", "monitoring/prometheus.yml"]);
}

/// `hookrelay_republishes_total` counts what the broker confirmed, by target, on the real
/// broker, and a worker's `/metrics` shows it.
#[tokio::test]
async fn confirmed_republishes_are_counted_by_target() {
    let t = TestLadder::apply("republished", &["300ms"], &["300ms"]).await;
    let s = secret();
    let receiver = common::failing_first_attempts(&s).await;
    let worker = RunningWorker::start_for_receiver(&t, &receiver, &s).await;
    t.publish(&event("evt_republished", "acme", "sub_a")).await;
    assert!(
        receiver
            .wait_until(Duration::from_secs(20), |r| r.delivered_count() == 1)
            .await
    );
    let vitals = worker.vitals.expect("the tests' workers serve /metrics");
    let text = reqwest::get(format!("http://{vitals}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let m = worker.metrics.clone();
    worker.stop().await;
    assert_eq!(
        m.count("hookrelay_republishes_total", &[("target", "retry-300ms")]),
        1
    );
    assert_eq!(m.count("hookrelay_republishes_total", &[]), 1);
    assert_eq!(m.count("hookrelay_republish_failures_total", &[]), 0);
    assert!(
        text.contains("hookrelay_republishes_total{target=\"retry-300ms\"} 1"),
        "{text}"
    );
}
