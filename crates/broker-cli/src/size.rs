//! Disk sizing: message size × rate × retention × replication, plus headroom, in
//! overflow-checked 64-bit arithmetic.

use std::fmt;
use std::time::Duration;

use broker_storage::RECORD_OVERHEAD_BYTES;
use serde::Serialize;

/// What to size: the inputs of the sizing example's capacity plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizingInput {
    /// Average message size in bytes (payload plus key and overhead, as the user counts it).
    pub message_bytes: u64,
    /// Messages per second.
    pub messages_per_second: u64,
    /// How long messages are kept.
    pub retention: Duration,
    /// Copies of every message (1 for a single broker).
    pub replication: u64,
    /// Extra room on top of the raw figure, in percent (30 to 50 is common).
    pub headroom_percent: u64,
}

/// The sizing result, every figure in bytes (but `records`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sizing {
    /// Bytes written per second, one copy.
    pub bytes_per_second: u64,
    /// Bytes kept for the whole retention period, one copy.
    pub one_copy_bytes: u64,
    /// `one_copy_bytes × replication`: the floor.
    pub replicated_bytes: u64,
    /// `replicated_bytes` plus the headroom, rounded up: what to provision.
    pub with_headroom_bytes: u64,
    /// Messages kept for the whole retention period (records of one copy).
    pub records: u64,
    /// What the broker's record segments add to each record on disk (its segment entry and its
    /// index entry), taking the message size as payload plus key.
    pub overhead_bytes_per_record: u64,
    /// One copy on the broker's disk: `records × (message + overhead)`.
    pub on_disk_bytes: u64,
    /// `on_disk_bytes × replication` plus the headroom, rounded up: what to provision for the
    /// broker's own files.
    pub on_disk_with_headroom_bytes: u64,
}

/// A product that does not fit in 64 bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizingOverflow {
    /// Which step overflowed.
    pub step: &'static str,
}

impl fmt::Display for SizingOverflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the {} does not fit in 64 bits (over 18.4 EB): check the inputs",
            self.step
        )
    }
}

impl std::error::Error for SizingOverflow {}

/// Computes the sizing; every multiplication is checked, so no input can wrap around.
pub fn size(input: SizingInput) -> Result<Sizing, SizingOverflow> {
    let overflow = |step| SizingOverflow { step };
    let bytes_per_second = input
        .message_bytes
        .checked_mul(input.messages_per_second)
        .ok_or(overflow("bytes per second"))?;
    let one_copy_bytes = bytes_per_second
        .checked_mul(input.retention.as_secs())
        .ok_or(overflow("size of one copy"))?;
    let replicated_bytes = one_copy_bytes
        .checked_mul(input.replication)
        .ok_or(overflow("replicated size"))?;
    let with_headroom = |bytes: u64, step| {
        let scaled = u128::from(bytes) * u128::from(100 + input.headroom_percent);
        u64::try_from(scaled.div_ceil(100)).map_err(|_| overflow(step))
    };
    let with_headroom_bytes = with_headroom(replicated_bytes, "size with headroom")?;
    let records = input
        .messages_per_second
        .checked_mul(input.retention.as_secs())
        .ok_or(overflow("number of records"))?;
    let overhead_bytes_per_record = RECORD_OVERHEAD_BYTES;
    let on_disk_bytes = input
        .message_bytes
        .checked_add(overhead_bytes_per_record)
        .and_then(|stored| stored.checked_mul(records))
        .ok_or(overflow("size on disk"))?;
    let on_disk_with_headroom_bytes = with_headroom(
        on_disk_bytes
            .checked_mul(input.replication)
            .ok_or(overflow("replicated size on disk"))?,
        "size on disk with headroom",
    )?;
    Ok(Sizing {
        bytes_per_second,
        one_copy_bytes,
        replicated_bytes,
        with_headroom_bytes,
        records,
        overhead_bytes_per_record,
        on_disk_bytes,
        on_disk_with_headroom_bytes,
    })
}

