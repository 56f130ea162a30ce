//! Defaults, then a TOML file, then `HOOKRELAY_*` variables, merged into one [`Config`].

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::{Config, ConfigError};

/// Variables with a meaning of their own rather than `<SECTION>_<KEY>`.
const CONFIG_VAR: &str = "HOOKRELAY_CONFIG";
const ENV_PREFIX: &str = "HOOKRELAY_";

/// Where settings come from besides files. `ProcessEnv` in production, a map in tests.
pub trait Env: Send + Sync {
    fn var(&self, name: &str) -> Option<String>;
    /// Every variable name starting with `HOOKRELAY_`.
    fn hookrelay_names(&self) -> Vec<String>;
}

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
    fn hookrelay_names(&self) -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| k.starts_with(ENV_PREFIX))
            .collect()
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
    fn hookrelay_names(&self) -> Vec<String> {
        self.keys()
            .filter(|k| k.starts_with(ENV_PREFIX))
            .cloned()
            .collect()
    }
}

impl Config {
    /// Defaults, then the file named by `file` or `HOOKRELAY_CONFIG` (if any), then the
    /// environment, then validation.
    pub fn load(file: Option<&Path>, env: &dyn Env) -> Result<Self, ConfigError> {
        let mut table = toml::Table::try_from(Config::default()).map_err(|e| {
            ConfigError::invalid("defaults", format!("cannot serialise defaults: {e}"))
        })?;
        let otel = super::traces::otel_overlay(env)?;
        if let Some(toml::Value::Table(traces)) = table.get_mut("traces") {
            merge(traces, otel);
        }
        let file = file
            .map(Path::to_path_buf)
            .or_else(|| env.var(CONFIG_VAR).map(PathBuf::from));
        if let Some(path) = &file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let overlay: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.clone(),
                message: e.to_string(),
            })?;
            merge(&mut table, overlay);
        }
        apply_env(&mut table, env)?;
        let config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: file.unwrap_or_else(|| PathBuf::from("(defaults and environment)")),
                    message: e.to_string(),
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Every environment variable that overrides a setting, in `section.key` order.
    pub fn env_names() -> Vec<String> {
        let mut names = vec![CONFIG_VAR.to_owned()];
        if let Ok(table) = toml::Table::try_from(Config::default()) {
            names.extend(env_slots(&table).into_keys());
        }
        names
    }
}

fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// `HOOKRELAY_<SECTION>_<KEY>` -> (section, key) for every setting the defaults have.
fn env_slots(table: &toml::Table) -> BTreeMap<String, (Option<String>, String)> {
    let mut slots = BTreeMap::new();
    for (key, value) in table {
        match value {
            toml::Value::Table(section) => {
                for inner in section.keys() {
                    let var = format!("{ENV_PREFIX}{key}_{inner}").to_uppercase();
                    slots.insert(var, (Some(key.clone()), inner.clone()));
                }
            }
            _ => {
                let var = format!("{ENV_PREFIX}{key}").to_uppercase();
                slots.insert(var, (None, key.clone()));
            }
        }
    }
    slots
}

