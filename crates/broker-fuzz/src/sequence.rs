//! Fuzz target `sequence`: arbitrary command sequences applied to the core.
//!
//! The first bytes pick the per-partition capacity (1 to 5) and an optional memory budget (up
//! to 127 bytes); every following group of bytes is one [`Command`] over small pools of names
//! (including invalid ones), settings and small numbers, applied at a time that moves forward
//! by 0 to 3 milliseconds, so that the fuzzer reaches full partitions, rebalances, deliveries,
//! commits, ages and deadlines quickly. After every command:
//!
//! - a clone of the state given the same command returns the same result and ends in the same
//!   state (the core is deterministic);
//! - a command that fails, and one whose outcome its kind says a log need not record (a
//!   read-only command, an ack or retry answering `false`, a poll that took nothing, ...),
//!   change nothing;
//! - a publish gets the partition's end offset (offsets are consecutive, within a batch too),
//!   or `-1` only when the partition is at capacity or the record would pass the memory budget;
//!   a keyed publish lands on the partition its key hashes to;
//! - polled records are one per partition in ascending order, each at the group's committed
//!   offset (or the earliest retained one) and now in flight, and taken while already in
//!   flight only once the group's acknowledgement timeout has passed since it was delivered;
//!   fetched records are ascending and
//!   consecutive within a partition; every delivered record carries the key and payload
//!   published at its offset;
//! - every partition retains `end - earliest` records, at most its topic's limit, with exactly
//!   the bytes published at those offsets (the dead-letter topic, which only the broker
//!   writes, ends after exactly the records it reported moving there); nothing leaves an
//!   interest-retention topic that has no group, but by a maximum age or a purge; the
//!   broker's retained bytes are the sum of its partitions' and within the budget;
//! - every group's members are sorted and distinct; with members, each partition has exactly one
//!   owner, the one its assignor names, and each member lists exactly the partitions it owns;
//!   without members, none has an owner; a delivery in flight has an owner and lies within the
//!   retained log; lag is `max(end - committed, 0)`.

use std::collections::{HashMap, HashSet};

use broker_core::{
    hash, Assignor, BrokerDescription, BrokerRecord, BrokerState, Command, CommandKind, Discard,
    GroupDescription, GroupSetting, GroupSettings, Header, IntoEnumIterator, KeyHash, Outcome,
    PartitionBatch, PartitionDescription, PublishRecord, ResetTo, Retention, StartAt,
    TopicDescription, TopicName, TopicSetting, RECORD_OVERHEAD_BYTES,
};
use bytes::Bytes;

use crate::input::Input;

/// Topic names: three valid ones and an invalid one.
const TOPICS: [&str; 4] = ["t0", "t1", "t2", "bad topic"];
/// Group names: two valid ones and an invalid one.
const GROUPS: [&str; 3] = ["g0", "g1", ""];
/// Member names: three valid ones and an invalid one.
const MEMBERS: [&str; 4] = ["m0", "m1", "m2", "m\u{e9}"];
/// Most commands one input applies, so that a run stays fast.
const MAX_COMMANDS: usize = 2_000;

/// Applies the commands `data` describes to a fresh [`BrokerState`]; panics if an invariant in
/// the module documentation fails.
pub fn apply_sequence(data: &[u8]) {
    let mut input = Input::new(data);
    let capacity = 1 + i32::from(input.byte() % 5);
    let budget = match input.byte() {
        low @ 0..=127 if low.is_multiple_of(2) => None,
        byte => Some(u64::from(byte / 2)),
    };
    let state = match BrokerState::new(capacity) {
        Ok(state) => state.with_memory_budget(budget),
        Err(error) => panic!("capacity {capacity} refused: {error}"),
    };
    let mut checker = Checker {
        state,
        capacity: capacity as u64,
        budget,
        published: HashMap::new(),
        trimmed: HashSet::new(),
        configured: HashSet::new(),
        delivered_at: HashMap::new(),
        dead_lettered: 0,
        now: 0,
        step: 0,
    };
    while !input.is_empty() && checker.step < MAX_COMMANDS {
        let before = checker.state.describe_all();
        checker.now += i64::from(input.byte() % 4);
        let command = next_command(&mut input, &before, checker.step);
        checker.apply(command, &before);
        checker.step += 1;
    }
}

/// The dead-letter topic of the groups that have one.
fn dead_letter_topic() -> TopicName {
    match TopicName::new("dlq") {
        Ok(name) => name,
        Err(error) => panic!("\"dlq\" is a valid topic name: {error}"),
    }
}

