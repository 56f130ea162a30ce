//! A subscription's own headers and endpoint authentication as the store keeps them: the
//! settings that are not secret in the `request` column (JSON, the shape the API shows), and
//! each secret a row of `subscription_secrets` with its purpose (`header:x-api-key`,
//! `basic_auth.password`, `oauth2.client_secret`, `tls.cert`, `tls.key`, `tls.ca`).
//!
//! [`StoredRequest::of`] splits a subscription into the two; [`StoredRequest::assemble`] puts
//! them together again, checked as a file's entry is.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::subscriptions::auth::{check_username, conflicts};
use crate::subscriptions::headers::{check_header_name, check_header_value, reserved_header};
use crate::subscriptions::{
    AmqpTarget, BasicAuth, ClientTls, ExtraHeader, HeaderValueSpec, OAuth2, SecretRef, Subscription,
};

/// The purpose of a signing secret's row.
pub const SIGNING: &str = "signing";
pub const BASIC_PASSWORD: &str = "basic_auth.password";
pub const OAUTH2_CLIENT_SECRET: &str = "oauth2.client_secret";
pub const TLS_CERT: &str = "tls.cert";
pub const TLS_KEY: &str = "tls.key";
pub const TLS_CA: &str = "tls.ca";

/// The purpose of header `name`'s secret (lower case).
pub fn header_purpose(name: &str) -> String {
    format!("header:{}", name.to_ascii_lowercase())
}

/// A subscription's headers and authentication, without a secret value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredRequest {
    /// By lower-case name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, StoredHeader>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<StoredBasicAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth2: Option<StoredOAuth2>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<StoredTls>,
    /// Send the attempt's W3C `traceparent` to the endpoint (docs/tracing.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trace_context: bool,
    /// The exchange and routing key of an `amqp://` or `amqps://` destination
    /// (docs/destinations.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amqp: Option<AmqpTarget>,
}

/// A header: its value, or `secret: true` when the value is secret (never shown).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredHeader {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

/// Basic authentication: the user name (the password is secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredBasicAuth {
    pub username: String,
}

/// OAuth2 client credentials, without the client secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredOAuth2 {
    pub token_url: String,
    pub client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// `basic` (client_secret_basic) or `post` (client_secret_post).
    pub auth_method: String,
}

/// A client certificate is presented (certificate and key are kept as secrets); `ca`: the
/// endpoint's certificate must chain to a CA of the subscription's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredTls {
    pub ca: bool,
}

/// What [`StoredRequest::assemble`] gives back: the subscription's fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestParts {
    pub headers: Vec<ExtraHeader>,
    pub basic_auth: Option<BasicAuth>,
    pub oauth2: Option<OAuth2>,
    pub tls: Option<ClientTls>,
    pub trace_context: bool,
    pub amqp: Option<AmqpTarget>,
}

impl RequestParts {
    /// A subscription's parts, to split with [`StoredRequest::of`].
    pub fn of(sub: &Subscription) -> Self {
        Self {
            headers: sub.headers.clone(),
            basic_auth: sub.basic_auth.clone(),
            oauth2: sub.oauth2.clone(),
            tls: sub.tls.clone(),
            trace_context: sub.trace_context,
            amqp: sub.amqp.clone(),
        }
    }
}

impl StoredRequest {
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The settings of a subscription, and its secrets by purpose.
    pub fn of(parts: &RequestParts) -> (Self, Vec<(String, SecretRef)>) {
        let mut secrets = Vec::new();
        let mut stored = Self {
            trace_context: parts.trace_context,
            amqp: parts.amqp.clone(),
            ..Self::default()
        };
        for h in &parts.headers {
            let header = match &h.value {
                HeaderValueSpec::Static(v) => StoredHeader {
                    value: Some(v.clone()),
                    secret: false,
                },
                HeaderValueSpec::Secret(r) => {
                    secrets.push((header_purpose(&h.name), r.clone()));
                    StoredHeader {
                        value: None,
                        secret: true,
                    }
                }
            };
            stored.headers.insert(h.name.clone(), header);
        }
        if let Some(b) = &parts.basic_auth {
            stored.basic_auth = Some(StoredBasicAuth {
                username: b.username.clone(),
            });
            secrets.push((BASIC_PASSWORD.into(), b.password.clone()));
        }
        if let Some(o) = &parts.oauth2 {
            stored.oauth2 = Some(StoredOAuth2 {
                token_url: o.token_url.to_string(),
                client_id: o.client_id.clone(),
                scope: o.scope.clone(),
                audience: o.audience.clone(),
                auth_method: o.method.as_str().into(),
            });
            secrets.push((OAUTH2_CLIENT_SECRET.into(), o.client_secret.clone()));
        }
        if let Some(t) = &parts.tls {
            stored.tls = Some(StoredTls { ca: t.ca.is_some() });
            secrets.push((TLS_CERT.into(), t.cert.clone()));
            secrets.push((TLS_KEY.into(), t.key.clone()));
            if let Some(ca) = &t.ca {
                secrets.push((TLS_CA.into(), ca.clone()));
            }
        }
        (stored, secrets)
    }

