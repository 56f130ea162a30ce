//! `redrive`: move envelopes from the dead sink back to a ready lane.

use std::process::ExitCode;

use super::args::RedriveArgs;
use super::common::{connect, load_ladder, publisher};
use crate::config::Config;

pub(super) async fn run(args: RedriveArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, config)?;
    let filter = crate::ops::redrive::Filter {
        tenant: args.tenant,
        subscription: args.subscription,
        reason: args.reason,
        since: args.since,
        until: args.until,
    };
    let conn = connect(config, "hookrelay redrive").await?;
    let channel = conn.create_channel().await?;
    let publisher = publisher(config, "hookrelay redrive").await?;
    let dead = ladder.dead();
    let total = crate::ops::mover::depth(&channel, &dead).await?;
    let limit = args
        .limit
        .map_or(total as u64, |l| (l as u64).min(total.into()));
    let progress = crate::ops::progress::Progress::new(
        limit,
        if args.dry_run { "would move" } else { "moved" },
    );
    let options = crate::ops::mover::MoveOptions {
        rate: args.rate,
        limit: args.limit,
        dry_run: args.dry_run,
    };
    let report = crate::ops::mover::move_messages(
        &channel,
        &publisher,
        &dead,
        &options,
        Some(&progress),
        |props, _| crate::ops::redrive::plan(&ladder, &filter, props),
    )
    .await;
    publisher.close().await;
    let _ = conn.close(200, "done".into()).await;
    let report = report?;
    let verb = if args.dry_run { "would move" } else { "moved" };
    println!(
        "Examined {} of {} dead message(s): {verb} {} to {}; {} stayed in the sink.",
        report.examined,
        total,
        report.moved,
        ladder.ingress(),
        report.kept_total()
    );
    for (why, n) in &report.kept {
        println!("  stayed: {n} ({why})");
    }
    Ok(ExitCode::SUCCESS)
}
