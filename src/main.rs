//! The `hookrelay` binary: parse the command line, load configuration, start tracing, run the
//! command, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use hookrelay::cli::{self, Cli};
use hookrelay::config::{Config, LogFormat, ProcessEnv};
use tracing_subscriber::EnvFilter;

// Many small allocations per delivery (headers, futures, buffers) across threads: mimalloc's
// per-thread heaps cost less than glibc's arenas here (see docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref(), &ProcessEnv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // lapin logs every message the broker returns, body and all, at WARN: a webhook's payload
    // has no place in a log line. hookrelay counts and reports returns itself.
    const QUIET: &str = "lapin::returned_messages=error";
    let level = config.log.level.as_str();
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(QUIET.parse().unwrap_or_default());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match config.log.format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli.command, config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
