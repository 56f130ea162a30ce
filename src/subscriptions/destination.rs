//! Where a subscription's deliveries go: an HTTP endpoint (`http://`, `https://`), or a
//! partner's RabbitMQ (`amqp://`, `amqps://`, the vhost in the path) with the exchange and
//! routing key to publish to. The broker's login is the subscription's `basic_auth` (its
//! password a sealed secret like every other); its client certificate is `tls`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The longest exchange name or routing key AMQP 0-9-1 carries (a short string).
pub const MAX_AMQP_NAME: usize = 255;

/// Where on a partner's broker a delivery is published.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AmqpTarget {
    /// The exchange on the partner's broker; `""` is its default exchange (the routing key
    /// names a queue).
    #[schema(example = "partner.webhooks", max_length = 255)]
    pub exchange: String,
    /// A fixed routing key; absent: each event's type (`order.created`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "hookrelay.orders", max_length = 255)]
    pub routing_key: Option<String>,
}

impl AmqpTarget {
    /// The routing key of an event of type `event_type`.
    pub fn routing_key_for<'a>(&'a self, event_type: &'a str) -> &'a str {
        self.routing_key.as_deref().unwrap_or(event_type)
    }

    /// The exchange and routing key, or the field at fault and why.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let name_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
        if self.exchange.len() > MAX_AMQP_NAME || !self.exchange.chars().all(name_ok) {
            return Err((
                "amqp.exchange",
                format!(
                    "{:?}: at most {MAX_AMQP_NAME} letters, digits, '-', '_', '.' or ':'",
                    self.exchange
                ),
            ));
        }
        if let Some(key) = &self.routing_key
            && (key.len() > MAX_AMQP_NAME || key.chars().any(char::is_control))
        {
            return Err((
                "amqp.routing_key",
                format!("at most {MAX_AMQP_NAME} bytes, no control characters"),
            ));
        }
        Ok(())
    }
}

/// Whether deliveries to `url` are published to a broker rather than POSTed.
pub fn is_amqp(url: &reqwest::Url) -> bool {
    matches!(url.scheme(), "amqp" | "amqps")
}

/// Whether the connection to `url` is TLS.
pub fn is_tls(url: &reqwest::Url) -> bool {
    matches!(url.scheme(), "https" | "amqps")
}

/// The port of `url`, the scheme's own when none is written (5672, 5671 for AMQP).
pub fn port(url: &reqwest::Url) -> Option<u16> {
    url.port_or_known_default().or(match url.scheme() {
        "amqp" => Some(5672),
        "amqps" => Some(5671),
        _ => None,
    })
}

/// What a destination's settings cannot be together, as (field, why): an AMQP URL without
/// an exchange, AMQP settings for an HTTP URL, OAuth2 (an HTTP header) for a broker.
pub fn conflicts(
    url: &reqwest::Url,
    amqp: Option<&AmqpTarget>,
    oauth2: bool,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    match (is_amqp(url), amqp) {
        (true, None) => out.push((
            "amqp",
            "an amqp:// or amqps:// url needs the exchange (and routing key) to publish to: \
             give amqp"
                .into(),
        )),
        (false, Some(_)) => out.push((
            "amqp",
            "amqp settings are for an amqp:// or amqps:// url; this url is HTTP".into(),
        )),
        (true, Some(target)) => {
            if let Err(problem) = target.check() {
                out.push(problem);
            }
            if oauth2 {
                out.push((
                    "oauth2",
                    "a broker takes a user name and password (basic_auth), not an OAuth2 token"
                        .into(),
                ));
            }
        }
        (false, None) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> reqwest::Url {
        raw.parse().unwrap()
    }

    #[test]
    fn an_amqp_url_needs_its_target_and_an_http_url_has_none() {
        let target = AmqpTarget {
            exchange: "partner.webhooks".into(),
            routing_key: None,
        };
        assert!(conflicts(&url("amqps://b.example/%2f"), Some(&target), false).is_empty());
        assert!(conflicts(&url("https://h.example/x"), None, true).is_empty());
        assert_eq!(
            conflicts(&url("amqp://b.example"), None, false)[0].0,
            "amqp"
        );
        assert_eq!(
            conflicts(&url("https://h.example"), Some(&target), false)[0].0,
            "amqp"
        );
        assert_eq!(
            conflicts(&url("amqp://b.example"), Some(&target), true)[0].0,
            "oauth2"
        );
        let bad = AmqpTarget {
            exchange: "no spaces".into(),
            routing_key: Some("k".into()),
        };
        assert_eq!(
            conflicts(&url("amqp://b.example"), Some(&bad), false)[0].0,
            "amqp.exchange"
        );
        assert_eq!(target.routing_key_for("order.created"), "order.created");
        assert_eq!(port(&url("amqps://b.example")), Some(5671));
        assert_eq!(port(&url("amqp://b.example:5673")), Some(5673));
    }
}
