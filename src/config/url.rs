//! URLs that may carry credentials: shown without them anywhere, handed whole to a client.

use std::fmt;
use std::str::FromStr;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use url::Url;

/// How a URL that may carry secrets is shown anywhere (errors, logs, headers, events):
/// `scheme://host[:port]/path`. User information and the query (where tokens travel) are left
/// out, and so is the fragment; a URL without a host shows its scheme alone.
pub fn shown_url(url: &Url) -> String {
    match url.host_str() {
        Some(host) => {
            let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}{}", url.scheme(), url.path())
        }
        None => format!("{}:", url.scheme()),
    }
}

/// A URL that may carry credentials: `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(Url);

impl SecretUrl {
    pub fn parse(text: &str) -> Result<Self, url::ParseError> {
        Url::parse(text).map(Self)
    }

    /// A URL this file writes as a default; the defaults are parsed by every test that loads a
    /// configuration.
    pub(super) fn shipped(text: &'static str) -> Self {
        Self::parse(text).expect("the shipped default URLs parse")
    }

    /// The full URL, credentials included. Only for handing to a client library.
    pub fn expose(&self) -> &str {
        self.0.as_str()
    }

    /// The parsed URL, credentials included. Only for handing to a client library.
    pub fn expose_url(&self) -> &Url {
        &self.0
    }

    /// The URL with no user information at all, for showing as a link.
    pub fn without_credentials(&self) -> String {
        let mut url = self.0.clone();
        if url.set_username("").is_err() || url.set_password(None).is_err() {
            return self.redacted();
        }
        url.to_string()
    }

    /// The URL with any password replaced by `***`.
    pub fn redacted(&self) -> String {
        let text = self.0.as_str();
        if self.0.cannot_be_a_base() {
            // Written without `scheme://` (`user:pass@host:port` parses as scheme `user`):
            // whatever precedes the `@` may be a password.
            return match text.rfind('@') {
                Some(at) => format!("***{}", &text[at..]),
                None => text.to_owned(),
            };
        }
        let mut url = self.0.clone();
        if !url.username().is_empty() || url.password().is_some() {
            let _ = url.set_password(Some("***"));
        }
        url.to_string()
    }
}

impl FromStr for SecretUrl {
    type Err = url::ParseError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl From<Url> for SecretUrl {
    fn from(url: Url) -> Self {
        Self(url)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        // The text is not repeated: it may hold a password.
        Self::parse(&text).map_err(|e| D::Error::custom(format!("expected a URL ({e})")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, env};

    #[test]
    fn a_shown_url_has_no_user_information_query_or_fragment() {
        let shown = |s: &str| shown_url(&Url::parse(s).unwrap());
        assert_eq!(
            shown("https://user:pw@hooks.example:8443/a/b?token=t&x=1#frag"),
            "https://hooks.example:8443/a/b"
        );
        assert_eq!(shown("http://u@[::1]/"), "http://[::1]/");
        assert_eq!(shown("mailto:someone@example.com"), "mailto:");
    }

    #[test]
    fn a_proxy_password_never_reaches_debug_output() {
        let config = Config::load(
            None,
            &env(&[(
                "HOOKRELAY_EGRESS_PROXY",
                "http://ops:s3cret@proxy.internal:3128",
            )]),
        )
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("ops:***@proxy.internal:3128"), "{shown}");
        let proxy = config.egress.proxy.unwrap();
        assert_eq!(proxy.expose(), "http://ops:s3cret@proxy.internal:3128/");
        assert_eq!(proxy.without_credentials(), "http://proxy.internal:3128/");
    }

    #[test]
    fn credentials_never_reach_debug_output() {
        let config = Config::default();
        let shown = format!("{config:?}");
        assert!(!shown.contains("guest:guest"), "{shown}");
        assert!(shown.contains("guest:***@127.0.0.1:5672"));
        // Written without a scheme, the part before the `@` may be a password.
        let bare = SecretUrl::parse("guest:s3cret@localhost:15672").unwrap();
        assert_eq!(bare.to_string(), "***@localhost:15672");
        assert_eq!(bare.without_credentials(), "***@localhost:15672");
    }
}
