//! What leaves a partition, and the groups that skip what left.
//!
//! Interest retention (the default): a record leaves its partition once every group of its
//! topic has consumed it (committed past it); with no groups nothing leaves. Limits retention:
//! records stay, consumed or not, until a limit (count, bytes) makes room for new ones. In
//! either, records older than the topic's maximum age leave, and a purge removes records below
//! an offset. A group whose committed offset was below records that left without it moves to
//! the first record kept, and counts what it skipped. What leaves is subtracted from the bytes
//! the memory budget counts (see the `memory` module).

use super::memory::Held;
use super::topic::Topic;
use super::BrokerState;
use crate::{BrokerError, Retention};

impl Topic {
    /// Interest retention: drops the records of `partition` that every group has consumed, and
    /// returns what left. With no groups nothing is consumed, so nothing leaves; with
    /// limits retention, consumption frees nothing.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    pub(super) fn release(&mut self, partition: usize) -> Result<Held, BrokerError> {
        if self.settings.retention != Retention::Interest {
            return Ok(Held::default());
        }
        let consumed_by_all = self
            .groups
            .values()
            .map(|group| group.partitions[partition].committed)
            .min();
        consumed_by_all.map_or(Ok(Held::default()), |offset| {
            self.partitions[partition].trim_below(offset)
        })
    }

    /// [`Topic::release`] on every partition: what left.
    ///
    /// # Errors
    /// As [`Topic::release`].
    pub(super) fn release_all(&mut self) -> Result<Held, BrokerError> {
        let mut freed = Held::default();
        for partition in 0..self.partitions.len() {
            freed += self.release(partition)?;
        }
        Ok(freed)
    }

    /// Drops the records of `partition` older than the topic's maximum age at `now_ms`;
    /// returns what left. Groups that had not consumed them skip them.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the times or sizes of evicted records cannot be read.
    pub(super) fn expire(&mut self, partition: usize, now_ms: i64) -> Result<Held, BrokerError> {
        let Some(max_age) = self.settings.max_age_ms else {
            return Ok(Held::default());
        };
        let log = &self.partitions[partition];
        let oldest_kept = now_ms.saturating_sub(i64::try_from(max_age).unwrap_or(i64::MAX));
        if log.is_empty() || log.last_timestamp_ms < oldest_kept {
            // Every record is too old (or there is none): no need to look at their times.
            let end = log.end();
            return self.discard_below(partition, end);
        }
        let keep_from = log.first_at_or_after(oldest_kept)?;
        self.discard_below(partition, keep_from)
    }

    /// Drops the records of `partition` below `offset` whatever the groups consumed (a limit,
    /// an age, a purge), and moves every group that had not consumed them past them; returns
    /// what left.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    pub(super) fn discard_below(
        &mut self,
        partition: usize,
        offset: i64,
    ) -> Result<Held, BrokerError> {
        let freed = self.partitions[partition].trim_below(offset)?;
        self.skip_to_base(partition);
        Ok(freed)
    }

    /// Moves every group whose committed offset on `partition` is below the partition's earliest
    /// record up to it, counting the records it skipped; a delivery in flight of a record that
    /// left is gone.
    pub(super) fn skip_to_base(&mut self, partition: usize) {
        let base = self.partitions[partition].base;
        for group in self.groups.values_mut() {
            group.partitions[partition].skip_to(base);
        }
    }
}

impl BrokerState {
    /// The payload, key and header bytes of the largest record retained anywhere (0 with none):
    /// a server must be able to deliver it, so its payload limit may not be below this.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    pub fn largest_retained_record(&self) -> Result<u64, BrokerError> {
        let mut largest = 0;
        for log in self.topics.values().flat_map(|topic| &topic.partitions) {
            largest = largest.max(log.largest_record()?);
        }
        Ok(largest)
    }
}