/// Reads one command: its kind first (one of every [`CommandKind`], so a new kind is drawn as
/// soon as it exists), then its arguments. Acks, retries and commits often name the offset in
/// flight (or the committed offset) of the state `now`, so that they reach the paths that change
/// state.
fn next_command(input: &mut Input<'_>, now: &BrokerDescription, step: usize) -> Command {
    // `PublishUntilFull` is made by the `PublishBatch` arm, `ConfigureTopic` by the `Create`
    // arm and `KafkaGroups` by the `ClusterStatus` arm, so that the kinds of the committed
    // inputs stay what they were when they were added.
    let kinds: Vec<CommandKind> = CommandKind::iter()
        .filter(|kind| {
            !matches!(
                kind,
                CommandKind::PublishUntilFull
                    | CommandKind::ConfigureTopic
                    | CommandKind::KafkaGroups
            )
        })
        .collect();
    let kind = input.pick(&kinds);
    let topic = input.pick(&TOPICS).to_owned();
    let group = input.pick(&GROUPS).to_owned();
    let member = input.pick(&MEMBERS).to_owned();
    match kind {
        CommandKind::Create | CommandKind::ConfigureTopic => {
            let partition_count = input.pick(&[1, 2, 3, 4, 0, 65]);
            let key_hash = input.pick(&[KeyHash::Murmur2, KeyHash::Fnv1a]);
            // One byte says which settings and, in what it has left, which kind.
            let settings = input.byte();
            if (settings / 6) % 2 == 1 {
                return Command::ConfigureTopic {
                    topic,
                    settings: match settings % 6 {
                        0 => vec![TopicSetting::MaxRecords(1)],
                        1 => vec![TopicSetting::MaxAgeMs(2)],
                        2 => vec![TopicSetting::MaxBytes(3)],
                        3 => vec![TopicSetting::MaxRecords(0)],
                        4 => vec![
                            TopicSetting::Retention(Retention::Limits),
                            TopicSetting::Discard(Discard::New),
                        ],
                        _ => vec![TopicSetting::MaxRecords(5), TopicSetting::MaxBytes(20)],
                    },
                };
            }
            Command::Create {
                topic,
                partition_count,
                key_hash,
                settings: match settings % 6 {
                    0 => vec![
                        TopicSetting::Retention(Retention::Limits),
                        TopicSetting::MaxRecords(2),
                    ],
                    1 => vec![TopicSetting::MaxAgeMs(5)],
                    2 => vec![
                        TopicSetting::Retention(Retention::Limits),
                        TopicSetting::MaxBytes(6),
                    ],
                    3 => vec![TopicSetting::MaxRecords(0)],
                    _ => Vec::new(),
                },
            }
        }
        CommandKind::Join => Command::Join {
            topic,
            group,
            member,
            assignor: input.pick(&[None, Some(Assignor::RoundRobin), Some(Assignor::Range)]),
            settings: match input.byte() % 7 {
                0 => vec![GroupSetting::StartAt(StartAt::Latest)],
                1 => vec![GroupSetting::AckTimeoutMs(3)],
                // Dead letters go to a topic no command names, whose records are not checked
                // against what was published.
                2 => vec![
                    GroupSetting::MaxDeliveries(2),
                    GroupSetting::DeadLetter(dead_letter_topic()),
                ],
                3 => vec![
                    GroupSetting::AckTimeoutMs(3),
                    GroupSetting::MaxDeliveries(1),
                    GroupSetting::DeadLetter(dead_letter_topic()),
                ],
                _ => Vec::new(),
            },
        },
        CommandKind::Leave => Command::Leave {
            topic,
            group,
            member,
        },
        CommandKind::Publish => Command::Publish {
            topic,
            partition: input.below(5) as i32 - 1,
            payload: payload(input, step),
        },
        CommandKind::PublishKeyed => {
            let key = match input.byte() % 3 {
                0 => None,
                _ => Some(Bytes::from(vec![
                    input.byte();
                    usize::from(input.byte() % 4)
                ])),
            };
            Command::PublishKeyed {
                topic,
                key,
                payload: payload(input, step),
            }
        }
        CommandKind::Poll => Command::Poll {
            topic,
            group,
            member,
            max_records: input.pick(&[1, 2, 3, 64, 0, 65]),
            max_bytes: input.pick(&[None, Some(0), Some(3), Some(10)]),
        },
        CommandKind::Ack => {
            let (partition, offset) = delivery(input, now, &topic, &group);
            Command::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            }
        }
        CommandKind::Retry => {
            let (partition, offset) = delivery(input, now, &topic, &group);
            Command::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            }
        }
        CommandKind::ConfigureGroup => Command::ConfigureGroup {
            topic,
            group,
            settings: match input.byte() % 5 {
                0 => vec![GroupSetting::AckTimeoutMs(2)],
                1 => vec![
                    GroupSetting::MaxDeliveries(1),
                    GroupSetting::DeadLetter(dead_letter_topic()),
                ],
                2 => vec![GroupSetting::StartAt(StartAt::Latest)],
                3 => vec![GroupSetting::MaxDeliveries(2)],
                _ => Vec::new(),
            },
        },
        // The broker's state refuses these (a server answers them about its cluster), and must
        // stay as it was.
        // (By the step, not a byte of the input: the inputs committed before it read on.)
        CommandKind::ClusterStatus | CommandKind::KafkaGroups if step % 2 == 1 => {
            Command::KafkaGroups
        }
        CommandKind::ClusterStatus | CommandKind::KafkaGroups => Command::ClusterStatus,
        CommandKind::GroupsStatus => Command::GroupsStatus,
        CommandKind::AddNode => Command::AddNode {
            node_id: u64::from(input.byte() % 5),
            peer_addr: "127.0.0.1:1".to_owned(),
            client_addr: "127.0.0.1:2".to_owned(),
        },
        CommandKind::RemoveNode => Command::RemoveNode {
            node_id: u64::from(input.byte() % 5),
        },
        CommandKind::TransferLeadership => Command::TransferLeadership {
            node_id: u64::from(input.byte() % 5),
        },
        CommandKind::Metadata => Command::Metadata {
            topic: input.byte().is_multiple_of(2).then_some(topic),
        },
        CommandKind::MoveTopic => Command::MoveTopic {
            topic,
            group: u32::from(input.byte() % 4),
        },
        CommandKind::RetryAfter => {
            let (partition, offset) = delivery(input, now, &topic, &group);
            Command::RetryAfter {
                topic,
                group,
                member,
                partition,
                offset,
                delay_ms: input.pick(&[0, 1, 5, u64::MAX]),
            }
        }
        CommandKind::Fetch => Command::Fetch {
            topic,
            group,
            member,
            max_records: input.pick(&[1, 2, 5, 10_000, 0]),
            max_bytes: input.pick(&[None, Some(0), Some(4)]),
        },
        CommandKind::Commit => {
            let offsets = match input.byte() % 3 {
                0 => None,
                entries => Some(
                    (0..entries)
                        .map(|_| (input.below(5) as i32 - 1, input.below(10) - 1))
                        .collect(),
                ),
            };
            Command::Commit {
                topic,
                group,
                member,
                offsets,
            }
        }
        CommandKind::Assignment => Command::Assignment {
            topic,
            group,
            member,
        },
        CommandKind::Committed => Command::Committed {
            topic,
            group,
            partition: input.below(5) as i32 - 1,
        },
        CommandKind::EndOffset => Command::EndOffset {
            topic,
            partition: input.below(5) as i32 - 1,
        },
        CommandKind::Lag => Command::Lag { topic, group },
        CommandKind::StoredOffsets => Command::StoredOffsets { topic, group },
        CommandKind::DeleteOffsets => Command::DeleteOffsets {
            topic,
            group,
            partitions: (0..input.byte() % 3)
                .map(|_| input.below(5) as i32 - 1)
                .collect(),
        },
        CommandKind::Producers => Command::Producers {
            topic,
            partition: input.below(5) as i32 - 1,
        },
        CommandKind::PublishBatch | CommandKind::PublishUntilFull => {
            // One byte says how many records (below 5) and, in what it has left, which kind.
            let count = input.byte();
            let until_full = (count / 5) % 2 == 1;
            let records = (0..count % 5)
                .map(|_| PublishRecord {
                    partition: input.pick(&[None, Some(0), Some(1), Some(3)]),
                    key: (input.byte() % 2 == 1).then(|| Bytes::from(vec![input.byte(); 2])),
                    payload: payload(input, step),
                    headers: match input.byte() % 3 {
                        0 => vec![Header {
                            name: "h".to_owned(),
                            value: Some(Bytes::from_static(b"v")),
                        }],
                        _ => Vec::new(),
                    },
                    timestamp_ms: input.pick(&[None, Some(0), Some(i64::MAX)]),
                })
                .collect();
            match until_full {
                false => Command::PublishBatch { topic, records },
                true => Command::PublishUntilFull { topic, records },
            }
        }
        CommandKind::AckAndPoll => {
            let acks = (0..input.byte() % 4)
                .map(|_| delivery(input, now, &topic, &group))
                .collect();
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records: input.pick(&[1, 2, 64, 0]),
                max_bytes: input.pick(&[None, Some(0), Some(3)]),
            }
        }
        CommandKind::Redeliver => Command::Redeliver {
            topic,
            group,
            member,
            max_records: input.pick(&[1, 2, 64, 0]),
            max_bytes: input.pick(&[None, Some(0), Some(3)]),
        },
        CommandKind::Describe => Command::Describe {
            topic: input.byte().is_multiple_of(2).then_some(topic),
        },
        CommandKind::AddPartitions => Command::AddPartitions {
            topic,
            partition_count: input.pick(&[1, 2, 3, 5, 0, 65]),
        },
        CommandKind::DeleteTopic => Command::DeleteTopic { topic },
        CommandKind::DeleteGroup => Command::DeleteGroup { topic, group },
        CommandKind::Purge => Command::Purge {
            topic,
            partition: input.below(5) as i32 - 1,
            before: input.below(10) - 1,
        },
        CommandKind::ResetGroup => Command::ResetGroup {
            topic,
            group,
            partitions: match input.byte() % 3 {
                0 => None,
                count => Some((0..count).map(|_| input.below(4) as i32 - 1).collect()),
            },
            to: match input.byte() % 5 {
                0 => ResetTo::Earliest,
                1 => ResetTo::Latest,
                2 => ResetTo::Offset(input.below(10) - 1),
                3 => ResetTo::Timestamp(input.below(20)),
                _ => ResetTo::ShiftBy(input.below(7) - 3),
            },
        },
        CommandKind::OffsetForTime => Command::OffsetForTime {
            topic,
            partition: input.below(5) as i32 - 1,
            timestamp_ms: input.below(20),
        },
        CommandKind::CommitGroup => Command::CommitGroup {
            topic,
            group,
            offsets: (0..input.byte() % 3)
                .map(|_| (input.below(4) as i32 - 1, input.below(10) - 1))
                .collect(),
        },
        CommandKind::Read => Command::Read {
            topic,
            partition: input.below(5) as i32 - 1,
            offset: input.below(12) - 1,
            max_records: input.pick(&[1, 2, 64, 0]),
            max_bytes: input.pick(&[None, Some(0), Some(3)]),
        },
        CommandKind::PublishIdempotent => Command::PublishIdempotent {
            topic,
            producer: input.pick(&[1, 2, u64::MAX]),
            batches: (0..1 + input.byte() % 3)
                .map(|_| PartitionBatch {
                    partition: input.below(4) as i32 - 1,
                    sequence: input.below(8) as u64,
                    records: (0..input.byte() % 4)
                        .map(|_| PublishRecord::keyed(None, payload(input, step)))
                        .collect(),
                })
                .collect(),
        },
    }
}

