//! `tier hold`, `release` and `status`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;

use super::args::TierCommand;
use super::common::{connect, load_ladder, management, publisher};
use crate::config::Config;

pub(super) async fn run(cmd: TierCommand, config: &Config) -> anyhow::Result<ExitCode> {
    match cmd {
        TierCommand::Hold { ladder, tier } => {
            let ladder = load_ladder(&ladder, config)?;
            let i = crate::ops::tier::find(&ladder, &tier)?;
            let api = management(config)?;
            let conn = connect(config, "hookrelay tier").await?;
            let channel = conn.create_channel().await?;
            crate::ops::tier::hold(&api, &channel, &ladder, i).await?;
            let applied =
                crate::ops::tier::wait_applied(&api, &ladder, i, true, Duration::from_secs(10))
                    .await?;
            let _ = conn.close(200, "done".into()).await;
            if !applied {
                bail!(
                    "the hold policy {} was set but the broker has not applied it to {} yet; \
                     check `hookrelay tier status` (another policy of higher priority may match)",
                    ladder.hold_policy(i),
                    ladder.tier_queue(i)
                );
            }
            println!(
                "Held {}: messages expiring there now park in {} (nothing is promoted or lost). \
                 Resume with `hookrelay tier release {}`.",
                ladder.tier_queue(i),
                ladder.held_queue(i),
                ladder.tier(i).name
            );
            Ok(ExitCode::SUCCESS)
        }
        TierCommand::Release { ladder, tier, rate } => {
            let ladder = load_ladder(&ladder, config)?;
            let i = crate::ops::tier::find(&ladder, &tier)?;
            let api = management(config)?;
            let conn = connect(config, "hookrelay tier").await?;
            let channel = conn.create_channel().await?;
            let publisher = publisher(config, "hookrelay tier").await?;
            let options = crate::ops::mover::MoveOptions {
                rate,
                ..Default::default()
            };
            let released =
                crate::ops::tier::release(&api, &channel, &publisher, &ladder, i, &options, true)
                    .await;
            publisher.close().await;
            let _ = conn.close(200, "done".into()).await;
            let released = released?;
            println!(
                "Released {}: {} parked message(s) returned to the retry lanes ({} more expired during the release); promotion resumed.",
                ladder.tier_queue(i),
                released.first_pass.moved,
                released.stragglers.moved
            );
            Ok(ExitCode::SUCCESS)
        }
        TierCommand::Status { ladder, json } => {
            let ladder = load_ladder(&ladder, config)?;
            let api = management(config)?;
            let states = crate::ops::tier::status(&api, &ladder).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&states)?);
            } else {
                println!(
                    "{:<14} {:>8} {:>8}  {:<5} {:>8}",
                    "TIER", "DELAY", "WAITING", "HELD", "PARKED"
                );
                for s in states {
                    let n = |v: Option<i64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
                    println!(
                        "{:<14} {:>8} {:>8}  {:<5} {:>8}",
                        s.tier,
                        s.delay,
                        n(s.waiting),
                        if s.held { "yes" } else { "no" },
                        n(s.parked)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
