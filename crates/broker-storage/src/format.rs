//! The on-disk encodings: file names, headers, entries and the bincode configuration.

use std::path::Path;

use bincode::config::{Configuration, Fixint, LittleEndian, NoLimit};
use broker_core::{Command, Revision};
use serde::{Deserialize, Serialize};

use crate::StorageError;

/// The format version this build writes, in every log segment and snapshot header. It also
/// reads every earlier one (see [`OLDEST_FORMAT_VERSION`]): a data directory of an earlier
/// format is migrated to this one when a server opens it. Format 3 added idempotent producers
/// to snapshots (its log entries are those of format 2, with one more command); format 4 a
/// group's maximum of deliveries and dead-letter topic (and, in the log, delayed retries and
/// the group settings that name them); format 5, in snapshots, which partitions each group
/// stored an offset on (its log entries are those of format 4); format 6, in the log, entries
/// whose published records are in their partitions' record segments instead
/// ([`EntryRef::Placed`]; its snapshots are those of format 5); format 7, in the log, entries
/// applied under [`Revision::Bounded`] (see [`revision_of_format`]; its entries and snapshots
/// are encoded as those of format 6).
pub const FORMAT_VERSION: u32 = 7;

/// The revision of the core's rules the entries of a log segment of format `version` were
/// applied under, and are replayed under: [`Revision::Original`] up to format 6,
/// [`Revision::Bounded`] from format 7 on.
pub fn revision_of_format(version: u32) -> Revision {
    match version {
        0..=6 => Revision::Original,
        7.. => Revision::Bounded,
    }
}

/// The oldest format version this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// The largest entry body: a command is at most one request frame.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024 * 1024;

/// The bincode configuration of entry and snapshot bodies.
pub type StorageConfig = Configuration<LittleEndian, Fixint, NoLimit>;

/// The bincode 2.0.1 configuration of entry and snapshot bodies: little-endian, fixed-width
/// integers (enum variants `u32`, lengths `u64`). Bodies are decoded only after their checksum
/// and their length (at most [`MAX_ENTRY_BYTES`] for an entry) are checked.
pub fn config() -> StorageConfig {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
}

pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"BROKRWAL";
pub(crate) const SNAPSHOT_MAGIC: [u8; 8] = *b"BROKSNAP";
pub(crate) const SEGMENT_HEADER: usize = 32;
pub(crate) const SNAPSHOT_HEADER: usize = 40;
pub(crate) const ENTRY_HEADER: usize = 8;

/// What a log entry of format 2 says happened, as it is encoded: a command applied at a time,
/// or time passing (see [`broker_core::BrokerState::advance_clock`]). Format 1 entries are a
/// bare [`broker_core::v1::Command`], applied with no time.
#[derive(Debug, Serialize)]
pub enum EntryRef<'a> {
    /// [`broker_core::BrokerState::apply_at`] of `command` at `at_ms`.
    Apply {
        /// Milliseconds since the Unix epoch.
        at_ms: i64,
        /// The command.
        command: &'a Command,
    },
    /// [`broker_core::BrokerState::advance_clock`] to `at_ms`.
    Tick {
        /// Milliseconds since the Unix epoch.
        at_ms: i64,
    },
    /// [`broker_core::BrokerState::apply_at`] of `command` at `at_ms`, where the records
    /// `placed` names were taken out of the command ([`broker_core::RecordParts::take`]): they
    /// are in their partitions' record segments, at the offsets `placed` gives, and are put
    /// back from there before the command is replayed (format 6).
    Placed {
        /// Milliseconds since the Unix epoch.
        at_ms: i64,
        /// The command, without the records `placed` names.
        command: &'a Command,
        /// Where the records taken out are.
        placed: &'a [PlacedRun],
    },
}

/// Records a command published that were stored at consecutive offsets of one partition: its
/// records `first..first + count` (numbered as
/// [`broker_core::Command::published_records_mut`] lists them) are at offsets
/// `offset..offset + count` of `partition`. Encoded as `first` `u32`, `count` `u32`,
/// `partition` `i32`, `offset` `i64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacedRun {
    /// The first record's number in the command.
    pub first: u32,
    /// How many records.
    pub count: u32,
    /// Their partition.
    pub partition: i32,
    /// The first record's offset.
    pub offset: i64,
}

impl PlacedRun {
    /// The runs of `placements` (where each record of a command went, `-1` for one not stored
    /// now, see [`broker_core::Command::placements`]) whose records `stored` says the command
    /// stored (asked in record order, for each placement with an offset), in record order.
    pub fn runs(
        placements: &[(i32, i64)],
        mut stored: impl FnMut(i32, i64) -> bool,
    ) -> Vec<PlacedRun> {
        let mut runs: Vec<PlacedRun> = Vec::new();
        for (number, &(partition, offset)) in placements.iter().enumerate() {
            if offset < 0 || !stored(partition, offset) {
                continue;
            }
            // At most one frame of records: fewer than 2^32.
            let number = number as u32;
            match runs.last_mut() {
                Some(run)
                    if run.partition == partition
                        && run.first + run.count == number
                        && run.offset + i64::from(run.count) == offset =>
                {
                    run.count += 1;
                }
                _ => runs.push(PlacedRun {
                    first: number,
                    count: 1,
                    partition,
                    offset,
                }),
            }
        }
        runs
    }

