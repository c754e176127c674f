//! One partition's log: the records it retains, at consecutive offsets from `base`, with their
//! times (never decreasing within the partition). The oldest may be evicted to a
//! [`ColdStore`]; every question about a record is answered the same wherever it is held.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

use super::memory::Held;
use crate::cold::{ColdError, ColdStore, LogId};
use crate::image::RecordImage;
use crate::{BrokerError, BrokerRecord, Header};

/// A partition log holding offsets `base..end()`; the records below `base` have left it. Those
/// of `base..cold_end()` are held by a cold store, the rest in memory.
#[derive(Debug, Clone, Default)]
pub(super) struct PartitionLog {
    /// The offset of the oldest retained record (the end, when none is).
    pub(super) base: i64,
    /// The evicted records, when there are any.
    pub(super) cold: Option<Cold>,
    /// The records in memory: offsets `cold_end()..end()`.
    pub(super) records: VecDeque<StoredRecord>,
    /// The payload, key and header bytes of `records`.
    pub(super) memory_bytes: u64,
    /// The time of the last record ever appended (0 before the first): the next one's time is
    /// never earlier.
    pub(super) last_timestamp_ms: i64,
}

/// The records of a log held by a cold store: offsets `base..end` of the log.
#[derive(Debug, Clone)]
pub(super) struct Cold {
    pub(super) store: Arc<dyn ColdStore>,
    pub(super) id: LogId,
    /// The first offset held in memory again.
    pub(super) end: i64,
    /// The payload, key and header bytes of the records the store holds for the log (from
    /// `base`).
    pub(super) bytes: u64,
    /// The time of the record at `base`.
    pub(super) first_timestamp_ms: i64,
    /// Records read ahead of the command being applied (see [`super::read_ahead`]): what it
    /// asks of the store there is taken from these.
    pub(super) ahead: Option<ReadAheadRun>,
}

/// Records of a cold store at consecutive offsets from `first`, read ahead.
#[derive(Debug, Clone)]
pub(super) struct ReadAheadRun {
    pub(super) first: i64,
    pub(super) records: Arc<Vec<StoredRecord>>,
    /// The size of the record after them, when they stopped at the byte budget.
    pub(super) next_size: Option<u64>,
}

impl ReadAheadRun {
    /// What the store's read of `offsets` within `max_bytes` gives, if these records settle it:
    /// they hold every record it takes, and the one that stops it (or its size) if one does.
    fn settles(&self, offsets: &Range<i64>, max_bytes: Option<u64>) -> Option<Vec<StoredRecord>> {
        let skip = usize::try_from(offsets.start - self.first).ok()?;
        // The store's rule: the first record always, then records while their total fits.
        let fits = |taken: u64, records: &[StoredRecord]| {
            records.is_empty() || max_bytes.is_none_or(|max| taken <= max)
        };
        let mut records = Vec::new();
        let mut taken = 0u64;
        let mut next = offsets.start;
        for record in self.records.get(skip..)? {
            if next == offsets.end {
                return Some(records);
            }
            taken += record.size();
            if !fits(taken, &records) {
                return Some(records);
            }
            records.push(record.clone());
            next += 1;
        }
        let stopped_here = self
            .next_size
            .is_some_and(|size| !fits(taken + size, &records));
        (next == offsets.end || stopped_here).then_some(records)
    }
}

/// A record as the log keeps it.
#[derive(Debug, Clone)]
pub(super) struct StoredRecord {
    pub(super) payload: Bytes,
    pub(super) timestamp_ms: i64,
    /// The key and headers: a key alone is held inline (no allocation beyond its bytes),
    /// headers (rare) in a box, so a record in memory costs 80 bytes besides its payload
    /// instead of the 96 of key and headers side by side.
    extras: Extras,
}

/// What a record has beyond its payload and time.
#[derive(Debug, Clone)]
enum Extras {
    /// Neither key nor headers.
    None,
    /// A key, no headers.
    Key(Bytes),
    /// Headers, and the key if there is one.
    Headers(Box<(Option<Bytes>, Vec<Header>)>),
}

