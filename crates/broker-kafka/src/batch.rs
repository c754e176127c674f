//! Kafka's record batches (format 2, which every Produce and Fetch version the listener speaks
//! carries), read and written here byte for byte as Kafka's documentation gives them: the
//! records of kafka-protocol keep one value per header name, where a Kafka record may repeat a
//! name, and every value must reach the broker, and come back, in its place.
//!
//! A batch: base offset (`i64`), length of the rest (`i32`), partition leader epoch (`i32`),
//! magic (`i8`, 2), CRC-32C of everything after it (`u32`), attributes (`i16`: compression in
//! bits 0 to 2, log-append time in bit 3, transactional in bit 4, control in bit 5), last
//! offset delta (`i32`), base and largest timestamps (`i64`), producer id (`i64`), producer
//! epoch (`i16`), base sequence (`i32`), record count (`i32`), then the records, compressed
//! together when the batch is. A record: its length, attributes (`i8`), timestamp delta,
//! offset delta, key, value and headers, lengths and deltas as zigzag varints (-1 for a null
//! key or value). Integers are big-endian.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::records::Compression;
use std::io::{self, BufReader, Read, Take};

use crate::decompress::inflating;
use broker_core::MAX_HEADERS;

/// The bytes of a batch after its length field, up to its first record.
const BATCH_HEADER_AFTER_LENGTH: usize = 4 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 2 + 4 + 4;

/// Where the bytes the CRC covers start: after base offset, length, leader epoch, magic and
/// the CRC itself.
const CRC_COVERS_FROM: usize = 8 + 4 + 4 + 1 + 4;

/// The magic byte of the only format read and written.
const MAGIC: i8 = 2;

/// "No producer", "no epoch", "no sequence" and "no leader epoch" in a batch's header.
const NONE: i64 = -1;

/// Why a produced batch is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RecordsError {
    /// The bytes are not record batches: a failed checksum, a truncated batch, an unknown
    /// compression or format.
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    /// A transactional batch: the broker has no transactions.
    #[error("transactions are not supported by this broker")]
    Transactional,
    /// A record the broker can never store (its headers break the broker's rules).
    #[error("{0}")]
    Invalid(String),
    /// A record larger than the server stores, or batches that decompress to more than the
    /// server takes of one request.
    #[error("{0}")]
    TooLarge(String),
}

/// One record of a produced batch, with what its batch's header says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducedRecord {
    /// Its batch is part of a transaction.
    pub(crate) transactional: bool,
    /// Its batch holds transaction markers.
    pub(crate) control: bool,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    /// The record's sequence number: the batch's base sequence, `delta` records on (see
    /// [`sequence_after`]); meaningless without a producer.
    pub(crate) sequence: i32,
    /// The batch's base timestamp plus the record's delta.
    pub(crate) timestamp: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    /// Name and value of each header, in order, names repeated as the record repeats them.
    pub(crate) headers: Vec<(String, Option<Bytes>)>,
}

/// The sequence number `delta` records after `base`, as Kafka numbers an idempotent producer's
/// records: up to `i32::MAX`, then from 0 again. A negative base (a batch without a producer)
/// gives a negative number, which the records' reader refuses for an idempotent producer.
pub(crate) fn sequence_after(base: i32, delta: i32) -> i32 {
    if base < 0 {
        return base;
    }
    // Past i32::MAX the sum turns negative; its low 31 bits are the number from 0 again.
    base.wrapping_add(delta) & i32::MAX
}

/// What the batches of one produce request may hold and inflate to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// The largest record (value, key and headers) the server stores: a record whose encoded
    /// length shows it larger is refused before anything after it is decompressed.
    pub(crate) record_bytes: u64,
    /// What the request's compressed batches may still decompress to, in bytes: one budget for
    /// the whole request, which each batch spends as it is read.
    pub(crate) inflate_left: usize,
    /// What the records the request's batches claim (compressed or not) may still take in
    /// memory once decoded, in bytes: each spends [`RECORD_MEMORY`] of it.
    pub(crate) records_left: usize,
}

