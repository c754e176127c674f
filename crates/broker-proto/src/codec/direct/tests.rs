use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tokio_util::codec::Encoder;

use super::publish;
use crate::codec::{decode_body, Codec, Decoded, MAX_FRAME_CEILING};
use crate::{RequestFrame, ResponseFrame};
use broker_core::{Command, Header, PartitionBatch, PublishRecord};

/// `frame`'s body as a client encodes it.
fn body(frame: &RequestFrame) -> Vec<u8> {
    let mut buffer = BytesMut::new();
    Codec::<ResponseFrame, RequestFrame>::new(MAX_FRAME_CEILING)
        .encode(frame, &mut buffer)
        .unwrap();
    buffer[4..].to_vec()
}

fn request(command: Command) -> RequestFrame {
    RequestFrame {
        correlation_id: 0x0102_0304_0506_0708,
        max_wait_ms: 7,
        command,
    }
}

fn frame(batches: Vec<PartitionBatch>) -> RequestFrame {
    request(Command::PublishIdempotent {
        topic: "orders-é".to_owned(),
        producer: u64::MAX - 3,
        batches,
    })
}

/// What the generic decoder makes of `body`, when it is a message.
fn generic(body: &[u8]) -> Option<RequestFrame> {
    match decode_body::<RequestFrame>(body) {
        Decoded::Message(frame) => Some(frame),
        Decoded::Malformed { .. } => None,
    }
}

/// What the direct decoder makes of `body`, when it is a message.
fn direct(body: &[u8]) -> Option<RequestFrame> {
    match publish(body)? {
        Decoded::Message(frame) => Some(frame),
        Decoded::Malformed { .. } => None,
    }
}

/// The property: whatever the direct decoder decodes, the generic one decodes the same way.
fn agrees(body: &[u8]) -> Result<(), TestCaseError> {
    if let Some(direct) = direct(body) {
        prop_assert_eq!(Some(direct), generic(body));
    }
    Ok(())
}

#[test]
fn more_records_than_a_publish_holds_are_refused_before_they_are_read() {
    use broker_core::MAX_BATCH_RECORDS;
    let records = |count: usize| vec![PublishRecord::to_partition(0, Bytes::new()); count];
    let within = request(Command::PublishBatch {
        topic: "t".to_owned(),
        records: records(MAX_BATCH_RECORDS),
    });
    assert_eq!(direct(&body(&within)), Some(within));
    let over = request(Command::PublishBatch {
        topic: "t".to_owned(),
        records: records(MAX_BATCH_RECORDS + 1),
    });
    let refused = |body: &[u8]| match publish(body) {
        Some(Decoded::Malformed {
            leading_u64,
            reason,
        }) => (leading_u64, reason),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        refused(&body(&over)),
        (
            Some(0x0102_0304_0506_0708),
            "a batch holds at most 10000 records, got 10001".to_owned()
        )
    );
    // The batches of an idempotent publish count together.
    let split = frame(vec![
        PartitionBatch {
            partition: 0,
            sequence: 0,
            records: records(MAX_BATCH_RECORDS / 2),
        },
        PartitionBatch {
            partition: 1,
            sequence: 0,
            records: records(MAX_BATCH_RECORDS / 2 + 1),
        },
    ]);
    assert_eq!(
        refused(&body(&split)).1,
        "a batch holds at most 10000 records, got 10001"
    );
}

#[test]
fn every_field_of_a_publish_idempotent_decodes_as_the_generic_decoder_decodes_it() {
    let every_field = PublishRecord {
        partition: Some(-2),
        key: Some(Bytes::from_static(b"key")),
        payload: Bytes::from_static(b"payload"),
        headers: vec![
            Header {
                name: "trace-é".to_owned(),
                value: Some(Bytes::from_static(b"\x00\xff")),
            },
            Header {
                name: String::new(),
                value: None,
            },
        ],
        timestamp_ms: Some(-5),
    };
    let bare = PublishRecord::to_partition(3, Bytes::new());
    let frame = frame(vec![
        PartitionBatch {
            partition: 3,
            sequence: 9,
            records: vec![bare.clone(), every_field],
        },
        PartitionBatch {
            partition: i32::MIN,
            sequence: u64::MAX,
            records: Vec::new(),
        },
        PartitionBatch {
            partition: 0,
            sequence: 0,
            records: vec![PublishRecord {
                partition: None,
                ..bare
            }],
        },
    ]);
    let body = body(&frame);
    assert_eq!(direct(&body), Some(frame.clone()));
    assert_eq!(generic(&body), Some(frame));
}

