//! Kafka's record batches (format v2, as every current client sends them) to the broker's
//! records and back. A record's key, value, headers and time are the broker record's key,
//! payload, headers and time; a null value is stored as an empty payload.

use broker_core::{check_headers, BrokerRecord, Header, PublishRecord};
use bytes::Bytes;

use crate::batch::{self, sequence_after, FetchedRecord};
pub(crate) use crate::batch::{Limits, RecordsError};

/// The records of one partition of a produce request, ready to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Produced {
    /// For an idempotent producer's records: the broker's producer (see [`native_producer`])
    /// and the sequence number of the first record (the next ones are numbered on from it).
    pub(crate) idempotent: Option<(u64, i32)>,
    /// The records, in order, each for the partition.
    pub(crate) records: Vec<PublishRecord>,
}

/// The broker's producer for Kafka's producer `id` (never negative) at `epoch`: epoch 0 is the
/// id itself, and each later epoch a producer of its own. Kafka's clients bump their epoch when
/// they cannot tell what became of a batch (librdkafka after a failover, for one) and number
/// their sequences from zero again, which the broker's de-duplication, kept per producer,
/// accepts only from a producer it has not seen. The epoch goes into the id's top bits: ids are
/// drawn at random, so no two producers share a key with any real likelihood.
pub(crate) fn native_producer(id: i64, epoch: i16) -> u64 {
    id.unsigned_abs() ^ (u64::from(epoch.unsigned_abs()) << 48)
}

/// The records of one partition of a produce request, checked (each batch's CRC-32C),
/// decompressed within `limits` (whose budget they spend) and ready to publish to
/// `partition`. Control records (transaction markers) are refused with the batch that holds
/// them.
pub(crate) fn decode_produced(
    partition: i32,
    batches: Bytes,
    limits: &mut Limits,
) -> Result<Produced, RecordsError> {
    let produced = batch::decode(batches, limits)?;
    let mut records = Vec::with_capacity(produced.len());
    // The producer's id, epoch and first sequence number, as the first record gives them.
    let mut idempotent: Option<(i64, i16, i32)> = None;
    for record in produced {
        if record.transactional || record.control {
            return Err(RecordsError::Transactional);
        }
        match idempotent {
            None if records.is_empty() && record.producer_id >= 0 => {
                if record.sequence < 0 || record.producer_epoch < 0 {
                    return Err(RecordsError::Corrupt(
                        "an idempotent producer's batch without a sequence number or epoch"
                            .to_owned(),
                    ));
                }
                idempotent = Some((record.producer_id, record.producer_epoch, record.sequence));
            }
            Some((producer, epoch, first))
                if (producer, epoch) != (record.producer_id, record.producer_epoch)
                    || record.sequence != sequence_after(first, records.len() as i32) =>
            {
                return Err(RecordsError::Corrupt(
                    "the batches of one partition must come from one producer with \
                     consecutive sequence numbers"
                        .to_owned(),
                ));
            }
            _ => {}
        }
        let headers: Vec<Header> = record
            .headers
            .into_iter()
            .map(|(name, value)| Header { name, value })
            .collect();
        // Refused here, for its partition alone, rather than with every partition of the
        // request by the broker.
        check_headers(&headers).map_err(|refused| RecordsError::Invalid(refused.to_string()))?;
        records.push(PublishRecord {
            partition: Some(partition),
            key: record.key,
            payload: record.value.unwrap_or_default(),
            headers,
            timestamp_ms: (record.timestamp >= 0).then_some(record.timestamp),
        });
    }
    Ok(Produced {
        idempotent: idempotent
            .map(|(producer, epoch, first)| (native_producer(producer, epoch), first)),
        records,
    })
}

