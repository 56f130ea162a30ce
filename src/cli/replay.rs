//! `replay`: publish archived events again through the ingress.

use std::process::ExitCode;

use super::args::ReplayArgs;
use super::common::{connect, load_ladder, publisher};
use crate::config::Config;
use crate::ops::replay::{ReplayFilter, ReplayOptions};

pub(super) async fn run(args: ReplayArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let ladder = load_ladder(&args.ladder, config)?;
    if let Some(to) = args.to
        && to <= args.from
    {
        anyhow::bail!("--to must be after --from");
    }
    let options = ReplayOptions {
        id: None,
        from: args.from,
        to: args.to,
        filter: ReplayFilter {
            tenant: args.tenant,
            subscription: args.subscription,
            event_type: args.event_type,
            event: args.event,
        },
        only_undelivered: args.only_undelivered,
        index_max: None,
        rate: Some(args.rate),
        dry_run: args.dry_run,
    };
    let conn = connect(config, "hookrelay replay").await?;
    let publisher = publisher(config, "hookrelay replay").await?;
    // Counts archived events read; the window's size is set once its first offset is known.
    let progress = crate::ops::progress::Progress::new(0, "archived events read");
    let report =
        crate::ops::replay::replay(&conn, &publisher, &ladder, &options, Some(&progress), None)
            .await;
    progress.finish();
    publisher.close().await;
    let _ = conn.close(200, "done".into()).await;
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if args.dry_run {
        "would publish"
    } else {
        "published"
    };
    println!(
        "Replay {}: read {} archived event(s) in the window, {} matched; {verb} {} to {}{}.",
        report.id,
        report.read,
        report.matched,
        report.published,
        ladder.ingress(),
        if args.only_undelivered {
            format!(
                ", skipped {} the attempt log shows delivered",
                report.delivered_already
            )
        } else {
            String::new()
        }
    );
    Ok(ExitCode::SUCCESS)
}
