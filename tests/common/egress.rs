//! The egress seams as tests fill them: a policy allowing some ranges, and resolvers: fixed
//! answers for names no public DNS knows, none at all, and answers that change (rebinding).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};

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

type Answer<'a> = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// A resolver that never answers, as a DNS server that drops queries behaves.
#[derive(Debug)]
pub struct SilentLookup;

impl Lookup for SilentLookup {
    fn lookup<'a>(&'a self, _host: &'a str) -> Answer<'a> {
        Box::pin(std::future::pending())
    }
}

/// A resolver that answers the first lookup with one address and every later one with another,
/// as a rebinding DNS server does.
#[derive(Debug)]
pub struct RebindingLookup {
    first: IpAddr,
    then: IpAddr,
    lookups: AtomicUsize,
}

impl RebindingLookup {
    pub fn new(first: IpAddr, then: IpAddr) -> Self {
        Self {
            first,
            then,
            lookups: AtomicUsize::new(0),
        }
    }
}

impl Lookup for RebindingLookup {
    fn lookup<'a>(&'a self, _host: &'a str) -> Answer<'a> {
        let n = self.lookups.fetch_add(1, Ordering::SeqCst);
        let addr = if n == 0 { self.first } else { self.then };
        Box::pin(async move { Ok(vec![addr]) })
    }
}
