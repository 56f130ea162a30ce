//! What several commands share: the ladder file, a broker connection, the management API.

use anyhow::Context;
use lapin::{Connection, ConnectionProperties};

use super::args::LadderArg;
use crate::broker::management::Management;
use crate::broker::publish::Publisher;
use crate::config::Config;
use crate::contract::ladder::Ladder;

pub(super) fn load_ladder(arg: &LadderArg, config: &Config) -> anyhow::Result<Ladder> {
    let path = arg.ladder.clone().unwrap_or_else(|| config.ladder.clone());
    Ok(Ladder::load(&path)?)
}

pub(super) async fn connect(config: &Config, name: &str) -> anyhow::Result<Connection> {
    Connection::connect(
        config.amqp.url.expose(),
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .with_context(|| format!("cannot connect to the broker at {}", config.amqp.url))
}

pub(super) fn management(config: &Config) -> anyhow::Result<Management> {
    Ok(Management::new(
        &config.management.url,
        &Management::vhost_of(&config.amqp.url),
    )?)
}

/// A confirming publisher on a connection named `name`.
pub(super) async fn publisher(config: &Config, name: &str) -> anyhow::Result<Publisher> {
    Ok(Publisher::connect(&config.amqp.url, name, config.amqp.confirm_timeout).await?)
}
