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
/// (`16777216`), or a whole number of KiB, MiB, GiB or TiB (`16MiB`, `1 GiB`; powers of 1024,
/// the unit in any case).
///
/// # Errors
/// What is wrong with `input`, and what a good value looks like.
pub fn parse_bytes(input: &str) -> Result<u64, String> {
    let trimmed = input.trim();
    let digits = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits);
    let example = "a number of bytes, such as 16777216, or with a unit, such as 16MiB \
                   (KiB, MiB, GiB or TiB)";
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{input:?} is not {example}"))?;
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => return Err(format!("{input:?} is not {example}")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{input:?} is more bytes than can be counted"))
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
    use super::parse_bytes;

    #[test]
    fn bytes_are_plain_numbers_or_binary_units() {
        assert_eq!(parse_bytes("16777216"), Ok(16_777_216));
        assert_eq!(parse_bytes("16MiB"), Ok(16 << 20));
        assert_eq!(parse_bytes(" 1 GiB "), Ok(1 << 30));
        assert_eq!(parse_bytes("64kib"), Ok(64 << 10));
        assert_eq!(parse_bytes("2TiB"), Ok(2 << 40));
        for bad in ["", "16MB", "1.5GiB", "-1", "MiB", "16 MiBs"] {
            let refused = parse_bytes(bad).unwrap_err();
            assert!(refused.contains("16MiB"), "{bad:?}: {refused}");
        }
        assert!(parse_bytes("99999999999TiB")
            .unwrap_err()
            .contains("more bytes"));
    }
}
