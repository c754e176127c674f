//! Durations as people type them (`10s`, `500ms`, `1h 30m`, `3d`) and as the broker shows
//! them: [`duration_text`] writes what [`parse_duration`] reads, so a duration shown (a topic's
//! maximum age in `broker describe`, in the server's log or in an error) can be typed back as
//! it is.

use std::time::Duration;

/// The longest duration a flag takes: longer ones are typing mistakes, and would overflow the
/// broker's times in milliseconds.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// Why text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// It starts with a minus sign and a digit.
    #[error("a duration cannot be negative (a duration such as 10s, 500ms or 1h 30m)")]
    Negative,
    /// It is another option (`--follow`): the value was left out.
    #[error(
        "the value is missing (a duration such as 10s, 500ms or 1h 30m), found the option {0}"
    )]
    Missing(String),
    /// It is longer than [`MAX_DURATION`].
    #[error("too long: at most 100 years (36500d)")]
    TooLong,
    /// It does not read as a duration; says why.
    #[error("{0} (a duration such as 10s, 500ms or 1h 30m)")]
    Invalid(String),
}

/// A duration such as `10s`, `500ms` or `1h 30m` (numbers each followed by a unit: `d`, `h`,
/// `m`, `s`, `ms`, and longer names such as `days`), of at most [`MAX_DURATION`].
///
/// # Errors
/// [`DurationError`] saying why `text` is not one.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    if let Some(rest) = text.trim_start().strip_prefix('-') {
        return Err(match rest.starts_with(|c: char| c.is_ascii_digit()) {
            true => DurationError::Negative,
            false => DurationError::Missing(text.to_owned()),
        });
    }
    match humantime::parse_duration(text) {
        Ok(duration) if duration <= MAX_DURATION => Ok(duration),
        Ok(_) | Err(humantime::DurationError::NumberOverflow) => Err(DurationError::TooLong),
        Err(error) => Err(DurationError::Invalid(error.to_string())),
    }
}

/// A duration in milliseconds as text [`parse_duration`] reads back to it: days, hours,
/// minutes, seconds and milliseconds, largest first, those that are zero left out, separated by
/// spaces (`3d`, `1m 30s`, `1h 30m`, `250ms`; `0s` for none).
pub fn duration_text(ms: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let mut left = ms;
    let parts: Vec<String> = UNITS
        .iter()
        .filter_map(|&(unit, size)| {
            let count = left / size;
            left %= size;
            (count > 0).then(|| format!("{count}{unit}"))
        })
        .collect();
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What [`duration_text`] shows for the duration `typed` reads as.
    fn shown(typed: &str) -> String {
        duration_text(parse_duration(typed).unwrap().as_millis() as u64)
    }

    #[test]
    fn a_duration_is_shown_in_its_canonical_form_which_reads_back_the_same() {
        for (typed, canonical) in [
            ("3d", "3d"),
            ("72h", "3d"),
            ("259200000ms", "3d"),
            ("90s", "1m 30s"),
            ("1h30m", "1h 30m"),
            ("1h 30m", "1h 30m"),
            ("90min", "1h 30m"),
            ("250ms", "250ms"),
            ("1500ms", "1s 500ms"),
            ("2days 1ms", "2d 1ms"),
            ("0s", "0s"),
            ("36500d", "36500d"),
        ] {
            assert_eq!(shown(typed), canonical, "{typed}");
            assert_eq!(shown(canonical), canonical, "{typed}");
        }
    }

    #[test]
    fn every_duration_shown_reads_back_as_itself() {
        let max = MAX_DURATION.as_millis() as u64;
        let mut ms = 0u64;
        while ms <= max {
            let text = duration_text(ms);
            assert_eq!(
                parse_duration(&text),
                Ok(Duration::from_millis(ms)),
                "{ms} shown as {text}"
            );
            // Steps that reach every unit, and values whose every unit is non-zero.
            ms = ms * 3 + 1_001;
        }
        assert_eq!(duration_text(86_400_000 + 61_001), "1d 1m 1s 1ms");
        assert_eq!(parse_duration(&duration_text(max)), Ok(MAX_DURATION));
    }

    #[test]
    fn durations_are_neither_negative_nor_longer_than_a_century() {
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("36500d"), Ok(MAX_DURATION));
        assert_eq!(parse_duration("36501d"), Err(DurationError::TooLong));
        assert_eq!(
            parse_duration("9223372036854775807ms"),
            Err(DurationError::TooLong)
        );
        assert_eq!(parse_duration("-1s"), Err(DurationError::Negative));
        assert!(parse_duration("--follow")
            .unwrap_err()
            .to_string()
            .contains("value is missing"));
        assert!(parse_duration("soon")
            .unwrap_err()
            .to_string()
            .contains("such as 10s"));
    }
}
