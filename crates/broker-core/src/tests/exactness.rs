//! Exactness where replicas, restarts and old data directories meet: every replica applies a
//! tick alike, and a state an earlier release wrote reads without a panic.

use std::panic::AssertUnwindSafe;

use crate::image::v1;
use crate::{BrokerState, Command, GroupSetting, KeyHash, Outcome, TopicName};

/// A group's settings: at most `max` deliveries, then the dead-letter topic `dlq`.
pub(super) fn dlq_settings(max: u32, timeout: Option<u64>) -> Vec<GroupSetting> {
    let mut settings = vec![
        GroupSetting::MaxDeliveries(max),
        GroupSetting::DeadLetter(TopicName::new("dlq").unwrap()),
    ];
    settings.extend(timeout.map(GroupSetting::AckTimeoutMs));
    settings
}

/// The offsets and delivery counts a poll of member `m` of `group` on `t` at `at` takes.
pub(super) fn poll_at(state: &mut BrokerState, at: i64, group: &str) -> Vec<(i64, u32)> {
    let command = Command::Poll {
        topic: "t".into(),
        group: group.into(),
        member: "m".into(),
        max_records: 10,
        max_bytes: None,
    };
    match state.apply_at(at, command).unwrap() {
        Outcome::Records(records) => records
            .into_iter()
            .map(|r| (r.offset, r.delivery_count))
            .collect(),
        other => panic!("{other:?}"),
    }
}

/// 16 groups of one topic share a dead-letter topic; each took the same record at time 0
/// and lets it time out. Built the same way, two states must dead-letter in the same order.
fn sixteen_groups() -> BrokerState {
    let mut state = BrokerState::new(100).unwrap();
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    for g in 0..16 {
        let group = format!("g{g:02}");
        state
            .join("t", &group, "m", None, &dlq_settings(1, Some(10)))
            .unwrap();
    }
    state.publish("t", 0, "x".into()).unwrap();
    for g in 0..16 {
        assert_eq!(poll_at(&mut state, 0, &format!("g{g:02}")), [(0, 1)]);
    }
    state
}

fn dead_letter_order(state: &mut BrokerState) -> Vec<String> {
    state.advance_clock(10).unwrap();
    let read = state.read("dlq", 0, 0, 100, None).unwrap();
    read.records
        .iter()
        .map(|record| {
            let header = record
                .headers
                .iter()
                .find(|h| h.name == "dead-letter.group")
                .unwrap();
            String::from_utf8(header.value.clone().unwrap().to_vec()).unwrap()
        })
        .collect()
}

#[test]
fn dead_letters_of_one_tick_are_ordered_the_same_on_every_replica() {
    let first = dead_letter_order(&mut sixteen_groups());
    assert_eq!(first.len(), 16);
    let mut orders = vec![first.clone()];
    for _ in 0..4 {
        orders.push(dead_letter_order(&mut sixteen_groups()));
    }
    // A replica restored from a snapshot of the same state.
    let image = sixteen_groups().to_image();
    let mut restored = BrokerState::from_image(image, None).unwrap();
    orders.push(dead_letter_order(&mut restored));
    for order in &orders {
        assert_eq!(
            order, &first,
            "replicas disagree on the dead-letter topic's offsets"
        );
    }
}

#[test]
fn a_fetch_from_past_the_end_after_a_format_1_snapshot_reads_nothing() {
    // Format 1 accepted commits past a partition's end (they were refused later).
    let image = v1::StateImage {
        capacity: 10,
        topics: vec![(
            "t".into(),
            v1::TopicImage {
                key_hash: 0,
                next_keyless: 0,
                partitions: vec![v1::PartitionImage {
                    base: 0,
                    records: Vec::new(),
                    retained_bytes: 0,
                }],
                groups: vec![(
                    "g".into(),
                    v1::GroupImage {
                        assignor: 0,
                        members: vec![v1::MemberImage {
                            id: "m".into(),
                            partitions: vec![0],
                        }],
                        partitions: vec![v1::GroupPartitionImage {
                            owner: Some(0),
                            committed: 5,
                            position: 5,
                            in_flight: None,
                        }],
                    },
                )],
            },
        )],
        memory_budget: None,
        retained_bytes: 0,
        max_topics: 10_000,
        max_groups_per_topic: 1_000,
        max_members_per_group: 1_000,
    };
    let mut state = BrokerState::from_image_v1(image).expect("the snapshot is accepted");
    let fetched =
        std::panic::catch_unwind(AssertUnwindSafe(|| state.fetch("t", "g", "m", 10, None)));
    assert!(fetched.expect("no panic").unwrap().is_empty());
    // The group reads on from where it committed, as it did when it committed there.
    for i in 0..6 {
        state.publish("t", 0, format!("r{i}").into()).unwrap();
    }
    let fetched = state.fetch("t", "g", "m", 10, None).unwrap();
    let offsets: Vec<i64> = fetched.iter().map(|record| record.offset).collect();
    assert_eq!(offsets, [5]);
}

#[test]
fn a_fetch_and_a_poll_from_a_position_past_the_end_read_nothing() {
    // No release wrote such a position, but a state that passes the checks must not panic.
    let mut state = BrokerState::new(10).unwrap();
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    state.join("t", "g", "m", None, &[]).unwrap();
    let mut image = state.to_image();
    image.topics[0].1.groups[0].1.partitions[0].position = 7;
    let mut state = BrokerState::from_image(image, None).expect("accepted by check_consistency");
    let fetched =
        std::panic::catch_unwind(AssertUnwindSafe(|| state.fetch("t", "g", "m", 10, None)));
    assert!(fetched.expect("no panic").unwrap().is_empty());
    let polled = std::panic::catch_unwind(AssertUnwindSafe(|| state.poll("t", "g", "m", 10, None)));
    assert!(polled.expect("no panic").unwrap().is_empty());
}
