//! A RabbitMQ node of its own, beside the machine's broker: its own node name, AMQP,
//! management and distribution ports and data directory under a temporary directory,
//! configured from the project's `rabbitmq/` files. Stopped and removed on drop.
//! [`cluster`] joins three. The fault suite stops, restarts, cuts and alarms such nodes; the
//! bench's `--cluster` runs the sharded matrix on three.
//!
//! The node's programs are the machine's RabbitMQ, or, when `TEST_RABBITMQ_ROOT` names a
//! folder made by `rabbitmq/v4 install`, the RabbitMQ 4 installed there, run from it (chroot)
//! with an epmd port of the folder's own, so its nodes never meet the machine's. A node may
//! also run in a network namespace with an address of its own ([`Host`]), for partitions.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const CONF: &str = include_str!("../../rabbitmq/rabbitmq.conf");
const ADVANCED: &str = include_str!("../../rabbitmq/advanced.config");

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "could not run {program}: {source} (is RabbitMQ installed? rabbitmq/up installs it on Debian)"
    )]
    Run {
        program: &'static str,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("rabbitmqctl {args} on {node} failed: {output}")]
    Ctl {
        node: String,
        args: String,
        output: String,
    },
    #[error("{node} did not {what} within {after:?}{detail}")]
    NotReady {
        node: String,
        what: &'static str,
        after: Duration,
        detail: String,
    },
}

/// The kernel's range of local ports for outgoing connections (`net.ipv4.ip_local_port_range`),
/// Linux's default where it cannot be read.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(str::parse::<u16>);
            Some((it.next()?.ok()?, it.next()?.ok()?))
        })
        .unwrap_or((32768, 60999))
}

/// The lowest port [`free_port`] hands out: above the well-known services.
const FREE_PORTS_FROM: u16 = 10_000;

/// A free loopback port (bound, then let go) for a server of a test's own, below the kernel's
/// range for outgoing connections: no connection's local end can take it between this check and
/// the server's start, or while the server is stopped and started again, as it can take a port
/// in that range. Where that range leaves no room below it, the kernel's choice.
pub fn free_port() -> Result<u16, std::io::Error> {
    static TAKEN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let (low, _) = ephemeral_range();
    if low > FREE_PORTS_FROM + 1000 {
        let span = u32::from(low - FREE_PORTS_FROM);
        // Start somewhere else in each process, and move on within one, so tests running at
        // once rarely try the same port.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = std::process::id().wrapping_mul(7919) ^ nanos;
        let taken = TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..span {
            let offset = start.wrapping_add(taken.wrapping_mul(97)).wrapping_add(i) % span;
            let port = FREE_PORTS_FROM + offset as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Calls `done` every `poll` until it says yes or `timeout` has passed.
fn wait_until(timeout: Duration, poll: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(poll);
    }
}

/// Where a node's programs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Install {
    /// `rabbitmq-server` and `rabbitmqctl` on this machine's PATH.
    Machine,
    /// A folder made by `rabbitmq/v4 install`: the programs run inside it (chroot).
    Root(PathBuf),
}

/// The epmd port of every node run from a `rabbitmq/v4` folder (`rabbitmq/v4`'s default):
/// nodes of one folder find each other, and never the machine's broker on 4369.
pub const ROOT_EPMD_PORT: u16 = 4373;

impl Install {
    /// `TEST_RABBITMQ_ROOT` when set (a `rabbitmq/v4` folder), else the machine's RabbitMQ.
    pub fn from_env() -> Self {
        match std::env::var_os("TEST_RABBITMQ_ROOT") {
            Some(root) if !root.is_empty() => Install::Root(PathBuf::from(root)),
            _ => Install::Machine,
        }
    }

    /// The RabbitMQ version installed, read from the server's library folder.
    pub fn version(&self) -> Option<String> {
        let lib = match self {
            Install::Machine => PathBuf::from("/usr/lib/rabbitmq/lib"),
            Install::Root(root) => root.join("usr/lib/rabbitmq/lib"),
        };
        std::fs::read_dir(lib).ok()?.find_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_prefix("rabbitmq_server-")
                .map(str::to_owned)
        })
    }
}

