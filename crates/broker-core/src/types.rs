//! The values the broker hands out and the options it takes.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use strum::EnumIter;

/// A record as delivered to a consumer: a snapshot of the stored record.
///
/// Changing a returned record never changes the broker: `payload` and `key` share the stored
/// bytes through reference counting, and [`Bytes`] is immutable.
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
}

impl PublishRecord {
    /// A record for an explicit partition, without a key.
    pub fn to_partition(partition: i32, payload: impl Into<Bytes>) -> Self {
        PublishRecord {
            partition: Some(partition),
            key: None,
            payload: payload.into(),
        }
    }

    /// A record placed by its key (round-robin when `key` is `None`).
    pub fn keyed(key: Option<&[u8]>, payload: impl Into<Bytes>) -> Self {
        PublishRecord {
            partition: None,
            key: key.map(Bytes::copy_from_slice),
            payload: payload.into(),
        }
    }

    /// Payload plus key bytes: what a record takes against size limits and budgets.
    pub fn size(&self) -> usize {
        self.payload.len() + self.key.as_ref().map_or(0, Bytes::len)
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
    /// negative, when the group committed past the end).
    pub lag: i64,
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
