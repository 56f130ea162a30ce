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

/// How the client id and secret reach the token endpoint (RFC 6749 section 2.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ClientAuthMethod {
    /// `Authorization: Basic` (`client_secret_basic`): what the RFC asks servers to support.
    #[default]
    Basic,
    /// `client_id` and `client_secret` in the form body (`client_secret_post`).
    Post,
}

impl ClientAuthMethod {
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "basic" | "client_secret_basic" => Ok(Self::Basic),
            "post" | "client_secret_post" => Ok(Self::Post),
            other => Err(format!(
                "{other:?}: expected \"basic\" (client_secret_basic) or \"post\" (client_secret_post)"
            )),
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

/// Mutual TLS: the client certificate (chain, PEM) and its private key (PEM) presented to the
/// endpoint, and optionally the CA its own certificate must chain to (instead of the system's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientTls {
    pub cert: SecretRef,
    pub key: SecretRef,
    pub ca: Option<SecretRef>,
}
