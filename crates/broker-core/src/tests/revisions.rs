//! Behaviours that differ between revisions (see [`Revision`]): each scenario runs under the
//! original rules, which it must keep for the entries written under them, and under the newest.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::exactness::{dlq_settings, poll_at};
use crate::{
    BrokerState, GroupSetting, Header, KeyHash, PublishRecord, Retention, Revision, TopicSetting,
    HEADER_WIRE_BYTES, RECORD_OVERHEAD_BYTES,
};

/// An empty broker of capacity 10 applying `revision`.
fn state_under(revision: Revision) -> BrokerState {
    let mut state = BrokerState::new(10).unwrap();
    assert_eq!(state.set_revision(revision), Revision::NEWEST);
    state
}

/// The delivery counts a poll at 20 (past the timeout of 10, before any tick) takes, after one
/// delivery of the only record with a maximum of 1 delivery.
fn poll_after_the_timeout(revision: Revision) -> (Vec<(i64, u32)>, usize) {
    let mut state = state_under(revision);
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    state
        .join("t", "g", "m", None, &dlq_settings(1, Some(10)))
        .unwrap();
    state.publish("t", 0, "a".into()).unwrap();
    assert_eq!(poll_at(&mut state, 0, "g"), [(0, 1)]);
    let again = poll_at(&mut state, 20, "g");
    (again, state.take_dead_letters().len())
}

#[test]
fn a_poll_after_the_ack_timeout_does_not_deliver_past_max_deliveries() {
    assert_eq!(poll_after_the_timeout(Revision::NEWEST), (vec![], 1));
    assert_eq!(
        poll_after_the_timeout(Revision::Original),
        (vec![(0, 2)], 0)
    );
}

fn redeliver_after_one_delivery(revision: Revision) -> (Vec<(i64, u32)>, usize) {
    let mut state = state_under(revision);
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    state
        .join("t", "g", "m", None, &dlq_settings(1, None))
        .unwrap();
    state.publish("t", 0, "a".into()).unwrap();
    assert_eq!(poll_at(&mut state, 0, "g"), [(0, 1)]);
    let again = state
        .redeliver("t", "g", "m", 10, None)
        .unwrap()
        .into_iter()
        .map(|r| (r.offset, r.delivery_count))
        .collect();
    (again, state.take_dead_letters().len())
}

#[test]
fn redeliver_does_not_deliver_past_max_deliveries() {
    assert_eq!(redeliver_after_one_delivery(Revision::NEWEST), (vec![], 1));
    assert_eq!(
        redeliver_after_one_delivery(Revision::Original),
        (vec![(0, 2)], 0)
    );
}

fn add_partitions_under_a_delivery(revision: Revision) -> (Vec<(i32, u32)>, usize) {
    let mut state = state_under(revision);
    state.create("t", 2, KeyHash::default(), &[]).unwrap();
    for member in ["a", "b"] {
        state
            .join(
                "t",
                "g",
                member,
                Some(crate::Assignor::Range),
                &dlq_settings(1, None),
            )
            .unwrap();
    }
    state.publish("t", 1, "x".into()).unwrap();
    let first = state.poll("t", "g", "b", 10, None).unwrap();
    assert_eq!((first[0].partition, first[0].delivery_count), (1, 1));
    // Range over 4 partitions: a gets [0, 1], so partition 1 changes owner.
    state.add_partitions("t", 4).unwrap();
    let again = state
        .poll("t", "g", "a", 10, None)
        .unwrap()
        .into_iter()
        .map(|r| (r.partition, r.delivery_count))
        .collect();
    (again, state.take_dead_letters().len())
}

#[test]
fn adding_partitions_dead_letters_a_last_delivery_it_moves() {
    assert_eq!(
        add_partitions_under_a_delivery(Revision::NEWEST),
        (vec![], 1)
    );
    assert_eq!(
        add_partitions_under_a_delivery(Revision::Original),
        (vec![(1, 2)], 0)
    );
}

