//! The documentation matches the code: every setting, metric, command and API error kind is on
//! the page where it lives, every block a page marks runnable runs, every relative link leads
//! to a file, README and the performance page stay short, the example config is the defaults and
//! the example subscriptions files parse.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use hookrelay::api::problem::{ApiError, Problem};
use hookrelay::config::{Config, ProcessEnv};

const README: &str = include_str!("../README.md");
const CONFIGURATION: &str = include_str!("../docs/configuration.md");
const OPERATING: &str = include_str!("../docs/operating.md");
const API: &str = include_str!("../docs/api.md");
const PERFORMANCE: &str = include_str!("../docs/performance.md");

/// README and every page of docs/, by path from the repository root. Read at run time so a page
/// added later is covered without a change here.
fn pages() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

#[test]
fn the_configuration_page_lists_every_environment_variable() {
    for name in Config::env_names() {
        assert!(
            CONFIGURATION.contains(&format!("`{name}`")),
            "docs/configuration.md lacks {name}"
        );
    }
}

#[test]
fn the_operating_page_lists_every_metric() {
    for name in hookrelay::observe::metrics::metric_names() {
        assert!(
            OPERATING.contains(&format!("`{name}")),
            "docs/operating.md lacks {name}"
        );
    }
}

/// Every command path of `hookrelay` (`hookrelay topology apply`, `hookrelay status`, ...):
/// each subcommand that has none of its own, and each that runs without one (`hookrelay api`).
fn command_paths(command: &clap::Command, prefix: &str, out: &mut Vec<String>) {
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let path = format!("{prefix} {}", sub.get_name());
        if sub.has_subcommands() {
            if !sub.is_subcommand_required_set() {
                out.push(path.clone());
            }
            command_paths(sub, &path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn the_operating_page_lists_every_command() {
    let mut paths = Vec::new();
    command_paths(&hookrelay::cli::Cli::command(), "hookrelay", &mut paths);
    assert!(paths.len() > 20, "{paths:?}");
    for path in paths {
        assert!(
            OPERATING.contains(&format!("| `{path}` |")),
            "docs/operating.md's command table lacks {path}"
        );
    }
}

/// Every kind of problem the API answers with. The match has no wildcard, so a new kind of
/// error fails to compile here until it is listed, and then until docs/api.md names it.
fn problem_types() -> Vec<String> {
    let every = [
        ApiError::Malformed(String::new()),
        ApiError::Invalid(Vec::new()),
        ApiError::TooLarge { max: 1 },
        ApiError::BadRequest(String::new()),
        ApiError::NotFound,
        ApiError::Absent("replay"),
        ApiError::NoRoute,
        ApiError::Forbidden(String::new()),
        ApiError::MethodNotAllowed,
        ApiError::Conflict(String::new()),
        ApiError::IdempotencyMismatch,
        ApiError::Quota(String::new()),
        ApiError::RateLimited {
            what: "writes",
            setting: "api.writes_per_minute",
            per_minute: 1,
            retry_after: 1,
        },
        ApiError::Unavailable(String::new()),
        ApiError::Internal(String::new()),
    ];
    for e in &every {
        match e {
            ApiError::Malformed(_)
            | ApiError::Invalid(_)
            | ApiError::TooLarge { .. }
            | ApiError::BadRequest(_)
            | ApiError::NotFound
            | ApiError::Absent(_)
            | ApiError::NoRoute
            | ApiError::Forbidden(_)
            | ApiError::MethodNotAllowed
            | ApiError::Conflict(_)
            | ApiError::IdempotencyMismatch
            | ApiError::Quota(_)
            | ApiError::RateLimited { .. }
            | ApiError::Unavailable(_)
            | ApiError::Internal(_) => {}
        }
    }
    let mut kinds: Vec<String> = every.iter().map(|e| e.to_problem().kind).collect();
    kinds.push(Problem::unauthorized().kind);
    kinds.sort();
    kinds.dedup();
    kinds
}

#[test]
fn the_api_page_names_every_problem_type() {
    for kind in problem_types() {
        let slug = kind.strip_prefix("urn:hookrelay:problem:").unwrap();
        assert!(
            API.contains(&format!("`{slug}`")) || API.contains(&format!("`{kind}`")),
            "docs/api.md lacks the problem type {kind}"
        );
    }
}

/// The shell blocks a page marks runnable: fenced with the info string `sh runnable`.
fn runnable_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim_end() == "```sh runnable" => current = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(current.is_none(), "a runnable block is not closed");
    blocks
}

#[test]
fn every_runnable_block_runs() {
    let bin = Path::new(env!("CARGO_BIN_EXE_hookrelay")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for (page, text) in pages() {
        for block in runnable_blocks(&text) {
            let out = std::process::Command::new("bash")
                .args(["-euo", "pipefail", "-c", &block])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .env("PATH", &path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: this block failed ({}):\n{block}\nstdout:\n{}\nstderr:\n{}",
                page.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            ran += 1;
        }
    }
    assert!(ran > 0, "no runnable block found");
}

/// The targets of a page's Markdown links, `[text](target)`, that are not URLs or anchors.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].trim();
        let is_url = target.contains("://") || target.starts_with("mailto:");
        if !is_url && !target.starts_with('#') && !target.is_empty() {
            links.push(target.split('#').next().unwrap().to_owned());
        }
    }
    links
}

#[test]
fn every_relative_link_leads_to_a_file() {
    for (page, text) in pages() {
        let dir = page.parent().unwrap();
        for link in relative_links(&text) {
            assert!(
                dir.join(&link).exists(),
                "{}: the link {link} leads nowhere",
                page.display()
            );
        }
    }
}

#[test]
fn readme_and_the_performance_page_stay_short() {
    let readme = README.lines().count();
    assert!(
        readme <= 320,
        "README.md has {readme} lines; the rest belongs in docs/"
    );
    let performance = PERFORMANCE.lines().count();
    assert!(
        performance <= 160,
        "docs/performance.md has {performance} lines; runs belong in docs/bench/results/"
    );
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
    let partner = subs.get("sub_partner").unwrap();
    assert!(partner.amqp.is_some() && partner.tls.is_some() && partner.basic_auth.is_some());
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