/// What a record decoded from a batch takes in memory besides its bytes, counted against the
/// request's budget ([`Limits::records_left`]) for every record: a compressed batch of empty
/// records (a few bytes each once compressed) could otherwise make one small request hold
/// millions of them.
const RECORD_MEMORY: usize = 128;

/// Most bytes a record's encoding takes besides its key, value and header names and values:
/// attributes, timestamp and offset deltas, the key's, value's and header count's lengths, and
/// each header's two lengths, every varint at its longest.
const RECORD_OVERHEAD: u64 = 1 + 10 + 5 + 5 + 5 + 5 + MAX_HEADERS as u64 * (5 + 5);

/// The records of the batches `bytes` holds, one after another: each batch's CRC-32C checked
/// and its records decompressed within `limits`, whose budget they spend.
///
/// # Errors
/// [`RecordsError::Corrupt`] for bytes that are not such batches (truncated, another format,
/// a failed checksum, an unknown compression, a negative length or count, a header name that
/// is not UTF-8); [`RecordsError::Invalid`] for a record with more headers than the broker
/// stores, refused before they are read; [`RecordsError::TooLarge`] for a record larger than
/// the server stores or batches that decompress past the request's budget, refused before
/// the rest is decompressed.
pub(crate) fn decode(
    mut bytes: Bytes,
    limits: &mut Limits,
) -> Result<Vec<ProducedRecord>, RecordsError> {
    let mut records = Vec::new();
    while !bytes.is_empty() {
        let mut head = Reader(bytes.clone());
        let _base_offset = head.i64()?;
        let length = usize::try_from(head.i32()?)
            .ok()
            .filter(|&length| length >= BATCH_HEADER_AFTER_LENGTH)
            .ok_or_else(|| corrupt("a record batch shorter than its header"))?;
        if bytes.len() < 12 + length {
            return Err(corrupt("a truncated record batch"));
        }
        let batch = bytes.split_to(12 + length);
        decode_batch(batch, limits, &mut records)?;
    }
    Ok(records)
}

/// Adds the records of `batch` (one whole batch) to `records`.
fn decode_batch(
    batch: Bytes,
    limits: &mut Limits,
    records: &mut Vec<ProducedRecord>,
) -> Result<(), RecordsError> {
    let mut reader = Reader(batch.slice(8 + 4..));
    let _leader_epoch = reader.i32()?;
    let magic = reader.i8()?;
    if magic != MAGIC {
        return Err(corrupt(&format!(
            "a record batch of format {magic}: format {MAGIC} is the only one read"
        )));
    }
    let crc = reader.u32()?;
    if crc32c::crc32c(&batch[CRC_COVERS_FROM..]) != crc {
        return Err(corrupt("Cyclic redundancy check failed"));
    }
    let attributes = reader.i16()?;
    let compression = match attributes & 0x7 {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        4 => Compression::Zstd,
        other => return Err(corrupt(&format!("unknown compression {other}"))),
    };
    let transactional = attributes & (1 << 4) != 0;
    let control = attributes & (1 << 5) != 0;
    let _last_offset_delta = reader.i32()?;
    let base_timestamp = reader.i64()?;
    let _max_timestamp = reader.i64()?;
    let producer_id = reader.i64()?;
    let producer_epoch = reader.i16()?;
    let base_sequence = reader.i32()?;
    let count = usize::try_from(reader.i32()?).map_err(|_| corrupt("a negative record count"))?;
    let most_encoded = limits.record_bytes.saturating_add(RECORD_OVERHEAD);
    // Refused before any is read: the records claimed take this much memory once decoded.
    limits.records_left = count
        .checked_mul(RECORD_MEMORY)
        .and_then(|memory| limits.records_left.checked_sub(memory))
        .ok_or_else(|| {
            RecordsError::TooLarge(
                "a request holding more records than this server decodes in one request".to_owned(),
            )
        })?;
    let mut body = match compression {
        // Room for the records claimed, as far as the bytes can hold them (7 bytes at least
        // each); compressed records are not reserved for, since their bytes say nothing of
        // how many they hold.
        Compression::None => {
            records.reserve(count.min(reader.0.len() / 7));
            Body::Plain(reader)
        }
        compression => Body::Inflating(Inflating::new(
            reader.0,
            compression,
            &mut limits.inflate_left,
        )?),
    };
    for _ in 0..count {
        let mut record = Reader(body.next_record(most_encoded)?);
        let _attributes = record.i8()?;
        let timestamp_delta = record.varlong()?;
        let offset_delta = record.varint()?;
        // Copied out of the request (or its inflated batch): a record the broker keeps must not
        // keep the whole buffer alive, which the memory bound does not count.
        let key = record.nullable_copied()?;
        let value = record.nullable_copied()?;
        let header_count = record
            .length()?
            .ok_or_else(|| corrupt("a negative header count"))?;
        // Refused before they are read: at two bytes each, a record could claim millions.
        if header_count > MAX_HEADERS {
            return Err(RecordsError::Invalid(format!(
                "a record carries at most {MAX_HEADERS} headers, got {header_count}"
            )));
        }
        let mut headers = Vec::with_capacity(header_count);
        let mut size = key.as_ref().map_or(0, Bytes::len) + value.as_ref().map_or(0, Bytes::len);
        for _ in 0..header_count {
            let name = record
                .nullable()?
                .ok_or_else(|| corrupt("a header without a name"))?;
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| corrupt("a header name that is not UTF-8"))?;
            let value = record.nullable_copied()?;
            size += name.len() + value.as_ref().map_or(0, Bytes::len);
            headers.push((name, value));
        }
        // Refused before the batch's later records are decompressed.
        if size as u64 > limits.record_bytes {
            return Err(RecordsError::TooLarge(format!(
                "a record of {size} bytes (value, key and headers) is larger than this server \
                 accepts ({} bytes)",
                limits.record_bytes
            )));
        }
        records.push(ProducedRecord {
            transactional,
            control,
            producer_id,
            producer_epoch,
            sequence: sequence_after(base_sequence, offset_delta),
            timestamp: base_timestamp.wrapping_add(timestamp_delta),
            key,
            value,
            headers,
        });
    }
    Ok(())
}