/// The variables references (`env:NAME`) name, in the configuration's strings and in the
/// settings' variables (`HOOKRELAY_API_TOKENS="env:A,acme=env:B"`): a secret's variable may
/// carry hookrelay's prefix without being a setting.
fn referenced_variables(
    table: &toml::Table,
    env: &dyn Env,
    slots: &BTreeMap<String, (Option<String>, String)>,
) -> std::collections::HashSet<String> {
    fn strings(value: &toml::Value, out: &mut Vec<String>) {
        match value {
            toml::Value::String(s) => out.push(s.clone()),
            toml::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            toml::Value::Table(t) => t.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let mut texts = Vec::new();
    table.values().for_each(|v| strings(v, &mut texts));
    texts.extend(slots.keys().filter_map(|var| env.var(var)));
    texts
        .iter()
        .flat_map(|t| t.split([',', '=', ' ']))
        .filter_map(
            |part| match super::reference::SecretSource::parse(part.trim()) {
                Ok(super::reference::SecretSource::Env(name)) => Some(name),
                _ => None,
            },
        )
        .collect()
}

fn apply_env(table: &mut toml::Table, env: &dyn Env) -> Result<(), ConfigError> {
    let slots = env_slots(table);
    let referenced = referenced_variables(table, env, &slots);
    let mut names = env.hookrelay_names();
    names.sort();
    for var in names {
        if var == CONFIG_VAR || (referenced.contains(&var) && !slots.contains_key(&var)) {
            continue;
        }
        let Some((section, key)) = slots.get(&var) else {
            return Err(ConfigError::Env {
                var,
                message: format!(
                    "not a hookrelay setting; known variables: {}",
                    Config::env_names().join(", ")
                ),
            });
        };
        let Some(raw) = env.var(&var) else { continue };
        let target = match section {
            Some(s) => match table.get_mut(s).and_then(toml::Value::as_table_mut) {
                Some(section) => section,
                // The slots come from this very table; an error, not a panic, should that change.
                None => {
                    return Err(ConfigError::Env {
                        var,
                        message: format!("the config file sets {s} to a value, not a section"),
                    });
                }
            },
            None => &mut *table,
        };
        let typed = match target.get(key.as_str()) {
            Some(toml::Value::Integer(_)) => raw
                .trim()
                .parse::<i64>()
                .map(toml::Value::Integer)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    message: format!("expected a whole number, found {raw:?}"),
                })?,
            // Lists are comma-separated: HOOKRELAY_EGRESS_ALLOW="127.0.0.0/8,10.20.0.0/16".
            Some(toml::Value::Array(_)) => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|item| !item.is_empty())
                    .map(|item| match item.parse::<i64>() {
                        Ok(n) => toml::Value::Integer(n),
                        Err(_) => toml::Value::String(item.to_owned()),
                    })
                    .collect(),
            ),
            Some(toml::Value::Float(_)) => raw
                .trim()
                .parse::<f64>()
                .map(toml::Value::Float)
                .map_err(|_| ConfigError::Env {
                    var: var.clone(),
                    message: format!("expected a number such as 0.3, found {raw:?}"),
                })?,
            Some(toml::Value::Boolean(_)) => raw
                .trim()
                .parse::<bool>()
                .map(toml::Value::Boolean)
                .map_err(|_| ConfigError::Env {
                var: var.clone(),
                message: format!("expected true or false, found {raw:?}"),
            })?,
            _ => toml::Value::String(raw),
        };
        target.insert(key.clone(), typed);
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ipnet::IpNet;

    use super::*;
    use crate::config::{ApiToken, LogFormat, env};

    #[test]
    fn environment_overrides_the_file_and_is_typed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[http]\nrequest_timeout = \"12s\"\n[worker]\nin_flight = 7\n",
        )
        .unwrap();
        let config = Config::load(
            Some(&path),
            &env(&[
                ("HOOKRELAY_WORKER_IN_FLIGHT", "9"),
                ("HOOKRELAY_WORKER_RETRY_SHARE", "0.25"),
                ("HOOKRELAY_AMQP_URL", "amqp://u:p@h:1/v"),
                ("HOOKRELAY_LADDER", "x.toml"),
                ("HOOKRELAY_EGRESS_ALLOW", "127.0.0.0/8, 10.20.0.0/16"),
                ("HOOKRELAY_EGRESS_ALLOWED_PORTS", "443,8443"),
                ("HOOKRELAY_EGRESS_HTTPS_ONLY", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.egress.allow,
            vec![
                "127.0.0.0/8".parse::<IpNet>().unwrap(),
                "10.20.0.0/16".parse().unwrap()
            ]
        );
        assert_eq!(config.egress.allowed_ports, vec![443, 8443]);
        assert!(config.egress.https_only);
        assert_eq!(config.http.request_timeout, Duration::from_secs(12));
        assert_eq!(config.worker.in_flight, 9);
        assert_eq!(config.worker.retry_share, 0.25);
        assert_eq!(config.amqp.url.expose(), "amqp://u:p@h:1/v");
        assert_eq!(config.ladder, PathBuf::from("x.toml"));
    }

    /// docs/api.md names `env:HOOKRELAY_ADMIN_TOKEN` and `env:HOOKRELAY_STORE_KEY`: a variable
    /// a reference points at is the secret's, not a setting, whatever its name; one nothing
    /// names is still a mistake.
    #[test]
    fn a_variable_a_reference_names_is_not_mistaken_for_a_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[api]\ntokens = [{ token = \"env:HOOKRELAY_ADMIN_TOKEN\" }]\n",
        )
        .unwrap();
        let key = "HOOKRELAY_STORE_KEY";
        let config = Config::load(
            Some(&path),
            &env(&[
                ("HOOKRELAY_ADMIN_TOKEN", "an-admin-token-of-length"),
                ("HOOKRELAY_STORE_KEYS", "env:HOOKRELAY_STORE_KEY"),
                (key, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
                (
                    "HOOKRELAY_API_TOKENS",
                    "env:HOOKRELAY_ADMIN_TOKEN,acme=env:HOOKRELAY_ACME",
                ),
                ("HOOKRELAY_ACME", "a-tenant-token-of-length"),
            ]),
        )
        .unwrap();
        assert_eq!(config.api.tokens.len(), 2);
        let err = Config::load(
            Some(&path),
            &env(&[
                ("HOOKRELAY_ADMIN_TOKEN", "an-admin-token-of-length"),
                ("HOOKRELAY_WORKER_INFLIGHT", "9"),
            ]),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("HOOKRELAY_WORKER_INFLIGHT"),
            "{err}"
        );
    }

    #[test]
    fn typed_settings_name_the_field_and_what_they_expect() {
        for (var, value, expected) in [
            ("HOOKRELAY_LOG_FORMAT", "xml", "expected `text` or `json`"),
            ("HOOKRELAY_METRICS_LISTEN", "port 9464", "an address like"),
            ("HOOKRELAY_EGRESS_ALLOW", "not-a-cidr", "is not a CIDR"),
            (
                "HOOKRELAY_EGRESS_PROXY",
                "http://u:s3cret@[::",
                "a URL like",
            ),
            (
                "HOOKRELAY_MANAGEMENT_URL",
                "http://u:s3cret@[::",
                "expected a URL",
            ),
        ] {
            let err = Config::load(None, &env(&[(var, value)])).unwrap_err();
            let shown = err.to_string();
            let field = var
                .trim_start_matches("HOOKRELAY_")
                .to_lowercase()
                .replacen('_', ".", 1);
            assert!(shown.contains(&field), "{var}: {shown}");
            assert!(shown.contains(expected), "{var}: {shown}");
            assert!(!shown.contains("s3cret"), "{var}: {shown}");
        }
    }

    #[test]
    fn empty_turns_metrics_and_the_proxy_off() {
        let config = Config::load(
            None,
            &env(&[
                ("HOOKRELAY_METRICS_LISTEN", ""),
                ("HOOKRELAY_EGRESS_PROXY", ""),
                ("HOOKRELAY_LOG_FORMAT", "json"),
                ("HOOKRELAY_EGRESS_ALLOW", "10.1.2.3"),
            ]),
        )
        .unwrap();
        assert_eq!(config.metrics.listen, None);
        assert_eq!(config.egress.proxy, None);
        assert_eq!(config.log.format, LogFormat::Json);
        // A bare address is a network of one.
        assert_eq!(
            config.egress.allow,
            vec!["10.1.2.3/32".parse::<IpNet>().unwrap()]
        );
        assert_eq!(
            Config::default().metrics.listen,
            Some("0.0.0.0:9464".parse().unwrap())
        );
        // Off still has a key, so it still has an environment name.
        assert!(
            Config::env_names()
                .iter()
                .any(|n| n == "HOOKRELAY_EGRESS_PROXY")
        );
    }

    #[test]
    fn api_tokens_are_references_with_an_optional_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[api]\nlisten = \"0.0.0.0:9000\"\ntokens = [{ token = \"env:ADMIN\" }, \
             { token = \"file:/run/acme\", tenant = \"acme\" }]\n",
        )
        .unwrap();
        let config = Config::load(Some(&path), &env(&[])).unwrap();
        assert_eq!(config.api.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.api.tokens[1].tenant.as_deref(), Some("acme"));
        let config = Config::load(
            None,
            &env(&[
                ("HOOKRELAY_API_TOKENS", "env:ADMIN, acme=env:ACME"),
                ("HOOKRELAY_API_MAX_BODY_BYTES", "1024"),
            ]),
        )
        .unwrap();
        assert_eq!(
            config.api.tokens,
            vec![
                ApiToken {
                    token: "env:ADMIN".into(),
                    tenant: None
                },
                ApiToken {
                    token: "env:ACME".into(),
                    tenant: Some("acme".into())
                }
            ]
        );
        assert_eq!(config.api.max_body_bytes, 1024);
        for (var, value, field) in [
            ("HOOKRELAY_API_TOKENS", "s3cret-token", "api.tokens"),
            ("HOOKRELAY_API_TOKENS", "ac.me=env:X", "api.tokens"),
            ("HOOKRELAY_API_MAX_BODY_BYTES", "0", "api.max_body_bytes"),
            ("HOOKRELAY_STORE_KEYS", "not-a-reference", "store.keys"),
        ] {
            let err = Config::load(None, &env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{var}: {err}");
            assert!(!err.contains("s3cret"), "{var}: {err}");
        }
    }

    #[test]
    fn every_setting_has_an_environment_name() {
        let names = Config::env_names();
        for expected in [
            "HOOKRELAY_AMQP_URL",
            "HOOKRELAY_MANAGEMENT_URL",
            "HOOKRELAY_LADDER",
            "HOOKRELAY_SUBSCRIPTIONS",
            "HOOKRELAY_CONFIG",
            "HOOKRELAY_HTTP_CONNECT_TIMEOUT",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing");
        }
    }
}
