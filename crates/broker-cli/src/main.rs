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
mod cluster;
mod commands;
mod connect;
mod kafka_groups;
mod output;
mod retention;
mod size;
mod top;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches};

/// The allocator: jemalloc, faster than the system's under this workload (BENCHMARKS.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let matches = broker_args::get_matches(cli::Cli::command());
    let cli = cli::Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    // The client library warns through `tracing` (a cluster node whose name does not resolve,
    // left out): its warnings go to standard error, one line each.
    // (A failed write to stderr is not reported on stderr, where it would panic; and only this
    // library's `tracing` events come through, not the `log` records of its dependencies.)
    let warnings = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .without_time()
        .with_target(false)
        .log_internal_errors(false)
        .finish();
    // Only fails if a subscriber is set already, which nothing here does.
    let _ = tracing::subscriber::set_global_default(warnings);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let cli::Command::Bench(bench) = &cli.command {
        if let Err(problem) = bench.args.check() {
            let mut command = cli::Cli::command();
            command.build();
            if let Some(bench) = command.find_subcommand_mut("bench") {
                bench
                    .error(clap::error::ErrorKind::ValueValidation, problem)
                    .exit();
            }
        }
        if let Some(threads) = bench.args.threads {
            // At most 1,024 (checked by clap).
            runtime.worker_threads(threads as usize);
        }
    }
    if cli.command.connect_args().is_none() {
        // `broker --addr HOST size`: options for a server given to a command that talks to none.
        let given = cli::ConnectArgs::IDS
            .iter()
            .find(|id| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine));
        if let Some(id) = given {
            let mut command = cli::Cli::command();
            command.build();
            command
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!(
                        "--{} is a connection option, and this command talks to no server",
                        id.replace('_', "-")
                    ),
                )
                .exit();
        }
    }
    let connect = connect_args(&cli, &matches);
    let ran = runtime
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(commands::run(connect, cli.command)));
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
        // Arguments that do not go together: refused as clap refuses arguments (exit 2).
        Err(error) if error.is::<commands::Usage>() => {
            let message = error.to_string();
            let mut command = cli::Cli::command();
            command.build();
            let subcommand = error
                .downcast_ref::<commands::Usage>()
                .map_or("", |usage| usage.command);
            match command.find_subcommand_mut(subcommand) {
                Some(subcommand) => subcommand
                    .error(clap::error::ErrorKind::ArgumentConflict, message)
                    .exit(),
                None => command
                    .error(clap::error::ErrorKind::ArgumentConflict, message)
                    .exit(),
            }
        }
        // A membership change whose last steps go on after the command: not a failure.
        Err(error) if error.is::<cluster::Pending>() => {
            eprintln!("pending: {error}");
            ExitCode::from(cluster::Pending::EXIT_STATUS)
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            if may_have_been_applied(&error) {
                eprintln!(
                    "note: the answer was lost or late, so the server may have carried the \
                     request out; look before repeating a change (a publish repeated is stored \
                     twice)"
                );
            }
            ExitCode::FAILURE
        }
    }
}

/// The connection options of the command: those given after its name, else those given
/// before it (`broker --addr HOST describe`), else its environment variables and defaults.
fn connect_args(cli: &cli::Cli, matches: &ArgMatches) -> Option<cli::ConnectArgs> {
    let after = cli.command.connect_args()?;
    let mut leaf = matches;
    while let Some((_, sub)) = leaf.subcommand() {
        leaf = sub;
    }
    let given = |matches: &ArgMatches, id: &str| {
        matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
    Some(cli::ConnectArgs::merge(
        cli.connect.clone(),
        after.clone(),
        |id| given(matches, id) && !given(leaf, id),
    ))
}

/// Whether `error` is a client call whose answer was lost or late, so that the server may
/// have applied it.
fn may_have_been_applied(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<broker_client::Error>()
            .is_some_and(broker_client::Error::may_have_been_applied)
    })
}

/// Whether `error` is standard output closed by its reader.
fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lost_or_late_answer_may_have_been_applied() {
        let late = anyhow::Error::from(broker_client::Error::Timeout).context("publishing to t");
        assert!(may_have_been_applied(&late));
        let lost = anyhow::Error::from(broker_client::Error::ConnectionLost("reset".to_owned()));
        assert!(may_have_been_applied(&lost));
        let refused = anyhow::Error::from(broker_client::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(!may_have_been_applied(&refused));
        assert!(!may_have_been_applied(&anyhow::anyhow!("no such topic")));
    }
}
