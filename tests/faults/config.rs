//! Configuration the worker must refuse to start with.

use crate::common::{self, SubsFile, subscription_toml};

#[test]
fn config_faults_refuse_to_start_with_a_clear_error() {
    let subs = SubsFile::new(&subscription_toml(
        "s",
        "t",
        "https://x.example",
        "\"env:HOOKRELAY_TEST_MISSING_SECRET\"",
        "",
    ));
    let ladder = format!("{}/topology/ladder.toml", env!("CARGO_MANIFEST_DIR"));
    let run = |env: &[(&str, &str)]| common::hookrelay(&["worker", "--ladder", &ladder], env);
    let (code, _, err) = run(&[
        ("HOOKRELAY_SUBSCRIPTIONS", subs.path.to_str().unwrap()),
        ("HOOKRELAY_METRICS_LISTEN", ""),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("secret env:HOOKRELAY_TEST_MISSING_SECRET: environment variable is not set"),
        "{err}"
    );

    let (code, _, err) = run(&[
        ("HOOKRELAY_SUBSCRIPTIONS", "/nonexistent/subs.toml"),
        ("HOOKRELAY_METRICS_LISTEN", ""),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("/nonexistent/subs.toml:0: (file): cannot read"),
        "{err}"
    );

    subs.write("");
    let (code, _, err) = run(&[
        ("HOOKRELAY_SUBSCRIPTIONS", subs.path.to_str().unwrap()),
        ("HOOKRELAY_METRICS_LISTEN", ""),
        ("HOOKRELAY_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/%2f"),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("cannot start: cannot reach the broker"),
        "{err}"
    );

    let (code, _, err) = run(&[
        ("HOOKRELAY_SUBSCRIPTIONS", subs.path.to_str().unwrap()),
        ("HOOKRELAY_HTTP_REQUEST_TIMEOUT", "soon"),
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("request_timeout"), "{err}");
}