/// The records of a batch, after its header.
enum Body<'a> {
    /// Uncompressed: read in place.
    Plain(Reader),
    /// Compressed: decompressed as they are read.
    Inflating(Inflating<'a>),
}

impl Body<'_> {
    /// The bytes of the next record (after its length), refused when its length passes
    /// `most_encoded`, before they are read.
    fn next_record(&mut self, most_encoded: u64) -> Result<Bytes, RecordsError> {
        match self {
            Body::Plain(reader) => {
                let length = reader
                    .length()?
                    .ok_or_else(|| corrupt("a record of negative length"))?;
                check_record_length(length, most_encoded)?;
                Ok(reader.take(length)?)
            }
            Body::Inflating(inflating) => inflating.next_record(most_encoded),
        }
    }
}

/// A record of `length` encoded bytes, refused when that shows its key, value and headers
/// larger than the server stores.
fn check_record_length(length: usize, most_encoded: u64) -> Result<(), RecordsError> {
    match length as u64 <= most_encoded {
        true => Ok(()),
        false => Err(RecordsError::TooLarge(format!(
            "a record of {length} encoded bytes holds more than this server accepts ({} bytes \
             of value, key and headers)",
            most_encoded - RECORD_OVERHEAD
        ))),
    }
}

/// A compressed batch's records, decompressed as they are read, each byte decompressed taken
/// from the request's budget (with the few kilobytes read ahead).
struct Inflating<'a> {
    /// The decompressed stream, cut where the budget ends.
    stream: BufReader<Take<Box<dyn Read + Send>>>,
    /// The request's budget, brought up to date after each record.
    budget: &'a mut usize,
    /// The budget when the batch started, to say it in a refusal.
    started_with: usize,
}

impl<'a> Inflating<'a> {
    fn new(
        compressed: Bytes,
        compression: Compression,
        budget: &'a mut usize,
    ) -> Result<Self, RecordsError> {
        let source = inflating(compressed, compression, *budget)
            .map_err(|error| corrupt(&error.to_string()))?;
        Ok(Inflating {
            stream: BufReader::new(source.take(*budget as u64)),
            started_with: *budget,
            budget,
        })
    }

