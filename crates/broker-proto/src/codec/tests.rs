//! Byte-level tests of the framing and of malformed input.

use broker_core::{Command, KeyHash, Outcome};
use bytes::{BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::{
    v1, ClientCodec, Codec, ErrorReply, RequestFrame, ResponseFrame, ServerCodec, PROTOCOL_VERSION,
};

fn request() -> RequestFrame {
    RequestFrame {
        correlation_id: 7,
        max_wait_ms: 0,
        command: Command::Create {
            topic: "t".into(),
            partition_count: 2,
            key_hash: KeyHash::Murmur2,
            settings: Vec::new(),
        },
    }
}

#[test]
fn a_request_round_trips_through_client_and_server_codecs() {
    let mut buf = BytesMut::new();
    ClientCodec::new(1024).encode(request(), &mut buf).unwrap();
    match ServerCodec::new(1024, PROTOCOL_VERSION)
        .decode(&mut buf)
        .unwrap()
    {
        Some(crate::Decoded::Message(frame)) => assert_eq!(frame, request()),
        other => panic!("unexpected {other:?}"),
    }
    assert!(buf.is_empty());
}

/// The frame proto.md's example of version 1 shows: `Create` of "t" with 2 partitions.
fn create_v1_bytes() -> Vec<u8> {
    let mut expected = Vec::new();
    expected.extend_from_slice(&33u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&7u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // max_wait_ms
    expected.extend_from_slice(&0u32.to_le_bytes()); // Command::Create
    expected.extend_from_slice(&1u64.to_le_bytes()); // topic length
    expected.extend_from_slice(b"t");
    expected.extend_from_slice(&2i32.to_le_bytes()); // partition_count
    expected.extend_from_slice(&0u32.to_le_bytes()); // KeyHash::Murmur2
    expected
}

#[test]
fn create_request_encodes_to_the_bytes_proto_md_documents() {
    let mut buf = BytesMut::new();
    ClientCodec::new(1024).encode(request(), &mut buf).unwrap();
    let mut expected = create_v1_bytes();
    expected[..4].copy_from_slice(&41u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&0u64.to_le_bytes()); // settings: none
    assert_eq!(&buf[..], &expected[..]);
    // The client encodes from a borrowed command: the same bytes.
    let owned = request();
    let mut borrowed = BytesMut::new();
    let frame = crate::RequestFrameRef {
        correlation_id: owned.correlation_id,
        max_wait_ms: owned.max_wait_ms,
        command: &owned.command,
    };
    ClientCodec::new(1024).encode(frame, &mut borrowed).unwrap();
    assert_eq!(&borrowed[..], &expected[..]);
}

#[test]
fn a_version_1_create_decodes_as_the_same_call_with_no_settings() {
    let mut buf = BytesMut::from(&create_v1_bytes()[..]);
    match ServerCodec::new(1024, 1).decode(&mut buf).unwrap() {
        Some(crate::Decoded::Message(frame)) => assert_eq!(frame, request()),
        other => panic!("unexpected {other:?}"),
    }
    // A version 1 client's encoder writes exactly those bytes.
    let mut written = BytesMut::new();
    Codec::<v1::ResponseFrame, v1::RequestFrame>::new(1024)
        .encode(
            v1::RequestFrame {
                correlation_id: 7,
                max_wait_ms: 0,
                command: broker_core::v1::Command::Create {
                    topic: "t".into(),
                    partition_count: 2,
                    key_hash: KeyHash::Murmur2,
                },
            },
            &mut written,
        )
        .unwrap();
    assert_eq!(&written[..], &create_v1_bytes()[..]);
}

#[test]
fn a_version_1_connection_gets_records_without_the_fields_version_2_added() {
    let record = broker_core::BrokerRecord {
        topic: "t".into(),
        partition: 1,
        offset: 2,
        key: None,
        payload: Bytes::from_static(b"p"),
        timestamp_ms: 99,
        headers: vec![broker_core::Header {
            name: "h".into(),
            value: None,
        }],
        delivery_count: 1,
    };
    let mut buf = BytesMut::new();
    ServerCodec::new(1024, 1)
        .encode(
            ResponseFrame {
                correlation_id: 7,
                result: Ok(Outcome::Records(vec![record])),
            },
            &mut buf,
        )
        .unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&7u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // Ok
    expected.extend_from_slice(&5u32.to_le_bytes()); // Outcome::Records
    expected.extend_from_slice(&1u64.to_le_bytes()); // one record
    expected.extend_from_slice(&1u64.to_le_bytes()); // topic length
    expected.extend_from_slice(b"t");
    expected.extend_from_slice(&1i32.to_le_bytes()); // partition
    expected.extend_from_slice(&2i64.to_le_bytes()); // offset
    expected.push(0); // key: None
    expected.extend_from_slice(&1u64.to_le_bytes()); // payload length
    expected.extend_from_slice(b"p");
    assert_eq!(&buf[4..], &expected[..]);
    assert_eq!(&buf[..4], &(expected.len() as u32).to_be_bytes());
}

#[test]
fn a_command_version_1_does_not_have_is_malformed_on_a_version_1_connection() {
    let mut body = Vec::new();
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&19u32.to_le_bytes()); // DeleteTopic, version 2 only
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(b"t");
    let mut buf = BytesMut::new();
    buf.put_u32(body.len() as u32);
    buf.extend_from_slice(&body);
    assert!(matches!(
        ServerCodec::new(1024, 1).decode(&mut buf.clone()).unwrap(),
        Some(crate::Decoded::Malformed {
            leading_u64: Some(7),
            ..
        })
    ));
    assert!(matches!(
        ServerCodec::new(1024, 2).decode(&mut buf).unwrap(),
        Some(crate::Decoded::Message(RequestFrame {
            command: Command::DeleteTopic { .. },
            ..
        }))
    ));
}

#[test]
fn dead_letter_settings_are_version_4_in_both_directions() {
    let dead_letter = broker_core::TopicName::new("dlq").unwrap();
    let settings = vec![
        broker_core::GroupSetting::AckTimeoutMs(5),
        broker_core::GroupSetting::MaxDeliveries(3),
        broker_core::GroupSetting::DeadLetter(dead_letter),
    ];
    // A join that carries them is malformed on a connection of version 3.
    let join = RequestFrame {
        correlation_id: 7,
        max_wait_ms: 0,
        command: Command::Join {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            assignor: None,
            settings: settings.clone(),
        },
    };
    let mut bytes = BytesMut::new();
    ClientCodec::new(1024)
        .encode(join.clone(), &mut bytes)
        .unwrap();
    assert!(matches!(
        ServerCodec::new(1024, 3)
            .decode(&mut bytes.clone())
            .unwrap(),
        Some(crate::Decoded::Malformed {
            leading_u64: Some(7),
            ..
        })
    ));
    match ServerCodec::new(1024, 4).decode(&mut bytes).unwrap() {
        Some(crate::Decoded::Message(decoded)) => assert_eq!(decoded, join),
        other => panic!("unexpected {other:?}"),
    }
    // A description leaves them out for version 3 and keeps them for version 4.
    let description = |settings: Vec<broker_core::GroupSetting>| ResponseFrame {
        correlation_id: 8,
        result: Ok(Outcome::Description(broker_core::BrokerDescription {
            capacity_per_partition: 10,
            topics: vec![broker_core::TopicDescription {
                name: "t".into(),
                key_hash: KeyHash::Murmur2,
                settings: Vec::new(),
                retained_bytes: 0,
                partitions: Vec::new(),
                groups: vec![broker_core::GroupDescription {
                    name: "g".into(),
                    assignor: broker_core::Assignor::RoundRobin,
                    settings,
                    members: Vec::new(),
                    partitions: Vec::new(),
                }],
            }],
        })),
    };
    for (version, expected) in [(3, settings[..1].to_vec()), (4, settings.clone())] {
        assert_eq!(
            as_read_by_a_client(version, description(settings.clone())),
            description(expected),
            "version {version}"
        );
    }
}

/// `answer` as a server speaking `version` encodes it, decoded by a client.
fn as_read_by_a_client(version: u16, answer: ResponseFrame) -> ResponseFrame {
    let mut bytes = BytesMut::new();
    ServerCodec::new(1024, version)
        .encode(answer, &mut bytes)
        .unwrap();
    match ClientCodec::new(1024).decode(&mut bytes).unwrap() {
        Some(crate::Decoded::Message(decoded)) => decoded,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_dead_letter_topic_named_under_kafkas_rules_is_version_11() {
    use broker_core::{GroupSetting, NameRules, TopicName};
    let dotted = TopicName::with_rules("orders.v1.dlq", NameRules::Kafka).unwrap();
    let plain = TopicName::new("orders-dlq").unwrap();
    let with = |dead_letter| {
        vec![
            GroupSetting::AckTimeoutMs(5),
            GroupSetting::MaxDeliveries(3),
            GroupSetting::DeadLetter(dead_letter),
        ]
    };
    let answer = |settings| ResponseFrame {
        correlation_id: 9,
        result: Ok(Outcome::GroupSettings(settings)),
    };
    // Version 10 leaves out the dotted name with its maximum, and nothing else; version 11
    // keeps it; a plain name stays in both.
    for (version, settings, expected) in [
        (10, with(dotted), vec![GroupSetting::AckTimeoutMs(5)]),
        (11, with(dotted), with(dotted)),
        (10, with(plain), with(plain)),
    ] {
        assert_eq!(
            as_read_by_a_client(version, answer(settings)),
            answer(expected),
            "version {version}"
        );
    }
}

#[test]
fn a_pending_change_is_version_12_and_invalid_argument_before() {
    let answer = |error| ResponseFrame {
        correlation_id: 4,
        result: Err(error),
    };
    let text = "node 4 is a voter of the first group, but data group 2 has not added it yet";
    for (version, expected) in [
        (1, ErrorReply::InvalidArgument(text.into())),
        (11, ErrorReply::InvalidArgument(text.into())),
        (12, ErrorReply::Pending(text.into())),
    ] {
        assert_eq!(
            as_read_by_a_client(version, answer(ErrorReply::Pending(text.into()))),
            answer(expected),
            "version {version}"
        );
    }
}

#[test]
fn a_partial_frame_waits_for_more_bytes() {
    let mut whole = BytesMut::new();
    ClientCodec::new(1024)
        .encode(request(), &mut whole)
        .unwrap();
    let mut codec = ServerCodec::new(1024, PROTOCOL_VERSION);
    for cut in 0..whole.len() {
        let mut part = BytesMut::from(&whole[..cut]);
        assert!(codec.decode(&mut part).unwrap().is_none(), "cut at {cut}");
    }
}

#[test]
fn eof_inside_a_frame_is_an_error_and_eof_between_frames_is_clean() {
    let mut whole = BytesMut::new();
    ClientCodec::new(1024)
        .encode(request(), &mut whole)
        .unwrap();
    let mut codec = ServerCodec::new(1024, PROTOCOL_VERSION);
    let mut part = BytesMut::from(&whole[..whole.len() - 1]);
    assert!(matches!(
        codec.decode_eof(&mut part),
        Err(crate::ProtocolError::TruncatedFrame { .. })
    ));
    assert!(codec.decode_eof(&mut BytesMut::new()).unwrap().is_none());
}

#[test]
fn an_oversized_length_prefix_is_refused_before_any_allocation() {
    let mut buf = BytesMut::new();
    buf.put_u32(u32::MAX);
    assert!(matches!(
        ServerCodec::new(1024, PROTOCOL_VERSION).decode(&mut buf),
        Err(crate::ProtocolError::FrameTooLarge { size, limit: 1024 }) if size == u64::from(u32::MAX)
    ));
}

#[test]
fn an_unknown_command_is_malformed_but_keeps_its_correlation_id_and_the_stream() {
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    body.extend_from_slice(&42u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&9_999u32.to_le_bytes()); // no such command
    buf.put_u32(body.len() as u32);
    buf.extend_from_slice(&body);
    ClientCodec::new(1024).encode(request(), &mut buf).unwrap();
    let mut codec = ServerCodec::new(1024, PROTOCOL_VERSION);
    match codec.decode(&mut buf).unwrap() {
        Some(crate::Decoded::Malformed { leading_u64, .. }) => assert_eq!(leading_u64, Some(42)),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        codec.decode(&mut buf).unwrap(),
        Some(crate::Decoded::Message(_))
    ));
}

#[test]
fn trailing_bytes_after_a_message_are_malformed() {
    let mut encoded = BytesMut::new();
    ClientCodec::new(1024)
        .encode(request(), &mut encoded)
        .unwrap();
    let mut body = encoded.split_off(4).to_vec();
    body.push(0);
    let mut buf = BytesMut::new();
    buf.put_u32(body.len() as u32);
    buf.extend_from_slice(&body);
    assert!(matches!(
        ServerCodec::new(1024, PROTOCOL_VERSION)
            .decode(&mut buf)
            .unwrap(),
        Some(crate::Decoded::Malformed { .. })
    ));
}

#[test]
fn a_huge_string_length_inside_a_small_frame_fails_without_allocating_it() {
    let mut body = Vec::new();
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes()); // Create
    body.extend_from_slice(&(u64::MAX / 2).to_le_bytes()); // topic "length"
    let mut buf = BytesMut::new();
    buf.put_u32(body.len() as u32);
    buf.extend_from_slice(&body);
    assert!(matches!(
        ServerCodec::new(1024, PROTOCOL_VERSION)
            .decode(&mut buf)
            .unwrap(),
        Some(crate::Decoded::Malformed { .. })
    ));
}

#[test]
fn an_encoded_response_larger_than_the_limit_is_refused_and_leaves_the_buffer_unchanged() {
    let response = ResponseFrame {
        correlation_id: 1,
        result: Ok(Outcome::Records(vec![broker_core::BrokerRecord {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            key: None,
            payload: Bytes::from(vec![0u8; 2048]),
            timestamp_ms: 0,
            headers: Vec::new(),
            delivery_count: 0,
        }])),
    };
    let mut buf = BytesMut::from(&b"keep"[..]);
    assert!(ServerCodec::new(1024, PROTOCOL_VERSION)
        .encode(response, &mut buf)
        .is_err());
    assert_eq!(&buf[..], b"keep");
}

#[test]
fn broker_errors_map_to_codes_zero_and_one_and_back() {
    for error in [
        broker_core::BrokerError::InvalidArgument("x".into()),
        broker_core::BrokerError::NotAssigned { partition: 3 },
    ] {
        assert_eq!(
            ErrorReply::from(error.clone()).to_broker_error(),
            Some(error)
        );
    }
    assert_eq!(ErrorReply::ShuttingDown.to_broker_error(), None);
}

#[test]
fn created_response_encodes_to_the_bytes_proto_md_documents() {
    let mut buf = BytesMut::new();
    let response = ResponseFrame {
        correlation_id: 7,
        result: Ok(Outcome::Created(true)),
    };
    ServerCodec::new(1024, PROTOCOL_VERSION)
        .encode(response, &mut buf)
        .unwrap();
    let mut expected = vec![0, 0, 0, 17];
    expected.extend_from_slice(&7u64.to_le_bytes());
    expected.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!(&buf[..], &expected[..]);
}

#[test]
fn hello_encodes_magic_version_name_and_optional_token_as_documented() {
    let mut buf = BytesMut::new();
    crate::ClientHandshakeCodec::new(1024)
        .encode(crate::Hello::new("c", Some("s".into())), &mut buf)
        .unwrap();
    let mut expected = vec![0, 0, 0, 25];
    expected.extend_from_slice(b"BRKR");
    expected.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.extend_from_slice(b"c");
    expected.push(1);
    expected.extend_from_slice(&1u64.to_le_bytes());
    expected.extend_from_slice(b"s");
    assert_eq!(&buf[..], &expected[..]);
}

#[test]
fn a_bool_other_than_zero_or_one_is_malformed() {
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 2]);
    buf.put_u32(body.len() as u32);
    buf.extend_from_slice(&body);
    assert!(matches!(
        ClientCodec::new(1024).decode(&mut buf).unwrap(),
        Some(crate::Decoded::Malformed { .. })
    ));
}

