//! `broker`: the broker's command-line tool. Parses the command line and reports errors as one
//! line; the subcommands live in their own modules.

mod bench;
mod cli;
mod commands;
mod output;
mod size;
mod wire;

use std::process::ExitCode;

use clap::Parser;

/// The allocator: jemalloc, faster than the system's under this workload (BENCHMARKS.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let cli::Command::Bench(bench::BenchArgs {
        threads: Some(threads),
        ..
    }) = &cli.command
    {
        runtime.worker_threads(threads.get());
    }
    let ran = runtime
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(commands::run(cli)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
