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

/// A resolver that holds every lookup of one name until [`GatedLookup::open`], as a DNS server
/// that answers slowly does; other names are answered by `rest`.
#[derive(Debug)]
pub struct GatedLookup {
    host: String,
    addrs: Vec<IpAddr>,
    rest: StaticLookup,
    held: AtomicUsize,
    gate: tokio::sync::watch::Sender<bool>,
}

impl GatedLookup {
    pub fn new(host: &str, addrs: &[&str], rest: StaticLookup) -> Self {
        Self {
            host: host.to_owned(),
            addrs: addrs
                .iter()
                .map(|a| a.parse().expect("an IP address"))
                .collect(),
            rest,
            held: AtomicUsize::new(0),
            gate: tokio::sync::watch::channel(false).0,
        }
    }

    /// How many lookups of the name have started (held until the gate opens).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Answers the held lookups, and every later one at once.
    pub fn open(&self) {
        self.gate.send_replace(true);
    }
}

impl Lookup for GatedLookup {
    fn lookup<'a>(&'a self, host: &'a str) -> Answer<'a> {
        if host != self.host {
            return self.rest.lookup(host);
        }
        let mut gate = self.gate.subscribe();
        self.held.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok(self.addrs.clone())
        })
    }
}