impl StoredRecord {
    /// A record to append, stamped `timestamp_ms` (bounded by the partition's last time and the
    /// clock when it is appended).
    pub(super) fn new(
        key: Option<Bytes>,
        payload: Bytes,
        headers: Vec<Header>,
        timestamp_ms: i64,
    ) -> StoredRecord {
        let extras = match (key, headers.is_empty()) {
            (None, true) => Extras::None,
            (Some(key), true) => Extras::Key(key),
            (key, false) => Extras::Headers(Box::new((key, headers))),
        };
        StoredRecord {
            payload,
            timestamp_ms,
            extras,
        }
    }

    /// The record's key, if it has one.
    #[inline]
    pub(super) fn key(&self) -> Option<&Bytes> {
        match &self.extras {
            Extras::None => None,
            Extras::Key(key) => Some(key),
            Extras::Headers(extras) => extras.0.as_ref(),
        }
    }

    /// The record's headers.
    #[inline]
    pub(super) fn headers(&self) -> &[Header] {
        match &self.extras {
            Extras::None | Extras::Key(_) => &[],
            Extras::Headers(extras) => &extras.1,
        }
    }

    /// The key, the payload, the headers and the time.
    pub(super) fn into_parts(self) -> (Option<Bytes>, Bytes, Vec<Header>, i64) {
        let (key, headers) = match self.extras {
            Extras::None => (None, Vec::new()),
            Extras::Key(key) => (Some(key), Vec::new()),
            Extras::Headers(extras) => *extras,
        };
        (key, self.payload, headers, self.timestamp_ms)
    }

    /// Payload, key and header bytes: what the record counts against budgets and limits.
    #[inline]
    pub(super) fn size(&self) -> u64 {
        (self.payload.len()
            + self.key().map_or(0, Bytes::len)
            + self.headers().iter().map(Header::size).sum::<usize>()) as u64
    }

    /// The record as delivered to a consumer of `topic`.
    #[inline]
    pub(super) fn delivered(
        record: Cow<'_, StoredRecord>,
        topic: &str,
        partition: usize,
        offset: i64,
        delivery_count: u32,
    ) -> BrokerRecord {
        let (key, payload, headers, timestamp_ms) = record.into_owned().into_parts();
        BrokerRecord {
            topic: topic.to_owned(),
            partition: partition as i32,
            offset,
            key,
            payload,
            timestamp_ms,
            headers,
            delivery_count,
        }
    }
}

impl From<RecordImage> for StoredRecord {
    fn from(image: RecordImage) -> StoredRecord {
        StoredRecord::new(
            image.key,
            image.payload,
            image.headers.into_iter().map(Header::from).collect(),
            image.timestamp_ms,
        )
    }
}

/// The part of a run of a log's records that its cold store holds: offsets `offsets` of log
/// `id`. Records in a cold store never change, so it reads the same whether the log is still
/// at hand or not, as long as they are still retained.
pub(super) struct ColdRun {
    pub(super) store: Arc<dyn ColdStore>,
    pub(super) id: LogId,
    pub(super) offsets: Range<i64>,
    /// Records read ahead, from which the run takes what they hold of it.
    ahead: Option<ReadAheadRun>,
}

/// What [`ColdRun::read_all`] read.
pub(super) struct ColdRead {
    /// The records, from the run's first offset.
    pub(super) records: Vec<StoredRecord>,
    /// Whether the store stopped at the byte budget before the end of the cold part.
    stopped: Option<i64>,
}

impl ColdRun {
    /// The records of `run` (none without one), no more than `max_bytes` can take (the first
    /// always); `from` is where the run starts.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if they cannot be read.
    pub(super) fn read_all(
        run: Option<&ColdRun>,
        from: i64,
        max_bytes: Option<u64>,
    ) -> Result<ColdRead, BrokerError> {
        let Some(run) = run else {
            return Ok(ColdRead {
                records: Vec::new(),
                stopped: None,
            });
        };
        let settled = run
            .ahead
            .as_ref()
            .and_then(|ahead| ahead.settles(&run.offsets, max_bytes));
        let records = match settled {
            Some(records) => records,
            None => run
                .store
                .read(run.id, run.offsets.clone(), max_bytes)
                .map_err(storage_error)?
                .into_iter()
                .map(StoredRecord::from)
                .collect(),
        };
        let end = from + records.len() as i64;
        Ok(ColdRead {
            stopped: (end < run.offsets.end).then_some(end),
            records,
        })
    }
}

impl ColdRead {
    /// Where a run meant to end at `to` ends: where the store stopped at the byte budget, if
    /// it did, so that the run's records stay consecutive.
    pub(super) fn run_end(&self, to: i64) -> i64 {
        self.stopped.unwrap_or(to)
    }
}

