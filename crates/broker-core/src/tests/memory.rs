//! The memory budget: retained payload, key and header bytes across the whole broker, with
//! [`RECORD_OVERHEAD_BYTES`] for each record, stay within it; past it, publishes answer "full"
//! (`-1`) and consume no offset, and consuming frees room.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::{BrokerState, EventBroker, KeyHash, RECORD_OVERHEAD_BYTES};

/// What each record counts besides its bytes.
const O: u64 = RECORD_OVERHEAD_BYTES;

/// A broker of capacity 100 with a budget of `budget` bytes and a topic "t" of 2 partitions.
fn budgeted(budget: u64) -> EventBroker {
    let state = BrokerState::new(100)
        .unwrap()
        .with_memory_budget(Some(budget));
    let broker = EventBroker::from_state(state);
    broker.create("t", 2).unwrap();
    broker
}

fn retained(broker: &EventBroker) -> u64 {
    broker.with_state(|state| state.retained_bytes())
}

#[test]
fn publish_past_the_budget_is_full_and_consumes_no_offset() {
    let b = budgeted(10 + 3 * O);
    assert_eq!(b.publish("t", 0, "12345").unwrap(), 0);
    assert_eq!(b.publish("t", 1, "1234").unwrap(), 0);
    // 9 bytes and 2 records retained: 2 more bytes would be 11.
    assert_eq!(b.publish("t", 0, "12").unwrap(), -1);
    assert_eq!(b.end_offset("t", 0).unwrap(), 1);
    // Exactly up to the budget is allowed.
    assert_eq!(b.publish("t", 0, "1").unwrap(), 1);
    assert_eq!(retained(&b), 10);
    assert_eq!(
        b.publish("t", 1, "").unwrap(),
        -1,
        "an empty payload takes its record's room"
    );
}

#[test]
fn keys_count_against_the_budget() {
    let b = budgeted(6 + O);
    let (_, offset) = b.publish_keyed("t", Some(b"kk"), "1234").unwrap();
    assert_eq!(offset, 0);
    assert_eq!(retained(&b), 6);
    assert_eq!(b.publish_keyed("t", Some(b"k"), "").unwrap().1, -1);
}

#[test]
fn a_record_larger_than_the_budget_is_never_stored() {
    let b = budgeted(3);
    assert_eq!(b.publish("t", 0, "1234").unwrap(), -1);
    assert_eq!(retained(&b), 0);
}

#[test]
fn acknowledging_frees_room_for_new_publishes() {
    let b = budgeted(4 + O);
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.publish("t", 0, "1234").unwrap(), 0);
    assert_eq!(b.publish("t", 1, "5").unwrap(), -1);
    let records = b.poll("t", "g", "m", 1).unwrap();
    assert_eq!(records.len(), 1);
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    assert_eq!(retained(&b), 0);
    assert_eq!(b.publish("t", 1, "5").unwrap(), 0);
}

#[test]
fn committing_frees_room_for_new_publishes() {
    let b = budgeted(4 + O);
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.publish("t", 0, "1234").unwrap(), 0);
    assert_eq!(b.fetch("t", "g", "m", 10).unwrap().len(), 1);
    b.commit("t", "g", "m", None).unwrap();
    assert_eq!(retained(&b), 0);
    assert_eq!(b.publish("t", 0, "abcd").unwrap(), 1);
    // An explicit commit to the end frees what it covers too.
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 2)])))
        .unwrap();
    assert_eq!(retained(&b), 0);
}

#[test]
fn the_budget_is_shared_by_every_topic() {
    let b = budgeted(4 + 2 * O);
    b.create_with("u", 1, KeyHash::Fnv1a).unwrap();
    assert_eq!(b.publish("t", 0, "12").unwrap(), 0);
    assert_eq!(b.publish("u", 0, "34").unwrap(), 0);
    assert_eq!(b.publish("u", 0, "5").unwrap(), -1);
    assert_eq!(b.publish("t", 1, "5").unwrap(), -1);
}

#[test]
fn without_a_budget_only_capacity_limits_and_retained_bytes_are_counted() {
    let mut state = BrokerState::new(2).unwrap();
    assert_eq!(state.memory_budget(), None);
    state.create("t", 1, KeyHash::default(), &[]).unwrap();
    let big = Bytes::from(vec![0u8; 1 << 20]);
    assert_eq!(state.publish("t", 0, big.clone()).unwrap(), 0);
    assert_eq!(state.publish("t", 0, big.clone()).unwrap(), 1);
    assert_eq!(
        state.publish("t", 0, big).unwrap(),
        -1,
        "capacity still applies"
    );
    assert_eq!(state.retained_bytes(), 2 << 20);
    // A budget set later below what is retained refuses publishes until records are consumed.
    state.set_memory_budget(Some(1));
    assert_eq!(state.memory_budget(), Some(1));
    state.join("t", "g", "m", None, &[]).unwrap();
    assert_eq!(state.publish("t", 0, Bytes::new()).unwrap(), -1);
}

#[test]
fn an_emptied_state_keeps_the_settings_and_nothing_else() {
    let limits = crate::Limits {
        max_topics: 7,
        ..crate::Limits::default()
    };
    let b = budgeted(1_000);
    b.publish("t", 0, "12345").unwrap();
    let emptied = b.with_state(|state| state.clone().with_limits(limits).emptied());
    assert_eq!(emptied.topic_names().count(), 0);
    assert_eq!(emptied.retained_bytes(), 0);
    assert_eq!(emptied.memory_budget(), Some(1_000));
    assert_eq!(emptied.capacity_per_partition(), 100);
    assert_eq!(emptied.limits(), limits);
    // The topic's name is free again, with its offsets from 0.
    let broker = EventBroker::from_state(emptied);
    broker.create("t", 1).unwrap();
    assert_eq!(broker.publish("t", 0, "1").unwrap(), 0);
}
