//! The `hookrelay` binary: parse the command line, load configuration, start logs and traces,
//! run the command, map errors to exit codes.

use std::process::ExitCode;

use clap::Parser;
use hookrelay::cli::{self, Cli};
use hookrelay::config::{Config, ProcessEnv};

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
    let traces = match hookrelay::observe::logs::install(&config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: traces: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(cli::run(cli.command, config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    };
    // The last spans: sent, or given up on after a short wait.
    if let Some(traces) = traces {
        traces.shutdown(std::time::Duration::from_secs(5));
    }
    code
}
