//! One partition's log: the records it retains, at consecutive offsets from `base`.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::BrokerRecord;

/// A partition log holding offsets `base..end()`; the records below `base` have left it.
#[derive(Debug, Clone, Default)]
pub(super) struct PartitionLog {
    /// The offset of the oldest retained record (the end, when none is).
    pub(super) base: i64,
    pub(super) records: VecDeque<StoredRecord>,
    /// The payload and key bytes of `records`.
    pub(super) retained_bytes: u64,
}

/// A record as the log keeps it.
#[derive(Debug, Clone)]
pub(super) struct StoredRecord {
    pub(super) key: Option<Bytes>,
    pub(super) payload: Bytes,
}

impl StoredRecord {
    /// Payload plus key bytes: what the record counts against budgets and limits.
    #[inline]
    pub(super) fn size(&self) -> u64 {
        (self.payload.len() + self.key.as_ref().map_or(0, Bytes::len)) as u64
    }
}

impl PartitionLog {
    /// The offset the next record appended gets.
    #[inline]
    pub(super) fn end(&self) -> i64 {
        self.base + self.records.len() as i64
    }

    /// The record at `offset`, which must be within `base..end()`.
    #[inline]
    pub(super) fn record(&self, offset: i64) -> &StoredRecord {
        &self.records[(offset - self.base) as usize]
    }

    /// The record at `offset` (within `base..end()`) as delivered to a consumer of `topic`.
    #[inline]
    pub(super) fn deliver(&self, topic: &str, partition: usize, offset: i64) -> BrokerRecord {
        let stored = self.record(offset);
        BrokerRecord {
            topic: topic.to_owned(),
            partition: partition as i32,
            offset,
            key: stored.key.clone(),
            payload: stored.payload.clone(),
        }
    }

    /// Appends `record`, whose size is `size`; returns its offset.
    #[inline]
    pub(super) fn push(&mut self, record: StoredRecord, size: u64) -> i64 {
        self.retained_bytes += size;
        self.records.push_back(record);
        self.end() - 1
    }

    /// Drops every record below `offset` (bounded by the end of the log); returns the bytes
    /// freed.
    pub(super) fn trim_below(&mut self, offset: i64) -> u64 {
        let mut freed = 0;
        while self.base < offset {
            let Some(record) = self.records.pop_front() else {
                break;
            };
            self.retained_bytes -= record.size();
            freed += record.size();
            self.base += 1;
        }
        freed
    }
}
