//! What `broker-server` and `broker` share about reading their settings.
//!
//! Both take every setting as a flag or an environment variable (`--capacity` or
//! `BROKER_CAPACITY`). When a value is bad, clap names the flag even if the value came from
//! the variable, which sends an operator looking for a flag nobody typed (in a container, the
//! variable is usually the only place a setting is given). [`name_the_variable`] rewrites such
//! an error to name the variable.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Parses the process's arguments against `command`, as [`clap::Command::get_matches`] does:
/// on `--help` or `--version` prints and exits 0; on bad arguments prints the error, rewritten
/// by [`name_the_variable`], and exits 2.
pub fn get_matches(command: clap::Command) -> clap::ArgMatches {
    let args: Vec<OsString> = std::env::args_os().collect();
    match command.clone().try_get_matches_from(&args) {
        Ok(matches) => matches,
        Err(error) => name_the_variable(error, &command, args.get(1..).unwrap_or_default()).exit(),
    }
}

/// `error`, from parsing `args` against `command`, rewritten to name the environment variable
/// its bad value came from: when it is an invalid value of a flag that has a variable, the
/// variable is set, and the flag is not among `args`. Any other error is returned unchanged.
pub fn name_the_variable(
    error: clap::Error,
    command: &clap::Command,
    args: &[OsString],
) -> clap::Error {
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return error;
    }
    let Some(ContextValue::String(shown)) = error.get(ContextKind::InvalidArg) else {
        return error;
    };
    // Arguments show as `--flag <VALUE>` only once their command is built.
    let mut built = command.clone();
    built.build();
    let Some(arg) = find_arg(&built, shown) else {
        return error;
    };
    let (Some(variable), Some(long)) = (arg.get_env(), arg.get_long()) else {
        return error;
    };
    let Some(value) = std::env::var_os(variable) else {
        return error;
    };
    if given_on_command_line(args, long, arg.get_short()) {
        return error;
    }
    let why = match (
        std::error::Error::source(&error),
        error.get(ContextKind::ValidValue),
    ) {
        (Some(cause), _) => cause.to_string(),
        (None, Some(ContextValue::Strings(valid))) => {
            format!("possible values: {}", valid.join(", "))
        }
        (None, _) => "not a valid value".to_owned(),
    };
    clap::Error::raw(
        error.kind(),
        format!(
            "invalid value {:?} in the environment variable {} (the variable of --{long}): {why}\n",
            value.to_string_lossy(),
            variable.to_string_lossy(),
        ),
    )
    .with_cmd(command)
}

/// The argument of `command` or of one of its subcommands that clap shows as `shown`
/// (`--capacity <CAPACITY>`).
fn find_arg<'a>(command: &'a clap::Command, shown: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|arg| arg.to_string() == shown)
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_arg(sub, shown))
        })
}

/// Whether `args` give the flag `--long` (or `-short`) a value themselves.
fn given_on_command_line(args: &[OsString], long: &str, short: Option<char>) -> bool {
    let long = format!("--{long}");
    let long_with_value = format!("{long}=");
    args.iter().filter_map(|arg| arg.to_str()).any(|arg| {
        arg == long
            || arg.starts_with(&long_with_value)
            || short.is_some_and(|short| {
                arg.strip_prefix('-')
                    .is_some_and(|rest| !rest.starts_with('-') && rest.starts_with(short))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn command() -> Command {
        Command::new("server").arg(
            Arg::new("capacity")
                .long("capacity")
                .short('c')
                .env("BROKER_ARGS_TEST_CAPACITY")
                .value_parser(clap::value_parser!(u32)),
        )
    }

    fn error_for(args: &[&str]) -> String {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let command = command();
        let error = command.clone().try_get_matches_from(&args).unwrap_err();
        name_the_variable(error, &command, &args[1..]).to_string()
    }

    #[test]
    fn a_bad_value_from_the_environment_names_the_variable_and_one_from_the_flag_the_flag() {
        // One test sets the variable, so that no other test sees it half-set.
        std::env::set_var("BROKER_ARGS_TEST_CAPACITY", "abc");
        let from_variable = error_for(&["server"]);
        assert!(
            from_variable.contains("invalid value \"abc\" in the environment variable BROKER_ARGS_TEST_CAPACITY (the variable of --capacity): invalid digit"),
            "{from_variable}"
        );
        let from_flag = error_for(&["server", "--capacity", "xyz"]);
        assert!(from_flag.contains("'xyz' for '--capacity"), "{from_flag}");
        assert!(
            !from_flag.contains("BROKER_ARGS_TEST_CAPACITY"),
            "{from_flag}"
        );
        let from_short = error_for(&["server", "-c", "xyz"]);
        assert!(!from_short.contains("environment variable"), "{from_short}");
        std::env::remove_var("BROKER_ARGS_TEST_CAPACITY");
    }
}

/// Parses a number of bytes, as the flags that take one accept it: a plain number
/// (`1048576`), or a whole number with a unit (`500MB`, `10GiB`, `64 KiB`; B, kB, MB, GB, TB in
/// powers of 1000, KiB, MiB, GiB, TiB in powers of 1024, in any case).
///
/// # Errors
/// What is wrong with `text`, and what a good value looks like.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if unit.starts_with('.') {
        return Err(format!(
            "{text:?}: give whole numbers, in a smaller unit if need be (1500MB, not 1.5GB)"
        ));
    }
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count (such as 1048576, 500MB or 10GiB)"))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB"
            ))
        }
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("{text:?} does not fit in 64 bits"))
}

/// [`parse_bytes`], for a setting held as a `usize`.
///
/// # Errors
/// As [`parse_bytes`], and a value this machine cannot address.
pub fn parse_bytes_usize(input: &str) -> Result<usize, String> {
    usize::try_from(parse_bytes(input)?)
        .map_err(|_| format!("{input:?} is more bytes than this machine can address"))
}

#[cfg(test)]
mod bytes_tests {
    use super::{parse_bytes, parse_bytes_usize};

    #[test]
    fn bytes_are_plain_numbers_or_numbers_with_a_unit() {
        assert_eq!(parse_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_bytes("500MB"), Ok(500_000_000));
        assert_eq!(parse_bytes("10 GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes("64kib"), Ok(64 << 10));
        assert_eq!(parse_bytes_usize(" 16MiB "), Ok(16 << 20));
        assert!(parse_bytes("ten").is_err());
        assert!(parse_bytes("5 apples")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_bytes("99999999999TiB").is_err());
        assert!(parse_bytes("1.5GB").unwrap_err().contains("whole numbers"));
    }
}
