//! A RabbitMQ node of the test's own, so fault tests can stop, restart, cut and alarm a broker
//! without touching the machine's shared one: its own node name, AMQP, management and
//! distribution ports, and data directory under a temporary directory, configured from the
//! project's `rabbitmq/` files. Stopped and removed on drop. [`cluster`] joins three.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use hookrelay::config::{Config, SecretUrl};

use super::wait_until_blocking;

const CONF: &str = include_str!("../../rabbitmq/rabbitmq.conf");
const ADVANCED: &str = include_str!("../../rabbitmq/advanced.config");

/// A free loopback port (bound, then let go).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Node {
    pub name: String,
    pub amqp_port: u16,
    pub mgmt_port: u16,
    dist_port: u16,
    dir: tempfile::TempDir,
}

impl Node {
    /// Starts a node and waits until it serves AMQP and the management API.
    pub fn start(tag: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        // The server runs as the rabbitmq user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let amqp_port = free_port();
        let mgmt_port = free_port();
        let dist_port = free_port();
        let conf = CONF
            .replace(
                "listeners.tcp.default = 5672",
                &format!("listeners.tcp.default = {amqp_port}"),
            )
            .replace(
                "management.tcp.port = 15672",
                &format!("management.tcp.port = {mgmt_port}"),
            );
        assert!(
            conf.contains(&amqp_port.to_string()),
            "rabbitmq.conf sets listeners.tcp.default"
        );
        std::fs::write(dir.path().join("rabbitmq.conf"), conf).unwrap();
        std::fs::write(dir.path().join("advanced.config"), ADVANCED).unwrap();
        // Management and the consistent-hash exchange (sharded ladders), not prometheus: the
        // shared broker's prometheus plugin holds its default port.
        std::fs::write(
            dir.path().join("enabled_plugins"),
            "[rabbitmq_management,rabbitmq_consistent_hash_exchange].\n",
        )
        .unwrap();
        let name = format!(
            "hrt-{tag}-{}@localhost",
            &uuid::Uuid::new_v4().simple().to_string()[..6]
        );
        let node = Node {
            name,
            amqp_port,
            mgmt_port,
            dist_port,
            dir,
        };
        node.boot();
        node
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("RABBITMQ_NODENAME", self.name.clone()),
            ("RABBITMQ_NODE_PORT", self.amqp_port.to_string()),
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string()),
            (
                "RABBITMQ_MNESIA_BASE",
                self.path("mnesia").display().to_string(),
            ),
            ("RABBITMQ_LOG_BASE", self.path("log").display().to_string()),
            ("RABBITMQ_PID_FILE", self.path("pid").display().to_string()),
            (
                "RABBITMQ_CONFIG_FILE",
                self.path("rabbitmq.conf").display().to_string(),
            ),
            (
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                self.path("advanced.config").display().to_string(),
            ),
            (
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.path("enabled_plugins").display().to_string(),
            ),
        ]
    }

    /// Starts the node process (again, after [`Node::stop`]) and waits for it.
    pub fn boot(&self) {
        let status = Command::new("rabbitmq-server")
            .arg("-detached")
            .envs(self.env())
            .status()
            .expect("rabbitmq-server is installed (rabbitmq/up installs it)");
        assert!(
            status.success(),
            "rabbitmq-server -detached failed for {}",
            self.name
        );
        // `await_startup` needs the node to be reachable; right after `-detached` it may not be.
        let mut stderr = Vec::new();
        let started =
            wait_until_blocking(Duration::from_secs(120), Duration::from_millis(500), || {
                let out = self.ctl(&["await_startup", "--timeout", "60"]);
                stderr = out.stderr;
                out.status.success()
            });
        assert!(
            started,
            "{} did not start: {}",
            self.name,
            String::from_utf8_lossy(&stderr)
        );
        self.wait_management();
    }

    fn wait_management(&self) {
        let answers =
            wait_until_blocking(Duration::from_secs(60), Duration::from_millis(200), || {
                Command::new("curl")
                    .args([
                        "-fsS",
                        "-o",
                        "/dev/null",
                        &format!("{}/api/overview", self.mgmt_url()),
                    ])
                    .status()
                    .is_ok_and(|s| s.success())
            });
        assert!(
            answers,
            "the management API of {} did not answer",
            self.name
        );
    }

    /// `rabbitmqctl -n <node> <args>`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new("rabbitmqctl")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .expect("rabbitmqctl is installed")
    }

    /// Runs `rabbitmqctl` and insists it succeeds.
    pub fn ctl_ok(&self, args: &[&str]) {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "rabbitmqctl {args:?} on {}: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
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

    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    pub fn mgmt_url(&self) -> String {
        format!("http://guest:guest@127.0.0.1:{}", self.mgmt_port)
    }

    /// The test configuration pointed at this node.
    pub fn config(&self) -> Config {
        let mut config = super::config();
        config.amqp.url = SecretUrl::parse(&self.amqp_url()).unwrap();
        config.management.url = SecretUrl::parse(&self.mgmt_url()).unwrap();
        config
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let out = self.ctl(&["stop"]);
        if !out.status.success() {
            self.kill();
        }
    }
}

/// Three nodes joined in one cluster; the first is the seed.
pub fn cluster(tag: &str) -> Vec<Node> {
    let nodes: Vec<Node> = (0..3).map(|i| Node::start(&format!("{tag}{i}"))).collect();
    for node in &nodes[1..] {
        node.ctl_ok(&["stop_app"]);
        node.ctl_ok(&["reset"]);
        node.ctl_ok(&["join_cluster", &nodes[0].name]);
        node.ctl_ok(&["start_app"]);
        node.ctl_ok(&["await_startup", "--timeout", "120"]);
    }
    nodes
}
