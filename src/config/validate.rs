//! The rules that span fields, and the time budgets behind the lease rule.

use std::time::Duration;

use super::{Config, ConfigError, SecretSource};
use crate::units::fmt_duration;

impl Config {
    /// Rules that span fields. Called by [`Config::load`]; call it again after editing a config
    /// in code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.traces.validate()?;
        self.amqp
            .url
            .expose()
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|e| ConfigError::invalid("amqp.url", format!("not an AMQP URI: {e}")))?;
        let management = self.management.url.expose_url();
        if !matches!(management.scheme(), "http" | "https") || !management.has_host() {
            return Err(ConfigError::invalid(
                "management.url",
                format!(
                    "expected an http(s) URL with a host, like http://user:pass@host:15672; \
                     found {}",
                    self.management.url
                ),
            ));
        }
        for (field, value) in [
            ("amqp.confirm_timeout", self.amqp.confirm_timeout),
            ("amqp.reconnect_min", self.amqp.reconnect_min),
            ("http.connect_timeout", self.http.connect_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("http.token_timeout", self.http.token_timeout),
            ("broker.consumer_timeout", self.broker.consumer_timeout),
            ("worker.shutdown_grace", self.worker.shutdown_grace),
            ("reload.interval", self.reload.interval),
            ("metrics.poll_interval", self.metrics.poll_interval),
            ("store.resync", self.store.resync),
            ("catalog.refresh", self.catalog.refresh),
            ("store.connect_timeout", self.store.connect_timeout),
            ("store.cache_load_timeout", self.store.cache_load_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::invalid(field, "must be longer than zero"));
            }
        }
        self.store.validate_cache()?;
        for key in &self.store.keys {
            SecretSource::parse(key)
                .map_err(|e| ConfigError::invalid("store.keys", e.to_string()))?;
        }
        if self.amqp.reconnect_max < self.amqp.reconnect_min {
            return Err(ConfigError::invalid(
                "amqp.reconnect_max",
                "must not be shorter than amqp.reconnect_min",
            ));
        }
        if self.endpoints.max_concurrent == 0
            || self.endpoints.max_concurrent_per_host == 0
            || self.endpoints.breaker_failures == 0
        {
            return Err(ConfigError::invalid(
                "endpoints.max_concurrent/max_concurrent_per_host/breaker_failures",
                "must be at least 1",
            ));
        }
        if !(self.endpoints.lane_share > 0.0 && self.endpoints.lane_share <= 1.0) {
            return Err(ConfigError::invalid(
                "endpoints.lane_share",
                "must be above 0 and at most 1 (a fraction of a lane's prefetch; 1 for no limit \
                 but the caps)",
            ));
        }
        if self.endpoints.busy_wait > Duration::from_secs(1) {
            return Err(ConfigError::invalid(
                "endpoints.busy_wait",
                "must be at most 1s: the waiting delivery holds a slot of its lane, which other \
                 tenants share; a slower endpoint's deliveries belong in the deferral queues",
            ));
        }
        if self.worker.in_flight < 2 {
            return Err(ConfigError::invalid(
                "worker.in_flight",
                "must be at least 2 (one delivery per lane)",
            ));
        }
        if !(self.worker.retry_share > 0.0 && self.worker.retry_share < 1.0) {
            return Err(ConfigError::invalid(
                "worker.retry_share",
                format!(
                    "must be between 0 and 1 (exclusive), as in 0.3; found {}",
                    self.worker.retry_share
                ),
            ));
        }
        if self.limits.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "limits.max_body_bytes",
                "must be at least 1",
            ));
        }
        if self.history.batch == 0 || self.history.retention_days == 0 {
            return Err(ConfigError::invalid(
                "history.batch/retention_days",
                "must be at least 1",
            ));
        }
        if self.history.flush.is_zero() {
            return Err(ConfigError::invalid(
                "history.flush",
                "must be longer than zero",
            ));
        }
        if let Some(url) = &self.history.database
            && !matches!(url.expose_url().scheme(), "postgres" | "postgresql")
        {
            return Err(ConfigError::invalid(
                "history.database",
                format!("expected a postgres:// URL; found {url}"),
            ));
        }
        if self.api.max_body_bytes == 0 {
            return Err(ConfigError::invalid(
                "api.max_body_bytes",
                "must be at least 1",
            ));
        }
        if self.api.max_subscriptions_per_tenant == 0
            || self.api.max_event_types == 0
            || self.api.writes_per_minute == 0
            || self.api.test_events_per_minute == 0
            || self.api.replays_running == 0
            || self.api.replays_per_tenant == 0
            || self.api.replay_index_max == 0
        {
            return Err(ConfigError::invalid(
                "api.max_subscriptions_per_tenant/max_event_types/writes_per_minute/\
                 test_events_per_minute/replays_running/replays_per_tenant/replay_index_max",
                "must be at least 1 (a large number for practically no limit)",
            ));
        }
        if self.api.replays_per_tenant > self.api.replays_running {
            return Err(ConfigError::invalid(
                "api.replays_per_tenant",
                "must not exceed api.replays_running",
            ));
        }
        if self.api.tenant_replay_window.is_zero() {
            return Err(ConfigError::invalid(
                "api.tenant_replay_window",
                "must be longer than zero",
            ));
        }
        if !self.api.public_url.is_empty() {
            let url = url::Url::parse(&self.api.public_url)
                .map_err(|e| ConfigError::invalid("api.public_url", e.to_string()))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(ConfigError::invalid(
                    "api.public_url",
                    "must be an http:// or https:// address with a host",
                ));
            }
        }
        if self.api.session_ttl.is_zero() || self.api.session_ttl > Duration::from_secs(7 * 86_400)
        {
            return Err(ConfigError::invalid(
                "api.session_ttl",
                "must be longer than zero and at most 7 days",
            ));
        }
        for origin in &self.api.frame_ancestors {
            // One source expression each: no spaces or semicolons to smuggle directives in.
            if origin.is_empty()
                || origin
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, ';' | ',' | '\'' | '"'))
            {
                return Err(ConfigError::invalid(
                    "api.frame_ancestors",
                    format!("{origin:?} is not an origin such as https://app.example.com"),
                ));
            }
        }
        for token in &self.api.tokens {
            SecretSource::parse(&token.token)
                .map_err(|e| ConfigError::invalid("api.tokens", format!("token: {e}")))?;
            if let Some(tenant) = &token.tenant {
                crate::contract::envelope::check_tenant(tenant)
                    .map_err(|e| ConfigError::invalid("api.tokens", format!("tenant: {e}")))?;
            }
        }
        let lease = self.lease_window();
        if lease >= self.broker.consumer_timeout {
            return Err(ConfigError::invalid(
                "broker.consumer_timeout",
                format!(
                    "the longest a delivery is held before its outcome is first published (an \
                     OAuth2 token {} + the attempt, lookup through a proxy {} + connect {} + \
                     request {}, + one publish {} + slack {} = {}) must stay below the broker's consumer_timeout ({}); a \
                     publish that fails is tried again only while another fits before \
                     consumer_timeout less the slack. Raise consumer_timeout in rabbitmq.conf, or \
                     lower the timeouts",
                    fmt_duration(self.http.token_timeout),
                    fmt_duration(self.lookup_budget()),
                    fmt_duration(self.http.connect_timeout),
                    fmt_duration(self.http.request_timeout),
                    fmt_duration(self.publish_budget()),
                    fmt_duration(self.worker.lease_slack),
                    fmt_duration(lease),
                    fmt_duration(self.broker.consumer_timeout),
                ),
            ));
        }
        if self.worker.shutdown_grace <= self.attempt_budget() {
            return Err(ConfigError::invalid(
                "worker.shutdown_grace",
                format!(
                    "must be longer than one attempt and its publish (OAuth2 token + lookup \
                     through a proxy + connect + request + confirm = {}) so a drain can finish \
                     what is in flight",
                    fmt_duration(self.attempt_budget())
                ),
            ));
        }
        Ok(())
    }

    /// The longest one delivery can be held before its outcome is first published, and that
    /// publish: a wait for a fast endpoint's slot (`endpoints.busy_wait`), an OAuth2 token's
    /// fetch (for subscriptions with one), the HTTP attempt and one publish
    /// ([`Config::publish_budget`]). Nothing else waits while holding the delivery: an endpoint
    /// that is slow, stuck or down defers at once, unpaced (a deferral is one confirmed
    /// publish, like a retry). A publish that fails is tried again within [`Config::lease`],
    /// not within this.
    pub fn attempt_budget(&self) -> Duration {
        self.endpoints.busy_wait
            + self.http.token_timeout
            + self.lookup_budget()
            + self.http.connect_timeout
            + self.http.request_timeout
            + self.publish_budget()
    }

    /// Through a proxy, hookrelay resolves and checks the target itself before the request
    /// (the proxy would resolve it out of the policy's sight), bounded by `http.connect_timeout`;
    /// without one the lookup is part of the connect.
    pub fn lookup_budget(&self) -> Duration {
        match self.egress.proxy {
            Some(_) => self.http.connect_timeout,
            None => Duration::ZERO,
        }
    }

    /// The longest one confirmed publish may take: one deadline covers the wait for a free
    /// channel, opening it, handing the message over and its confirm (`Publisher::publish`).
    pub fn publish_budget(&self) -> Duration {
        self.amqp.confirm_timeout
    }

    /// How long after it is handed over a delivery may be held: the broker's `consumer_timeout`
    /// less `worker.lease_slack`. A republish that fails is tried again within it.
    pub fn lease(&self) -> Duration {
        self.broker
            .consumer_timeout
            .saturating_sub(self.worker.lease_slack)
    }

    /// The attempt budget plus slack: what the broker's `consumer_timeout` must exceed.
    pub fn lease_window(&self) -> Duration {
        self.attempt_budget() + self.worker.lease_slack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BrokerConfig, WorkerConfig, env};

    #[test]
    fn defaults_validate_and_keep_the_lease_rule() {
        let config = Config::load(None, &env(&[])).unwrap();
        assert_eq!(config, Config::default());
        // The shipped defaults: 5s + 3s + 10s + 5s + 30s slack is well below the 5m
        // consumer_timeout that rabbitmq/rabbitmq.conf sets.
        assert!(config.lease_window() * 4 <= config.broker.consumer_timeout);
    }

    #[test]
    fn the_lease_rule_counts_every_wait_a_delivery_can_make() {
        let defaults = Config::default();
        // A fast endpoint's slot 20ms, an OAuth2 token 5s, the attempt (3s + 15s), one publish
        // under one deadline 5s, then 30s slack. No deferral pacing: it would hold a lane slot.
        assert_eq!(defaults.attempt_budget(), Duration::from_millis(28_020));
        assert_eq!(defaults.lease_window(), Duration::from_millis(58_020));
        assert!(defaults.validate().is_ok());
        assert_eq!(defaults.lease(), Duration::from_secs(270));
        let mut slow = Config::default();
        slow.http.request_timeout = Duration::from_secs(300);
        let refused = slow.validate().unwrap_err().to_string();
        assert!(
            refused.contains("broker.consumer_timeout") && refused.contains("request 5m"),
            "{refused}"
        );
        // Through a proxy, the pre-send lookup of the target (bounded by the connect timeout)
        // comes before the attempt's own connect.
        let proxied = Config::load(
            None,
            &env(&[("HOOKRELAY_EGRESS_PROXY", "http://proxy.internal:3128")]),
        )
        .unwrap();
        // slot 0.02 + token 5 + lookup 3 + connect 3 + request 15 + confirm 5
        assert_eq!(proxied.attempt_budget(), Duration::from_millis(31_020));
        // The drain must have room for an attempt and its publish.
        let mut short_grace = Config::default();
        short_grace.worker.shutdown_grace = Duration::from_secs(15);
        let refused = short_grace.validate().unwrap_err().to_string();
        assert!(
            refused.contains("worker.shutdown_grace") && refused.contains("28s"),
            "{refused}"
        );
    }

    #[test]
    fn shipped_rabbitmq_conf_matches_the_default_consumer_timeout() {
        let conf = include_str!("../../rabbitmq/rabbitmq.conf");
        let ms: u64 = conf
            .lines()
            .find_map(|l| l.trim().strip_prefix("consumer_timeout"))
            .and_then(|rest| rest.trim().strip_prefix('='))
            .map(|v| v.trim().parse().unwrap())
            .expect("rabbitmq.conf sets consumer_timeout");
        assert_eq!(
            Duration::from_millis(ms),
            BrokerConfig::default().consumer_timeout
        );
        assert!(Config::default().lease_window() < Duration::from_millis(ms));
    }

    #[test]
    fn errors_name_the_field() {
        let err = Config::load(None, &env(&[("HOOKRELAY_WORKER_IN_FLIGHT", "lots")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("HOOKRELAY_WORKER_IN_FLIGHT: expected a whole number")
        );

        let err = Config::load(None, &env(&[("HOOKRELAY_WORKR_PREFETCH", "1")])).unwrap_err();
        assert!(err.to_string().contains("not a hookrelay setting"));

        let err = Config::load(
            None,
            &env(&[("HOOKRELAY_HTTP_REQUEST_TIMEOUT", "10 parsecs")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("request_timeout"), "{err}");

        let err =
            Config::load(None, &env(&[("HOOKRELAY_BROKER_CONSUMER_TIMEOUT", "20s")])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid setting broker.consumer_timeout"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[http]\nrequest_timout = \"20s\"\n").unwrap();
        let err = Config::load(Some(&path), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("request_timout"), "{err}");
    }

    #[test]
    fn a_management_url_must_be_http_with_a_host() {
        for bad in [
            "localhost:15672",
            "ftp://h:21",
            "guest:guest@localhost:15672",
        ] {
            let err = Config::load(None, &env(&[("HOOKRELAY_MANAGEMENT_URL", bad)])).unwrap_err();
            let shown = err.to_string();
            assert!(
                shown.starts_with("invalid setting management.url"),
                "{bad}: {shown}"
            );
            assert!(!shown.contains("guest:guest"), "{shown}");
        }
    }

    #[test]
    fn a_lane_share_is_a_fraction_above_zero() {
        for bad in ["0", "1.5", "-0.25", "NaN"] {
            let err = Config::load(None, &env(&[("HOOKRELAY_ENDPOINTS_LANE_SHARE", bad)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("invalid setting endpoints.lane_share"),
                "{bad}: {err}"
            );
        }
        for good in ["0.1", "1"] {
            let config =
                Config::load(None, &env(&[("HOOKRELAY_ENDPOINTS_LANE_SHARE", good)])).unwrap();
            assert_eq!(config.endpoints.lane_share.to_string(), good);
        }
    }

    #[test]
    fn the_api_quotas_and_replay_bounds_are_typed_and_checked() {
        let config = Config::load(
            None,
            &env(&[
                ("HOOKRELAY_API_TENANT_REPLAY_RATE", "600/m"),
                ("HOOKRELAY_API_TENANT_REPLAY_WINDOW", "2h"),
                ("HOOKRELAY_API_REPLAYS_PER_TENANT", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(config.api.tenant_replay_rate, "10/s".parse().unwrap());
        assert_eq!(config.api.tenant_replay_window, Duration::from_secs(7200));
        assert_eq!(config.api.replays_per_tenant, 2);
        for (var, value, expected) in [
            ("HOOKRELAY_API_TENANT_REPLAY_RATE", "1e-300/s", "between"),
            ("HOOKRELAY_API_REPLAYS_PER_TENANT", "5", "must not exceed"),
            ("HOOKRELAY_API_REPLAYS_RUNNING", "0", "at least 1"),
            ("HOOKRELAY_API_REPLAY_INDEX_MAX", "0", "at least 1"),
            ("HOOKRELAY_API_WRITES_PER_MINUTE", "0", "at least 1"),
            ("HOOKRELAY_API_MAX_EVENT_TYPES", "0", "at least 1"),
            (
                "HOOKRELAY_API_TENANT_REPLAY_WINDOW",
                "0s",
                "longer than zero",
            ),
        ] {
            let err = Config::load(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.to_string().contains(expected), "{var}: {err}");
        }
    }

    #[test]
    fn the_retry_share_splits_a_budget() {
        let w = WorkerConfig::default();
        assert_eq!(w.split(300), (210, 90));
        assert_eq!(w.split(500), (350, 150));
        assert_eq!(w.split(2), (1, 1));
        assert_eq!(w.split(10), (7, 3));
        let err = Config::load(None, &env(&[("HOOKRELAY_WORKER_RETRY_SHARE", "1.5")])).unwrap_err();
        assert!(err.to_string().contains("worker.retry_share"), "{err}");
    }
}
