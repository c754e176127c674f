//! A direct decoder for the requests services send most: the publishes (`Publish`,
//! `PublishKeyed`, `PublishBatch`, `PublishUntilFull`, and `PublishIdempotent`, which every
//! `Producer` sends).
//!
//! The generic decoder goes through serde's visitors for every field of every record: about 710
//! instructions a record in the `Producer`'s usual request (one record or a few per partition
//! batch, 100-byte payloads). This one reads the bytes proto.md documents, in order: about 440,
//! a third of them copying the payload into its own allocation. It gives exactly what the
//! generic decoder gives, or nothing: a body it does not read to its last byte as a well-formed
//! publish (another command, an option tag other than 0 or 1, a length past the end, text that
//! is not UTF-8, trailing bytes) is left to the generic decoder, which decodes it or words why
//! not.

use bytes::Bytes;

use broker_core::{Command, Header, PartitionBatch, PublishRecord, MAX_BATCH_RECORDS};

use crate::{Decoded, RequestFrame};

/// The variant indexes of the publishes on the wire.
const PUBLISH: u32 = 3;
const PUBLISH_KEYED: u32 = 4;
const PUBLISH_BATCH: u32 = 15;
const PUBLISH_IDEMPOTENT: u32 = 24;
const PUBLISH_UNTIL_FULL: u32 = 34;

/// The most room a list reserves before its elements are read, in bytes (as serde's own
/// decoders): its elements take more room in memory than on the wire, several times over.
const MAX_RESERVED_BYTES: usize = 1 << 20;

/// The fewest bytes a `PartitionBatch` takes: partition, sequence and an empty record list.
const MIN_BATCH_BYTES: usize = 4 + 8 + 8;

/// The fewest bytes a `PublishRecord` takes: no partition, no key, an empty payload, no
/// headers, no time.
const MIN_RECORD_BYTES: usize = 1 + 1 + 8 + 8 + 1;

/// The fewest bytes a `Header` takes: an empty name and no value.
const MIN_HEADER_BYTES: usize = 8 + 1;

/// `body` decoded as a publish request, when it is one, read exactly; `None` otherwise (the
/// generic decoder then decides).
pub(super) fn publish(body: &[u8]) -> Option<Decoded<RequestFrame>> {
    let mut reader = Reader {
        rest: body,
        records: 0,
    };
    match publish_frame(&mut reader) {
        // More records than a publish may hold, refused without keeping them (read past, so
        // that only a body the generic decoder would decode is refused so): decoded, small
        // records take several times their wire bytes, which the request memory counted.
        Some(_) if reader.records > MAX_BATCH_RECORDS => Some(Decoded::Malformed {
            leading_u64: body
                .get(..8)
                .and_then(|bytes| bytes.try_into().ok())
                .map(u64::from_le_bytes),
            reason: format!(
                "a batch holds at most {MAX_BATCH_RECORDS} records, got {}",
                reader.records
            ),
        }),
        frame => frame.map(Decoded::Message),
    }
}

/// A version 1 `PublishBatch` (whose command index and leading fields are today's) announcing
/// more records than a publish may hold: refused as [`publish`] refuses one, before anything
/// is decoded. `None` for anything else, which version 1's decoder then decodes.
pub(super) fn v1_batch_over_limit(body: &[u8]) -> Option<Decoded<RequestFrame>> {
    let mut reader = Reader {
        rest: body,
        records: 0,
    };
    let correlation_id = reader.u64()?;
    let _max_wait_ms = reader.u32()?;
    if reader.u32()? != PUBLISH_BATCH {
        return None;
    }
    reader.bytes()?;
    let count = reader.length()?;
    (count > MAX_BATCH_RECORDS).then(|| Decoded::Malformed {
        leading_u64: Some(correlation_id),
        reason: format!("a batch holds at most {MAX_BATCH_RECORDS} records, got {count}"),
    })
}

/// [`publish`] of a request within the limits.
fn publish_frame(reader: &mut Reader<'_>) -> Option<RequestFrame> {
    let correlation_id = reader.u64()?;
    let max_wait_ms = reader.u32()?;
    let command = match reader.u32()? {
        PUBLISH => Command::Publish {
            topic: reader.text()?.to_owned(),
            partition: reader.i32()?,
            payload: reader.copied_bytes()?,
        },
        PUBLISH_KEYED => Command::PublishKeyed {
            topic: reader.text()?.to_owned(),
            key: reader.option(Reader::copied_bytes)?,
            payload: reader.copied_bytes()?,
        },
        PUBLISH_BATCH => Command::PublishBatch {
            topic: reader.text()?.to_owned(),
            records: reader.records()?,
        },
        PUBLISH_IDEMPOTENT => Command::PublishIdempotent {
            topic: reader.text()?.to_owned(),
            producer: reader.u64()?,
            batches: reader.list(MIN_BATCH_BYTES, Reader::partition_batch)?,
        },
        PUBLISH_UNTIL_FULL => Command::PublishUntilFull {
            topic: reader.text()?.to_owned(),
            records: reader.records()?,
        },
        _ => return None,
    };
    if !reader.rest.is_empty() {
        return None;
    }
    Some(RequestFrame {
        correlation_id,
        max_wait_ms,
        command,
    })
}

