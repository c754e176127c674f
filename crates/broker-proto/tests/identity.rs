//! The wire identity of every tag is pinned to proto.md: each command, outcome and error code
//! encodes with exactly the index the page gives it, and the page lists exactly the variants the
//! code has, for the current version and for version 1 alike. Moving a variant, adding one
//! without documenting it, or documenting one that does not exist fails here.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use broker_core::{
    v1, Assignor, BrokerDescription, BrokerMetadata, BrokerRecord, ClusterStatus, Command,
    CommandKind, Discard, GroupSetting, GroupStatus, IntoEnumIterator, KafkaGroupDescription,
    KafkaMemberDescription, KeyHash, NodeRole, Outcome, OutcomeKind, PartitionBatch, PartitionLag,
    PartitionRead, ProducerState, PublishRecord, ResetTo, Retention, StartAt, TopicPartitions,
    TopicSetting,
};
use broker_proto::{config, ErrorKind, ErrorReply};
use bytes::Bytes;

const PROTO_MD: &str = include_str!("../../../proto.md");

/// The `(index, name)` rows of the table in the section whose heading starts with `heading`:
/// rows such as ``| `[3]` | `Publish` | ...`` or ``| 3 | `NotLeader` | ...``.
fn documented(heading: &str) -> BTreeMap<String, u32> {
    let section = PROTO_MD
        .split("\n## ")
        .find(|section| section.starts_with(heading))
        .unwrap_or_else(|| panic!("proto.md has no section {heading:?}"));
    let mut rows = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        let index = cells[1].trim_matches(|c| c == '`' || c == '[' || c == ']');
        let Ok(index) = index.parse::<u32>() else {
            continue;
        };
        let name = cells[2].trim_matches('`').to_owned();
        assert!(
            rows.insert(name.clone(), index).is_none(),
            "{name} twice in {heading:?}"
        );
    }
    assert!(!rows.is_empty(), "no rows in {heading:?}");
    rows
}