#[test]
fn every_other_publish_decodes_as_the_generic_decoder_decodes_it() {
    let topic = || "t".to_owned();
    let payload = || Bytes::from_static(b"payload");
    let record = PublishRecord {
        partition: None,
        key: Some(Bytes::from_static(b"k")),
        payload: payload(),
        headers: vec![Header {
            name: "h".to_owned(),
            value: None,
        }],
        timestamp_ms: Some(1),
    };
    for command in [
        Command::Publish {
            topic: topic(),
            partition: 2,
            payload: payload(),
        },
        Command::PublishKeyed {
            topic: topic(),
            key: None,
            payload: payload(),
        },
        Command::PublishKeyed {
            topic: topic(),
            key: Some(Bytes::new()),
            payload: Bytes::new(),
        },
        Command::PublishBatch {
            topic: topic(),
            records: vec![record.clone(), PublishRecord::to_partition(0, payload())],
        },
        Command::PublishUntilFull {
            topic: topic(),
            records: vec![record.clone(), PublishRecord::to_partition(0, payload())],
        },
    ] {
        let frame = request(command);
        let body = body(&frame);
        assert_eq!(direct(&body), Some(frame.clone()));
        assert_eq!(generic(&body), Some(frame));
    }
}

/// Bytes as proto.md's section 2 writes a `bytes` or a `String`: a `u64` length, then them.
fn with_length(bytes: &[u8]) -> Vec<u8> {
    let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(bytes);
    out
}

#[test]
fn a_publish_written_byte_by_byte_as_proto_md_documents_decodes_through_the_server_codec() {
    use tokio_util::codec::Decoder;
    let mut body = Vec::new();
    body.extend_from_slice(&9u64.to_le_bytes()); // correlation_id
    body.extend_from_slice(&0u32.to_le_bytes()); // max_wait_ms
    body.extend_from_slice(&24u32.to_le_bytes()); // [24] PublishIdempotent
    body.extend(with_length(b"orders")); // topic
    body.extend_from_slice(&7u64.to_le_bytes()); // producer
    body.extend_from_slice(&1u64.to_le_bytes()); // batches: 1
    body.extend_from_slice(&2i32.to_le_bytes()); // partition
    body.extend_from_slice(&5u64.to_le_bytes()); // sequence
    body.extend_from_slice(&1u64.to_le_bytes()); // records: 1
    body.push(1); // partition: Some
    body.extend_from_slice(&2i32.to_le_bytes());
    body.push(1); // key: Some
    body.extend(with_length(b"k"));
    body.extend(with_length(b"hello")); // payload
    body.extend_from_slice(&1u64.to_le_bytes()); // headers: 1
    body.extend(with_length(b"trace")); // name
    body.push(0); // value: None
    body.push(1); // timestamp_ms: Some
    body.extend_from_slice(&(-3i64).to_le_bytes());
    let mut frame = (body.len() as u32).to_be_bytes().to_vec(); // length prefix, big-endian
    frame.extend(body);
    let expected = request(Command::PublishIdempotent {
        topic: "orders".to_owned(),
        producer: 7,
        batches: vec![PartitionBatch {
            partition: 2,
            sequence: 5,
            records: vec![PublishRecord {
                partition: Some(2),
                key: Some(Bytes::from_static(b"k")),
                payload: Bytes::from_static(b"hello"),
                headers: vec![Header {
                    name: "trace".to_owned(),
                    value: None,
                }],
                timestamp_ms: Some(-3),
            }],
        }],
    });
    let expected = RequestFrame {
        correlation_id: 9,
        max_wait_ms: 0,
        ..expected
    };
    assert_eq!(direct(&frame[4..]), Some(expected.clone()));
    let mut buffer = BytesMut::from(&frame[..]);
    let decoded = crate::ServerCodec::new(1024, crate::PROTOCOL_VERSION)
        .decode(&mut buffer)
        .unwrap();
    assert!(
        matches!(decoded, Some(Decoded::Message(ref frame)) if *frame == expected),
        "{decoded:?}"
    );
    assert!(buffer.is_empty());
}

