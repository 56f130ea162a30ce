//! The RabbitMQ management HTTP API: what `topology plan` compares against, and what tools and
//! tests use to look at queues and connections.

use std::fmt;
use std::time::Duration;

use serde_json::Value;

use crate::broker::topology::{BrokerExchange, BrokerObjects, BrokerQueue};
use crate::config::SecretUrl;

#[derive(Debug, thiserror::Error)]
pub enum ManagementError {
    #[error(
        "the management API at {url} is not reachable ({message}); is the rabbitmq_management \
         plugin enabled (`rabbitmq-plugins enable rabbitmq_management`)?"
    )]
    Unreachable { url: String, message: String },
    #[error("the management API refused {what}: HTTP {status} {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
    #[error("invalid management URL {0}")]
    BadUrl(String),
    #[error("unexpected answer from the management API for {what}: {message}")]
    Unexpected { what: String, message: String },
}

/// A client for one broker's management API, scoped to one vhost. `Debug` leaves the password out.
#[derive(Clone)]
pub struct Management {
    client: reqwest::Client,
    base: reqwest::Url,
    user: String,
    password: String,
    shown: String,
    vhost: String,
}

impl fmt::Debug for Management {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Management")
            .field("base", &self.shown)
            .field("user", &self.user)
            .field("password", &"***")
            .field("vhost", &self.vhost)
            .finish_non_exhaustive()
    }
}