/// The `u32` an encoded enum starts with: its variant index on the wire.
fn wire_index<T: serde::Serialize>(value: &T) -> u32 {
    let bytes = bincode::serde::encode_to_vec(value, config()).unwrap();
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

fn text() -> String {
    "t".to_owned()
}

/// One command of each kind.
fn command(kind: CommandKind) -> Command {
    let (topic, group, member) = (text(), text(), text());
    match kind {
        CommandKind::ClusterStatus => Command::ClusterStatus,
        CommandKind::GroupsStatus => Command::GroupsStatus,
        CommandKind::KafkaGroups => Command::KafkaGroups,
        CommandKind::AddNode => Command::AddNode {
            node_id: 4,
            peer_addr: text(),
            client_addr: text(),
        },
        CommandKind::RemoveNode => Command::RemoveNode { node_id: 4 },
        CommandKind::TransferLeadership => Command::TransferLeadership { node_id: 2 },
        CommandKind::MoveTopic => Command::MoveTopic { topic, group: 3 },
        CommandKind::Producers => Command::Producers {
            topic,
            partition: 0,
        },
        CommandKind::StoredOffsets => Command::StoredOffsets { topic, group },
        CommandKind::DeleteOffsets => Command::DeleteOffsets {
            topic,
            group,
            partitions: vec![0],
        },
        CommandKind::Metadata => Command::Metadata { topic: None },
        CommandKind::Create => Command::Create {
            topic,
            partition_count: 1,
            key_hash: KeyHash::Murmur2,
            settings: Vec::new(),
        },
        CommandKind::Join => Command::Join {
            topic,
            group,
            member,
            assignor: Some(Assignor::Range),
            settings: Vec::new(),
        },
        CommandKind::Leave => Command::Leave {
            topic,
            group,
            member,
        },
        CommandKind::Publish => Command::Publish {
            topic,
            partition: 0,
            payload: Bytes::new(),
        },
        CommandKind::PublishKeyed => Command::PublishKeyed {
            topic,
            key: None,
            payload: Bytes::new(),
        },
        CommandKind::Poll => Command::Poll {
            topic,
            group,
            member,
            max_records: 1,
            max_bytes: None,
        },
        CommandKind::Ack => Command::Ack {
            topic,
            group,
            member,
            partition: 0,
            offset: 0,
        },
        CommandKind::Retry => Command::Retry {
            topic,
            group,
            member,
            partition: 0,
            offset: 0,
        },
        CommandKind::ConfigureGroup => Command::ConfigureGroup {
            topic,
            group,
            settings: Vec::new(),
        },
        CommandKind::RetryAfter => Command::RetryAfter {
            topic,
            group,
            member,
            partition: 0,
            offset: 0,
            delay_ms: 1000,
        },
        CommandKind::Fetch => Command::Fetch {
            topic,
            group,
            member,
            max_records: 1,
            max_bytes: None,
        },
        CommandKind::Commit => Command::Commit {
            topic,
            group,
            member,
            offsets: None,
        },
        CommandKind::Assignment => Command::Assignment {
            topic,
            group,
            member,
        },
        CommandKind::Committed => Command::Committed {
            topic,
            group,
            partition: 0,
        },
        CommandKind::EndOffset => Command::EndOffset {
            topic,
            partition: 0,
        },
        CommandKind::Lag => Command::Lag { topic, group },
        CommandKind::Describe => Command::Describe { topic: None },
        CommandKind::PublishBatch => Command::PublishBatch {
            topic,
            records: vec![PublishRecord::to_partition(0, "x")],
        },
        CommandKind::ConfigureTopic => Command::ConfigureTopic {
            topic,
            settings: vec![TopicSetting::MaxRecords(10)],
        },
        CommandKind::PublishUntilFull => Command::PublishUntilFull {
            topic,
            records: vec![PublishRecord::to_partition(0, "x")],
        },
        CommandKind::AckAndPoll => Command::AckAndPoll {
            topic,
            group,
            member,
            acks: vec![(0, 0)],
            max_records: 1,
            max_bytes: None,
        },
        CommandKind::Redeliver => Command::Redeliver {
            topic,
            group,
            member,
            max_records: 1,
            max_bytes: None,
        },
        CommandKind::AddPartitions => Command::AddPartitions {
            topic,
            partition_count: 2,
        },
        CommandKind::DeleteTopic => Command::DeleteTopic { topic },
        CommandKind::DeleteGroup => Command::DeleteGroup { topic, group },
        CommandKind::Purge => Command::Purge {
            topic,
            partition: 0,
            before: 1,
        },
        CommandKind::ResetGroup => Command::ResetGroup {
            topic,
            group,
            partitions: None,
            to: ResetTo::Earliest,
        },
        CommandKind::OffsetForTime => Command::OffsetForTime {
            topic,
            partition: 0,
            timestamp_ms: 0,
        },
        CommandKind::CommitGroup => Command::CommitGroup {
            topic,
            group,
            offsets: vec![(0, 1)],
        },
        CommandKind::Read => Command::Read {
            topic,
            partition: 0,
            offset: 0,
            max_records: 1,
            max_bytes: None,
        },
        CommandKind::PublishIdempotent => Command::PublishIdempotent {
            topic,
            producer: 1,
            batches: vec![PartitionBatch {
                partition: 0,
                sequence: 0,
                records: vec![PublishRecord::to_partition(0, "x")],
            }],
        },
    }
}

/// One outcome of each kind.
fn outcome(kind: OutcomeKind) -> Outcome {
    let record = BrokerRecord {
        topic: text(),
        partition: 0,
        offset: 0,
        key: None,
        payload: Bytes::new(),
        timestamp_ms: 0,
        headers: Vec::new(),
        delivery_count: 0,
    };
    match kind {
        OutcomeKind::Created => Outcome::Created(true),
        OutcomeKind::Partitions => Outcome::Partitions(vec![0]),
        OutcomeKind::Left => Outcome::Left(true),
        OutcomeKind::Published => Outcome::Published(0),
        OutcomeKind::PublishedKeyed => Outcome::PublishedKeyed {
            partition: 0,
            offset: 0,
        },
        OutcomeKind::Records => Outcome::Records(vec![record]),
        OutcomeKind::Acked => Outcome::Acked(true),
        OutcomeKind::Retried => Outcome::Retried(true),
        OutcomeKind::Committed => Outcome::Committed,
        OutcomeKind::Offset => Outcome::Offset(0),
        OutcomeKind::Lag => Outcome::Lag(vec![PartitionLag {
            partition: 0,
            committed: 0,
            end_offset: 0,
            lag: 0,
            skipped: 0,
        }]),
        OutcomeKind::Description => Outcome::Description(BrokerDescription::default()),
        OutcomeKind::PublishedBatch => Outcome::PublishedBatch(vec![(0, 0)]),
        OutcomeKind::AckedAndPolled => Outcome::AckedAndPolled {
            acked: vec![true],
            records: vec![record],
        },
        OutcomeKind::Deleted => Outcome::Deleted(true),
        OutcomeKind::PartitionCount => Outcome::PartitionCount(2),
        OutcomeKind::GroupSettings => Outcome::GroupSettings(Vec::new()),
        OutcomeKind::TopicSettings => {
            Outcome::TopicSettings(vec![TopicSetting::Retention(Retention::Limits)])
        }
        OutcomeKind::ClusterStatus => Outcome::ClusterStatus(ClusterStatus {
            node_id: 1,
            role: NodeRole::Leader,
            term: 1,
            leader: Some(1),
            last_log_index: None,
            applied_index: None,
            members: Vec::new(),
        }),
        OutcomeKind::GroupsStatus => Outcome::GroupsStatus(vec![GroupStatus {
            group: 2,
            status: ClusterStatus {
                node_id: 1,
                role: NodeRole::Follower,
                term: 3,
                leader: Some(2),
                last_log_index: Some(7),
                applied_index: Some(7),
                members: Vec::new(),
            },
            topics: vec!["t".to_owned()],
        }]),
        OutcomeKind::Producers => Outcome::Producers(vec![ProducerState {
            producer: 1,
            next_sequence: 2,
            last_offset: Some(1),
            last_seen_ms: 0,
        }]),
        OutcomeKind::StoredOffsets => Outcome::StoredOffsets(vec![Some(3), None]),
        OutcomeKind::KafkaGroups => Outcome::KafkaGroups(vec![KafkaGroupDescription {
            name: text(),
            state: "Stable".to_owned(),
            generation: 1,
            protocol: "range".to_owned(),
            members: vec![KafkaMemberDescription {
                member: text(),
                client_id: text(),
                client_host: "/127.0.0.1".to_owned(),
                assignment: vec![TopicPartitions {
                    topic: text(),
                    partitions: vec![0],
                }],
            }],
        }]),
        OutcomeKind::Members => Outcome::Members(Vec::new()),
        OutcomeKind::Metadata => Outcome::Metadata(BrokerMetadata::default()),
        OutcomeKind::Read => Outcome::Read(PartitionRead {
            records: Vec::new(),
            start_offset: 0,
            end_offset: 0,
        }),
    }
}

/// One error of each kind.
fn error(kind: ErrorKind) -> ErrorReply {
    match kind {
        ErrorKind::InvalidArgument => ErrorReply::InvalidArgument(text()),
        ErrorKind::NotAssigned => ErrorReply::NotAssigned { partition: 3 },
        ErrorKind::MalformedRequest => ErrorReply::MalformedRequest(text()),
        ErrorKind::UnsupportedProtocol => ErrorReply::UnsupportedProtocol(text()),
        ErrorKind::TooLarge => ErrorReply::TooLarge {
            what: text(),
            size: 2,
            limit: 1,
        },
        ErrorKind::ShuttingDown => ErrorReply::ShuttingDown,
        ErrorKind::Unauthenticated => ErrorReply::Unauthenticated(text()),
        ErrorKind::Storage => ErrorReply::Storage(text()),
        ErrorKind::NotLeader => ErrorReply::NotLeader {
            leader: Some(text()),
        },
        ErrorKind::Pending => ErrorReply::Pending(text()),
    }
}

/// Checks that the code's `(name, index)` pairs are exactly the page's.
fn same_as_the_page(heading: &str, code: BTreeMap<String, u32>) {
    let page = documented(heading);
    let names: BTreeSet<&String> = code.keys().chain(page.keys()).collect();
    for name in names {
        assert_eq!(
            code.get(name),
            page.get(name),
            "{name}: index in the code vs in proto.md section {heading:?}"
        );
    }
}

#[test]
fn every_command_has_the_index_proto_md_gives_it() {
    let code = CommandKind::iter()
        .map(|kind| (kind.name().to_owned(), wire_index(&command(kind))))
        .collect();
    same_as_the_page("4. Commands", code);
}

#[test]
fn every_outcome_has_the_index_proto_md_gives_it() {
    let code = OutcomeKind::iter()
        .map(|kind| {
            let outcome = outcome(kind);
            (outcome.name().to_owned(), wire_index(&outcome))
        })
        .collect();
    same_as_the_page("5. Outcomes", code);
}

#[test]
fn every_error_code_is_the_one_proto_md_gives_it_and_decodes_back() {
    let mut code = BTreeMap::new();
    for kind in ErrorKind::iter() {
        let error = error(kind);
        assert_eq!(wire_index(&error), error.code(), "{error:?}");
        let bytes = bincode::serde::encode_to_vec(&error, config()).unwrap();
        let (back, used): (ErrorReply, usize) =
            bincode::serde::decode_from_slice(&bytes, config()).unwrap();
        assert_eq!((back, used), (error.clone(), bytes.len()));
        let json = serde_json::to_string(&error).unwrap();
        assert_eq!(serde_json::from_str::<ErrorReply>(&json).unwrap(), error);
        code.insert(error.name().to_owned(), error.code());
    }
    same_as_the_page("6. Error codes", code);
}

#[test]
fn an_unknown_error_code_does_not_decode() {
    let mut bytes = bincode::serde::encode_to_vec(ErrorReply::ShuttingDown, config()).unwrap();
    bytes[..4].copy_from_slice(&999u32.to_le_bytes());
    let decoded = bincode::serde::decode_from_slice::<ErrorReply, _>(&bytes, config());
    assert!(decoded.is_err(), "{decoded:?}");
}

/// The `[n] Name` pairs proto.md lists after `` `name`: `` (the enums of section 4).
fn documented_enum(name: &str) -> BTreeMap<String, u32> {
    let marker = format!("`{name}`:");
    let start = PROTO_MD
        .find(&marker)
        .unwrap_or_else(|| panic!("proto.md does not list {name}"));
    let line = PROTO_MD[start + marker.len()..].split('.').next().unwrap();
    let mut pairs = BTreeMap::new();
    for item in line.split("`[").skip(1) {
        let (index, rest) = item.split_once("] ").unwrap();
        let name = rest.split('`').next().unwrap().to_owned();
        pairs.insert(name, index.parse().unwrap());
    }
    pairs
}

#[test]
fn key_hashes_and_assignors_have_the_indexes_proto_md_gives_them() {
    let key_hashes: BTreeMap<String, u32> = KeyHash::iter()
        .map(|hash| (format!("{hash:?}"), wire_index(&hash)))
        .collect();
    assert_eq!(key_hashes, documented_enum("KeyHash"));
    let assignors: BTreeMap<String, u32> = Assignor::iter()
        .map(|assignor| (format!("{assignor:?}"), wire_index(&assignor)))
        .collect();
    assert_eq!(assignors, documented_enum("Assignor"));
}

/// One command of each kind of version 1: what a client written for version 1 sends.
fn commands_v1() -> Vec<v1::Command> {
    let mut commands: Vec<v1::Command> = vec![
        v1::Command::Create {
            topic: text(),
            partition_count: 1,
            key_hash: KeyHash::Murmur2,
        },
        v1::Command::Join {
            topic: text(),
            group: text(),
            member: text(),
            assignor: None,
        },
        v1::Command::PublishBatch {
            topic: text(),
            records: vec![v1::PublishRecord {
                partition: Some(0),
                key: None,
                payload: Bytes::new(),
            }],
        },
    ];
    // The other commands of version 1 encode as their current namesakes do: decode those.
    for kind in CommandKind::iter() {
        let bytes = bincode::serde::encode_to_vec(command(kind), config()).unwrap();
        if let Ok((command, used)) =
            bincode::serde::decode_from_slice::<v1::Command, _>(&bytes, config())
        {
            if used == bytes.len() && !commands.iter().any(|c| c.name() == command.name()) {
                commands.push(command);
            }
        }
    }
    commands
}

#[test]
fn every_command_of_version_1_has_the_index_proto_md_gives_it() {
    let code = commands_v1()
        .iter()
        .map(|command| (command.name().to_owned(), wire_index(command)))
        .collect();
    same_as_the_page("10. Version 1", code);
}

#[test]
fn every_outcome_of_version_1_has_the_index_proto_md_gives_it() {
    let mut code = BTreeMap::new();
    for kind in OutcomeKind::iter() {
        if let Ok(outcome) = v1::Outcome::try_from(outcome(kind)) {
            code.insert(outcome.name().to_owned(), wire_index(&outcome));
        }
    }
    same_as_the_page("11. Outcomes of version 1", code);
}

#[test]
fn settings_and_reset_targets_have_the_indexes_proto_md_gives_them() {
    let topic_settings = [
        TopicSetting::Retention(Retention::Interest),
        TopicSetting::MaxRecords(1),
        TopicSetting::MaxBytes(1),
        TopicSetting::MaxAgeMs(1),
        TopicSetting::Discard(Discard::New),
    ];
    let indexes = |values: Vec<(String, u32)>| values.into_iter().collect::<BTreeMap<_, _>>();
    let variant = |debug: String| debug.split('(').next().unwrap().to_owned();
    assert_eq!(
        indexes(
            topic_settings
                .iter()
                .map(|s| (variant(format!("{s:?}")), wire_index(s)))
                .collect()
        ),
        documented_enum("TopicSetting")
    );
    let group_settings = [
        GroupSetting::StartAt(StartAt::Earliest),
        GroupSetting::AckTimeoutMs(1),
        GroupSetting::MaxDeliveries(1),
        GroupSetting::DeadLetter(broker_core::TopicName::new("dlq").unwrap()),
    ];
    assert_eq!(
        indexes(
            group_settings
                .iter()
                .map(|s| (variant(format!("{s:?}")), wire_index(s)))
                .collect()
        ),
        documented_enum("GroupSetting")
    );
    let targets = [
        ResetTo::Earliest,
        ResetTo::Latest,
        ResetTo::Offset(0),
        ResetTo::Timestamp(0),
        ResetTo::ShiftBy(0),
    ];
    assert_eq!(
        indexes(
            targets
                .iter()
                .map(|t| (variant(format!("{t:?}")), wire_index(t)))
                .collect()
        ),
        documented_enum("ResetTo")
    );
    for (name, values) in [
        (
            "Retention",
            vec![
                ("Interest", wire_index(&Retention::Interest)),
                ("Limits", wire_index(&Retention::Limits)),
            ],
        ),
        (
            "Discard",
            vec![
                ("New", wire_index(&Discard::New)),
                ("Old", wire_index(&Discard::Old)),
            ],
        ),
        (
            "StartAt",
            vec![
                ("Earliest", wire_index(&StartAt::Earliest)),
                ("Latest", wire_index(&StartAt::Latest)),
            ],
        ),
    ] {
        let code: BTreeMap<String, u32> =
            values.into_iter().map(|(n, i)| (n.to_owned(), i)).collect();
        assert_eq!(code, documented_enum(name), "{name}");
    }
}

/// The version table of proto.md (section 9) lists, for each version, the commands it added:
/// each command's `since_version`.
#[test]
fn every_command_belongs_to_the_version_proto_md_says_added_it() {
    let section = PROTO_MD
        .split("\n## ")
        .find(|section| section.starts_with("9. Versioning"))
        .unwrap();
    for kind in CommandKind::iter() {
        let version = kind.since_version();
        let row = section
            .lines()
            .find(|line| line.starts_with(&format!("| {version} |")))
            .unwrap_or_else(|| panic!("no row for version {version}"));
        let listed = version == 1 || row.contains(&format!("`{}`", kind.name()));
        assert!(
            listed,
            "{} is not in the row of version {version}",
            kind.name()
        );
    }
}

#[test]
fn a_request_with_a_borrowed_command_encodes_to_the_same_bytes_for_every_command() {
    use broker_proto::{ClientCodec, RequestFrame, RequestFrameRef};
    use tokio_util::codec::Encoder;

    for kind in CommandKind::iter() {
        let command = command(kind);
        let mut owned = bytes::BytesMut::new();
        let frame = RequestFrame {
            correlation_id: 0x0102_0304_0506_0708,
            max_wait_ms: 250,
            command: command.clone(),
        };
        ClientCodec::new(1 << 20).encode(frame, &mut owned).unwrap();
        let mut borrowed = bytes::BytesMut::new();
        let frame = RequestFrameRef {
            correlation_id: 0x0102_0304_0506_0708,
            max_wait_ms: 250,
            command: &command,
        };
        ClientCodec::new(1 << 20)
            .encode(frame, &mut borrowed)
            .unwrap();
        assert_eq!(borrowed, owned, "{kind:?}");
    }
}