    fn next_record(&mut self, most_encoded: u64) -> Result<Bytes, RecordsError> {
        let read = self.read_record(most_encoded);
        *self.budget = usize::try_from(self.stream.get_ref().limit()).unwrap_or(0);
        read
    }

    fn read_record(&mut self, most_encoded: u64) -> Result<Bytes, RecordsError> {
        let mut failed = None;
        let length = varlong(|| {
            let mut byte = [0];
            match self.stream.read_exact(&mut byte) {
                Ok(()) => Ok(byte[0]),
                Err(error) => {
                    failed = Some(error);
                    Err(())
                }
            }
        });
        let length = match (length, failed) {
            (Ok(length), _) => length,
            (Err(_), Some(error)) => return Err(self.stream_error(error)),
            (Err(why), None) => return Err(corrupt(why.unwrap_or("a truncated record batch"))),
        };
        let length = usize::try_from(length).map_err(|_| corrupt("a record of negative length"))?;
        check_record_length(length, most_encoded)?;
        if length as u64 > self.stream.get_ref().limit() + self.stream.buffer().len() as u64 {
            return Err(self.past_budget());
        }
        let mut record = vec![0; length];
        self.stream
            .read_exact(&mut record)
            .map_err(|error| self.stream_error(error))?;
        Ok(Bytes::from(record))
    }

    /// Why the stream ended early: the budget, or the data.
    fn stream_error(&self, error: io::Error) -> RecordsError {
        let spent = self.stream.get_ref().limit() == 0;
        match error.kind() {
            io::ErrorKind::OutOfMemory => self.past_budget(),
            io::ErrorKind::UnexpectedEof if spent => self.past_budget(),
            io::ErrorKind::UnexpectedEof => corrupt("a truncated record batch"),
            _ => corrupt(&error.to_string()),
        }
    }

    fn past_budget(&self) -> RecordsError {
        RecordsError::TooLarge(format!(
            "the request's record batches decompress to more than this server takes of one \
             request ({} bytes were left for this batch)",
            self.started_with
        ))
    }
}

fn corrupt(why: &str) -> RecordsError {
    RecordsError::Corrupt(why.to_owned())
}

/// What [`Reader`] found wrong: the batch is corrupt.
impl From<&'static str> for RecordsError {
    fn from(why: &'static str) -> Self {
        corrupt(why)
    }
}

/// One record to write in a batch.
pub(crate) struct FetchedRecord<'a> {
    pub(crate) offset: i64,
    pub(crate) timestamp: i64,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: &'a [u8],
    pub(crate) headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// `records` (ascending offsets, the first the batch's base) as one uncompressed batch with
/// no producer, their times as creation times.
///
/// # Errors
/// A length or an offset delta past what the format holds (an `i32`).
pub(crate) fn encode(records: &[FetchedRecord<'_>]) -> Result<Bytes, String> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Ok(Bytes::new());
    };
    let too_large = |what: &str| format!("{what} past what a record batch holds");
    let base_timestamp = first.timestamp;
    let max_timestamp = records.iter().map(|record| record.timestamp).max();
    let mut out = BytesMut::new();
    out.put_i64(first.offset);
    out.put_i32(0); // the length, once known
    out.put_i32(NONE as i32); // leader epoch
    out.put_i8(MAGIC);
    out.put_u32(0); // the CRC, once the rest is written
    out.put_i16(0); // uncompressed, creation times, no transaction
    let delta = |offset: i64| {
        offset
            .checked_sub(first.offset)
            .and_then(|delta| i32::try_from(delta).ok())
            .ok_or_else(|| too_large("offsets"))
    };
    let last_delta = delta(last.offset)?;
    out.put_i32(last_delta);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp.unwrap_or(base_timestamp));
    out.put_i64(NONE); // producer id
    out.put_i16(NONE as i16); // producer epoch
    out.put_i32(NONE as i32); // base sequence
    out.put_i32(i32::try_from(records.len()).map_err(|_| too_large("records"))?);
    let mut body = BytesMut::new();
    for record in records {
        body.clear();
        body.put_i8(0);
        put_varint(&mut body, record.timestamp.wrapping_sub(base_timestamp));
        put_varint(&mut body, i64::from(delta(record.offset)?));
        put_nullable(&mut body, record.key)?;
        put_nullable(&mut body, Some(record.value))?;
        put_length(&mut body, record.headers.len())?;
        for &(name, value) in &record.headers {
            put_nullable(&mut body, Some(name.as_bytes()))?;
            put_nullable(&mut body, value)?;
        }
        put_length(&mut out, body.len())?;
        out.put_slice(&body);
    }
    let length = i32::try_from(out.len() - 12).map_err(|_| too_large("a batch"))?;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let crc = crc32c::crc32c(&out[CRC_COVERS_FROM..]);
    out[CRC_COVERS_FROM - 4..CRC_COVERS_FROM].copy_from_slice(&crc.to_be_bytes());
    Ok(out.freeze())
}

