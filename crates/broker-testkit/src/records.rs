//! Delivered records as tests check them: where a record is and what it holds, not its time
//! (the server's clock) or its delivery count (how it was consumed).

use broker_core::BrokerRecord;
use bytes::Bytes;

/// A keyless record expected at `offset` of `partition` of `topic`, with `payload`. A
/// [`BrokerRecord`] equals it when those match, whatever its time and delivery count.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset.
    pub offset: i64,
    /// The payload.
    pub payload: Bytes,
}

impl PartialEq<Seen> for BrokerRecord {
    fn eq(&self, seen: &Seen) -> bool {
        self.topic == seen.topic
            && self.partition == seen.partition
            && self.offset == seen.offset
            && self.key.is_none()
            && self.payload == seen.payload
    }
}

/// The keyless record with `payload` expected at `offset` of `partition` of `topic`.
pub fn record(topic: &str, partition: i32, offset: i64, payload: &str) -> Seen {
    Seen {
        topic: topic.into(),
        partition,
        offset,
        payload: Bytes::copy_from_slice(payload.as_bytes()),
    }
}