#[test]
fn a_command_a_later_version_added_is_malformed_on_an_older_connection() {
    let frame = RequestFrame {
        correlation_id: 9,
        max_wait_ms: 0,
        command: Command::PublishIdempotent {
            topic: "t".into(),
            producer: 1,
            batches: Vec::new(),
        },
    };
    let mut bytes = BytesMut::new();
    ClientCodec::new(1024).encode(frame, &mut bytes).unwrap();
    assert_needs_version(bytes, 9, 3);
}

/// Asserts that the request `bytes` (correlation id `id`) is malformed on a connection of the
/// version before `version`, saying which version it needs, and decodes on one of `version`.
fn assert_needs_version(mut bytes: BytesMut, id: u64, version: u16) {
    match ServerCodec::new(1024, version - 1)
        .decode(&mut bytes.clone())
        .unwrap()
    {
        Some(crate::Decoded::Malformed {
            leading_u64: Some(leading),
            reason,
        }) => {
            assert_eq!(leading, id);
            let needs = format!("protocol version {version}");
            assert!(reason.contains(&needs), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        ServerCodec::new(1024, version).decode(&mut bytes).unwrap(),
        Some(crate::Decoded::Message(_))
    ));
}

#[test]
fn configure_topic_encodes_to_the_bytes_proto_md_documents_and_needs_version_9() {
    let frame = RequestFrame {
        correlation_id: 7,
        max_wait_ms: 0,
        command: Command::ConfigureTopic {
            topic: "t".into(),
            settings: vec![broker_core::TopicSetting::MaxRecords(2)],
        },
    };
    let mut bytes = BytesMut::new();
    ClientCodec::new(1024).encode(frame, &mut bytes).unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&45u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&7u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // max_wait_ms
    expected.extend_from_slice(&35u32.to_le_bytes()); // Command::ConfigureTopic
    expected.extend_from_slice(&1u64.to_le_bytes()); // topic length
    expected.extend_from_slice(b"t");
    expected.extend_from_slice(&1u64.to_le_bytes()); // settings: one
    expected.extend_from_slice(&1u32.to_le_bytes()); // TopicSetting::MaxRecords
    expected.extend_from_slice(&2u64.to_le_bytes());
    assert_eq!(&bytes[..], &expected[..]);
    assert_needs_version(bytes, 7, 9);
    // The answer: outcome [21] TopicSettings.
    let response = ResponseFrame {
        correlation_id: 7,
        result: Ok(Outcome::TopicSettings(vec![
            broker_core::TopicSetting::MaxRecords(2),
        ])),
    };
    let mut bytes = BytesMut::new();
    ServerCodec::new(1024, 9)
        .encode(response, &mut bytes)
        .unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&36u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&7u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // Ok
    expected.extend_from_slice(&21u32.to_le_bytes()); // Outcome::TopicSettings
    expected.extend_from_slice(&1u64.to_le_bytes()); // one setting
    expected.extend_from_slice(&1u32.to_le_bytes()); // TopicSetting::MaxRecords
    expected.extend_from_slice(&2u64.to_le_bytes());
    assert_eq!(&bytes[..], &expected[..]);
}

#[test]
fn groups_status_encodes_to_the_bytes_proto_md_documents_and_needs_version_10() {
    let frame = RequestFrame {
        correlation_id: 5,
        max_wait_ms: 0,
        command: Command::GroupsStatus,
    };
    let mut bytes = BytesMut::new();
    ClientCodec::new(1024).encode(frame, &mut bytes).unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&16u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&5u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // max_wait_ms
    expected.extend_from_slice(&36u32.to_le_bytes()); // Command::GroupsStatus
    assert_eq!(&bytes[..], &expected[..]);
    assert_needs_version(bytes, 5, 10);
    // The answer: outcome [22] GroupsStatus, one group of one member.
    let response = ResponseFrame {
        correlation_id: 5,
        result: Ok(Outcome::GroupsStatus(vec![broker_core::GroupStatus {
            group: 2,
            status: broker_core::ClusterStatus {
                node_id: 1,
                role: broker_core::NodeRole::Leader,
                term: 3,
                leader: Some(1),
                last_log_index: Some(9),
                applied_index: None,
                members: vec![broker_core::ClusterMember {
                    node_id: 1,
                    peer_addr: "p".into(),
                    client_addr: "c".into(),
                    voter: true,
                    matched_index: Some(9),
                    reachable: true,
                }],
            },
            topics: vec!["t".into()],
        }])),
    };
    let mut bytes = BytesMut::new();
    ServerCodec::new(1024, 10)
        .encode(response, &mut bytes)
        .unwrap();
    let mut expected = Vec::new();
    let mut body = Vec::new();
    body.extend_from_slice(&5u64.to_le_bytes()); // correlation_id
    body.extend_from_slice(&0u32.to_le_bytes()); // Ok
    body.extend_from_slice(&22u32.to_le_bytes()); // Outcome::GroupsStatus
    body.extend_from_slice(&1u64.to_le_bytes()); // one group
    body.extend_from_slice(&2u32.to_le_bytes()); // group
    body.extend_from_slice(&1u64.to_le_bytes()); // status.node_id
    body.extend_from_slice(&0u32.to_le_bytes()); // NodeRole::Leader
    body.extend_from_slice(&3u64.to_le_bytes()); // term
    body.extend_from_slice(&[1]); // leader: Some
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&[1]); // last_log_index: Some
    body.extend_from_slice(&9u64.to_le_bytes());
    body.extend_from_slice(&[0]); // applied_index: None
    body.extend_from_slice(&1u64.to_le_bytes()); // one member
    body.extend_from_slice(&1u64.to_le_bytes()); // node_id
    body.extend_from_slice(&1u64.to_le_bytes()); // peer_addr
    body.extend_from_slice(b"p");
    body.extend_from_slice(&1u64.to_le_bytes()); // client_addr
    body.extend_from_slice(b"c");
    body.extend_from_slice(&[1]); // voter
    body.extend_from_slice(&[1]); // matched_index: Some
    body.extend_from_slice(&9u64.to_le_bytes());
    body.extend_from_slice(&[1]); // reachable
    body.extend_from_slice(&1u64.to_le_bytes()); // one topic
    body.extend_from_slice(&1u64.to_le_bytes()); // its name's length
    body.extend_from_slice(b"t");
    expected.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    expected.extend_from_slice(&body);
    assert_eq!(&bytes[..], &expected[..]);
}

