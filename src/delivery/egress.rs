//! The egress policy: an endpoint URL is tenant-chosen data, so before any connection hookrelay
//! checks where it would go. The check runs on the addresses the HTTP client actually connects
//! to (inside its DNS resolver), so a name that resolves to a public address at one moment and an
//! internal one the next (DNS rebinding) cannot slip between check and connect.
//!
//! Blocked unless allow-listed: loopback, private (RFC 1918), link-local (169.254/16, including
//! cloud metadata at 169.254.169.254; fe80::/10), CGNAT (100.64/10), unspecified, multicast,
//! broadcast, documentation and other reserved ranges, unique-local (fc00::/7), and IPv4-mapped,
//! NAT64 and 6to4 forms of any blocked IPv4 address. A name with any blocked address is refused
//! as a whole.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use crate::config::{EgressConfig, SecretUrl, shown_url};

/// Why an address is not a place to send webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockedClass {
    Loopback,
    Private,
    LinkLocal,
    Cgnat,
    Unspecified,
    Multicast,
    Broadcast,
    Documentation,
    Reserved,
    UniqueLocal,
}

impl BlockedClass {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockedClass::Loopback => "loopback",
            BlockedClass::Private => "private",
            BlockedClass::LinkLocal => "link-local",
            BlockedClass::Cgnat => "carrier-grade NAT",
            BlockedClass::Unspecified => "unspecified",
            BlockedClass::Multicast => "multicast",
            BlockedClass::Broadcast => "broadcast",
            BlockedClass::Documentation => "documentation",
            BlockedClass::Reserved => "reserved",
            BlockedClass::UniqueLocal => "unique-local",
        }
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    (u128::from(ip) & mask) == (u128::from(Ipv6Addr::from(net)) & mask)
}

/// The class of a blocked IPv4 address, or `None` for a public one.
pub fn classify_v4(ip: Ipv4Addr) -> Option<BlockedClass> {
    use BlockedClass::*;
    let table: [([u8; 4], u32, BlockedClass); 17] = [
        ([255, 255, 255, 255], 32, Broadcast),
        ([0, 0, 0, 0], 32, Unspecified),
        ([0, 0, 0, 0], 8, Reserved),
        ([10, 0, 0, 0], 8, Private),
        ([172, 16, 0, 0], 12, Private),
        ([192, 168, 0, 0], 16, Private),
        ([100, 64, 0, 0], 10, Cgnat),
        ([127, 0, 0, 0], 8, Loopback),
        ([169, 254, 0, 0], 16, LinkLocal),
        ([192, 0, 0, 0], 24, Reserved),
        ([192, 0, 2, 0], 24, Documentation),
        ([198, 51, 100, 0], 24, Documentation),
        ([203, 0, 113, 0], 24, Documentation),
        ([192, 88, 99, 0], 24, Reserved),
        ([198, 18, 0, 0], 15, Reserved),
        ([224, 0, 0, 0], 4, Multicast),
        ([240, 0, 0, 0], 4, Reserved),
    ];
    table
        .iter()
        .find(|(net, prefix, _)| in_v4(ip, *net, *prefix))
        .map(|(_, _, class)| *class)
}

/// The IPv4 address an IPv6 address stands for: IPv4-mapped (`::ffff:a.b.c.d`), NAT64
/// (`64:ff9b::a.b.c.d`) or 6to4 (`2002:aabb:ccdd::`).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(ip);
    if in_v6(ip, [0, 0, 0, 0, 0, 0xffff, 0, 0], 96)
        || in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96)
    {
        return Some(Ipv4Addr::from(bits as u32));
    }
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        return Some(Ipv4Addr::from((bits >> 80) as u32));
    }
    None
}

/// The class of a blocked IPv6 address, or `None` for a public one.
pub fn classify_v6(ip: Ipv6Addr) -> Option<BlockedClass> {
    use BlockedClass::*;
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    let table: [([u16; 8], u32, BlockedClass); 9] = [
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, Multicast),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, LinkLocal),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, Reserved),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, UniqueLocal),
        ([0x2001, 0x0db8, 0, 0, 0, 0, 0, 0], 32, Documentation),
        // IETF special-purpose block (Teredo, benchmarking, ORCHID, ...).
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, Reserved),
        ([0x0064, 0xff9b, 1, 0, 0, 0, 0, 0], 48, Reserved),
        ([0x0100, 0, 0, 0, 0, 0, 0, 0], 64, Reserved),
        // IPv4-compatible (deprecated) and the rest of ::/8.
        ([0, 0, 0, 0, 0, 0, 0, 0], 8, Reserved),
    ];
    if let Some((_, _, class)) = table.iter().find(|(net, p, _)| in_v6(ip, *net, *p)) {
        return Some(*class);
    }
    // Only 2000::/3 is global unicast.
    if !in_v6(ip, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some(Reserved);
    }
    None
}

