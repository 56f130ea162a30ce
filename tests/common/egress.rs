//! The egress seams as tests fill them: a policy allowing some ranges, and a resolver with fixed
//! answers for names no public DNS knows.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use hookrelay::config::EgressConfig;
use hookrelay::delivery::egress::{EgressPolicy, Lookup};

/// A policy that allows `cidrs` on top of the defaults.
pub fn allowing(cidrs: &[&str]) -> EgressPolicy {
    EgressPolicy::from_config(&EgressConfig {
        allow: cidrs.iter().map(|c| c.parse().expect("a CIDR")).collect(),
        ..EgressConfig::default()
    })
}

/// Fixed answers: `name -> addresses`.
#[derive(Debug, Default, Clone)]
pub struct StaticLookup(pub HashMap<String, Vec<IpAddr>>);

impl StaticLookup {
    pub fn with(mut self, host: &str, addrs: &[&str]) -> Self {
        self.0.insert(
            host.to_owned(),
            addrs
                .iter()
                .map(|a| a.parse().expect("an IP address"))
                .collect(),
        );
        self
    }
}

impl Lookup for StaticLookup {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>> {
        Box::pin(async move {
            self.0.get(host).cloned().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no such host: {host}"),
                )
            })
        })
    }
}