/// Whether a delivery made at 1,000,000 with an hour to go, moved to a state whose clock is
/// 100 ms behind, is due there at once; and whether it is still in flight after a tick.
fn delivery_moved_behind_the_clock(revision: Revision) -> (bool, Option<i64>) {
    let mut source = BrokerState::new(10).unwrap();
    source.create("t", 1, KeyHash::default(), &[]).unwrap();
    source
        .join(
            "t",
            "g",
            "m",
            None,
            &[GroupSetting::AckTimeoutMs(3_600_000)],
        )
        .unwrap();
    source.publish("t", 0, "a".into()).unwrap();
    assert_eq!(poll_at(&mut source, 1_000_000, "g"), [(0, 1)]);
    let image = source.export_topic("t").unwrap();
    let mut target = state_under(revision);
    target.advance_clock(999_900).unwrap();
    target.import_topic("t", image).unwrap();
    let due = target.is_due(999_900);
    target.advance_clock(999_900).unwrap();
    let state = target.describe(Some("t")).unwrap();
    (due, state.topics[0].groups[0].partitions[0].in_flight)
}

#[test]
fn a_delivery_made_later_than_the_clock_is_not_overdue() {
    assert_eq!(
        delivery_moved_behind_the_clock(Revision::NEWEST),
        (false, Some(0))
    );
    assert_eq!(
        delivery_moved_behind_the_clock(Revision::Original),
        (true, None)
    );
}

/// The offset an 11th record of one byte gets in a topic that keeps 10 records and discards
/// the oldest, with a budget of exactly what 10 such records take.
fn publish_at_the_budget_discarding_old(revision: Revision) -> i64 {
    let overhead = match revision {
        Revision::Original => 0,
        Revision::Bounded => RECORD_OVERHEAD_BYTES,
    };
    let mut state = state_under(revision).with_memory_budget(Some(10 * (1 + overhead)));
    let settings = [
        TopicSetting::Retention(Retention::Limits),
        TopicSetting::MaxRecords(10),
    ];
    state.create("t", 1, KeyHash::default(), &settings).unwrap();
    for offset in 0..10 {
        assert_eq!(state.publish("t", 0, "x".into()).unwrap(), offset);
    }
    state.publish("t", 0, "y".into()).unwrap()
}

#[test]
fn a_discard_old_topic_at_the_memory_budget_rotates() {
    assert_eq!(publish_at_the_budget_discarding_old(Revision::NEWEST), 10);
    assert_eq!(publish_at_the_budget_discarding_old(Revision::Original), -1);
}

#[test]
fn a_discard_that_cannot_make_enough_room_discards_nothing() {
    let mut state =
        state_under(Revision::NEWEST).with_memory_budget(Some(2 * (1 + RECORD_OVERHEAD_BYTES)));
    let settings = [
        TopicSetting::Retention(Retention::Limits),
        TopicSetting::MaxRecords(2),
    ];
    state.create("t", 1, KeyHash::default(), &settings).unwrap();
    for offset in 0..2 {
        assert_eq!(state.publish("t", 0, "x".into()).unwrap(), offset);
    }
    // One record of one byte leaves for this one of two: still past the budget.
    assert_eq!(state.publish("t", 0, "yy".into()).unwrap(), -1);
    assert_eq!(state.read("t", 0, 0, 10, None).unwrap().records.len(), 2);
    assert_eq!(state.retained_records(), 2);
}

/// What a group that rewound below the earliest record does with a record retried once with a
/// maximum of one delivery: the dead letters moved, the deliveries after the retry.
fn retry_after_a_commit_below_the_earliest(revision: Revision) -> (usize, Vec<(i64, u32)>) {
    let mut state = state_under(revision);
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    state
        .join("t", "g", "m", None, &dlq_settings(1, None))
        .unwrap();
    for payload in ["a", "b", "c"] {
        state.publish("t", 0, payload.into()).unwrap();
    }
    for offset in [0, 1] {
        assert_eq!(poll_at(&mut state, 0, "g"), [(offset, 1)]);
        assert!(state.ack("t", "g", "m", 0, offset).unwrap());
    }
    // Records 0 and 1 left (interest retention, one group). A rewind to 0 is accepted, and
    // stored as given.
    state
        .commit("t", "g", "m", Some(&BTreeMap::from([(0, 0)])))
        .unwrap();
    assert_eq!(state.committed("t", "g", 0).unwrap(), 0);
    assert_eq!(poll_at(&mut state, 1, "g"), [(2, 1)]);
    assert!(state.retry("t", "g", "m", 0, 2).unwrap());
    let moved = state.take_dead_letters().len();
    (moved, poll_at(&mut state, 2, "g"))
}