pub fn classify(ip: IpAddr) -> Option<BlockedClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

/// Why the policy refused an endpoint. Its text is the dead-letter's error, so a URL in it is
/// the [`shown_url`] form: never its user information or query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EgressDenied {
    #[error("egress denied: {host} resolves to {addr} ({})", class.as_str())]
    Address {
        host: String,
        addr: IpAddr,
        class: BlockedClass,
    },
    #[error("egress denied: {0} is not https and egress.https_only is set")]
    NotHttps(String),
    #[error("egress denied: port {port} of {host} is not in egress.allowed_ports")]
    Port { host: String, port: u16 },
    #[error("egress denied: {0} has no host")]
    NoHost(String),
}

/// The policy, ready to apply.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    allow: Vec<IpNet>,
    https_only: bool,
    allowed_ports: Vec<u16>,
    proxy: Option<SecretUrl>,
}

impl EgressPolicy {
    pub fn from_config(config: &EgressConfig) -> Self {
        Self {
            allow: config.allow.clone(),
            https_only: config.https_only,
            allowed_ports: config.allowed_ports.clone(),
            proxy: config.proxy.clone(),
        }
    }

    pub fn proxy(&self) -> Option<&reqwest::Url> {
        self.proxy.as_ref().map(SecretUrl::expose_url)
    }

    fn allowed(&self, ip: IpAddr) -> bool {
        let embedded = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        self.allow
            .iter()
            .any(|net| net.contains(&ip) || embedded.is_some_and(|e| net.contains(&e)))
    }

    /// Checks one address `host` resolved to.
    pub fn check_addr(&self, host: &str, addr: IpAddr) -> Result<(), EgressDenied> {
        if self.allowed(addr) {
            return Ok(());
        }
        match classify(addr) {
            Some(class) => Err(EgressDenied::Address {
                host: host.to_owned(),
                addr,
                class,
            }),
            None => Ok(()),
        }
    }

    /// The checks a URL allows without resolving: scheme, port, and IP-literal hosts (which
    /// the client connects to without asking the resolver).
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), EgressDenied> {
        // `amqps://` is a broker over TLS: what `https_only` asks of a destination.
        if self.https_only && !crate::subscriptions::destination::is_tls(url) {
            return Err(EgressDenied::NotHttps(shown_url(url)));
        }
        let host = url
            .host()
            .ok_or_else(|| EgressDenied::NoHost(shown_url(url)))?;
        let port = crate::subscriptions::destination::port(url).unwrap_or(0);
        if !self.allowed_ports.is_empty() && !self.allowed_ports.contains(&port) {
            return Err(EgressDenied::Port {
                host: host.to_string(),
                port,
            });
        }
        match host {
            url::Host::Ipv4(ip) => self.check_addr(&ip.to_string(), IpAddr::V4(ip)),
            url::Host::Ipv6(ip) => self.check_addr(&ip.to_string(), IpAddr::V6(ip)),
            url::Host::Domain(_) => Ok(()),
        }
    }
}

type LookupFuture<'a> = Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Name resolution, behind a trait so tests can answer for names no public DNS knows.
pub trait Lookup: Send + Sync + fmt::Debug {
    fn lookup<'a>(&'a self, host: &'a str) -> LookupFuture<'a>;
}

/// The system resolver.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup<'a>(&'a self, host: &'a str) -> LookupFuture<'a> {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host, 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// The HTTP client's resolver: resolves, then lets through only names whose every address the
/// policy allows. The proxy's own name, when one is configured, is exempt.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    policy: Arc<EgressPolicy>,
    lookup: Arc<dyn Lookup>,
    /// A bound on each lookup. Through a proxy the target is resolved before the client's own
    /// timeouts start, so without it a resolver that never answers holds the attempt forever.
    timeout: Option<Duration>,
}

impl GuardedResolver {
    pub fn new(policy: Arc<EgressPolicy>, lookup: Arc<dyn Lookup>) -> Self {
        Self {
            policy,
            lookup,
            timeout: None,
        }
    }

    /// Bounds every lookup by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Looks `host` up, within the bound when there is one.
    async fn lookup_bounded(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let lookup = self.lookup.lookup(host);
        let found =
            match self.timeout {
                None => lookup.await,
                Some(after) => tokio::time::timeout(after, lookup).await.map_err(|_| {
                    ResolveError::TimedOut {
                        host: host.to_owned(),
                        after,
                    }
                })?,
            };
        found.map_err(ResolveError::Lookup)
    }

