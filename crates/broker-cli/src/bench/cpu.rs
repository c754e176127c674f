//! The CPU time this process has spent, user and system, every thread together, read from
//! `/proc/self/stat` (Linux; the workspace forbids the `unsafe` a `getrusage` call would need).
//! Its unit is the kernel's clock tick, `AT_CLKTCK` in `/proc/self/auxv` (what `getconf
//! CLK_TCK` prints; 100 a second on common systems), so a reading is exact to 10 ms there.

/// `AT_CLKTCK`: the auxiliary vector's entry for clock ticks per second.
const AT_CLKTCK: usize = 17;
/// Linux's `USER_HZ` on every common architecture, where the auxiliary vector cannot be read.
const DEFAULT_TICKS_PER_SEC: u64 = 100;

/// CPU seconds spent in user space and in the kernel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct CpuTime {
    pub(super) user_s: f64,
    pub(super) system_s: f64,
}

impl CpuTime {
    /// What this process has spent so far, or `None` where `/proc` cannot tell.
    pub(super) fn of_this_process() -> Option<CpuTime> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let (user, system) = ticks_of(&stat)?;
        let per_sec = std::fs::read("/proc/self/auxv")
            .ok()
            .and_then(|auxv| ticks_per_sec(&auxv))
            .unwrap_or(DEFAULT_TICKS_PER_SEC) as f64;
        Some(CpuTime {
            user_s: user as f64 / per_sec,
            system_s: system as f64 / per_sec,
        })
    }

    /// What was spent between `earlier` and this reading.
    pub(super) fn since(self, earlier: CpuTime) -> CpuTime {
        CpuTime {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            system_s: (self.system_s - earlier.system_s).max(0.0),
        }
    }
}

/// `utime` and `stime` (fields 14 and 15, in clock ticks) of a `/proc/PID/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces and parentheses itself: the
/// fields are counted from after its last `)`.
fn ticks_of(stat: &str) -> Option<(u64, u64)> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name: state (field 3) first, so utime is the 12th.
    let mut fields = after_name.split_whitespace().skip(11);
    let user = fields.next()?.parse().ok()?;
    let system = fields.next()?.parse().ok()?;
    Some((user, system))
}

/// `AT_CLKTCK` from the auxiliary vector: pairs of native-endian words, key then value.
fn ticks_per_sec(auxv: &[u8]) -> Option<u64> {
    const WORD: usize = std::mem::size_of::<usize>();
    auxv.chunks_exact(2 * WORD).find_map(|pair| {
        let word = |bytes: &[u8]| bytes.try_into().ok().map(usize::from_ne_bytes);
        let (key, value) = (word(&pair[..WORD])?, word(&pair[WORD..])?);
        (key == AT_CLKTCK && value > 0).then_some(value as u64)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_times_are_read_after_the_command_name() {
        // A name with spaces and parentheses, as a thread may be named.
        let stat = "4242 (broker (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 731 86 0 0 20 0 \
                    2 0 123 456789 1234 18446744073709551615";
        assert_eq!(ticks_of(stat), Some((731, 86)));
        assert_eq!(ticks_of("4242 (broker) S 1 2"), None);
        assert_eq!(ticks_of("no name at all"), None);
    }

    #[test]
    fn the_tick_rate_comes_from_the_auxiliary_vector() {
        let auxv: Vec<u8> = [(6usize, 4096usize), (AT_CLKTCK, 250), (0, 0)]
            .iter()
            .flat_map(|&(key, value)| [key.to_ne_bytes(), value.to_ne_bytes()])
            .flatten()
            .collect();
        assert_eq!(ticks_per_sec(&auxv), Some(250));
        assert_eq!(
            ticks_per_sec(&auxv[..2 * std::mem::size_of::<usize>()]),
            None
        );
    }

    #[test]
    fn this_process_can_be_read_and_a_difference_is_never_negative() {
        let now = CpuTime::of_this_process().unwrap();
        assert!(now.user_s >= 0.0 && now.system_s >= 0.0);
        let later = CpuTime {
            user_s: now.user_s + 1e9,
            system_s: now.system_s + 1e9,
        };
        let none = CpuTime {
            user_s: 0.0,
            system_s: 0.0,
        };
        assert_eq!(now.since(later), none);
        assert!(later.since(now).user_s > 0.0);
    }
}