/// A store failure as the broker reports it.
#[cold]
fn storage_error(error: ColdError) -> BrokerError {
    BrokerError::Storage(error.0)
}

impl PartitionLog {
    /// The offset the next record appended gets.
    #[inline]
    pub(super) fn end(&self) -> i64 {
        self.cold_end() + self.records.len() as i64
    }

    /// The first offset held in memory: records below it (from `base`) are in the cold store.
    #[inline]
    pub(super) fn cold_end(&self) -> i64 {
        self.cold.as_ref().map_or(self.base, |cold| cold.end)
    }

    /// How many records the log retains.
    #[inline]
    pub(super) fn len(&self) -> u64 {
        (self.end() - self.base) as u64
    }

    /// Whether the log retains no record.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.end() == self.base
    }

    /// The payload, key and header bytes of every retained record.
    #[inline]
    pub(super) fn retained_bytes(&self) -> u64 {
        self.memory_bytes + self.cold.as_ref().map_or(0, |cold| cold.bytes)
    }

    /// Up to `count` records from `from` (within `base..end()`), in order: borrowed from memory,
    /// read from the cold store for evicted ones, of which no more are read than `max_bytes`
    /// can take (the first always).
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if evicted records cannot be read.
    pub(super) fn run(
        &self,
        from: i64,
        count: usize,
        max_bytes: Option<u64>,
    ) -> Result<impl Iterator<Item = Cow<'_, StoredRecord>>, BrokerError> {
        let to = self.run_end(from, count);
        let cold = ColdRun::read_all(self.cold_run(from, to).as_ref(), from, max_bytes)?;
        let to = cold.run_end(to);
        Ok(cold
            .records
            .into_iter()
            .map(Cow::Owned)
            .chain(self.memory_run(from, to).map(Cow::Borrowed)))
    }

    /// The size of the record at `offset` (as [`StoredRecord::size`] counts it) without
    /// reading it: from memory, from records read ahead (or the size they noted of the record
    /// after them), or from the cold store's index. `None` past the log's end.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the cold store cannot say.
    pub(super) fn record_size(&self, offset: i64) -> Result<Option<u64>, BrokerError> {
        if offset < self.base || offset >= self.end() {
            return Ok(None);
        }
        let Some(cold) = self.cold.as_ref().filter(|cold| offset < cold.end) else {
            return Ok(self
                .memory_run(offset, offset + 1)
                .next()
                .map(StoredRecord::size));
        };
        if let Some(ahead) = &cold.ahead {
            let index = usize::try_from(offset - ahead.first).ok();
            match index {
                Some(index) if index < ahead.records.len() => {
                    return Ok(Some(ahead.records[index].size()));
                }
                Some(index) if index == ahead.records.len() && ahead.next_size.is_some() => {
                    return Ok(ahead.next_size);
                }
                _ => {}
            }
        }
        cold.store
            .bytes(cold.id, offset..offset + 1)
            .map(Some)
            .map_err(storage_error)
    }

    /// Where a run of up to `count` records from `from` ends (exclusive).
    pub(super) fn run_end(&self, from: i64, count: usize) -> i64 {
        from.saturating_add(count as i64).min(self.end())
    }

    /// The part of the run `from..to` that the cold store holds, if any: read by
    /// [`ColdRun::read_all`], with this log or without it.
    pub(super) fn cold_run(&self, from: i64, to: i64) -> Option<ColdRun> {
        let cold = self.cold.as_ref().filter(|cold| from < cold.end)?;
        Some(ColdRun {
            store: Arc::clone(&cold.store),
            id: cold.id,
            offsets: from..to.min(cold.end),
            ahead: cold.ahead.clone(),
        })
    }

    /// The records of the run `from..to` held in memory, in order: none when `from` is at or
    /// past `to` (a group that committed past the end, as the first releases allowed, reads
    /// from past it).
    pub(super) fn memory_run(&self, from: i64, to: i64) -> impl Iterator<Item = &StoredRecord> {
        let memory_from = (from.max(self.cold_end()) - self.cold_end()) as usize;
        let memory_to = (to.max(self.cold_end()) - self.cold_end()) as usize;
        let memory_to = memory_to.min(self.records.len());
        self.records.range(memory_from.min(memory_to)..memory_to)
    }

    /// The time of the oldest retained record, if there is one.
    pub(super) fn earliest_timestamp(&self) -> Option<i64> {
        match &self.cold {
            Some(cold) => Some(cold.first_timestamp_ms),
            None => self.records.front().map(|record| record.timestamp_ms),
        }
    }

    /// The time a record appended at `now_ms` gets: `wanted`, but never later than `now_ms`
    /// and never earlier than the last record's time.
    #[inline]
    pub(super) fn next_timestamp(&self, wanted: i64, now_ms: i64) -> i64 {
        wanted.min(now_ms).max(self.last_timestamp_ms)
    }

    /// Appends `record`, whose size is `size`; returns its offset.
    #[inline]
    pub(super) fn push(&mut self, record: StoredRecord, size: u64) -> i64 {
        self.memory_bytes += size;
        self.last_timestamp_ms = record.timestamp_ms;
        self.records.push_back(record);
        self.end() - 1
    }

    /// Drops every record below `offset` (bounded by the end of the log); returns the bytes
    /// freed.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read; nothing changed.
    pub(super) fn trim_below(&mut self, offset: i64) -> Result<Held, BrokerError> {
        let offset = offset.min(self.end());
        if offset <= self.base {
            return Ok(Held::default());
        }
        let records = (offset - self.base) as u64;
        let mut freed = 0;
        if let Some(cold) = &mut self.cold {
            if offset < cold.end {
                let kept = cold
                    .store
                    .bytes(cold.id, offset..cold.end)
                    .map_err(storage_error)?;
                let first_timestamp_ms = cold
                    .store
                    .timestamp(cold.id, offset)
                    .map_err(storage_error)?;
                freed = cold.bytes.checked_sub(kept).ok_or_else(|| {
                    BrokerError::Storage(format!(
                        "the record store counts {kept} bytes from offset {offset}, more than the \
                         {} it holds",
                        cold.bytes
                    ))
                })?;
                cold.bytes = kept;
                cold.first_timestamp_ms = first_timestamp_ms;
                self.base = offset;
                return Ok(Held {
                    bytes: freed,
                    records,
                });
            }
            // Every evicted record goes: the log is in memory only again.
            freed = cold.bytes;
            self.base = cold.end;
            self.cold = None;
        }
        while self.base < offset {
            let Some(record) = self.records.pop_front() else {
                break;
            };
            self.memory_bytes -= record.size();
            freed += record.size();
            self.base += 1;
        }
        Ok(Held {
            bytes: freed,
            records,
        })
    }

    /// What [`PartitionLog::trim_below`] of `offset` would free, without freeing it.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    pub(super) fn held_below(&self, offset: i64) -> Result<Held, BrokerError> {
        let offset = offset.min(self.end());
        if offset <= self.base {
            return Ok(Held::default());
        }
        let records = (offset - self.base) as u64;
        let cold_bytes = match &self.cold {
            Some(cold) if offset < cold.end => {
                let kept = cold
                    .store
                    .bytes(cold.id, offset..cold.end)
                    .map_err(storage_error)?;
                return Ok(Held {
                    bytes: cold.bytes.saturating_sub(kept),
                    records,
                });
            }
            Some(cold) => cold.bytes,
            None => 0,
        };
        let in_memory = (offset - self.cold_end()) as usize;
        let memory_bytes: u64 = self
            .records
            .iter()
            .take(in_memory)
            .map(StoredRecord::size)
            .sum();
        Ok(Held {
            bytes: cold_bytes + memory_bytes,
            records,
        })
    }

    /// The first offset such that the records from it on take at most `bytes` (the end when
    /// even the last record alone takes more).
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    pub(super) fn first_within_bytes(&self, bytes: u64) -> Result<i64, BrokerError> {
        if self.memory_bytes > bytes {
            // Within the records in memory: the oldest leave until the rest fit, so that a
            // publish at the limit (which makes room for one record) takes as many steps as
            // records leave, not as many as the partition holds.
            let mut left = self.memory_bytes;
            let mut start = self.cold_end();
            for record in &self.records {
                if left <= bytes {
                    break;
                }
                left -= record.size();
                start += 1;
            }
            return Ok(start);
        }
        match &self.cold {
            Some(cold) if cold.bytes + self.memory_bytes > bytes => cold
                .store
                .first_within_bytes(cold.id, self.base..cold.end, bytes - self.memory_bytes)
                .map_err(storage_error),
            _ => Ok(self.base),
        }
    }

    /// The first offset whose record's time is at or after `timestamp_ms`; the end when every
    /// retained record is older. (Times never decrease, so this is a binary search.)
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the times of evicted records cannot be read.
    pub(super) fn first_at_or_after(&self, timestamp_ms: i64) -> Result<i64, BrokerError> {
        let in_memory = self
            .records
            .front()
            .is_none_or(|first| first.timestamp_ms >= timestamp_ms);
        match &self.cold {
            Some(cold) if in_memory => cold
                .store
                .first_at_or_after(cold.id, self.base..cold.end, timestamp_ms)
                .map_err(storage_error),
            _ => {
                let index = self
                    .records
                    .partition_point(|record| record.timestamp_ms < timestamp_ms);
                Ok(self.cold_end() + index as i64)
            }
        }
    }

    /// The size of the largest retained record (0 with none).
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the sizes of evicted records cannot be read.
    pub(super) fn largest_record(&self) -> Result<u64, BrokerError> {
        let in_memory = self.records.iter().map(StoredRecord::size).max();
        let cold = match &self.cold {
            Some(cold) => cold
                .store
                .largest(cold.id, self.base..cold.end)
                .map_err(storage_error)?,
            None => 0,
        };
        Ok(in_memory.unwrap_or(0).max(cold))
    }

    /// The records below `offset` are held by `store` from now on (it has them all, from
    /// `base`): they leave memory. Offsets the log no longer retains, or holds in the store
    /// already, are ignored.
    pub(super) fn evict(&mut self, store: &Arc<dyn ColdStore>, id: LogId, offset: i64) {
        let offset = offset.min(self.end());
        if offset <= self.cold_end() {
            return;
        }
        let moved = ((offset - self.cold_end()) as usize).min(self.records.len());
        let Some(first_timestamp_ms) = self.records.front().map(|record| record.timestamp_ms)
        else {
            return;
        };
        let bytes: u64 = self
            .records
            .drain(..moved)
            .map(|record| record.size())
            .sum();
        self.memory_bytes -= bytes;
        let end = self.cold_end() + moved as i64;
        match &mut self.cold {
            Some(cold) => {
                cold.end = end;
                cold.bytes += bytes;
            }
            None => {
                self.cold = Some(Cold {
                    store: Arc::clone(store),
                    id,
                    end,
                    bytes,
                    first_timestamp_ms,
                    ahead: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_held_in_80_bytes_besides_its_payload_and_keeps_its_key_and_headers() {
        assert_eq!(std::mem::size_of::<StoredRecord>(), 80);
        let plain = StoredRecord::new(None, Bytes::from_static(b"payload"), Vec::new(), 7);
        assert!(matches!(plain.extras, Extras::None));
        assert_eq!(
            (plain.key(), plain.headers(), plain.size()),
            (None, &[][..], 7)
        );

        let header = Header {
            name: "trace".to_owned(),
            value: Some(Bytes::from_static(b"abc")),
        };
        let key = Bytes::from_static(b"key");
        // A key alone is held inline.
        let keyed = StoredRecord::new(Some(key.clone()), Bytes::from_static(b"p"), Vec::new(), 7);
        assert!(matches!(keyed.extras, Extras::Key(_)));
        assert_eq!(
            (keyed.key(), keyed.headers(), keyed.size()),
            (Some(&key), &[][..], 4)
        );
        assert_eq!(
            keyed.into_parts(),
            (Some(key.clone()), Bytes::from_static(b"p"), Vec::new(), 7)
        );

        let full = StoredRecord::new(
            Some(key.clone()),
            Bytes::from_static(b"payload"),
            vec![header.clone()],
            7,
        );
        assert_eq!(full.key(), Some(&key));
        assert_eq!(full.headers(), std::slice::from_ref(&header));
        assert_eq!(full.size(), (7 + 3 + header.size()) as u64);
        let parts = full.into_parts();
        assert_eq!(
            parts,
            (
                Some(key),
                Bytes::from_static(b"payload"),
                vec![header.clone()],
                7
            )
        );

        // Headers without a key are kept too.
        let headers_only = StoredRecord::new(None, Bytes::new(), vec![header.clone()], 0);
        assert_eq!(
            (headers_only.key(), headers_only.headers()),
            (None, &[header][..])
        );
    }
}