#[test]
fn other_commands_and_damaged_bodies_are_left_to_the_generic_decoder() {
    let end_offset = request(Command::EndOffset {
        topic: "t".to_owned(),
        partition: 0,
    });
    assert!(publish(&body(&end_offset)).is_none());
    let batch = PartitionBatch {
        partition: 0,
        sequence: 0,
        records: vec![PublishRecord::to_partition(0, Bytes::from_static(b"x"))],
    };
    let good = body(&frame(vec![batch]));
    // Trailing bytes, a body cut short, an option tag of 2, a topic that is not UTF-8.
    let mut trailing = good.clone();
    trailing.push(0);
    let cut = &good[..good.len() - 1];
    let mut bad_tag = good.clone();
    let tag_at = good.len() - 1; // The record's time: `None`.
    bad_tag[tag_at] = 2;
    let mut bad_text = good.clone();
    bad_text[8 + 4 + 4 + 8] = 0xff; // The topic's first byte.
    for body in [&trailing[..], cut, &bad_tag, &bad_text] {
        assert!(publish(body).is_none());
        assert_eq!(generic(body), None, "the generic decoder takes it");
    }
    // A forged count of batches reserves nothing it cannot fill.
    let mut forged = good[..8 + 4 + 4 + 8 + "orders-é".len() + 8].to_vec();
    forged.extend_from_slice(&u64::MAX.to_le_bytes());
    assert!(publish(&forged).is_none());
}

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn record() -> impl Strategy<Value = PublishRecord> {
    let header =
        (".{0,4}", prop::option::of(bytes(4))).prop_map(|(name, value)| Header { name, value });
    (
        prop::option::of(any::<i32>()),
        prop::option::of(bytes(6)),
        bytes(12),
        prop::collection::vec(header, 0..3),
        prop::option::of(any::<i64>()),
    )
        .prop_map(
            |(partition, key, payload, headers, timestamp_ms)| PublishRecord {
                partition,
                key,
                payload,
                headers,
                timestamp_ms,
            },
        )
}

fn batches() -> impl Strategy<Value = Vec<PartitionBatch>> {
    let batch = (
        any::<i32>(),
        any::<u64>(),
        prop::collection::vec(record(), 0..4),
    )
        .prop_map(|(partition, sequence, records)| PartitionBatch {
            partition,
            sequence,
            records,
        });
    prop::collection::vec(batch, 0..4)
}

/// Any publish request.
fn publishes() -> impl Strategy<Value = RequestFrame> {
    prop_oneof![
        (".{0,6}", any::<u64>(), batches()).prop_map(|(topic, producer, batches)| {
            request(Command::PublishIdempotent {
                topic,
                producer,
                batches,
            })
        }),
        (".{0,6}", any::<i32>(), bytes(12)).prop_map(|(topic, partition, payload)| {
            request(Command::Publish {
                topic,
                partition,
                payload,
            })
        }),
        (".{0,6}", prop::option::of(bytes(6)), bytes(12)).prop_map(|(topic, key, payload)| {
            request(Command::PublishKeyed {
                topic,
                key,
                payload,
            })
        }),
        (".{0,6}", prop::collection::vec(record(), 0..4))
            .prop_map(|(topic, records)| request(Command::PublishBatch { topic, records })),
        (".{0,6}", prop::collection::vec(record(), 0..4))
            .prop_map(|(topic, records)| request(Command::PublishUntilFull { topic, records })),
    ]
}

proptest! {
    #[test]
    fn the_direct_decoder_decodes_every_publish_as_the_generic_one(frame in publishes()) {
        let body = body(&frame);
        prop_assert_eq!(direct(&body), Some(frame));
        agrees(&body)?;
    }

    #[test]
    fn a_damaged_publish_is_decoded_as_the_generic_decoder_decodes_it_or_not_at_all(
        frame in publishes(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut body = body(&frame);
        let at = at.index(body.len());
        body[at] = byte;
        agrees(&body)?;
        agrees(&body[..cut.index(body.len())])?;
    }
}