/// `value` as a zigzag varint.
fn put_varint(out: &mut BytesMut, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.put_u8((zigzag as u8 & 0x7f) | 0x80);
        zigzag >>= 7;
    }
    out.put_u8(zigzag as u8);
}

fn put_length(out: &mut BytesMut, length: usize) -> Result<(), String> {
    let length = i32::try_from(length).map_err(|_| "a length past what a record batch holds")?;
    put_varint(out, i64::from(length));
    Ok(())
}

/// `bytes` with their length before them, or the length -1 for none.
fn put_nullable(out: &mut BytesMut, bytes: Option<&[u8]>) -> Result<(), String> {
    match bytes {
        None => put_varint(out, -1),
        Some(bytes) => {
            put_length(out, bytes.len())?;
            out.put_slice(bytes);
        }
    }
    Ok(())
}

/// A zigzag varint of at most 10 bytes, its bytes taken from `next` (whose error ends it as
/// `None`); `Some` says why the bytes are not a varint.
fn varlong(mut next: impl FnMut() -> Result<u8, ()>) -> Result<i64, Option<&'static str>> {
    let mut value: u64 = 0;
    for index in 0..10 {
        let byte = next().map_err(|()| None)?;
        // The tenth byte holds the 64th bit alone.
        if index == 9 && byte > 1 {
            break;
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(Some("a varint past 64 bits"))
}

/// The unread part of a batch, read front to back; every read checks that the bytes are there.
/// Integers are read in place; only a key, a value or a record takes a view of its own.
struct Reader(Bytes);

impl Reader {
    fn take(&mut self, count: usize) -> Result<Bytes, &'static str> {
        self.need(count)?;
        Ok(self.0.split_to(count))
    }

    fn need(&self, count: usize) -> Result<(), &'static str> {
        match self.0.len() >= count {
            true => Ok(()),
            false => Err("a truncated record batch"),
        }
    }

    fn u8(&mut self) -> Result<u8, &'static str> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }

    fn i8(&mut self) -> Result<i8, &'static str> {
        self.need(1)?;
        Ok(self.0.get_i8())
    }

    fn i16(&mut self) -> Result<i16, &'static str> {
        self.need(2)?;
        Ok(self.0.get_i16())
    }

    fn i32(&mut self) -> Result<i32, &'static str> {
        self.need(4)?;
        Ok(self.0.get_i32())
    }

    fn u32(&mut self) -> Result<u32, &'static str> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }

    fn i64(&mut self) -> Result<i64, &'static str> {
        self.need(8)?;
        Ok(self.0.get_i64())
    }

    /// A zigzag varint of at most 10 bytes.
    fn varlong(&mut self) -> Result<i64, &'static str> {
        varlong(|| self.u8().map_err(|_| ()))
            .map_err(|why| why.unwrap_or("a truncated record batch"))
    }

    /// A zigzag varint that fits an `i32`.
    fn varint(&mut self) -> Result<i32, &'static str> {
        i32::try_from(self.varlong()?).map_err(|_| "a varint past 32 bits")
    }

    /// A length: `None` for -1.
    fn length(&mut self) -> Result<Option<usize>, &'static str> {
        match self.varint()? {
            -1 => Ok(None),
            length => usize::try_from(length)
                .map(Some)
                .map_err(|_| "a negative length"),
        }
    }

    /// Bytes after their length; `None` for the length -1.
    fn nullable(&mut self) -> Result<Option<Bytes>, &'static str> {
        self.length()?.map(|length| self.take(length)).transpose()
    }

    /// [`Reader::nullable`], copied into a buffer of its own.
    fn nullable_copied(&mut self) -> Result<Option<Bytes>, &'static str> {
        Ok(self.nullable()?.map(|bytes| Bytes::copy_from_slice(&bytes)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kafka_protocol::records::{Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    use super::*;

    /// A megabyte for a record and for what a request inflates to.
    fn limits() -> Limits {
        Limits {
            record_bytes: 1 << 20,
            inflate_left: 1 << 20,
            records_left: usize::MAX,
        }
    }

    /// A batch of `count` records of `size` zero bytes each, compressed with `compression` by
    /// the encoder of the kafka-protocol crate.
    fn zeros(compression: Compression, count: i64, size: usize) -> Bytes {
        let records: Vec<Record> = (0..count)
            .map(|offset| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset,
                sequence: -1,
                timestamp: 0,
                key: None,
                value: Some(Bytes::from(vec![0; size])),
                headers: Default::default(),
            })
            .collect();
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
        buffer.freeze()
    }

    const CODECS: [Compression; 4] = [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    #[test]
    fn every_codec_is_read_within_the_budget_which_it_spends() {
        for compression in CODECS {
            let batch = zeros(compression, 10, 10_000);
            assert!(batch.len() < 10_000, "{compression:?} compresses zeros");
            let mut limits = limits();
            assert_eq!(decode(batch, &mut limits).unwrap().len(), 10);
            let spent = (1 << 20) - limits.inflate_left;
            assert!(spent >= 100_000, "{compression:?} spent {spent}");
        }
    }

    #[test]
    fn the_budget_is_one_for_all_the_batches_of_a_request() {
        for compression in CODECS {
            // Each batch alone fits the budget; the second does not fit what the first left.
            let mut limits = Limits {
                record_bytes: 1 << 20,
                inflate_left: 150_000,
                records_left: usize::MAX,
            };
            assert_eq!(
                decode(zeros(compression, 10, 10_000), &mut limits)
                    .unwrap()
                    .len(),
                10
            );
            let refused = decode(zeros(compression, 10, 10_000), &mut limits);
            assert!(
                matches!(&refused, Err(RecordsError::TooLarge(why)) if why.contains("decompress")),
                "{compression:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn a_record_larger_than_the_server_stores_is_refused_before_the_rest_is_inflated() {
        for compression in CODECS {
            // 31 records of a megabyte and a byte of zeros: 32 MB inflated, in 32 kB or so.
            let batch = zeros(compression, 31, (1 << 20) + 1);
            let mut limits = Limits {
                record_bytes: 1 << 20,
                inflate_left: 64 << 20,
                records_left: usize::MAX,
            };
            let refused = decode(batch, &mut limits);
            assert!(
                matches!(&refused, Err(RecordsError::TooLarge(why)) if why.contains("1048577 bytes")),
                "{compression:?}: {refused:?}"
            );
            // A snappy batch is one block, decompressed whole (within the budget) or not at all.
            let spent = (64 << 20) - limits.inflate_left;
            assert!(
                spent < 2 << 20 || compression == Compression::Snappy,
                "{compression:?} spent {spent}"
            );
        }
        // A record whose length alone shows it too large is refused before it is read.
        let plain = zeros(Compression::None, 2, 2000);
        let refused = decode(
            plain,
            &mut Limits {
                record_bytes: 1000,
                // Room for the two records' memory, none to inflate (the batch is plain).
                inflate_left: 2 * RECORD_MEMORY,
                records_left: usize::MAX,
            },
        );
        assert!(
            matches!(&refused, Err(RecordsError::TooLarge(why)) if why.contains("encoded")),
            "{refused:?}"
        );
    }

    /// Records take memory once decoded however small they compress: a batch claiming more
    /// than the request's budget holds room for is refused before any is read, one within it
    /// spends that room.
    #[test]
    fn records_claimed_past_the_request_budget_are_refused_before_they_are_read() {
        for compression in [Compression::None, Compression::Zstd] {
            let batch = zeros(compression, 1000, 0);
            let mut limits = Limits {
                record_bytes: 1 << 20,
                inflate_left: 1 << 20,
                records_left: 999 * RECORD_MEMORY,
            };
            let refused = decode(batch.clone(), &mut limits);
            assert!(
                matches!(&refused, Err(RecordsError::TooLarge(why)) if why.contains("more records than")),
                "{compression:?}: {refused:?}"
            );
            let mut limits = Limits {
                record_bytes: 1 << 20,
                inflate_left: 1 << 20,
                records_left: 1000 * RECORD_MEMORY,
            };
            assert_eq!(decode(batch, &mut limits).unwrap().len(), 1000);
            assert_eq!(limits.records_left, 0);
        }
    }

    /// A record the broker keeps holds its own bytes, not a slice of the request's buffer:
    /// one small record kept for days must not keep a large request in memory.
    #[test]
    fn records_hold_their_own_bytes_not_the_request_buffer() {
        let batch = zeros(Compression::None, 3, 100);
        let within = |bytes: &Bytes| {
            let range = batch.as_ptr_range();
            range.contains(&bytes.as_ptr())
        };
        let records = decode(batch.clone(), &mut limits()).unwrap();
        assert_eq!(records.len(), 3);
        for record in &records {
            let value = record.value.as_ref().unwrap();
            assert_eq!(value.len(), 100);
            assert!(!within(value));
        }
    }

    #[test]
    fn varints_round_trip_at_their_bounds() {
        for value in [
            0,
            1,
            -1,
            63,
            -64,
            64,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            i64::MAX,
            i64::MIN,
        ] {
            let mut out = BytesMut::new();
            put_varint(&mut out, value);
            assert_eq!(Reader(out.freeze()).varlong().unwrap(), value);
        }
        // Kafka's own: 300 is 0xd8 0x04.
        let mut out = BytesMut::new();
        put_varint(&mut out, 300);
        assert_eq!(&out[..], &[0xd8, 0x04]);
    }

    #[test]
    fn a_varint_past_64_bits_or_a_negative_length_is_corrupt() {
        let overlong =
            Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]);
        assert_eq!(Reader(overlong).varlong(), Err("a varint past 64 bits"));
        let mut minus_two = BytesMut::new();
        put_varint(&mut minus_two, -2);
        assert_eq!(
            Reader(minus_two.freeze()).nullable(),
            Err("a negative length")
        );
    }

    #[test]
    fn a_record_with_more_headers_than_the_broker_stores_is_refused_before_they_are_read() {
        let names: Vec<String> = (0..=MAX_HEADERS).map(|index| format!("h{index}")).collect();
        let records = [FetchedRecord {
            offset: 0,
            timestamp: 0,
            key: None,
            value: b"v",
            headers: names.iter().map(|name| (name.as_str(), None)).collect(),
        }];
        let refused = decode(encode(&records).unwrap(), &mut limits());
        assert!(
            matches!(&refused, Err(RecordsError::Invalid(why)) if why.contains("at most 64")),
            "{refused:?}"
        );
    }

    #[test]
    fn repeated_header_names_keep_every_value_in_order() {
        let records = [FetchedRecord {
            offset: 5,
            timestamp: 1_000,
            key: None,
            value: b"v",
            headers: vec![("dup", Some(b"a")), ("z", None), ("dup", Some(b"b"))],
        }];
        let back = decode(encode(&records).unwrap(), &mut limits()).unwrap();
        assert_eq!(
            back[0].headers,
            vec![
                ("dup".to_owned(), Some(Bytes::from_static(b"a"))),
                ("z".to_owned(), None),
                ("dup".to_owned(), Some(Bytes::from_static(b"b"))),
            ]
        );
    }

    #[test]
    fn every_truncation_of_a_batch_is_refused_without_a_panic() {
        let records = [FetchedRecord {
            offset: 0,
            timestamp: 7,
            key: Some(b"k"),
            value: b"value",
            headers: vec![("h", Some(b"x"))],
        }];
        let whole = encode(&records).unwrap();
        for cut in 1..whole.len() {
            assert!(
                decode(whole.slice(..cut), &mut limits()).is_err(),
                "cut at {cut}"
            );
        }
        assert_eq!(decode(whole, &mut limits()).unwrap().len(), 1);
    }
}