    /// Resolves `host` and checks every address.
    pub async fn resolve_checked(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let addrs = self.lookup_bounded(host).await?;
        if addrs.is_empty() {
            return Err(ResolveError::Lookup(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host} has no addresses"),
            )));
        }
        for addr in &addrs {
            self.policy
                .check_addr(host, *addr)
                .map_err(ResolveError::Denied)?;
        }
        Ok(addrs)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{0}")]
    Denied(EgressDenied),
    #[error("cannot resolve: {0}")]
    Lookup(std::io::Error),
    #[error("cannot resolve {host}: no answer within {}", crate::units::fmt_duration(*.after))]
    TimedOut { host: String, after: Duration },
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let this = self.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let is_proxy = this
                .policy
                .proxy()
                .and_then(|p| p.host_str())
                .is_some_and(|p| p.eq_ignore_ascii_case(&host));
            let addrs = if is_proxy {
                this.lookup_bounded(&host).await?
            } else {
                this.resolve_checked(&host).await?
            };
            let addrs: reqwest::dns::Addrs =
                Box::new(addrs.into_iter().map(|ip| SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// Finds an egress refusal in an error's source chain (the HTTP client wraps the resolver's).
pub fn find_denial(error: &(dyn std::error::Error + 'static)) -> Option<EgressDenied> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(ResolveError::Denied(d)) = e.downcast_ref::<ResolveError>() {
            return Some(d.clone());
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn every_blocked_class_is_recognised() {
        use BlockedClass::*;
        for (addr, class) in [
            ("127.0.0.1", Loopback),
            ("127.255.0.9", Loopback),
            ("::1", Loopback),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("169.254.169.254", LinkLocal),
            ("169.254.0.1", LinkLocal),
            ("fe80::1", LinkLocal),
            ("100.64.0.1", Cgnat),
            ("100.127.255.254", Cgnat),
            ("0.0.0.0", Unspecified),
            ("::", Unspecified),
            ("224.0.0.1", Multicast),
            ("239.255.255.250", Multicast),
            ("ff02::1", Multicast),
            ("255.255.255.255", Broadcast),
            ("192.0.2.10", Documentation),
            ("198.51.100.7", Documentation),
            ("203.0.113.200", Documentation),
            ("2001:db8::1", Documentation),
            ("240.0.0.1", Reserved),
            ("0.1.2.3", Reserved),
            ("198.18.0.1", Reserved),
            ("192.0.0.170", Reserved),
            ("fc00::1", UniqueLocal),
            ("fd12:3456::1", UniqueLocal),
            ("fec0::1", Reserved),
            ("2001::1", Reserved),
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:10.0.0.1", Private),
            ("::ffff:169.254.169.254", LinkLocal),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::c0a8:0101", Private),
            ("2002:7f00:0001::1", Loopback),
            ("2002:a9fe:a9fe::", LinkLocal),
            ("::7f00:1", Reserved),
        ] {
            assert_eq!(classify(v(addr)), Some(class), "{addr}");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for addr in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "192.169.0.1",
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:0808:0808::1",
        ] {
            assert_eq!(classify(v(addr)), None, "{addr}");
        }
    }

    #[test]
    fn the_allow_list_wins_and_covers_mapped_forms() {
        let policy = EgressPolicy::from_config(&EgressConfig {
            allow: vec!["127.0.0.0/8".parse().unwrap()],
            ..EgressConfig::default()
        });
        assert!(policy.check_addr("h", v("127.0.0.1")).is_ok());
        assert!(policy.check_addr("h", v("::ffff:127.0.0.1")).is_ok());
        assert_eq!(
            policy
                .check_addr("h", v("10.0.0.1"))
                .unwrap_err()
                .to_string(),
            "egress denied: h resolves to 10.0.0.1 (private)"
        );
    }

    #[test]
    fn urls_are_checked_for_scheme_port_and_literal_hosts() {
        let policy = EgressPolicy::from_config(&EgressConfig {
            https_only: true,
            allowed_ports: vec![443],
            ..EgressConfig::default()
        });
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        assert!(policy.check_url(&url("https://hooks.example/x")).is_ok());
        // The refusal is a dead letter's error: no user information, no query.
        assert_eq!(
            policy
                .check_url(&url("http://u:pw@hooks.example:8080/x?token=t#f"))
                .unwrap_err()
                .to_string(),
            "egress denied: http://hooks.example:8080/x is not https and egress.https_only is set"
        );
        assert!(matches!(
            policy.check_url(&url("https://hooks.example:8443/x")),
            Err(EgressDenied::Port { port: 8443, .. })
        ));
        assert!(matches!(
            policy.check_url(&url("https://169.254.169.254/latest")),
            Err(EgressDenied::Address {
                class: BlockedClass::LinkLocal,
                ..
            })
        ));
        assert!(matches!(
            policy.check_url(&url("https://[::ffff:10.0.0.1]/")),
            Err(EgressDenied::Address {
                class: BlockedClass::Private,
                ..
            })
        ));
    }
}