/// A (partition, offset) to acknowledge or retry: half the time the delivery in flight there
/// (so the call takes effect), otherwise small numbers, some of them invalid.
fn delivery(
    input: &mut Input<'_>,
    now: &BrokerDescription,
    topic: &str,
    group: &str,
) -> (i32, i64) {
    let partition = input.below(5) as i32 - 1;
    let offset = match input.byte() {
        byte @ 0..=127 => i64::from(byte % 8) - 1,
        _ => in_flight(now, topic, group, partition).unwrap_or(0),
    };
    (partition, offset)
}

/// A payload of 0 to 7 bytes that differs from step to step.
fn payload(input: &mut Input<'_>, step: usize) -> Bytes {
    Bytes::from(vec![step as u8; usize::from(input.byte() % 8)])
}

/// The offset in flight for `group` on `partition` of `topic`, if any.
fn in_flight(now: &BrokerDescription, topic: &str, group: &str, partition: i32) -> Option<i64> {
    let topic = now.topics.iter().find(|t| t.name == topic)?;
    let group = topic.groups.iter().find(|g| g.name == group)?;
    group
        .partitions
        .get(usize::try_from(partition).ok()?)?
        .in_flight
}

/// The state under test and what the checks need to remember.
struct Checker {
    state: BrokerState,
    capacity: u64,
    budget: Option<u64>,
    /// The key, payload and headers of every record published, by topic, partition and
    /// offset.
    published: HashMap<(String, i32, i64), Published>,
    /// Topics (by name, since their creation) that were purged or expired records: records may
    /// have left them without groups.
    trimmed: HashSet<String>,
    /// Topics (by name, since their creation) whose settings changed: with interest retention
    /// or discard new, a partition may hold more than a lowered limit until consumers catch
    /// up.
    configured: HashSet<String>,
    /// When each group's delivery in flight on a partition was made, by topic, group and
    /// partition: a poll may take it again once the group's acknowledgement timeout passed.
    delivered_at: HashMap<(String, String, i32), i64>,
    /// How many records the broker moved to the dead-letter topic: the end of its only
    /// partition, since no command names it.
    dead_lettered: i64,
    /// The time commands are applied at.
    now: i64,
    step: usize,
}

