//! How a subscription authenticates to its endpoint, on top of the signature: HTTP basic auth,
//! an OAuth2 bearer token got with the client-credentials grant, or a TLS client certificate.
//! Every secret is a reference, read when an attempt is made.

use super::secrets::SecretRef;

/// HTTP basic authentication to the endpoint: the password a secret reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    pub username: String,
    pub password: SecretRef,
}

/// A basic-auth user name that cannot be one: empty, or with the `:` that ends it in the
/// `Authorization` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a user name is not empty and has no ':'")]
pub struct UsernameError;

/// A basic-auth user name, or why not.
pub fn check_username(username: &str) -> Result<(), UsernameError> {
    if username.is_empty() || username.contains(':') {
        return Err(UsernameError);
    }
    Ok(())
}

/// How the client id and secret reach the token endpoint (RFC 6749 section 2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ClientAuthMethod {
    /// `Authorization: Basic` (`client_secret_basic`): what the RFC asks servers to support.
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the form body (`client_secret_post`).
    Post,
}

/// An `auth_method` that is neither of the two hookrelay sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: expected \"basic\" (client_secret_basic) or \"post\" (client_secret_post)")]
pub struct UnknownAuthMethod(pub String);

impl ClientAuthMethod {
    pub fn parse(raw: &str) -> Result<Self, UnknownAuthMethod> {
        match raw {
            "basic" | "client_secret_basic" => Ok(Self::Basic),
            "post" | "client_secret_post" => Ok(Self::Post),
            other => Err(UnknownAuthMethod(other.to_owned())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Basic => "basic",
            Self::Post => "post",
        }
    }
}

/// OAuth2 client credentials: hookrelay asks `token_url` for a token and sends it as
/// `Authorization: Bearer` until shortly before it expires.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OAuth2 {
    /// An http(s) URL; it passes the egress policy like an endpoint.
    pub token_url: reqwest::Url,
    pub client_id: String,
    pub client_secret: SecretRef,
    /// Space-separated scopes, sent as they are written; none when absent.
    pub scope: Option<String>,
    /// Some identity providers want the API the token is for (`audience`).
    pub audience: Option<String>,
    pub method: ClientAuthMethod,
}

impl OAuth2 {
    /// Checked settings, or the field at fault and why.
    pub fn build(
        token_url: &str,
        client_id: &str,
        client_secret: SecretRef,
        scope: Option<&str>,
        audience: Option<&str>,
        auth_method: Option<&str>,
    ) -> Result<Self, (&'static str, String)> {
        let token_url =
            super::parse::parse_url(token_url).map_err(|e| ("token_url", e.to_string()))?;
        if client_id.is_empty() {
            return Err(("client_id", "a client id is not empty".into()));
        }
        let method = match auth_method {
            None => ClientAuthMethod::default(),
            Some(raw) => {
                ClientAuthMethod::parse(raw).map_err(|e| ("auth_method", e.to_string()))?
            }
        };
        let text = |v: Option<&str>| v.filter(|s| !s.is_empty()).map(str::to_owned);
        Ok(Self {
            token_url,
            client_id: client_id.to_owned(),
            client_secret,
            scope: text(scope),
            audience: text(audience),
            method,
        })
    }
}

/// What a subscription's ways of authenticating cannot be together, as (field, why): two
/// sources of `Authorization`, a client certificate for an endpoint that is not TLS, or a
/// destination's own conflicts ([`super::destination::conflicts`]).
pub fn conflicts(
    url: &reqwest::Url,
    amqp: Option<&super::AmqpTarget>,
    authorization_header: bool,
    basic: bool,
    oauth2: bool,
    tls: bool,
) -> Vec<(&'static str, String)> {
    let mut out = super::destination::conflicts(url, amqp, oauth2);
    let sources = [
        (authorization_header, "an \"authorization\" header"),
        (basic, "basic_auth"),
        (oauth2, "oauth2"),
    ];
    let set: Vec<&str> = sources.iter().filter(|s| s.0).map(|s| s.1).collect();
    if set.len() > 1 {
        out.push((
            "basic_auth",
            format!(
                "{} would each set the Authorization header; keep one",
                set.join(" and ")
            ),
        ));
    }
    if tls && !super::destination::is_tls(url) {
        out.push(("tls", TLS_ONLY.into()));
    }
    out
}

/// Mutual TLS: the client certificate (chain, PEM) and its private key (PEM) presented to the
/// endpoint, and optionally the CA its own certificate must chain to (instead of the system's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientTls {
    pub cert: SecretRef,
    pub key: SecretRef,
    pub ca: Option<SecretRef>,
}

/// Why a client certificate is refused for a URL without TLS.
pub const TLS_ONLY: &str =
    "a client certificate is presented over TLS only: the url must be https:// or amqps://";