    /// Each record of the run: its number in the command and its offset.
    pub fn records(&self) -> impl Iterator<Item = (usize, i64)> {
        let (first, offset) = (self.first as usize, self.offset);
        (0..self.count as usize).map(move |index| (first + index, offset + index as i64))
    }
}

/// A log entry of format 2 or later read back: [`EntryRef`], owned.
#[derive(Debug, Deserialize)]
pub(crate) enum Entry {
    Apply {
        at_ms: i64,
        command: Command,
    },
    Tick {
        at_ms: i64,
    },
    Placed {
        at_ms: i64,
        command: Command,
        placed: Vec<PlacedRun>,
    },
}

/// Appends the log entry of `entry` (length, checksum, body) to `out`.
///
/// # Errors
/// [`StorageError::Encode`] if the entry cannot be encoded or is larger than
/// [`MAX_ENTRY_BYTES`]; `out` is then unchanged.
pub fn encode_entry(entry: &EntryRef<'_>, out: &mut Vec<u8>) -> Result<(), StorageError> {
    let start = out.len();
    out.extend_from_slice(&[0; ENTRY_HEADER]);
    if let Err(error) = bincode::serde::encode_into_std_write(entry, out, config()) {
        out.truncate(start);
        return Err(StorageError::Encode(error.to_string()));
    }
    let length = out.len() - start - ENTRY_HEADER;
    if length > MAX_ENTRY_BYTES {
        out.truncate(start);
        return Err(StorageError::Encode(format!(
            "an entry of {length} bytes exceeds the limit of {MAX_ENTRY_BYTES}"
        )));
    }
    // `length <= MAX_ENTRY_BYTES < u32::MAX`, so the cast is lossless.
    let length = (length as u32).to_le_bytes();
    let crc = entry_crc(length, &out[start + ENTRY_HEADER..]);
    out[start..start + 4].copy_from_slice(&length);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The checksum of an entry whose 4 length bytes are `length` and whose body is `body`.
pub(crate) fn entry_crc(length: [u8; 4], body: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&length);
    crc.update(body);
    crc.finalize()
}

/// The 32-byte header of a segment whose first entry is `first_seq`.
pub(crate) fn segment_header(capacity: i32, first_seq: u64) -> [u8; SEGMENT_HEADER] {
    let mut header = [0; SEGMENT_HEADER];
    header[..8].copy_from_slice(&SEGMENT_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&(capacity as u32).to_le_bytes());
    header[16..24].copy_from_slice(&first_seq.to_le_bytes());
    let crc = crc32fast::hash(&header[..24]);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    header
}

/// A segment header read back: the format version, the capacity and the first sequence
/// number.
pub(crate) struct SegmentHeader {
    pub(crate) version: u32,
    pub(crate) capacity: i32,
    pub(crate) first_seq: u64,
}

/// Refuses a format version this build does not read.
pub(crate) fn check_version(path: &Path, version: u32) -> Result<(), StorageError> {
    if (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        Ok(())
    } else {
        Err(StorageError::Incompatible {
            path: path.to_owned(),
            found: version,
            supported: FORMAT_VERSION,
        })
    }
}

/// Checks and decodes a segment header (`bytes` holds at least [`SEGMENT_HEADER`] bytes).
pub(crate) fn read_segment_header(
    path: &Path,
    bytes: &[u8],
) -> Result<SegmentHeader, StorageError> {
    if bytes[..8] != SEGMENT_MAGIC {
        return Err(StorageError::corrupt(
            path,
            0,
            "not a log segment (bad magic)",
        ));
    }
    let version = u32_at(bytes, 8);
    check_version(path, version)?;
    if crc32fast::hash(&bytes[..24]) != u32_at(bytes, 24) {
        return Err(StorageError::corrupt(
            path,
            0,
            "segment header checksum mismatch",
        ));
    }
    Ok(SegmentHeader {
        version,
        capacity: u32_at(bytes, 12) as i32,
        first_seq: u64_at(bytes, 16),
    })
}

/// The little-endian `u32` at `at` (the caller checked the length).
pub(crate) fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut buf = [0; 4];
    buf.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(buf)
}

/// The little-endian `u64` at `at` (the caller checked the length).
pub(crate) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut buf = [0; 8];
    buf.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(buf)
}

/// `wal-<first_seq>.log`.
pub(crate) fn segment_name(first_seq: u64) -> String {
    format!("wal-{first_seq:020}.log")
}

/// `snap-<seq>.snap`.
pub(crate) fn snapshot_name(seq: u64) -> String {
    format!("snap-{seq:020}.snap")
}

/// The sequence number in a file name `<prefix><20 digits><suffix>`.
pub(crate) fn parse_name(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}