#[test]
fn a_commit_below_the_earliest_record_keeps_the_maximum_of_deliveries() {
    assert_eq!(
        retry_after_a_commit_below_the_earliest(Revision::NEWEST),
        (1, vec![])
    );
    assert_eq!(
        retry_after_a_commit_below_the_earliest(Revision::Original),
        (0, vec![(2, 2)])
    );
}

/// How many empty records a broker with a budget of 1 MiB takes (half a million offered).
fn empty_records_within_a_budget(revision: Revision) -> i64 {
    let mut state = state_under(revision).with_memory_budget(Some(1 << 20));
    state
        .create(
            "t",
            1,
            KeyHash::default(),
            &[TopicSetting::Retention(Retention::Limits)],
        )
        .unwrap();
    for _ in 0..50 {
        let batch = (0..10_000)
            .map(|_| PublishRecord::to_partition(0, Bytes::new()))
            .collect();
        state.publish_batch("t", batch).unwrap();
    }
    state.end_offset("t", 0).unwrap()
}

#[test]
fn empty_records_count_against_the_memory_budget() {
    assert_eq!(
        empty_records_within_a_budget(Revision::NEWEST),
        (1 << 20) / RECORD_OVERHEAD_BYTES as i64
    );
    assert_eq!(empty_records_within_a_budget(Revision::Original), 500_000);
}

/// How many records of 1 byte with 4 headers of 1-byte names a fetch and a read with a byte
/// budget of 150 take, of 30.
fn records_with_headers_within_150_bytes(revision: Revision) -> (usize, usize) {
    let mut state = state_under(revision);
    let limits = [TopicSetting::Retention(Retention::Limits)];
    state.create("t", 1, KeyHash::default(), &limits).unwrap();
    let headers: Vec<Header> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|name| Header {
            name: name.to_owned(),
            value: None,
        })
        .collect();
    let batch = (0..30)
        .map(|_| PublishRecord::to_partition(0, "x").with_headers(headers.clone()))
        .collect();
    state.publish_batch("t", batch).unwrap();
    let read = state.read("t", 0, 0, 30, Some(150)).unwrap().records.len();
    state.join("t", "g", "m", None, &[]).unwrap();
    let fetched = state.fetch("t", "g", "m", 30, Some(150)).unwrap().len();
    (fetched, read)
}

#[test]
fn an_answer_budget_counts_what_headers_take_on_the_wire() {
    // 5 bytes each, and 4 × 17 more on the wire: 73.
    assert_eq!(HEADER_WIRE_BYTES, 17);
    assert_eq!(
        records_with_headers_within_150_bytes(Revision::NEWEST),
        (2, 2)
    );
    assert_eq!(
        records_with_headers_within_150_bytes(Revision::Original),
        (30, 30)
    );
}

/// What a member polls after its delivery in flight was reset to where the group is (the
/// earliest record): the deliveries in flight, then the record and its delivery count.
fn poll_after_a_reset_in_place(revision: Revision) -> (Option<i64>, Vec<(i64, u32)>) {
    let mut state = state_under(revision);
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    state.join("t", "g", "m", None, &[]).unwrap();
    state.publish("t", 0, "a".into()).unwrap();
    assert_eq!(poll_at(&mut state, 0, "g"), [(0, 1)]);
    state
        .reset_group("t", "g", None, crate::ResetTo::Earliest)
        .unwrap();
    let described = state.describe(Some("t")).unwrap();
    let in_flight = described.topics[0].groups[0].partitions[0].in_flight;
    (in_flight, poll_at(&mut state, 1, "g"))
}

#[test]
fn a_reset_to_where_the_group_is_cancels_its_delivery_in_flight() {
    assert_eq!(
        poll_after_a_reset_in_place(Revision::NEWEST),
        (None, vec![(0, 1)])
    );
    assert_eq!(
        poll_after_a_reset_in_place(Revision::Original),
        (Some(0), vec![])
    );
}

#[test]
fn the_revision_is_kept_by_an_emptied_state_and_not_by_an_image() {
    let mut state = BrokerState::new(10).unwrap();
    assert_eq!(state.revision(), Revision::NEWEST);
    state.set_revision(Revision::Original);
    assert_eq!(state.emptied().revision(), Revision::Original);
    let restored = BrokerState::from_image(state.to_image(), None).unwrap();
    assert_eq!(restored.revision(), Revision::NEWEST);
}
