//! `[traces]`: OpenTelemetry traces over OTLP (docs/tracing.md). Off while no endpoint is set.
//! The standard `OTEL_*` variables fill these settings in before the file and `HOOKRELAY_*` do,
//! so a deployment configured the way every OpenTelemetry SDK is configured works as is.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Env, shown_url};

/// How spans travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP over gRPC, to port 4317 by convention.
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP over HTTP with protobuf bodies, to `<endpoint>/v1/traces` (port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// Which traces are recorded (`OTEL_TRACES_SAMPLER`, with `OTEL_TRACES_SAMPLER_ARG` as the
/// ratio of the two ratio samplers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceSampler {
    AlwaysOn,
    AlwaysOff,
    #[serde(rename = "traceidratio")]
    TraceIdRatio,
    /// The producer's decision when its context came with the event, else always.
    #[default]
    ParentbasedAlwaysOn,
    ParentbasedAlwaysOff,
    #[serde(rename = "parentbased_traceidratio")]
    ParentbasedTraceIdRatio,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracesConfig {
    /// The collector's OTLP endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT`), such as
    /// `http://otel-collector:4317`; empty: no traces. Over HTTP the traces path
    /// `/v1/traces` is added to it.
    pub endpoint: String,
    /// The traces endpoint itself (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), used as written,
    /// such as `http://otel-collector:4318/v1/traces`; wins over `endpoint` when set.
    pub traces_endpoint: String,
    pub protocol: OtlpProtocol,
    /// `service.name` of the spans (`OTEL_SERVICE_NAME`).
    pub service_name: String,
    pub sampler: TraceSampler,
    /// The ratio of the ratio samplers, 0 to 1 (`OTEL_TRACES_SAMPLER_ARG`).
    pub sampler_arg: f64,
    /// More resource attributes, `key=value,key=value` (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: String,
    /// Finished spans waiting for export at most; beyond, spans are dropped and counted
    /// (`hookrelay_trace_spans_dropped_total`), never waited for.
    pub queue: u32,
    /// Spans in one export request at most.
    pub batch: u32,
    /// The longest a finished span waits before its batch is sent.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// The longest one export request may take; its spans are dropped after.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for TracesConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            traces_endpoint: String::new(),
            protocol: OtlpProtocol::Grpc,
            service_name: "hookrelay".into(),
            sampler: TraceSampler::ParentbasedAlwaysOn,
            sampler_arg: 1.0,
            resource_attributes: String::new(),
            queue: 4096,
            batch: 512,
            export_interval: Duration::from_secs(1),
            export_timeout: Duration::from_secs(5),
        }
    }
}

impl TracesConfig {
    /// Whether spans are exported at all.
    pub fn enabled(&self) -> bool {
        self.export_url().is_some()
    }

    /// Where spans are sent: the traces endpoint as written, else the general endpoint (with
    /// `/v1/traces` over HTTP, as the specification says); `None` when neither is set.
    pub fn export_url(&self) -> Option<String> {
        let traces = self.traces_endpoint.trim();
        if !traces.is_empty() {
            return Some(traces.to_owned());
        }
        let base = self.endpoint.trim().trim_end_matches('/');
        match (base.is_empty(), self.protocol) {
            (true, _) => None,
            (false, OtlpProtocol::Grpc) => Some(base.to_owned()),
            (false, OtlpProtocol::HttpProtobuf) => Some(format!("{base}/v1/traces")),
        }
    }

    /// `OTEL_RESOURCE_ATTRIBUTES` as pairs; values are percent-decoded, as the specification
    /// says.
    pub fn resource_pairs(&self) -> Result<Vec<(String, String)>, ConfigError> {
        let mut pairs = Vec::new();
        for item in self.resource_attributes.split(',').map(str::trim) {
            if item.is_empty() {
                continue;
            }
            let Some((key, value)) = item.split_once('=') else {
                return Err(ConfigError::invalid(
                    "traces.resource_attributes",
                    format!("{item:?} is not key=value"),
                ));
            };
            let value = percent_encoding::percent_decode_str(value.trim())
                .decode_utf8()
                .map_err(|_| {
                    ConfigError::invalid(
                        "traces.resource_attributes",
                        format!("the value of {key:?} is not UTF-8 once decoded"),
                    )
                })?;
            pairs.push((key.trim().to_owned(), value.into_owned()));
        }
        Ok(pairs)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (field, value) in [
            ("traces.endpoint", &self.endpoint),
            ("traces.traces_endpoint", &self.traces_endpoint),
        ] {
            if value.trim().is_empty() {
                continue;
            }
            match reqwest::Url::parse(value.trim()) {
                Ok(url) if matches!(url.scheme(), "http" | "https") => {}
                Ok(url) => {
                    return Err(ConfigError::invalid(
                        field,
                        format!("{} is not an http:// or https:// URL", shown_url(&url)),
                    ));
                }
                // Not a URL, so nothing in it can be told apart as a credential: not shown.
                Err(e) => {
                    return Err(ConfigError::invalid(
                        field,
                        format!("not a URL ({e}); write it as http://collector:4317"),
                    ));
                }
            }
        }
        if !(0.0..=1.0).contains(&self.sampler_arg) {
            return Err(ConfigError::invalid(
                "traces.sampler_arg",
                "a ratio from 0 to 1",
            ));
        }
        if self.queue == 0 || self.batch == 0 || self.batch > self.queue {
            return Err(ConfigError::invalid(
                "traces.queue/batch",
                "both above 0, and a batch no bigger than the queue",
            ));
        }
        if self.export_timeout.is_zero() || self.export_interval.is_zero() {
            return Err(ConfigError::invalid(
                "traces.export_interval/export_timeout",
                "both above 0",
            ));
        }
        self.resource_pairs().map(|_| ())
    }
}

