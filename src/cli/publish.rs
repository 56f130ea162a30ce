//! `publish`: one event through the ingress exchange.

use std::io::Read;
use std::process::ExitCode;

use anyhow::Context;
use tracing::Instrument as _;

use super::args::PublishArgs;
use super::common::load_ladder;
use crate::broker::publish::Publisher;
use crate::config::Config;
use crate::contract::envelope::NewEvent;

pub(super) async fn run(args: PublishArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, config)?;
    let body = match (&args.data, &args.file) {
        (Some(data), _) => data.clone().into_bytes(),
        (None, Some(path)) => {
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?
        }
        (None, None) => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the body from standard input")?;
            buf
        }
    };
    let event = NewEvent {
        id: args
            .id
            .unwrap_or_else(|| format!("evt_{}", uuid::Uuid::new_v4().simple())),
        tenant: args.tenant,
        event_type: args.event_type,
        subscription: args.subscription,
        timestamp: args.timestamp,
        body,
    };
    // Refuse bad input before opening a connection: nothing is published.
    event
        .validate(config.limits.max_body_bytes)
        .context("not published")?;
    let parent = match &args.traceparent {
        None => None,
        Some(value) => Some(
            crate::contract::trace_context::parse_traceparent(value)
                .context("--traceparent is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")?,
        ),
    };
    let span = crate::observe::traces::publish_span(&ladder.ingress(), &event.id, parent.as_ref());
    // Without traces, the traceparent goes with the event as given.
    let cx = span.context().or(parent.as_ref());
    let published = async {
        let publisher = Publisher::connect(
            &config.amqp.url,
            "hookrelay publish",
            config.amqp.confirm_timeout,
        )
        .await?;
        let id = publisher
            .publish_event_in(&ladder.ingress(), &event, config.limits.max_body_bytes, cx)
            .await;
        publisher.close().await;
        id
    }
    .instrument(span.log_span())
    .await;
    drop(span);
    let id = published.map_err(|e| {
        let context = if e.is_transient() {
            // It may even have arrived (a confirm that timed out): the same id lets receivers
            // drop the duplicate.
            format!(
                "not published (the broker may take it later: retry with --id {})",
                event.id
            )
        } else {
            "not published".to_owned()
        };
        anyhow::Error::new(e).context(context)
    })?;
    println!("{id}");
    Ok(ExitCode::SUCCESS)
}