impl Checker {
    fn apply(&mut self, command: Command, before: &BrokerDescription) {
        let retained_before = self.state.retained_bytes();
        let dead_letters_before = self.state.dead_letter_events();
        let mut twin = self.state.clone();
        let result = self.state.apply_at(self.now, command.clone());
        let twin_result = twin.apply_at(self.now, command.clone());
        let after = self.state.describe_all();
        let context = || format!("step {}: {command:?} -> {result:?}", self.step);
        assert_eq!(twin_result, result, "not deterministic: {}", context());
        if let Err(why) = self.state.check_consistency() {
            panic!("inconsistent state ({why}): {}", context());
        }
        assert_eq!(
            twin.describe_all(),
            after,
            "not deterministic: {}",
            context()
        );
        // A failed command, and a successful one that a log would not record (its kind says
        // its outcome changed nothing, and no record went past its last delivery), must have
        // changed nothing: a replayed log would lose the change otherwise.
        let unchanged = match &result {
            Err(_) => true,
            Ok(outcome) => {
                !command.kind().changed_state(outcome)
                    && self.state.dead_letter_events() == dead_letters_before
            }
        };
        if unchanged {
            assert_eq!(&after, before, "changed the state: {}", context());
            assert_eq!(
                self.state.retained_bytes(),
                retained_before,
                "{}",
                context()
            );
        }
        if let Ok(outcome) = &result {
            self.check_outcome(&command, outcome, before, &after, retained_before);
        }
        self.check_kept_without_groups(before, &after);
        for moved in self.state.take_dead_letters() {
            if let Some(stored_at) = moved.stored_at {
                assert_eq!(
                    stored_at,
                    (0, self.dead_lettered),
                    "step {}: a dead letter not stored at the end of the dead-letter topic: \
                     {command:?}",
                    self.step
                );
                self.dead_lettered += 1;
            }
        }
        self.check_state(&after);
    }