/// `2332800000000` as `2,332,800,000,000`.
pub fn with_thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// Decimal and binary human units: `2.33 TB (2.12 TiB)`.
pub fn human(bytes: u64) -> String {
    fn scaled(bytes: u64, base: f64, units: [&str; 7]) -> String {
        let mut value = bytes as f64;
        let mut unit = 0;
        while value >= base && unit < units.len() - 1 {
            value /= base;
            unit += 1;
        }
        if unit == 0 {
            format!("{bytes} {}", units[0])
        } else {
            format!("{value:.2} {}", units[unit])
        }
    }
    let decimal = scaled(bytes, 1000.0, ["B", "kB", "MB", "GB", "TB", "PB", "EB"]);
    let binary = scaled(
        bytes,
        1024.0,
        ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"],
    );
    if bytes < 1000 {
        decimal
    } else {
        format!("{decimal} ({binary})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizing_example(headroom_percent: u64) -> SizingInput {
        SizingInput {
            message_bytes: 1_500,
            messages_per_second: 2_000,
            retention: Duration::from_secs(3 * 86_400),
            replication: 3,
            headroom_percent,
        }
    }

    #[test]
    fn the_sizing_example_gives_2_332_800_000_000_bytes_before_headroom() {
        let sizing = size(sizing_example(0)).unwrap();
        assert_eq!(sizing.bytes_per_second, 3_000_000);
        assert_eq!(sizing.one_copy_bytes, 777_600_000_000);
        assert_eq!(sizing.replicated_bytes, 2_332_800_000_000);
        assert_eq!(sizing.with_headroom_bytes, 2_332_800_000_000);
        assert_eq!(with_thousands(sizing.replicated_bytes), "2,332,800,000,000");
        // 518.4 million records, each with the segment format's overhead on disk.
        assert_eq!(sizing.records, 518_400_000);
        assert_eq!(
            sizing.on_disk_bytes,
            518_400_000 * (1_500 + RECORD_OVERHEAD_BYTES)
        );
    }

    #[test]
    fn headroom_is_added_on_top_and_rounded_up() {
        assert_eq!(
            size(sizing_example(30)).unwrap().with_headroom_bytes,
            3_032_640_000_000
        );
        let odd = SizingInput {
            message_bytes: 1,
            messages_per_second: 1,
            retention: Duration::from_secs(1),
            replication: 1,
            headroom_percent: 50,
        };
        assert_eq!(size(odd).unwrap().with_headroom_bytes, 2);
    }

    #[test]
    fn products_past_64_bits_are_reported_not_wrapped() {
        let huge = SizingInput {
            message_bytes: u64::MAX / 2,
            messages_per_second: 3,
            retention: Duration::from_secs(1),
            replication: 1,
            headroom_percent: 0,
        };
        assert_eq!(size(huge).unwrap_err().step, "bytes per second");
        let replicated = SizingInput {
            message_bytes: 1 << 20,
            messages_per_second: 1 << 20,
            retention: Duration::from_secs(1 << 20),
            replication: 1 << 10,
            headroom_percent: 0,
        };
        assert_eq!(size(replicated).unwrap_err().step, "replicated size");
        let headroom = SizingInput {
            message_bytes: u64::MAX,
            messages_per_second: 1,
            retention: Duration::from_secs(1),
            replication: 1,
            headroom_percent: 1,
        };
        assert_eq!(size(headroom).unwrap_err().step, "size with headroom");
    }

    #[test]
    fn thirty_two_bit_overflowing_inputs_are_exact() {
        // 1500 × 2000 × 259200 overflows 32 bits at the second step.
        assert!(size(sizing_example(0)).unwrap().one_copy_bytes > u64::from(u32::MAX));
    }

    #[test]
    fn thousands_separators_and_human_units() {
        assert_eq!(with_thousands(0), "0");
        assert_eq!(with_thousands(999), "999");
        assert_eq!(with_thousands(1_000), "1,000");
        assert_eq!(with_thousands(u64::MAX), "18,446,744,073,709,551,615");
        assert_eq!(human(512), "512 B");
        assert_eq!(human(2_332_800_000_000), "2.33 TB (2.12 TiB)");
    }
}
