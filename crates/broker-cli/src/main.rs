//! `broker`: the broker's command-line tool. Parses the command line and reports errors as one
//! line; the subcommands live in their own modules.

mod bench;
mod cli;
mod commands;
mod output;
mod size;

use std::process::ExitCode;

use clap::Parser;

/// The allocator: jemalloc, faster than the system's under this workload (BENCHMARKS.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    match commands::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