    fn check_outcome(
        &mut self,
        command: &Command,
        outcome: &Outcome,
        before: &BrokerDescription,
        after: &BrokerDescription,
        retained_before: u64,
    ) {
        let step = self.step;
        match (command, outcome) {
            (
                Command::Publish {
                    topic,
                    partition,
                    payload,
                },
                Outcome::Published(offset),
            ) => {
                self.check_publish(
                    before,
                    after,
                    retained_before,
                    topic,
                    *partition,
                    Published {
                        key: None,
                        payload: payload.clone(),
                        headers: Vec::new(),
                    },
                    *offset,
                );
            }
            (
                Command::PublishKeyed {
                    topic,
                    key,
                    payload,
                },
                Outcome::PublishedKeyed { partition, offset },
            ) => {
                if let Some(key) = key {
                    let topic_now = find_topic(before, topic);
                    let expected =
                        hash::partition_for(topic_now.key_hash, key, topic_now.partitions.len());
                    assert_eq!(
                        *partition as usize, expected,
                        "step {step}: key {key:?} misplaced"
                    );
                }
                self.check_publish(
                    before,
                    after,
                    retained_before,
                    topic,
                    *partition,
                    Published {
                        key: key.clone(),
                        payload: payload.clone(),
                        headers: Vec::new(),
                    },
                    *offset,
                );
            }
            (
                Command::PublishBatch { topic, records }
                | Command::PublishUntilFull { topic, records },
                Outcome::PublishedBatch(placed),
            ) => {
                assert_eq!(
                    placed.len(),
                    records.len(),
                    "step {step}: a placement per record"
                );
                let until_full = matches!(command, Command::PublishUntilFull { .. });
                let mut ends: HashMap<i32, i64> = HashMap::new();
                let mut refused: Vec<i32> = Vec::new();
                for (record, &(partition, offset)) in records.iter().zip(placed) {
                    let log = find_topic(before, topic).partitions[partition as usize];
                    let end = ends.entry(partition).or_insert(log.end_offset);
                    assert!(
                        !(until_full && refused.contains(&partition) && offset >= 0),
                        "step {step}: partition {partition} stored a record after refusing one"
                    );
                    if offset < 0 {
                        refused.push(partition);
                    }
                    if offset >= 0 {
                        assert_eq!(offset, *end, "step {step}: batch offsets not consecutive");
                        *end += 1;
                        self.published.insert(
                            (topic.clone(), partition, offset),
                            Published {
                                key: record.key.clone(),
                                payload: record.payload.clone(),
                                headers: record.headers.clone(),
                            },
                        );
                    }
                }
            }
            (
                Command::Poll {
                    topic,
                    group,
                    max_records,
                    ..
                }
                | Command::Redeliver {
                    topic,
                    group,
                    max_records,
                    ..
                },
                Outcome::Records(records),
            ) => {
                // A redelivery first releases the member's deliveries in flight, so its records
                // may have been in flight before; a poll takes one that was only once the
                // group's acknowledgement timeout has passed since it was delivered.
                let redelivered = matches!(command, Command::Redeliver { .. });
                // (An empty poll may name a group that does not exist.)
                let ack_timeout = group_in(before, topic, group)
                    .and_then(|described| GroupSettings::from_list(&described.settings).ok())
                    .and_then(|settings| settings.ack_timeout_ms);
                assert!(
                    records.len() <= *max_records as usize,
                    "step {step}: poll too long"
                );
                let mut last = None;
                for record in records {
                    self.check_delivered(topic, record);
                    assert!(
                        last < Some(record.partition),
                        "step {step}: poll not one per partition, ascending"
                    );
                    last = Some(record.partition);
                    let partition = record.partition as usize;
                    let log = find_topic(before, topic).partitions[partition];
                    let state = &find_group(before, topic, group).partitions[partition];
                    let key = (topic.clone(), group.clone(), record.partition);
                    let overdue = state.in_flight == Some(record.offset)
                        && ack_timeout.zip(self.delivered_at.get(&key)).is_some_and(
                            |(timeout, &at)| {
                                u64::try_from(self.now.saturating_sub(at))
                                    .is_ok_and(|elapsed| elapsed >= timeout)
                            },
                        );
                    assert!(
                        redelivered || state.in_flight.is_none() || overdue,
                        "step {step}: poll delivered past a delivery in flight, not overdue"
                    );
                    self.delivered_at.insert(key, self.now);
                    assert_eq!(
                        record.offset,
                        state.committed.max(log.earliest_offset),
                        "step {step}: poll skipped"
                    );
                    let now = &find_group(after, topic, group).partitions[partition];
                    assert_eq!(
                        now.in_flight,
                        Some(record.offset),
                        "step {step}: polled record not in flight"
                    );
                }
            }
            (
                Command::AckAndPoll {
                    topic,
                    group,
                    acks,
                    max_records,
                    ..
                },
                Outcome::AckedAndPolled { acked, records },
            ) => {
                assert_eq!(acked.len(), acks.len(), "step {step}: an answer per ack");
                assert!(
                    records.len() <= *max_records as usize,
                    "step {step}: ack-and-poll too long"
                );
                let hit_partitions: Vec<i32> = acks
                    .iter()
                    .zip(acked)
                    .filter(|(_, &hit)| hit)
                    .map(|(&(partition, _), _)| partition)
                    .collect();
                let committed = |description: &BrokerDescription, partition: i32| {
                    group_in(description, topic, group)
                        .map(|g| g.partitions[partition as usize].committed)
                };
                for (&(partition, offset), &hit) in acks.iter().zip(acked) {
                    if hit {
                        // At most one delivery is in flight per partition, so at most one ack
                        // of a partition matches.
                        assert_eq!(committed(after, partition), Some(offset + 1), "step {step}");
                    } else if !hit_partitions.contains(&partition) {
                        assert_eq!(
                            committed(after, partition),
                            committed(before, partition),
                            "step {step}: an unmatched ack moved the committed offset"
                        );
                    }
                }
                for record in records {
                    self.check_delivered(topic, record);
                    let now =
                        &find_group(after, topic, group).partitions[record.partition as usize];
                    assert_eq!(
                        now.in_flight,
                        Some(record.offset),
                        "step {step}: polled record not in flight"
                    );
                    self.delivered_at
                        .insert((topic.clone(), group.clone(), record.partition), self.now);
                }
            }
            (
                Command::Fetch {
                    topic, max_records, ..
                },
                Outcome::Records(records),
            ) => {
                assert!(
                    records.len() <= *max_records as usize,
                    "step {step}: fetch too long"
                );
                for pair in records.windows(2) {
                    let (a, b) = (&pair[0], &pair[1]);
                    assert!(
                        a.partition < b.partition
                            || (a.partition == b.partition && a.offset + 1 == b.offset),
                        "step {step}: fetch out of order: {a:?} then {b:?}"
                    );
                }
                for record in records {
                    self.check_delivered(topic, record);
                }
            }
            (
                Command::Ack {
                    topic,
                    group,
                    partition,
                    offset,
                    ..
                },
                Outcome::Acked(true),
            ) => {
                let now = &find_group(after, topic, group).partitions[*partition as usize];
                assert_eq!(
                    (now.committed, now.in_flight),
                    (offset + 1, None),
                    "step {step}: ack"
                );
            }
            (
                Command::Retry {
                    topic,
                    group,
                    partition,
                    ..
                },
                Outcome::Retried(true),
            ) => {
                let now = &find_group(after, topic, group).partitions[*partition as usize];
                assert_eq!(
                    now.in_flight, None,
                    "step {step}: retry left the delivery in flight"
                );
            }
            (
                Command::PublishIdempotent { topic, batches, .. },
                Outcome::PublishedBatch(placed),
            ) => {
                assert_eq!(
                    placed.len(),
                    batches
                        .iter()
                        .map(|batch| batch.records.len())
                        .sum::<usize>(),
                    "step {step}: a placement per record"
                );
                let mut placed = placed.iter();
                for PartitionBatch {
                    partition, records, ..
                } in batches
                {
                    let end = find_topic(before, topic).partitions[*partition as usize].end_offset;
                    let mut next = end;
                    for (record, &(at, offset)) in records.iter().zip(placed.by_ref()) {
                        assert_eq!(at, *partition, "step {step}: placed on another partition");
                        if offset >= end {
                            // A new record: stored at the next offset.
                            assert_eq!(
                                offset, next,
                                "step {step}: idempotent offsets not consecutive"
                            );
                            next += 1;
                            self.published.insert(
                                (topic.clone(), *partition, offset),
                                Published {
                                    key: record.key.clone(),
                                    payload: record.payload.clone(),
                                    headers: record.headers.clone(),
                                },
                            );
                        }
                    }
                    let end_after =
                        find_topic(after, topic).partitions[*partition as usize].end_offset;
                    assert_eq!(
                        end_after, next,
                        "step {step}: records stored but not answered"
                    );
                }
            }
            (Command::DeleteTopic { topic }, Outcome::Deleted(true)) => {
                // A topic created again under this name starts from offset 0.
                self.published.retain(|(name, _, _), _| name != topic);
                self.trimmed.remove(topic);
                self.configured.remove(topic);
                assert!(
                    after.topics.iter().all(|t| &t.name != topic),
                    "step {step}: a deleted topic is still there"
                );
            }
            (Command::Purge { topic, .. }, Outcome::Offset(_)) => {
                self.trimmed.insert(topic.clone());
            }
            (Command::ConfigureTopic { topic, .. }, Outcome::TopicSettings(settings)) => {
                self.configured.insert(topic.clone());
                assert_eq!(
                    &find_topic(after, topic).settings,
                    settings,
                    "step {step}: a topic's settings are not those its change answered"
                );
                for (log, was) in find_topic(after, topic)
                    .partitions
                    .iter()
                    .zip(&find_topic(before, topic).partitions)
                {
                    assert_eq!(
                        log.end_offset, was.end_offset,
                        "step {step}: a change of settings stored records"
                    );
                }
            }
            (
                Command::Read {
                    topic,
                    partition,
                    offset,
                    max_records,
                    ..
                },
                Outcome::Read(read),
            ) => {
                let log = find_topic(before, topic).partitions[*partition as usize];
                assert_eq!(
                    (read.start_offset, read.end_offset),
                    (log.earliest_offset, log.end_offset),
                    "step {step}: a read gave other bounds than the partition's"
                );
                assert!(
                    read.records.len() <= *max_records as usize,
                    "step {step}: a read returned more records than asked"
                );
                let first = (*offset).max(log.earliest_offset);
                for (record, expected) in read.records.iter().zip(first..) {
                    assert_eq!(
                        record.offset, expected,
                        "step {step}: a read skipped a record"
                    );
                    self.check_delivered(topic, record);
                }
                assert_eq!(before, after, "step {step}: a read changed the state");
            }
            _ => {}
        }
        // Records may leave a topic with a maximum age whenever time passes.
        for topic in &after.topics {
            if topic
                .settings
                .iter()
                .any(|s| matches!(s, TopicSetting::MaxAgeMs(_)))
            {
                self.trimmed.insert(topic.name.clone());
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn check_publish(
        &mut self,
        before: &BrokerDescription,
        after: &BrokerDescription,
        retained_before: u64,
        topic: &str,
        partition: i32,
        published: Published,
        offset: i64,
    ) {
        let step = self.step;
        let described = find_topic(before, topic);
        let log = described.partitions[partition as usize];
        let end_after = find_topic(after, topic).partitions[partition as usize].end_offset;
        let size = published.size();
        if offset == -1 {
            // Each record retained counts its overhead too: what the others take, and this one.
            let records_before: u64 = before
                .topics
                .iter()
                .flat_map(|topic| &topic.partitions)
                .map(|partition| partition.records)
                .sum();
            let overhead = (records_before + 1) * RECORD_OVERHEAD_BYTES;
            let over_budget = self
                .budget
                .is_some_and(|budget| retained_before + size + overhead > budget);
            let (retention, max_records, max_bytes) = limits(described, self.capacity);
            // A record larger than the byte limit is refused; at a limit, interest retention
            // and discard new refuse, while limits retention otherwise discards old records.
            let refuses_at_limit = retention == Retention::Interest
                || described
                    .settings
                    .contains(&TopicSetting::Discard(Discard::New));
            let at_limit = max_records.is_some_and(|max| log.records >= max)
                || max_bytes.is_some_and(|max| log.retained_bytes + size > max);
            let full = max_bytes.is_some_and(|max| size > max) || (refuses_at_limit && at_limit);
            assert!(
                full || over_budget,
                "step {step}: publish refused with room ({log:?}, {retained_before} bytes retained)"
            );
            assert_eq!(
                end_after, log.end_offset,
                "step {step}: a refused publish took an offset"
            );
        } else {
            assert_eq!(
                offset, log.end_offset,
                "step {step}: offsets not consecutive"
            );
            assert_eq!(
                end_after,
                offset + 1,
                "step {step}: the end did not advance"
            );
            self.published
                .insert((topic.to_owned(), partition, offset), published);
        }
    }

    fn check_delivered(&self, topic: &str, record: &BrokerRecord) {
        assert_eq!(record.topic, topic);
        let published = self
            .published
            .get(&(topic.to_owned(), record.partition, record.offset));
        let delivered = Published {
            key: record.key.clone(),
            payload: record.payload.clone(),
            headers: record.headers.clone(),
        };
        assert_eq!(
            published,
            Some(&delivered),
            "step {}: delivered {record:?}, not what was published there",
            self.step
        );
    }

    /// Records leave an interest-retention topic that had no group before the command and has
    /// none after it only by age or a purge. (Records a group consumed left while it existed: a
    /// topic may have no group and records gone, once its groups were deleted.)
    fn check_kept_without_groups(&self, before: &BrokerDescription, after: &BrokerDescription) {
        for topic in &after.topics {
            let Some(was) = before.topics.iter().find(|was| was.name == topic.name) else {
                continue;
            };
            let (retention, _, _) = limits(topic, self.capacity);
            if retention != Retention::Interest
                || !was.groups.is_empty()
                || !topic.groups.is_empty()
                || self.trimmed.contains(&topic.name)
            {
                continue;
            }
            for (log, was_log) in topic.partitions.iter().zip(&was.partitions) {
                assert!(
                    log.earliest_offset <= was_log.earliest_offset,
                    "step {}: released without groups: {was_log:?} became {log:?}",
                    self.step
                );
            }
        }
    }

    fn check_state(&self, now: &BrokerDescription) {
        let step = self.step;
        let mut total = 0;
        for topic in &now.topics {
            let mut topic_bytes = 0;
            for (index, log) in topic.partitions.iter().enumerate() {
                assert_eq!(log.partition as usize, index);
                assert_eq!(
                    log.records as i64,
                    log.end_offset - log.earliest_offset,
                    "step {step}: {log:?}"
                );
                let (retention, max_records, max_bytes) = limits(topic, self.capacity);
                // A lowered limit holds at once only where the oldest records leave for it.
                let may_be_over = self.configured.contains(&topic.name)
                    && (retention == Retention::Interest
                        || topic
                            .settings
                            .contains(&TopicSetting::Discard(Discard::New)));
                assert!(
                    may_be_over || max_records.is_none_or(|max| log.records <= max),
                    "step {step}: over the record limit: {log:?}"
                );
                assert!(
                    may_be_over || max_bytes.is_none_or(|max| log.retained_bytes <= max),
                    "step {step}: over the byte limit: {log:?}"
                );
                assert!(log.earliest_offset >= 0);
                // The dead-letter topic is created and written by the broker itself (no command
                // names it): its records were never published, and carry headers of their own,
                // so only its totals are checked.
                let bytes: u64 = if topic.name == dead_letter_topic().as_str() {
                    assert_eq!(
                        log.end_offset, self.dead_lettered,
                        "step {step}: the dead-letter topic holds other records than dead letters"
                    );
                    log.retained_bytes
                } else {
                    (log.earliest_offset..log.end_offset)
                        .map(|offset| {
                            match self
                                .published
                                .get(&(topic.name.clone(), log.partition, offset))
                            {
                                Some(published) => published.size(),
                                None => panic!(
                                    "step {step}: {}/{} retains offset {offset} never published",
                                    topic.name, log.partition
                                ),
                            }
                        })
                        .sum()
                };
                assert_eq!(
                    log.retained_bytes, bytes,
                    "step {step}: retained bytes of {log:?}"
                );
                topic_bytes += bytes;
            }
            assert_eq!(
                topic.retained_bytes, topic_bytes,
                "step {step}: topic bytes"
            );
            total += topic_bytes;
            for group in &topic.groups {
                check_group(step, &topic.partitions, group);
            }
        }
        assert_eq!(
            self.state.retained_bytes(),
            total,
            "step {step}: broker retained bytes"
        );
        if let Some(budget) = self.budget {
            let records = self.state.retained_records();
            assert!(
                total + records * RECORD_OVERHEAD_BYTES <= budget,
                "step {step}: {total} bytes in {records} records retained, budget {budget}"
            );
        }
    }
}

/// A record as published: what a delivery of it must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    key: Option<Bytes>,
    payload: Bytes,
    headers: Vec<Header>,
}

impl Published {
    /// Payload, key and header bytes.
    fn size(&self) -> u64 {
        (self.payload.len()
            + self.key.as_ref().map_or(0, Bytes::len)
            + self.headers.iter().map(Header::size).sum::<usize>()) as u64
    }
}

/// A topic's retention, record limit (the broker's capacity for interest retention without
/// one of its own) and byte limit, as its description says.
fn limits(topic: &TopicDescription, capacity: u64) -> (Retention, Option<u64>, Option<u64>) {
    let settings = match broker_core::TopicSettings::from_list(&topic.settings) {
        Ok(settings) => settings,
        Err(error) => panic!("a topic describes settings it refuses: {error}"),
    };
    let max_records = match settings.retention {
        Retention::Interest => Some(settings.max_records.unwrap_or(capacity)),
        Retention::Limits => settings.max_records,
    };
    (settings.retention, max_records, settings.max_bytes)
}

fn check_group(step: usize, logs: &[PartitionDescription], group: &GroupDescription) {
    let members: Vec<&str> = group.members.iter().map(|m| m.member.as_str()).collect();
    assert!(
        members.windows(2).all(|w| w[0] < w[1]),
        "step {step}: members not sorted: {members:?}"
    );
    assert_eq!(group.partitions.len(), logs.len());
    let count = logs.len();
    for (index, state) in group.partitions.iter().enumerate() {
        let expected = match (members.len(), group.assignor) {
            (0, _) => None,
            (n, Assignor::RoundRobin) => Some(members[index % n]),
            (n, Assignor::Range) => {
                let (share, extra) = (count / n, count % n);
                let owner = if index < extra * (share + 1) {
                    index / (share + 1)
                } else {
                    extra + (index - extra * (share + 1)) / share.max(1)
                };
                Some(members[owner])
            }
        };
        assert_eq!(
            state.owner.as_deref(),
            expected,
            "step {step}: owner of partition {index} in {group:?}"
        );
        let log = &logs[index];
        if let Some(offset) = state.in_flight {
            assert!(
                state.owner.is_some(),
                "step {step}: in flight without an owner"
            );
            assert!(
                log.earliest_offset <= offset && offset < log.end_offset,
                "step {step}: in-flight offset {offset} outside the log {log:?}"
            );
        }
        assert_eq!(
            state.lag,
            (log.end_offset - state.committed).max(0),
            "step {step}: lag"
        );
    }
    for member in &group.members {
        let owned: Vec<i32> = group
            .partitions
            .iter()
            .filter(|state| state.owner.as_deref() == Some(member.member.as_str()))
            .map(|state| state.partition)
            .collect();
        assert_eq!(
            member.partitions, owned,
            "step {step}: {} lists other partitions",
            member.member
        );
    }
}

fn find_topic<'a>(
    description: &'a BrokerDescription,
    topic: &str,
) -> &'a broker_core::TopicDescription {
    match description.topics.iter().find(|t| t.name == topic) {
        Some(found) => found,
        None => panic!("a successful call named topic {topic:?}, which does not exist"),
    }
}

fn find_group<'a>(
    description: &'a BrokerDescription,
    topic: &str,
    group: &str,
) -> &'a GroupDescription {
    match group_in(description, topic, group) {
        Some(found) => found,
        None => panic!("a successful delivery named group {group:?}, which does not exist"),
    }
}

/// `group` of `topic` (which must exist), if it exists.
fn group_in<'a>(
    description: &'a BrokerDescription,
    topic: &str,
    group: &str,
) -> Option<&'a GroupDescription> {
    find_topic(description, topic)
        .groups
        .iter()
        .find(|g| g.name == group)
}