/// The standard variables, as a `[traces]` table laid under the file's: what they name,
/// the file and `HOOKRELAY_TRACES_*` may still change.
pub(super) fn otel_overlay(env: &dyn Env) -> Result<toml::Table, ConfigError> {
    let mut t = toml::Table::new();
    let mut set = |key: &str, var: &str| {
        if let Some(v) = env.var(var).filter(|v| !v.trim().is_empty()) {
            t.insert(key.into(), toml::Value::String(v.trim().to_owned()));
        }
    };
    set("endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT");
    set("traces_endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    set("protocol", "OTEL_EXPORTER_OTLP_PROTOCOL");
    // The signal's own variables win over the general ones, as the specification says.
    set("protocol", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
    set("service_name", "OTEL_SERVICE_NAME");
    set("sampler", "OTEL_TRACES_SAMPLER");
    set("resource_attributes", "OTEL_RESOURCE_ATTRIBUTES");
    if let Some(raw) = env.var("OTEL_TRACES_SAMPLER_ARG") {
        let arg = raw.trim().parse::<f64>().map_err(|_| ConfigError::Env {
            var: "OTEL_TRACES_SAMPLER_ARG".into(),
            message: format!("expected a ratio such as 0.25, found {raw:?}"),
        })?;
        t.insert("sampler_arg".into(), toml::Value::Float(arg));
    }
    // The specification's two ways of saying "no traces" win over an endpoint.
    let disabled = env
        .var("OTEL_SDK_DISABLED")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || env
            .var("OTEL_TRACES_EXPORTER")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    if disabled {
        for key in ["endpoint", "traces_endpoint"] {
            t.insert(key.into(), toml::Value::String(String::new()));
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, env};

    #[test]
    fn the_standard_variables_configure_traces() {
        let config = Config::load(
            None,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_SERVICE_NAME", "relay-eu"),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,team=a%20b",
                ),
            ]),
        )
        .unwrap();
        let t = &config.traces;
        assert!(t.enabled());
        assert_eq!(t.endpoint, "http://collector:4318");
        assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(t.service_name, "relay-eu");
        assert_eq!(t.sampler, TraceSampler::ParentbasedTraceIdRatio);
        assert_eq!(t.sampler_arg, 0.25);
        assert_eq!(
            t.resource_pairs().unwrap(),
            vec![
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("team".to_owned(), "a b".to_owned())
            ]
        );
    }

    #[test]
    fn traces_are_off_unless_configured_and_when_the_sdk_is_disabled() {
        assert!(!Config::load(None, &env(&[])).unwrap().traces.enabled());
        let off = Config::load(
            None,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_SDK_DISABLED", "true"),
            ]),
        )
        .unwrap();
        assert!(!off.traces.enabled());
    }

    #[test]
    fn the_traces_endpoint_is_used_as_written_and_wins_over_the_general_one() {
        let load = |vars: &[(&str, &str)]| Config::load(None, &env(vars)).unwrap().traces;
        let http = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
        let general = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318/");
        assert_eq!(
            load(&[general, http]).export_url().as_deref(),
            Some("http://a:4318/v1/traces")
        );
        let traces = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4318/spans");
        assert_eq!(
            load(&[general, traces, http]).export_url().as_deref(),
            Some("http://b:4318/spans")
        );
        assert_eq!(
            load(&[traces]).export_url().as_deref(),
            Some("http://b:4318/spans")
        );
        assert_eq!(
            load(&[general]).export_url().as_deref(),
            Some("http://a:4318")
        );
        let grpc_for_traces = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc");
        assert_eq!(load(&[http, grpc_for_traces]).protocol, OtlpProtocol::Grpc);
        assert!(!load(&[traces, ("OTEL_TRACES_EXPORTER", "none")]).enabled());
        let bad = Config::load(
            None,
            &env(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "b:4318")]),
        )
        .unwrap_err();
        assert!(bad.to_string().contains("traces.traces_endpoint"), "{bad}");
    }

    #[test]
    fn hookrelay_variables_win_over_the_standard_ones() {
        let config = Config::load(
            None,
            &env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("HOOKRELAY_TRACES_ENDPOINT", "http://b:4317"),
            ]),
        )
        .unwrap();
        assert_eq!(config.traces.endpoint, "http://b:4317");
    }

    #[test]
    fn bad_settings_name_their_field() {
        for (var, value, field) in [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "collector:4317",
                "traces.endpoint",
            ),
            ("OTEL_TRACES_SAMPLER_ARG", "2", "traces.sampler_arg"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "novalue",
                "traces.resource_attributes",
            ),
            ("HOOKRELAY_TRACES_QUEUE", "0", "traces.queue"),
        ] {
            let e = Config::load(None, &env(&[(var, value)])).unwrap_err();
            assert!(e.to_string().contains(field), "{var}: {e}");
        }
        assert!(Config::load(None, &env(&[("OTEL_TRACES_SAMPLER", "sometimes")])).is_err());
    }
}