/// `extra` for a node run from the folder `root`, which sees only the folder: every file of this
/// machine a setting names (`ssl_options.certfile = /tmp/x/server.pem`) is copied into the
/// node's directory `dir` (inside `root`) and named as the node sees it.
fn files_into(
    extra: &str,
    dir: &std::path::Path,
    root: &std::path::Path,
) -> std::io::Result<String> {
    let mut out = String::new();
    for line in extra.lines() {
        match line.split_once('=') {
            Some((key, value))
                if value.trim().starts_with('/')
                    && std::path::Path::new(value.trim()).is_file() =>
            {
                let source = std::path::Path::new(value.trim());
                let name = source.file_name().unwrap_or_default();
                let copy = dir.join("files").join(name);
                std::fs::create_dir_all(dir.join("files"))?;
                std::fs::copy(source, &copy)?;
                let inner = copy.strip_prefix(root).unwrap_or(&copy);
                out.push_str(&format!("{key}= /{}\n", inner.display()));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// A network namespace the node runs in, with its address there (see `tests/faults/net.rs`).
/// The node is named for the address (long names) and listens on every address of the
/// namespace, with the default ports: the namespace is its host.
#[derive(Debug, Clone)]
pub struct Host {
    pub netns: String,
    pub addr: std::net::Ipv4Addr,
}

#[derive(Debug)]
pub struct Node {
    pub name: String,
    pub amqp_port: u16,
    pub mgmt_port: u16,
    dist_port: u16,
    dir: tempfile::TempDir,
    install: Install,
    host: Option<Host>,
}

impl Node {
    /// Starts a node and waits until it serves AMQP and the management API.
    pub fn start(tag: &str) -> Result<Node, NodeError> {
        Self::start_with(tag, "")
    }

    /// [`Node::start`] with `extra` lines added to its `rabbitmq.conf` (a TLS listener, say).
    pub fn start_with(tag: &str, extra: &str) -> Result<Node, NodeError> {
        Self::start_on(tag, extra, Install::from_env(), None)
    }

    /// A node of `install`, on this machine's loopback or (`host`) in a network namespace.
    pub fn start_on(
        tag: &str,
        extra: &str,
        install: Install,
        host: Option<Host>,
    ) -> Result<Node, NodeError> {
        // A node run from a folder sees only the folder: its files live in the folder's /tmp.
        let dir = match &install {
            Install::Machine => tempfile::tempdir()?,
            Install::Root(root) => tempfile::tempdir_in(root.join("tmp"))?,
        };
        // The server may run as the rabbitmq user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))?;
        let (amqp_port, mgmt_port, dist_port) = match host {
            // The namespace is the node's own host: the standard ports are free there.
            Some(_) => (5672, 15672, 25672),
            None => (free_port()?, free_port()?, free_port()?),
        };
        let mut conf = CONF
            .replace(
                "listeners.tcp.default = 5672",
                &format!("listeners.tcp.default = {amqp_port}"),
            )
            .replace(
                "management.tcp.port = 15672",
                &format!("management.tcp.port = {mgmt_port}"),
            );
        if host.is_some() {
            // Reached from the machine over the namespace's link, not over loopback.
            conf = conf
                .replace(
                    "management.tcp.ip = 127.0.0.1",
                    "management.tcp.ip = 0.0.0.0",
                )
                .replace("loopback_users.guest = true", "loopback_users = none");
        }
        let extra = match &install {
            Install::Machine => extra.to_owned(),
            Install::Root(root) => files_into(extra, dir.path(), root)?,
        };
        let conf = conf + "\n" + &extra;
        std::fs::write(dir.path().join("rabbitmq.conf"), conf)?;
        std::fs::write(dir.path().join("advanced.config"), ADVANCED)?;
        // Management and the consistent-hash exchange (sharded ladders), not prometheus: the
        // shared broker's prometheus plugin holds its default port.
        std::fs::write(
            dir.path().join("enabled_plugins"),
            "[rabbitmq_management,rabbitmq_consistent_hash_exchange].\n",
        )?;
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
        let name = match &host {
            Some(h) => format!("hrt-{tag}-{suffix}@{}", h.addr),
            None => format!("hrt-{tag}-{suffix}@localhost"),
        };
        let node = Node {
            name,
            amqp_port,
            mgmt_port,
            dist_port,
            dir,
            install,
            host,
        };
        node.boot()?;
        Ok(node)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// `file` of the node's directory as its programs see it (inside the folder they run in).
    fn inner_path(&self, file: &str) -> String {
        let path = self.path(file);
        match &self.install {
            Install::Machine => path.display().to_string(),
            Install::Root(root) => {
                let inner = path.strip_prefix(root).unwrap_or(&path);
                format!("/{}", inner.display())
            }
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        let path = |file: &str| self.inner_path(file);
        let mut env = vec![
            ("RABBITMQ_NODENAME", self.name.clone()),
            ("RABBITMQ_NODE_PORT", self.amqp_port.to_string()),
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string()),
            ("RABBITMQ_MNESIA_BASE", path("mnesia")),
            ("RABBITMQ_LOG_BASE", path("log")),
            ("RABBITMQ_PID_FILE", path("pid")),
            ("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf")),
            ("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config")),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins")),
        ];
        if self.host.is_some() {
            env.push(("RABBITMQ_USE_LONGNAME", "true".to_owned()));
        }
        if let Install::Root(_) = self.install {
            env.push(("ERL_EPMD_PORT", ROOT_EPMD_PORT.to_string()));
        }
        env
    }

    /// `program` with the node's environment, run where the node runs: in its network
    /// namespace, inside its install folder.
    fn command(&self, program: &str) -> Command {
        let mut argv: Vec<String> = Vec::new();
        if let Some(host) = &self.host {
            argv.extend(["ip", "netns", "exec", &host.netns].map(str::to_owned));
        }
        if let Install::Root(root) = &self.install {
            // `env -i`: the folder's programs see none of this machine's settings.
            argv.extend(["chroot".to_owned(), root.display().to_string()]);
            argv.extend(
                [
                    "env",
                    "-i",
                    "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                    "LANG=C.UTF-8",
                ]
                .map(str::to_owned),
            );
            argv.extend(self.env().into_iter().map(|(k, v)| format!("{k}={v}")));
        }
        argv.push(program.to_owned());
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).envs(self.env());
        command
    }

    /// Starts the node process (again, after [`Node::stop`]) and waits for it.
    pub fn boot(&self) -> Result<(), NodeError> {
        let status = self
            .command("rabbitmq-server")
            .arg("-detached")
            .status()
            .map_err(|source| NodeError::Run {
                program: "rabbitmq-server",
                source,
            })?;
        if !status.success() {
            return Err(NodeError::NotReady {
                node: self.name.clone(),
                what: "start (rabbitmq-server -detached failed)",
                after: Duration::ZERO,
                detail: String::new(),
            });
        }
        // `await_startup` needs the node to be reachable; right after `-detached` it may not be.
        let mut detail = String::new();
        let limit = Duration::from_secs(120);
        let started = wait_until(limit, Duration::from_millis(500), || {
            match self.ctl(&["await_startup", "--timeout", "60"]) {
                Ok(out) => {
                    detail = String::from_utf8_lossy(&out.stderr).trim().to_owned();
                    out.status.success()
                }
                Err(e) => {
                    detail = e.to_string();
                    false
                }
            }
        });
        if !started {
            return Err(NodeError::NotReady {
                node: self.name.clone(),
                what: "start",
                after: limit,
                detail: format!(": {detail}"),
            });
        }
        self.wait_management()
    }

    fn wait_management(&self) -> Result<(), NodeError> {
        let limit = Duration::from_secs(60);
        let overview = format!("{}/api/overview", self.mgmt_url());
        let answers = wait_until(limit, Duration::from_millis(200), || {
            Command::new("curl")
                .args(["-fsS", "-m", "5", "-o", "/dev/null", &overview])
                .status()
                .is_ok_and(|s| s.success())
        });
        if answers {
            Ok(())
        } else {
            Err(NodeError::NotReady {
                node: self.name.clone(),
                what: "answer on its management API",
                after: limit,
                detail: String::new(),
            })
        }
    }

    /// `rabbitmqctl -n <node> <args>`.
    pub fn ctl(&self, args: &[&str]) -> Result<Output, NodeError> {
        let mut command = self.command("rabbitmqctl");
        if self.host.is_some() {
            command.arg("--longnames");
        }
        command
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .map_err(|source| NodeError::Run {
                program: "rabbitmqctl",
                source,
            })
    }

    /// Runs `rabbitmqctl` and insists it succeeds.
    pub fn ctl_ok(&self, args: &[&str]) -> Result<(), NodeError> {
        let out = self.ctl(args)?;
        if out.status.success() {
            return Ok(());
        }
        Err(NodeError::Ctl {
            node: self.name.clone(),
            args: args.join(" "),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }

    /// Stops the whole node (the Erlang VM); [`Node::boot`] brings it back with its data.
    pub fn stop(&self) {
        let _ = self.ctl(&["stop"]);
    }

    /// Kills the node's VM without letting it shut down.
    pub fn kill(&self) {
        if let Ok(pid) = std::fs::read_to_string(self.path("pid")) {
            let _ = Command::new("kill").args(["-9", pid.trim()]).status();
        }
    }

    /// The node VM's process id, once it has written its pid file.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.path("pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The address clients reach the node at: loopback, or its namespace's address.
    pub fn addr(&self) -> std::net::Ipv4Addr {
        self.host
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |h| h.addr)
    }

    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@{}:{}/%2f", self.addr(), self.amqp_port)
    }

    pub fn mgmt_url(&self) -> String {
        format!("http://guest:guest@{}:{}", self.addr(), self.mgmt_port)
    }

    /// The RabbitMQ version the node runs (its install's).
    pub fn version(&self) -> Option<String> {
        self.install.version()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.ctl(&["stop"]).is_ok_and(|out| out.status.success()) {
            self.kill();
        }
    }
}

/// Three nodes joined in one cluster; the first is the seed.
pub fn cluster(tag: &str) -> Result<Vec<Node>, NodeError> {
    let nodes = (0..3)
        .map(|i| Node::start(&format!("{tag}{i}")))
        .collect::<Result<Vec<Node>, NodeError>>()?;
    join(nodes)
}

/// `extra` conf lines and a node per host, joined in one cluster; the first is the seed.
pub fn cluster_on(
    tag: &str,
    extra: &str,
    install: &Install,
    hosts: &[Host],
) -> Result<Vec<Node>, NodeError> {
    let nodes = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            Node::start_on(
                &format!("{tag}{i}"),
                extra,
                install.clone(),
                Some(h.clone()),
            )
        })
        .collect::<Result<Vec<Node>, NodeError>>()?;
    join(nodes)
}

fn join(nodes: Vec<Node>) -> Result<Vec<Node>, NodeError> {
    for node in &nodes[1..] {
        node.ctl_ok(&["stop_app"])?;
        node.ctl_ok(&["reset"])?;
        node.ctl_ok(&["join_cluster", &nodes[0].name])?;
        node.ctl_ok(&["start_app"])?;
        node.ctl_ok(&["await_startup", "--timeout", "120"])?;
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_is_below_the_range_the_kernel_gives_outgoing_connections_and_is_free() {
        let (low, _) = ephemeral_range();
        for _ in 0..50 {
            let port = free_port().unwrap();
            assert!(
                port < low,
                "{port} is in the ephemeral range from {low}: a connection can take it while a node is down"
            );
            // Free as handed out.
            drop(std::net::TcpListener::bind(("127.0.0.1", port)).unwrap());
        }
    }
}
