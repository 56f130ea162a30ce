//! The documentation matches the code: every setting is in README, the example config is the
//! defaults, the example subscriptions file parses.

use hookrelay::config::{Config, ProcessEnv};

const README: &str = include_str!("../README.md");

#[test]
fn readme_lists_every_environment_variable() {
    for name in Config::env_names() {
        assert!(README.contains(&format!("`{name}`")), "README lacks {name}");
    }
}

#[test]
fn readme_lists_every_metric() {
    for name in hookrelay::observe::metrics::metric_names() {
        assert!(README.contains(&format!("`{name}")), "README lacks {name}");
    }
}

#[test]
fn the_example_config_is_exactly_the_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/hookrelay.toml");
    // Any HOOKRELAY_* variables of the test environment apply to both sides alike.
    let from_file = Config::load(Some(std::path::Path::new(path)), &ProcessEnv).unwrap();
    assert_eq!(from_file, Config::load(None, &ProcessEnv).unwrap());
}

#[test]
fn the_example_subscriptions_parse() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/subscriptions.toml");
    let subs = hookrelay::subscriptions::Subscriptions::load(std::path::Path::new(path)).unwrap();
    assert_eq!(subs.len(), 1);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/subscriptions-auth.toml"
    );
    let subs = hookrelay::subscriptions::Subscriptions::load(std::path::Path::new(path)).unwrap();
    let erp = subs.get("sub_erp").unwrap();
    assert!(erp.oauth2.is_some() && erp.headers.len() == 2);
    let bank = subs.get("sub_bank").unwrap();
    assert!(bank.basic_auth.is_some() && bank.tls.as_ref().is_some_and(|t| t.ca.is_some()));
}

#[test]
fn help_explains_each_command() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hookrelay"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for command in ["topology", "publish", "worker", "demo"] {
        assert!(help.contains(command), "{help}");
    }
    assert!(help.contains("Exit codes"), "{help}");
}