#[test]
fn producers_encodes_to_the_bytes_proto_md_documents_and_needs_version_14() {
    let frame = RequestFrame {
        correlation_id: 3,
        max_wait_ms: 0,
        command: Command::Producers {
            topic: "t".into(),
            partition: 2,
        },
    };
    let mut bytes = BytesMut::new();
    ClientCodec::new(1024).encode(frame, &mut bytes).unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&29u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&3u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // max_wait_ms
    expected.extend_from_slice(&38u32.to_le_bytes()); // Command::Producers
    expected.extend_from_slice(&1u64.to_le_bytes()); // topic length
    expected.extend_from_slice(b"t");
    expected.extend_from_slice(&2i32.to_le_bytes()); // partition
    assert_eq!(&bytes[..], &expected[..]);
    assert_needs_version(bytes, 3, 14);
    // The answer: outcome [23] Producers, one producer.
    let response = ResponseFrame {
        correlation_id: 3,
        result: Ok(Outcome::Producers(vec![broker_core::ProducerState {
            producer: 9,
            next_sequence: 4,
            last_offset: Some(17),
            last_seen_ms: 1_000,
        }])),
    };
    let mut bytes = BytesMut::new();
    ServerCodec::new(1024, 14)
        .encode(response, &mut bytes)
        .unwrap();
    let mut body = Vec::new();
    body.extend_from_slice(&3u64.to_le_bytes()); // correlation_id
    body.extend_from_slice(&0u32.to_le_bytes()); // Ok
    body.extend_from_slice(&23u32.to_le_bytes()); // Outcome::Producers
    body.extend_from_slice(&1u64.to_le_bytes()); // one producer
    body.extend_from_slice(&9u64.to_le_bytes()); // producer
    body.extend_from_slice(&4u64.to_le_bytes()); // next_sequence
    body.extend_from_slice(&[1]); // last_offset: Some
    body.extend_from_slice(&17i64.to_le_bytes());
    body.extend_from_slice(&1_000i64.to_le_bytes()); // last_seen_ms
    let mut expected = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    expected.extend_from_slice(&body);
    assert_eq!(&bytes[..], &expected[..]);
}

