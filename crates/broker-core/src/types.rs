//! The values the broker hands out and the options it takes.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strum::EnumIter;

/// A record as delivered to a consumer: a snapshot of the stored record.
///
/// Changing a returned record never changes the broker: `payload`, `key` and header values
/// share the stored bytes through reference counting, and [`Bytes`] is immutable.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BrokerRecord {
    /// The topic the record was published to.
    #[serde(deserialize_with = "crate::byte_fields::string")]
    pub topic: String,
    /// The partition of that topic that holds the record.
    pub partition: i32,
    /// The record's offset, local to its partition: 0 for the first record ever published
    /// there, counting up by one.
    pub offset: i64,
    /// The key the record was published with, if any (keyed publishes only).
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub key: Option<Bytes>,
    /// The record's bytes. Empty payloads are valid.
    #[serde(deserialize_with = "crate::byte_fields::bytes")]
    pub payload: Bytes,
    /// The record's time, in milliseconds since the Unix epoch: the time its producer gave
    /// it, or else the broker's time when it was appended; never earlier than the record
    /// before it in its partition. 0 for a broker whose clock was never set (see
    /// [`crate::EventBroker::advance_clock`]) and for records stored before records had times.
    #[serde(default)]
    pub timestamp_ms: i64,
    /// The headers the record was published with, in order.
    #[serde(default)]
    pub headers: Vec<Header>,
    /// In ack mode, how many times the record has been delivered to the group, this delivery
    /// included (1 on the first); 0 in fetch mode, which does not count deliveries.
    #[serde(default)]
    pub delivery_count: u32,
}

/// A record header: a name and an optional value, as Kafka's record headers are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Header {
    /// The header's name (any UTF-8; names may repeat).
    #[serde(deserialize_with = "crate::byte_fields::string")]
    pub name: String,
    /// The header's value; `None` differs from an empty value.
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub value: Option<Bytes>,
}

impl Header {
    /// A header `name` with `value`.
    pub fn new(name: impl Into<String>, value: impl Into<Bytes>) -> Header {
        Header {
            name: name.into(),
            value: Some(value.into()),
        }
    }

    /// The name and value bytes: what a header counts against size limits and budgets.
    pub fn size(&self) -> usize {
        self.name.len() + self.value.as_ref().map_or(0, Bytes::len)
    }
}

/// What reading a partition from an offset found ([`crate::EventBroker::read`]), with the
/// partition's bounds at that moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRead {
    /// The records, at consecutive offsets from the offset asked for (from `start_offset` when
    /// that was below it); empty when none is there yet.
    pub records: Vec<BrokerRecord>,
    /// The partition's earliest retained offset: records below it have left.
    pub start_offset: i64,
    /// The offset the next record published to the partition gets.
    pub end_offset: i64,
}

/// The records one idempotent publish sends to one partition
/// ([`crate::EventBroker::publish_idempotent`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PartitionBatch {
    /// The partition every record goes to.
    pub partition: i32,
    /// The producer's sequence number of the first record on this partition; each next record
    /// has the next number.
    pub sequence: u64,
    /// The records, in order; their own `partition` must be `None` or `partition`.
    pub records: Vec<PublishRecord>,
}

/// One record of a batch publish ([`crate::EventBroker::publish_batch`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PublishRecord {
    /// The partition to append to; `None` lets the key (or round-robin, without a key) choose.
    pub partition: Option<i32>,
    /// The record's key, stored with it; it picks the partition only when `partition` is `None`.
    #[serde(default, deserialize_with = "crate::byte_fields::optional_bytes")]
    pub key: Option<Bytes>,
    /// The record's bytes.
    #[serde(deserialize_with = "crate::byte_fields::bytes")]
    pub payload: Bytes,
    /// Headers stored with the record.
    #[serde(default)]
    pub headers: Vec<Header>,
    /// The record's time as its producer gives it, in milliseconds since the Unix epoch; `None`
    /// stamps it with the broker's time. A time earlier than the partition's last record's is
    /// raised to it, so that times never decrease within a partition.
    #[serde(default)]
    pub timestamp_ms: Option<i64>,
}

