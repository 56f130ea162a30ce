//! A RabbitMQ node of the test's own (`hookrelay_tools::node`), so fault tests can stop,
//! restart, cut and alarm a broker without touching the machine's shared one. A test that cannot
//! start one fails, so this wrapper panics where the tools' node returns an error.

#![allow(dead_code)]

use std::ops::Deref;
use std::process::Output;

use hookrelay::config::{Config, SecretUrl};
use hookrelay_tools::node;

/// A free loopback port (bound, then let go).
pub fn free_port() -> u16 {
    node::free_port().unwrap()
}

pub struct Node(node::Node);

impl Deref for Node {
    type Target = node::Node;
    fn deref(&self) -> &node::Node {
        &self.0
    }
}

impl From<node::Node> for Node {
    fn from(node: node::Node) -> Self {
        Node(node)
    }
}

impl Node {
    /// Starts a node and waits until it serves AMQP and the management API.
    pub fn start(tag: &str) -> Node {
        Node(node::Node::start(tag).unwrap_or_else(|e| panic!("{e}")))
    }

    /// [`Node::start`] with `extra` lines in its `rabbitmq.conf`.
    pub fn start_with(tag: &str, extra: &str) -> Node {
        Node(node::Node::start_with(tag, extra).unwrap_or_else(|e| panic!("{e}")))
    }

    /// Starts the node process again, after [`node::Node::stop`], and waits for it.
    pub fn boot(&self) {
        self.0.boot().unwrap_or_else(|e| panic!("{e}"));
    }

    /// `rabbitmqctl -n <node> <args>`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.0.ctl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs `rabbitmqctl` and insists it succeeds.
    pub fn ctl_ok(&self, args: &[&str]) {
        self.0.ctl_ok(args).unwrap_or_else(|e| panic!("{e}"));
    }

    /// The test configuration pointed at this node.
    pub fn config(&self) -> Config {
        let mut config = super::config();
        config.amqp.url = SecretUrl::parse(&self.amqp_url()).unwrap();
        config.management.url = SecretUrl::parse(&self.mgmt_url()).unwrap();
        config
    }
}

/// Three nodes joined in one cluster; the first is the seed.
pub fn cluster(tag: &str) -> Vec<Node> {
    node::cluster(tag)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(Node)
        .collect()
}