/// The unread part of a body, read front to back with the wire's fixed-width little-endian
/// integers.
struct Reader<'a> {
    rest: &'a [u8],
    /// The records the lists read so far announced, in all.
    records: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.rest.split_at_checked(count)?;
        self.rest = rest;
        Some(taken)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn i32(&mut self) -> Option<i32> {
        self.array().map(i32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Option<i64> {
        self.array().map(i64::from_le_bytes)
    }

    /// A length prefix, as a count of what follows.
    fn length(&mut self) -> Option<usize> {
        usize::try_from(self.u64()?).ok()
    }

    /// Bytes with a length prefix, borrowed.
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let length = self.length()?;
        self.take(length)
    }

    /// Bytes with a length prefix, copied into an allocation of their own (as the generic
    /// decoder does), so that a stored record never keeps its request's buffer alive.
    fn copied_bytes(&mut self) -> Option<Bytes> {
        self.bytes().map(Bytes::copy_from_slice)
    }

    /// UTF-8 text with a length prefix, borrowed.
    fn text(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes()?).ok()
    }

    /// An option: a tag byte, 0 for `None`, 1 for `Some` followed by the value.
    fn option<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        match self.array::<1>()? {
            [0] => Some(None),
            [1] => read(self).map(Some),
            _ => None,
        }
    }

    /// A list: a count, then each element. A count larger than the bytes left could hold
    /// (elements of at least `min_bytes` each) is refused at once, and at most
    /// [`MAX_RESERVED_BYTES`] are reserved before the elements are read, so that a forged count
    /// allocates nothing large.
    fn list<T>(
        &mut self,
        min_bytes: usize,
        mut read: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        let count = self.length()?;
        if count > self.rest.len() / min_bytes {
            return None;
        }
        let mut list = Vec::with_capacity(count.min(MAX_RESERVED_BYTES / size_of::<T>().max(1)));
        for _ in 0..count {
            list.push(read(self)?);
        }
        Some(list)
    }

    fn partition_batch(&mut self) -> Option<PartitionBatch> {
        Some(PartitionBatch {
            partition: self.i32()?,
            sequence: self.u64()?,
            records: self.records()?,
        })
    }

    /// A list of records, counted with those of the lists before it: once there are more
    /// than a publish may hold in all, the records are read past without being kept (an empty
    /// list), and [`publish`] refuses the request.
    fn records(&mut self) -> Option<Vec<PublishRecord>> {
        let count = {
            let mut ahead = Reader {
                rest: self.rest,
                records: 0,
            };
            ahead.length()?
        };
        self.records = self.records.saturating_add(count);
        if self.records > MAX_BATCH_RECORDS {
            let count = self.length()?;
            if count > self.rest.len() / MIN_RECORD_BYTES {
                return None;
            }
            for _ in 0..count {
                self.skip_record()?;
            }
            return Some(Vec::new());
        }
        self.list(MIN_RECORD_BYTES, Reader::record)
    }

    /// [`Reader::record`], read past without keeping it.
    fn skip_record(&mut self) -> Option<()> {
        self.option(Reader::i32)?;
        self.option(Reader::bytes)?;
        self.bytes()?;
        let headers = self.length()?;
        if headers > self.rest.len() / MIN_HEADER_BYTES {
            return None;
        }
        for _ in 0..headers {
            self.text()?;
            self.option(Reader::bytes)?;
        }
        self.option(Reader::i64)?;
        Some(())
    }

    fn record(&mut self) -> Option<PublishRecord> {
        Some(PublishRecord {
            partition: self.option(Reader::i32)?,
            key: self.option(Reader::copied_bytes)?,
            payload: self.copied_bytes()?,
            headers: self.list(MIN_HEADER_BYTES, Reader::header)?,
            timestamp_ms: self.option(Reader::i64)?,
        })
    }

    fn header(&mut self) -> Option<Header> {
        Some(Header {
            name: self.text()?.to_owned(),
            value: self.option(Reader::copied_bytes)?,
        })
    }
}

#[cfg(test)]
mod tests;