/// `records` (consecutive offsets of one partition) as one uncompressed record batch.
pub(crate) fn encode_fetched(records: &[BrokerRecord]) -> Result<Bytes, String> {
    let records: Vec<FetchedRecord<'_>> = records
        .iter()
        .map(|record| FetchedRecord {
            offset: record.offset,
            timestamp: record.timestamp_ms,
            key: record.key.as_deref(),
            value: &record.payload,
            headers: record
                .headers
                .iter()
                .map(|header| (header.name.as_str(), header.value.as_deref()))
                .collect(),
        })
        .collect();
    batch::encode(&records)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE,
    };

    use super::*;

    fn limits() -> Limits {
        Limits {
            record_bytes: 1 << 20,
            inflate_left: 1 << 20,
            records_left: usize::MAX,
        }
    }

    fn fetched(offset: i64, key: Option<&'static [u8]>, payload: &'static [u8]) -> BrokerRecord {
        BrokerRecord {
            topic: "t".into(),
            partition: 2,
            offset,
            key: key.map(Bytes::from_static),
            payload: Bytes::from_static(payload),
            timestamp_ms: 1_700_000_000_000 + offset,
            headers: vec![
                Header::new("trace", "abc"),
                Header {
                    name: "empty".into(),
                    value: None,
                },
            ],
            delivery_count: 0,
        }
    }

    #[test]
    fn fetched_records_decode_as_produced_with_their_fields() {
        let records = vec![fetched(7, Some(b"k"), b"one"), fetched(8, None, b"")];
        let batch = encode_fetched(&records).unwrap();
        let back = decode_produced(2, batch.clone(), &mut limits())
            .unwrap()
            .records;
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(back[0].payload, "one");
        assert_eq!(back[0].timestamp_ms, Some(1_700_000_000_007));
        assert_eq!(back[0].headers, records[0].headers);
        assert_eq!(back[1].key, None);
        assert_eq!(back[1].partition, Some(2));
        // The batch keeps the broker's offsets.
        let mut bytes = batch;
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        let offsets: Vec<i64> = sets[0].records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![7, 8]);
    }

    #[test]
    fn every_compression_codec_decodes() {
        let records: Vec<Record> = (0..3)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: NO_SEQUENCE,
                timestamp: 5,
                key: None,
                value: Some(Bytes::from(format!("value {i}").repeat(20))),
                headers: Default::default(),
            })
            .collect();
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let mut buffer = BytesMut::new();
            let options = RecordEncodeOptions {
                version: 2,
                compression,
            };
            RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
            let back = decode_produced(0, buffer.freeze(), &mut limits())
                .unwrap()
                .records;
            assert_eq!(back.len(), 3, "{compression:?}");
            assert_eq!(back[2].payload, "value 2".repeat(20), "{compression:?}");
        }
    }

    #[test]
    fn a_damaged_batch_fails_its_checksum() {
        let mut batch =
            BytesMut::from(&encode_fetched(&[fetched(0, None, b"payload")]).unwrap()[..]);
        let last = batch.len() - 1;
        batch[last] ^= 0xff;
        assert!(matches!(
            decode_produced(0, batch.freeze(), &mut limits()),
            Err(RecordsError::Corrupt(message)) if message.contains("Cyclic redundancy check")
        ));
    }

    /// A batch of one record of producer 4 at `epoch`, sequence 0.
    fn of_producer_4(epoch: i16, transactional: bool) -> Bytes {
        let record = Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 4,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: 0,
            timestamp: 5,
            key: None,
            value: Some(Bytes::from_static(b"x")),
            headers: Default::default(),
        };
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buffer, [&record], &options).unwrap();
        buffer.freeze()
    }

    #[test]
    fn a_transactional_batch_is_refused() {
        assert_eq!(
            decode_produced(0, of_producer_4(0, true), &mut limits()),
            Err(RecordsError::Transactional)
        );
    }

    #[test]
    fn each_epoch_of_a_producer_numbers_its_sequences_as_a_producer_of_its_own() {
        let producer = |epoch| {
            decode_produced(0, of_producer_4(epoch, false), &mut limits())
                .unwrap()
                .idempotent
        };
        assert_eq!(producer(0), Some((4, 0)));
        let bumped = [1, 2, i16::MAX].map(|epoch| producer(epoch).unwrap().0);
        assert!(bumped.iter().all(|key| *key != 4));
        assert!(bumped[0] != bumped[1] && bumped[1] != bumped[2]);
        assert!(matches!(
            decode_produced(0, of_producer_4(-1, false), &mut limits()),
            Err(RecordsError::Corrupt(_))
        ));
    }
}
