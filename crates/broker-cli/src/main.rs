//! `broker`: the broker's command-line tool. Parses the command line and reports errors as one
//! line; the subcommands live in their own modules.

/// `println!` that returns the error instead of panicking when standard output is closed by its
/// reader (`broker describe | head -1`); `main` ends quietly on that error.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*)
    }};
}

mod bench;
mod cli;
mod commands;
mod connect;
mod output;
mod retention;
mod size;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// The allocator: jemalloc, faster than the system's under this workload (BENCHMARKS.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let cli::Command::Bench(args) = &cli.command {
        if let Err(problem) = args.check() {
            cli::Cli::command()
                .error(clap::error::ErrorKind::ValueValidation, problem)
                .exit();
        }
        if let Some(threads) = args.threads {
            // At most 1,024 (checked by clap).
            runtime.worker_threads(threads as usize);
        }
    }
    let ran = runtime
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(commands::run(cli)));
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of standard output went away (`| head`): nothing more to say.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        // Said already: how many records it consumed before the signal.
        Err(error) if error.is::<commands::Interrupted>() => ExitCode::from(
            error
                .downcast_ref::<commands::Interrupted>()
                .map_or(1, |i| i.code),
        ),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `error` is standard output closed by its reader.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
