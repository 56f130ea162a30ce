//! `hookrelay attempts tail`: following the attempt log through a queue of its own, and the
//! line each record prints as.

use futures_util::StreamExt;

use crate::observe::events::AttemptRecord;

/// One line of `hookrelay attempts tail`.
pub fn format_record(r: &AttemptRecord) -> String {
    let mut line = format!(
        "{} {:<13} {} {} {}",
        r.at,
        r.outcome,
        r.tenant.as_deref().unwrap_or("-"),
        r.subscription.as_deref().unwrap_or("-"),
        r.envelope.as_deref().unwrap_or("(no id)"),
    );
    if r.attempt > 0 {
        line.push_str(&format!(" attempt {}", r.attempt));
    }
    if let Some(status) = r.status {
        line.push_str(&format!(" HTTP {status}"));
    }
    if let Some(ms) = r.latency_ms {
        line.push_str(&format!(" {ms}ms"));
    }
    if let Some(tier) = &r.tier {
        line.push_str(&format!(" -> {tier}"));
    }
    if let Some(error) = r
        .error
        .as_deref()
        .filter(|e| r.status.is_none() || !e.starts_with("HTTP"))
    {
        line.push_str(&format!(" ({error})"));
    }
    line
}

/// Follows the attempt log through a queue of its own (exclusive, gone when the connection
/// closes), calling `each` with every record until it returns `false` or the stream ends.
/// `outcome` and `tenant` narrow the binding (`*` when absent); a batch the binding selects
/// also carries other records, which the caller leaves out ([`AttemptRecord::matches`]).
pub async fn tail_attempts(
    channel: &lapin::Channel,
    exchange: &str,
    outcome: Option<&str>,
    tenant: Option<&str>,
    mut each: impl FnMut(&[u8]) -> bool,
) -> Result<(), lapin::Error> {
    use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let queue = channel
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    let key = format!("{}.{}", outcome.unwrap_or("*"), tenant.unwrap_or("*"));
    channel
        .queue_bind(
            queue.name().clone(),
            exchange.into(),
            key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut consumer = channel
        .basic_consume(
            queue.name().clone(),
            "".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    while let Some(delivery) = consumer.next().await {
        if !each(&delivery?.data) {
            break;
        }
    }
    Ok(())
}
