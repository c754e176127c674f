//! Records that are no longer held in memory: the interface through which the state reads them
//! from wherever a storage layer put them (segment files on disk).
//!
//! A state without a [`ColdStore`] holds every record in memory. With one, a storage layer moves
//! the oldest records of a partition out of memory once it has written them
//! ([`crate::BrokerState::evict`]); the state keeps only how far that goes, and asks the store
//! whenever a rule needs one of those records: to deliver it, to know its time (age retention,
//! time lookups) or its size (byte accounting and limits). Which records are in memory never
//! changes what a command does, only where its records are read from: a state with some records
//! evicted answers every command exactly as it would with all of them in memory.
//!
//! The store may fail (a file cannot be read, a checksum does not match). A read-only command
//! then answers [`crate::BrokerError::Storage`] and changes nothing; a command that changes the
//! state may have been applied in part, so the state refuses every later command with that
//! error (see [`crate::BrokerState::failure`]) until it is rebuilt from its log.

use std::fmt::Debug;
use std::ops::Range;

use crate::image::RecordImage;

/// Names one partition's log for a [`ColdStore`]: the topic's id (never reused, even after the
/// topic is deleted and created again) and the partition number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LogId {
    /// The topic's id, given at creation.
    pub topic: u64,
    /// The partition number.
    pub partition: u32,
}

/// A record the state appended to a partition, as [`crate::BrokerState::take_appended`]
/// reports it to a storage layer that writes records as they come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The partition's log.
    pub log: LogId,
    /// The record's offset.
    pub offset: i64,
    /// The record as the state keeps it (its time is the one the state gave it).
    pub record: RecordImage,
}

/// Why a [`ColdStore`] could not answer: a message naming the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ColdError(pub String);

/// Where the records a state evicted from memory are read from. Every method is asked only about
/// offsets the state evicted and still retains (`range` within them), so a store may assume
/// they are all there; the size of a record is its payload, key and header bytes
/// ([`RecordImage::size`]).
pub trait ColdStore: Send + Sync + Debug {
    /// The records at offsets `range`, in order, but stopping before the first record (after
    /// the first one) that would take their total size past `max_bytes`: the state asks for no
    /// more than an answer can take.
    ///
    /// # Errors
    /// [`ColdError`] if they cannot be read.
    fn read(
        &self,
        log: LogId,
        range: Range<i64>,
        max_bytes: Option<u64>,
    ) -> Result<Vec<RecordImage>, ColdError>;

    /// The total size of the records at offsets `range`.
    ///
    /// # Errors
    /// [`ColdError`] if their sizes cannot be read.
    fn bytes(&self, log: LogId, range: Range<i64>) -> Result<u64, ColdError>;

    /// The time of the record at `offset`.
    ///
    /// # Errors
    /// [`ColdError`] if it cannot be read.
    fn timestamp(&self, log: LogId, offset: i64) -> Result<i64, ColdError>;

    /// The first offset in `range` whose record's time is at or after `timestamp_ms`
    /// (`range.end` if none is); times never decrease within a log.
    ///
    /// # Errors
    /// [`ColdError`] if the times cannot be read.
    fn first_at_or_after(
        &self,
        log: LogId,
        range: Range<i64>,
        timestamp_ms: i64,
    ) -> Result<i64, ColdError>;

    /// The first offset `start` in `range` such that the records at `start..range.end` take at
    /// most `bytes` (`range.end` if even the last one alone takes more).
    ///
    /// # Errors
    /// [`ColdError`] if the sizes cannot be read.
    fn first_within_bytes(
        &self,
        log: LogId,
        range: Range<i64>,
        bytes: u64,
    ) -> Result<i64, ColdError>;

    /// The size of the largest record at offsets `range` (0 if the range is empty).
    ///
    /// # Errors
    /// [`ColdError`] if the sizes cannot be read.
    fn largest(&self, log: LogId, range: Range<i64>) -> Result<u64, ColdError>;
}