#[test]
fn stored_offsets_encodes_to_the_bytes_proto_md_documents_and_needs_version_14() {
    let frame = RequestFrame {
        correlation_id: 4,
        max_wait_ms: 0,
        command: Command::StoredOffsets {
            topic: "t".into(),
            group: "g".into(),
        },
    };
    let mut bytes = BytesMut::new();
    ClientCodec::new(1024).encode(frame, &mut bytes).unwrap();
    let mut expected = Vec::new();
    expected.extend_from_slice(&34u32.to_be_bytes()); // frame length
    expected.extend_from_slice(&4u64.to_le_bytes()); // correlation_id
    expected.extend_from_slice(&0u32.to_le_bytes()); // max_wait_ms
    expected.extend_from_slice(&39u32.to_le_bytes()); // Command::StoredOffsets
    expected.extend_from_slice(&1u64.to_le_bytes()); // topic length
    expected.extend_from_slice(b"t");
    expected.extend_from_slice(&1u64.to_le_bytes()); // group length
    expected.extend_from_slice(b"g");
    assert_eq!(&bytes[..], &expected[..]);
    assert_needs_version(bytes, 4, 14);
    // The answer: outcome [24] StoredOffsets, partition 0 stored at 7, partition 1 not.
    let response = ResponseFrame {
        correlation_id: 4,
        result: Ok(Outcome::StoredOffsets(vec![Some(7), None])),
    };
    let mut bytes = BytesMut::new();
    ServerCodec::new(1024, 14)
        .encode(response, &mut bytes)
        .unwrap();
    let mut body = Vec::new();
    body.extend_from_slice(&4u64.to_le_bytes()); // correlation_id
    body.extend_from_slice(&0u32.to_le_bytes()); // Ok
    body.extend_from_slice(&24u32.to_le_bytes()); // Outcome::StoredOffsets
    body.extend_from_slice(&2u64.to_le_bytes()); // two partitions
    body.extend_from_slice(&[1]); // Some
    body.extend_from_slice(&7i64.to_le_bytes());
    body.extend_from_slice(&[0]); // None
    let mut expected = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
    expected.extend_from_slice(&body);
    assert_eq!(&bytes[..], &expected[..]);
}

