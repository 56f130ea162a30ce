//! Faults, each under load with mixed outcomes, each ending with an account taken from outside
//! the worker: the endpoint's record (delivered), the dead sink (dead-lettered) and the attempt
//! log (cancelled). Every published envelope must reach one of them: lost must be 0; duplicates
//! are counted and bounded.
//!
//! Scenarios that disturb the broker run on a node of their own (`common::node`), never on the
//! machine's shared broker. Each prints a `FAULT-TABLE` line; run with `--no-capture` to see them.
//! With `TEST_RABBITMQ_ROOT` set (`eval "$(rabbitmq/v4 env)"`), those nodes run RabbitMQ 4 from
//! that folder; the Khepri and partition scenarios need it.

#[path = "../common/mod.rs"]
mod common;
mod harness;

mod alarms;
mod broker;
mod cluster;
mod config;
mod endpoints;
mod hostile;
mod khepri;
mod net;
mod ops_kill;
mod partition;
mod worker_kill;