    /// The subscription's fields from the settings and its secrets by purpose, checked as a
    /// file's entry is; the error names the field.
    pub fn assemble(
        &self,
        url: &reqwest::Url,
        secrets: &HashMap<String, SecretRef>,
    ) -> Result<RequestParts, AssembleError> {
        let secret = |purpose: &str| {
            secrets
                .get(purpose)
                .cloned()
                .ok_or_else(|| AssembleError::NoSecret(purpose.to_owned()))
        };
        let mut parts = RequestParts {
            trace_context: self.trace_context,
            amqp: self.amqp.clone(),
            ..RequestParts::default()
        };
        for (name, header) in &self.headers {
            // Refused on every write since it was reserved; a row stored before keeps delivering
            // (left out, its deliveries would be cancelled as deleted), without the header.
            if let Some(why) = reserved_header(name) {
                tracing::warn!(header = %name, "A stored subscription's header is left out of its requests: {why}");
                continue;
            }
            let lower = check_header_name(name).map_err(|e| AssembleError::field("headers", e))?;
            let value = match (&header.value, header.secret) {
                (Some(v), false) => {
                    check_header_value(name, v).map_err(|e| AssembleError::field("headers", e))?;
                    HeaderValueSpec::Static(v.clone())
                }
                (None, true) => HeaderValueSpec::Secret(secret(&header_purpose(name))?),
                _ => {
                    return Err(AssembleError::field(
                        "headers",
                        format!("{name:?} needs a value or secret, not both"),
                    ));
                }
            };
            parts.headers.push(ExtraHeader { name: lower, value });
        }
        if let Some(b) = &self.basic_auth {
            check_username(&b.username)
                .map_err(|e| AssembleError::field("basic_auth.username", e))?;
            parts.basic_auth = Some(BasicAuth {
                username: b.username.clone(),
                password: secret(BASIC_PASSWORD)?,
            });
        }
        if let Some(o) = &self.oauth2 {
            parts.oauth2 = Some(
                OAuth2::build(
                    &o.token_url,
                    &o.client_id,
                    secret(OAUTH2_CLIENT_SECRET)?,
                    o.scope.as_deref(),
                    o.audience.as_deref(),
                    Some(&o.auth_method),
                )
                .map_err(|(field, e)| AssembleError::field(format!("oauth2.{field}"), e))?,
            );
        }
        if let Some(t) = &self.tls {
            parts.tls = Some(ClientTls {
                cert: secret(TLS_CERT)?,
                key: secret(TLS_KEY)?,
                ca: if t.ca { Some(secret(TLS_CA)?) } else { None },
            });
        }
        let problems = conflicts(
            url,
            self.amqp.as_ref(),
            self.headers.contains_key("authorization"),
            parts.basic_auth.is_some(),
            parts.oauth2.is_some(),
            parts.tls.is_some(),
        );
        if let Some((field, why)) = problems.into_iter().next() {
            return Err(AssembleError::field(field, why));
        }
        Ok(parts)
    }
}

/// Why stored request settings do not make a subscription's requests. The row is at fault
/// (written by hand, or its secrets deleted): it is left out and reported, not retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// A secret the settings use is not stored.
    #[error("{0}: no secret stored")]
    NoSecret(String),
    /// A field that does not check as a file's entry would.
    #[error("{field}: {message}")]
    Field { field: String, message: String },
}

impl AssembleError {
    fn field(field: impl Into<String>, message: impl ToString) -> Self {
        Self::Field {
            field: field.into(),
            message: message.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subscriptions::ClientAuthMethod;

    #[test]
    fn settings_and_secrets_split_and_assemble_again() {
        let parts = RequestParts {
            headers: vec![
                ExtraHeader {
                    name: "x-team".into(),
                    value: HeaderValueSpec::Static("orders".into()),
                },
                ExtraHeader {
                    name: "x-api-key".into(),
                    value: HeaderValueSpec::Secret(SecretRef::Env("K".into())),
                },
            ],
            basic_auth: None,
            trace_context: true,
            amqp: None,
            oauth2: Some(OAuth2 {
                token_url: "https://idp.example/token".parse().unwrap(),
                client_id: "c".into(),
                client_secret: SecretRef::Env("S".into()),
                scope: Some("a".into()),
                audience: None,
                method: ClientAuthMethod::Post,
            }),
            tls: Some(ClientTls {
                cert: SecretRef::Env("C".into()),
                key: SecretRef::Env("K2".into()),
                ca: None,
            }),
        };
        let (stored, secrets) = StoredRequest::of(&parts);
        let json = serde_json::to_string(&stored).unwrap();
        assert!(!json.contains("env:"), "{json}");
        let back: StoredRequest = serde_json::from_str(&json).unwrap();
        let secrets: HashMap<String, SecretRef> = secrets.into_iter().collect();
        let url: reqwest::Url = "https://h.example/x".parse().unwrap();
        let mut again = back.assemble(&url, &secrets).unwrap();
        again.headers.sort_by(|a, b| b.name.cmp(&a.name));
        assert_eq!(again, parts);

        let plain: reqwest::Url = "http://h.example/x".parse().unwrap();
        assert!(
            back.assemble(&plain, &secrets)
                .unwrap_err()
                .to_string()
                .contains("https://")
        );
        let mut missing = secrets.clone();
        missing.remove(TLS_KEY);
        assert_eq!(
            back.assemble(&url, &missing).unwrap_err().to_string(),
            "tls.key: no secret stored"
        );
    }

    #[test]
    fn a_row_stored_before_a_header_was_reserved_keeps_delivering_without_it() {
        let stored: StoredRequest = serde_json::from_value(serde_json::json!({
            "headers": {
                "expect": { "value": "100-continue" },
                "proxy-authorization": { "value": "Basic eA==" },
                "x-team": { "value": "orders" }
            }
        }))
        .unwrap();
        let url: reqwest::Url = "https://h.example/x".parse().unwrap();
        let parts = stored.assemble(&url, &HashMap::new()).unwrap();
        let names: Vec<&str> = parts.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["x-team"]);
    }
}