#[test]
fn an_answer_larger_than_a_frame_is_refused_with_its_size_and_writes_nothing() {
    use tokio_util::codec::Encoder;
    let payload = Bytes::from(vec![7u8; 4096]);
    let request = crate::RequestFrame {
        correlation_id: 1,
        max_wait_ms: 0,
        command: Command::Publish {
            topic: "t".into(),
            partition: 0,
            payload: payload.clone(),
        },
    };
    let mut whole = BytesMut::new();
    ClientCodec::new(1 << 20)
        .encode(request.clone(), &mut whole)
        .unwrap();
    let size = (whole.len() - 4) as u64;
    let mut buf = BytesMut::from(&b"kept"[..]);
    match ClientCodec::new(1024).encode(request, &mut buf) {
        Err(crate::ProtocolError::FrameTooLarge { size: told, limit }) => {
            assert_eq!((told, limit), (size, 1024));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(&buf[..], b"kept");
    assert!(buf.capacity() < 2048, "grew to {}", buf.capacity());
}

#[test]
fn a_version_1_batch_of_more_records_than_a_publish_holds_is_refused_before_it_is_read() {
    let mut body = BytesMut::new();
    body.put_u64_le(9);
    body.put_u32_le(0);
    body.put_u32_le(15);
    body.put_u64_le(1);
    body.put_slice(b"t");
    body.put_u64_le(10_001);
    let mut frame = BytesMut::new();
    frame.put_u32(body.len() as u32);
    frame.put_slice(&body);
    match ServerCodec::new(1 << 20, 1).decode(&mut frame).unwrap() {
        Some(crate::Decoded::Malformed {
            leading_u64,
            reason,
        }) => {
            assert_eq!(leading_u64, Some(9));
            assert_eq!(reason, "a batch holds at most 10000 records, got 10001");
        }
        other => panic!("{other:?}"),
    }
}
