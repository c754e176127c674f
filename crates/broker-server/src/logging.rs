//! Logging: the filter, from `RUST_LOG` or `--log-level` and checked strictly, and the format
//! of the lines on standard error.

use std::io::IsTerminal;
use std::str::FromStr;

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// `--log-format`: how each log line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines: time, level, target, message and fields.
    Text,
    /// One JSON object per line, fields at the top level, for log collectors.
    Json,
}

/// Checks a log filter strictly, as `--log-level`'s value parser, and returns it without
/// spaces around its directives: every comma-separated directive must be a level (`info`) or
/// name one (`broker_server=debug`). A word that is neither, such as a misspelt level, is
/// refused rather than taken as the name of a module to log everything from.
pub(crate) fn check_filter(directives: &str) -> Result<String, String> {
    const HINT: &str = "use a level (off, error, warn, info, debug, trace) or \
                        TARGET=LEVEL directives separated by commas, such as \
                        info,broker_server=debug";
    if directives.trim().is_empty() {
        return Err(format!("the log filter is empty; {HINT}"));
    }
    let directives: Vec<&str> = directives.split(',').map(str::trim).collect();
    for directive in &directives {
        let level = directive
            .rsplit_once('=')
            .map_or(*directive, |(_, level)| level);
        if directive.is_empty() || LevelFilter::from_str(level).is_err() {
            return Err(format!(
                "{directive:?} is not a log level or directive; {HINT}"
            ));
        }
    }
    // Spaces around directives are ignored here, but not by the filter's own parser.
    let directives = directives.join(",");
    EnvFilter::try_new(&directives).map_err(|error| format!("{error}; {HINT}"))?;
    Ok(directives)
}

/// The filter: `RUST_LOG` when set (checked as strictly as `--log-level`), else `level`
/// (already checked).
pub(crate) fn filter(level: &str) -> Result<EnvFilter, String> {
    let directives = match std::env::var("RUST_LOG") {
        Ok(value) => check_filter(&value).map_err(|why| format!("invalid RUST_LOG: {why}"))?,
        Err(std::env::VarError::NotPresent) => level.to_owned(),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err("invalid RUST_LOG: it is not valid UTF-8".to_owned())
        }
    };
    EnvFilter::try_new(with_quiet_consensus(&directives))
        .map_err(|error| format!("invalid log filter: {error}"))
}

/// `directives` with the consensus engine's own lines (target `openraft`) off unless they name
/// it: it reports every vote and message of an election, and every retry to a node that is
/// down (at error level), routine in a cluster, while the server says what matters in its own
/// lines (a change of leader, a peer unreachable and back, a storage failure).
fn with_quiet_consensus(directives: &str) -> String {
    if directives.contains("openraft") {
        directives.to_owned()
    } else {
        format!("{directives},openraft=off")
    }
}

/// Installs the subscriber writing `format` lines to standard error. The lines are written by a
/// thread of their own (a thread that logs, possibly holding the broker's lock, only queues its
/// line; past 128,000 lines waiting, new ones are dropped rather than slow the broker down);
/// keep the guard until the end: dropping it writes what is still queued.
pub(crate) fn init(filter: EnvFilter, format: LogFormat) -> WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // A log line that cannot be written (standard error on a full disk) is dropped: by
        // default the subscriber reports that on standard error itself, and a failing report
        // panics the thread that logged, such as the log writer's.
        .log_internal_errors(false);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).init(),
    }
    guard
}

#[cfg(test)]
mod tests {
    use super::check_filter;

    #[test]
    fn only_levels_and_directives_that_name_one_are_filters() {
        for good in [
            "info",
            "debug",
            "off",
            "info,broker_server=trace",
            " warn , h2=off ",
        ] {
            assert!(check_filter(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "verbose",
            "infoo",
            "info,broker_server",
            "broker=loud",
            "info,,debug",
        ] {
            assert!(check_filter(bad).is_err(), "{bad}");
        }
    }
}
