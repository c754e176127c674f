//! The broker's durability, with no async runtime: a write-ahead log of
//! [`broker_core::Command`]s and their times with its [`Journal`] (the flusher thread, the fsync
//! policy, group commit, background checkpoints), per-partition record segments to which the
//! flusher writes every record as it comes (or, with `--fsync always`, checkpoints write them)
//! and from which the state reads the records checkpoints took out of memory ([`RecordStore`], the state's cold store), snapshots
//! of the state's [`broker_core::image::StateImage`], a lock that keeps a second server off a
//! data directory, and recovery that replays the log through [`broker_core::BrokerState::apply_at`],
//! the same code that serves live requests.
//!
//! # The data directory
//!
//! ```text
//! LOCK                          held (flock) by the server using the directory; holds its pid
//! wal-<first seq, 20 digits>.log  a log segment: a header, then entries
//! snap-<seq, 20 digits>.snap      a snapshot: the state after every entry below <seq>
//! snap.tmp                      a snapshot being written (removed on start)
//! records/<topic>-<partition>/  record segments of one partition (see the records module)
//! ```
//!
//! Every log entry has a sequence number: the segment's first sequence number plus its index in
//! the segment. Sequence numbers count every entry ever logged, across segments and restarts.
//!
//! # Formats (all integers little-endian)
//!
//! Segment header, 32 bytes: magic `BROKRWAL`, format version `u32` ([`FORMAT_VERSION`]), the
//! broker's per-partition capacity the entries were logged under `u32`, the first sequence
//! number `u64`, a CRC-32 of the 24 bytes before it `u32`, 4 zero bytes.
//!
//! Entry: body length `u32`, CRC-32 of the length's 4 bytes followed by the body `u32`, body in
//! bincode 2.0.1 serde encoding with [`config()`] (fixed-width integers, enum variants as `u32`,
//! lengths as `u64`, `Option` as a `u8` tag), the same layout as the wire protocol's. Format 2
//! and later: the body is an [`EntryRef`]: `0` then the time `i64` and the command, `1` then
//! the time (the clock advanced), or (format 6) `2` then the time, the command with the records
//! it stored taken out (their key `None`, payload and headers empty) and where those records
//! are: a `u64` count of [`PlacedRun`]s, each `u32` first record, `u32` count, `i32` partition,
//! `i64` first offset. Format 1: the body is a [`broker_core::v1::Command`].
//!
//! Snapshot, 40-byte header then body: magic `BROKSNAP`, format version `u32`, capacity `u32`,
//! sequence number `u64` (the snapshot holds the effect of every entry below it), body length
//! `u64`, CRC-32 of the body `u32`, 4 zero bytes; body, format 5: a [`Checkpoint`] (the state's
//! [`broker_core::image::StateImage`], whose documentation gives its layout, then the record
//! segment catalog); formats 4, 3 and 2: the same with the state images of versions 4, 3 and 2
//! ([`broker_core::image::v4`], [`broker_core::image::v3`], [`broker_core::image::v2`]), whose
//! groups' offsets all count as stored once read; format 1: a
//! [`broker_core::image::v1::StateImage`]; formats 6 and 7 as format 5. The log entries of
//! formats 2 to 7 have the same layout; each later format only adds commands, settings, (6) the
//! third kind of entry, and (7) the rules its entries are replayed under: those of format 7
//! under [`broker_core::Revision::Bounded`], every earlier one under
//! [`broker_core::Revision::Original`] ([`revision_of_format`]).
//!
//! CRC-32 is the IEEE polynomial (`crc32fast`).
//!
//! A directory of an earlier format is read as it is and rewritten in the current format (a
//! checkpoint at start) when the journal starts (see [`Storage::start`]).
//!
//! # Each record written once
//!
//! With `--fsync batch` and `never`, the flusher writes each record a command stored to its
//! partition's record segment, then the command's entry, which says only where those records
//! went (format 6): each record is written once. Every interval (`batch`), the `.rec` files
//! written are synced, then the log; a log segment is synced when it rolls, after the `.rec`
//! files. So an entry synced has its records synced, and an entry whose records are missing
//! after a power loss is in the last log segment, where recovery cuts it (and what follows) as
//! a torn entry. Indexes (`.idx`) need no sync before the log: recovery writes again the index
//! of the records past the last checkpoint, and a checkpoint syncs those it names.
//!
//! With `--fsync always`, a group commit syncs the log alone: a publish's entry keeps its
//! records, and checkpoints write them to their segments (each record is written twice).
//! Syncing each `.rec` file a group commit wrote as well took 2.4 times as long per commit on
//! the disks measured (BENCHMARKS.md).
//!
//! # What recovery accepts
//!
//! The last segment may end inside an entry, with a last entry whose checksum fails, with zero
//! bytes after its last entry, or with an entry whose records are not in their segments (the
//! machine lost power before they reached the disk): the process (or the machine) died in the
//! middle of a write. That tail is cut off with a warning (it was never acknowledged as
//! durable). Records in a partition's segments past the last checkpoint's catalog are read
//! back for the entries that place them, and kept as far as the replayed state holds them; the
//! rest was never acknowledged and is cut. Anything
//! else refuses to start with a [`StorageError`] naming the file and the offset: a bad entry
//! with entries after it, a damaged segment other than the last, a snapshot whose checksum
//! fails, a record segment shorter than the snapshot says, a gap in sequence numbers, a format
//! version this build does not read, or an entry that the core refuses on replay.
//!
//! Recovery reads everything before it changes anything: the torn tail, what an unfinished
//! checkpoint left and a leftover temporary snapshot are cut and removed only once the whole
//! directory was found sound (by [`Storage::start`], or [`DataDir::recover`]), so a refused
//! start leaves the directory as the crash left it.

mod error;
mod format;
mod journal;
mod lock;
mod records;
mod recovery;
mod repair;
mod segment;
mod snapshot;
mod tails;

pub use error::StorageError;
pub use format::{
    config, encode_entry, revision_of_format, EntryRef, PlacedRun, StorageConfig, FORMAT_VERSION,
    MAX_ENTRY_BYTES, OLDEST_FORMAT_VERSION,
};
pub use journal::{Applied, Fsync, Journal, JournalError, JournalSettings, Storage, WRITE_RETRY};
pub use lock::DataDir;
pub use records::{
    segment_files, RecordStore, SegmentImage, WrittenOut, RECORD_FORMAT_VERSION,
    RECORD_OVERHEAD_BYTES,
};
pub use recovery::{Recovery, TornTail};
pub use repair::Repairs;
pub use segment::LogWriter;
pub use snapshot::{remove_covered, v4 as checkpoint_v4, write_snapshot, Checkpoint};

#[cfg(test)]
mod tests;