impl PublishRecord {
    /// A record for an explicit partition, without a key.
    pub fn to_partition(partition: i32, payload: impl Into<Bytes>) -> Self {
        PublishRecord {
            partition: Some(partition),
            key: None,
            payload: payload.into(),
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    /// A record placed by its key (round-robin when `key` is `None`).
    pub fn keyed(key: Option<&[u8]>, payload: impl Into<Bytes>) -> Self {
        PublishRecord {
            partition: None,
            key: key.map(Bytes::copy_from_slice),
            payload: payload.into(),
            headers: Vec::new(),
            timestamp_ms: None,
        }
    }

    /// This record with `headers`.
    #[must_use]
    pub fn with_headers(mut self, headers: Vec<Header>) -> Self {
        self.headers = headers;
        self
    }

    /// This record with the time its producer gives it.
    #[must_use]
    pub fn with_timestamp(mut self, timestamp_ms: i64) -> Self {
        self.timestamp_ms = Some(timestamp_ms);
        self
    }

    /// Payload, key and header bytes: what a record takes against size limits and budgets.
    pub fn size(&self) -> usize {
        self.payload.len()
            + self.key.as_ref().map_or(0, Bytes::len)
            + self.headers.iter().map(Header::size).sum::<usize>()
    }
}

/// How a consumer group divides its topic's partitions among its members.
///
/// Both assignors sort members by id (bytewise, which is ASCII order for valid identifiers), so
/// the assignment depends only on membership, never on join order. Named `round-robin` and
/// `range` in text and in JSON alike ([`Assignor::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, EnumIter)]
#[serde(rename_all = "kebab-case")]
pub enum Assignor {
    /// Partition `p` goes to member `p mod n`. The default.
    #[default]
    #[serde(alias = "RoundRobin")]
    RoundRobin,
    /// Kafka's range assignor: each member gets `partitions / members` consecutive partitions and
    /// the first `partitions % members` members one more; members past the partition count get
    /// none.
    #[serde(alias = "Range")]
    Range,
}

impl Assignor {
    /// The assignor's name: `round-robin` or `range`.
    pub fn name(self) -> &'static str {
        match self {
            Assignor::RoundRobin => "round-robin",
            Assignor::Range => "range",
        }
    }
}

impl fmt::Display for Assignor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a topic maps a record's key to a partition. Named `murmur2` and `fnv1a` in text and in
/// JSON alike ([`KeyHash::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, EnumIter)]
#[serde(rename_all = "kebab-case")]
pub enum KeyHash {
    /// Kafka's default partitioner: `(murmur2(key) & 0x7fffffff) % partitions`, so a key lands on
    /// the same partition as with Kafka's Java client. The default.
    #[default]
    #[serde(alias = "Murmur2")]
    Murmur2,
    /// 32-bit FNV-1a (offset basis `0x811c9dc5`, prime `0x01000193`): `fnv1a(key) % partitions`.
    #[serde(alias = "Fnv1a")]
    Fnv1a,
}

impl KeyHash {
    /// The hash's name: `murmur2` or `fnv1a`.
    pub fn name(self) -> &'static str {
        match self {
            KeyHash::Murmur2 => "murmur2",
            KeyHash::Fnv1a => "fnv1a",
        }
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where [`crate::EventBroker::reset_group`] moves a group's committed offsets, on each
/// partition it resets. A target outside the partition's retained records is moved to the
/// nearest end of them (the earliest retained offset, or the end offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResetTo {
    /// The earliest record retained: the group consumes everything kept again.
    Earliest,
    /// The end: the group consumes only records published from now on.
    Latest,
    /// This offset (not negative).
    Offset(i64),
    /// The first record at or after this time (milliseconds since the Unix epoch), or the end
    /// when every record is older.
    Timestamp(i64),
    /// The committed offset moved by this many records (negative goes back).
    ShiftBy(i64),
}

/// A consumer group's progress on one partition, as [`crate::EventBroker::lag`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PartitionLag {
    /// The partition this row describes.
    pub partition: i32,
    /// The group's committed offset: the next offset the group will consume.
    pub committed: i64,
    /// The offset the next record published to the partition will get.
    pub end_offset: i64,
    /// `end_offset - committed`: how many records the group has yet to consume (0, never
    /// negative).
    pub lag: i64,
    /// Records the group never consumed because the partition discarded them first (its
    /// retention limits, or a purge) and its committed offset moved past them.
    #[serde(default)]
    pub skipped: u64,
}

/// What a partition remembers of one idempotent producer, as
/// [`crate::EventBroker::producers`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProducerState {
    /// The producer's id, as it publishes with it.
    pub producer: u64,
    /// The sequence number its next new record on the partition must have: one past the last
    /// record it stored there (0 before it stored any).
    pub next_sequence: u64,
    /// The offset the last record it stored on the partition got (`None` if it stored none
    /// there: its batches were refused, or repeated records stored before), even once
    /// retention removed that record.
    pub last_offset: Option<i64>,
    /// The broker's clock when it last published to the topic, to any of its partitions, in
    /// milliseconds since the Unix epoch (the broker keeps one time per producer and topic).
    pub last_seen_ms: i64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn enum_names_are_the_same_in_text_and_json_and_old_names_still_read() {
        for (assignor, old) in [
            (Assignor::RoundRobin, "RoundRobin"),
            (Assignor::Range, "Range"),
        ] {
            let json = serde_json::to_string(&assignor).unwrap();
            assert_eq!(json, format!("\"{assignor}\""));
            let back: Assignor = serde_json::from_str(&format!("\"{old}\"")).unwrap();
            assert_eq!(back, assignor);
        }
        for (key_hash, old) in [(KeyHash::Murmur2, "Murmur2"), (KeyHash::Fnv1a, "Fnv1a")] {
            let json = serde_json::to_string(&key_hash).unwrap();
            assert_eq!(json, format!("\"{key_hash}\""));
            let back: KeyHash = serde_json::from_str(&format!("\"{old}\"")).unwrap();
            assert_eq!(back, key_hash);
        }
    }
}
