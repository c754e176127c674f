//! Deadlines from timeouts, any of which may be too large for the clock.

use std::time::Duration;

use tokio::time::Instant;

/// How far away the deadline of a timeout too large for the clock is: a century.
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The instant `timeout` after `now`; a timeout too large for the clock (such as
/// `Duration::MAX`, meaning "never") is a deadline a century away.
pub(crate) fn after(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout).unwrap_or_else(|| now + NEVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_too_large_for_the_clock_is_a_century() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(after(now, Duration::MAX), now + NEVER);
    }
}