impl Management {
    /// `url` carries the credentials (`http://user:pass@host:15672`); `vhost` is the one the
    /// AMQP URL names.
    pub fn new(url: &SecretUrl, vhost: &str) -> Result<Self, ManagementError> {
        let mut base = url.expose_url().clone();
        // A URL without `scheme://` (`localhost:15672`) parses, but has no path to add to.
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(ManagementError::BadUrl(format!(
                "{url}: expected http(s)://user:pass@host:15672"
            )));
        }
        let user = percent_decode(base.username());
        let password = percent_decode(base.password().unwrap_or_default());
        let _ = base.set_username("");
        let _ = base.set_password(None);
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .map_err(|e| ManagementError::BadUrl(e.to_string()))?;
        Ok(Self {
            client,
            shown: base.to_string(),
            base,
            user,
            password,
            vhost: vhost.to_owned(),
        })
    }

    /// The vhost of an AMQP URL (`/` when the URL names none).
    pub fn vhost_of(amqp_url: &SecretUrl) -> String {
        amqp_url
            .expose()
            .parse::<lapin::uri::AMQPUri>()
            .map(|u| u.vhost)
            .unwrap_or_else(|_| "/".to_owned())
    }

    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    /// `/api/<segments...>` with each segment percent-encoded (so vhost `/` becomes `%2F`).
    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, ManagementError> {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|()| ManagementError::BadUrl(self.shown.clone()))?;
            path.pop_if_empty().push("api");
            for s in segments {
                path.push(s);
            }
        }
        Ok(url)
    }

    async fn request(
        &self,
        method: reqwest::Method,
        segments: &[&str],
        body: Option<&Value>,
    ) -> Result<reqwest::Response, ManagementError> {
        let what = format!("{method} /api/{}", segments.join("/"));
        let mut req = self
            .client
            .request(method, self.url(segments)?)
            .basic_auth(&self.user, Some(&self.password));
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| ManagementError::Unreachable {
            url: self.shown.clone(),
            message: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        if resp.status().is_success() {
            Ok(resp)
        } else {
            let body = resp.text().await.unwrap_or_default();
            Err(ManagementError::Status { what, status, body })
        }
    }

    pub async fn get(&self, segments: &[&str]) -> Result<Value, ManagementError> {
        let what = format!("/api/{}", segments.join("/"));
        self.request(reqwest::Method::GET, segments, None)
            .await?
            .json()
            .await
            .map_err(|e| ManagementError::Unexpected {
                what,
                message: e.to_string(),
            })
    }

    /// `GET`, with `None` for 404.
    pub async fn get_optional(&self, segments: &[&str]) -> Result<Option<Value>, ManagementError> {
        match self.get(segments).await {
            Ok(v) => Ok(Some(v)),
            Err(ManagementError::Status { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn put(&self, segments: &[&str], body: &Value) -> Result<(), ManagementError> {
        self.request(reqwest::Method::PUT, segments, Some(body))
            .await
            .map(|_| ())
    }

    pub async fn post(&self, segments: &[&str], body: &Value) -> Result<Value, ManagementError> {
        let resp = self
            .request(reqwest::Method::POST, segments, Some(body))
            .await?;
        Ok(resp.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, segments: &[&str]) -> Result<(), ManagementError> {
        match self.request(reqwest::Method::DELETE, segments, None).await {
            Ok(_) | Err(ManagementError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The broker version, to show in messages and to check the API answers at all.
    pub async fn broker_version(&self) -> Result<String, ManagementError> {
        let overview = self.get(&["overview"]).await?;
        Ok(overview["rabbitmq_version"]
            .as_str()
            .unwrap_or("unknown")
            .to_owned())
    }

    /// The state of a feature flag (`enabled`, `disabled`), or `None` if the broker lacks it.
    pub async fn feature_flag(&self, name: &str) -> Result<Option<String>, ManagementError> {
        let flags = self.get(&["feature-flags"]).await?;
        Ok(flags.as_array().and_then(|list| {
            list.iter()
                .find(|f| f["name"] == name)
                .and_then(|f| f["state"].as_str().map(str::to_owned))
        }))
    }

    /// Exchanges, queues and bindings of the vhost, as `topology plan` compares them.
    pub async fn objects(&self) -> Result<BrokerObjects, ManagementError> {
        let vhost = self.vhost.as_str();
        let mut objects = BrokerObjects::default();
        let list = |v: Value, what: &str| -> Result<Vec<Value>, ManagementError> {
            match v {
                Value::Array(items) => Ok(items),
                other => Err(ManagementError::Unexpected {
                    what: what.to_owned(),
                    message: format!("expected a list, got {other}"),
                }),
            }
        };
        for x in list(self.get(&["exchanges", vhost]).await?, "exchanges")? {
            let name = x["name"].as_str().unwrap_or_default().to_owned();
            objects.exchanges.insert(
                name,
                BrokerExchange {
                    kind: x["type"].as_str().unwrap_or_default().to_owned(),
                    durable: x["durable"].as_bool().unwrap_or(false),
                    arguments: x["arguments"].as_object().cloned().unwrap_or_default(),
                },
            );
        }
        for q in list(self.get(&["queues", vhost]).await?, "queues")? {
            let name = q["name"].as_str().unwrap_or_default().to_owned();
            objects.queues.insert(
                name,
                BrokerQueue {
                    durable: q["durable"].as_bool().unwrap_or(false),
                    arguments: q["arguments"].as_object().cloned().unwrap_or_default(),
                },
            );
        }
        for b in list(self.get(&["bindings", vhost]).await?, "bindings")? {
            if b["destination_type"] == "queue" {
                objects.bindings.push((
                    b["source"].as_str().unwrap_or_default().to_owned(),
                    b["destination"].as_str().unwrap_or_default().to_owned(),
                    b["routing_key"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        Ok(objects)
    }

    /// One queue's details (`messages_ready`, `messages_unacknowledged`, `consumers`, rates...).
    pub async fn queue(&self, name: &str) -> Result<Option<Value>, ManagementError> {
        self.get_optional(&["queues", &self.vhost, name]).await
    }

    /// Closes (server side) every connection whose client-given name is `name`. Returns how
    /// many were closed.
    pub async fn close_connections_named(&self, name: &str) -> Result<usize, ManagementError> {
        let conns = self.get(&["connections"]).await?;
        let mut closed = 0;
        for c in conns.as_array().into_iter().flatten() {
            let client_name = c["client_properties"]["connection_name"].as_str();
            if client_name == Some(name)
                && let Some(id) = c["name"].as_str()
            {
                self.delete(&["connections", id]).await?;
                closed += 1;
            }
        }
        Ok(closed)
    }

    /// The connections whose client-given name is `name` (they appear a moment after connecting).
    pub async fn connections_named(&self, name: &str) -> Result<usize, ManagementError> {
        let conns = self.get(&["connections"]).await?;
        Ok(conns
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["client_properties"]["connection_name"].as_str() == Some(name))
            .count())
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_without_a_scheme_is_refused_when_the_client_is_built() {
        for bad in [
            "localhost:15672",
            "guest:guest@localhost:15672",
            "ftp://h:21/",
        ] {
            let err = Management::new(&SecretUrl::parse(bad).unwrap(), "/").unwrap_err();
            assert!(matches!(err, ManagementError::BadUrl(_)), "{bad}: {err}");
            assert!(!err.to_string().contains("guest:guest"), "{err}");
        }
        let api = Management::new(&SecretUrl::parse("http://u:p@h:15672").unwrap(), "/").unwrap();
        assert_eq!(
            api.url(&["queues", "/"]).unwrap().as_str(),
            "http://h:15672/api/queues/%2F"
        );
    }

    #[test]
    fn debug_output_leaves_the_password_out() {
        let api =
            Management::new(&SecretUrl::parse("http://ops:s3cret@h:15672").unwrap(), "/").unwrap();
        let shown = format!("{api:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("ops"), "{shown}");
    }
}
