//! `redeliver`: a member gets back the deliveries whose poll answer it never received.

use super::{assert_invalid, assert_no_change, broker, positions};

#[test]
fn records_in_flight_come_back_to_their_owner() {
    let broker = broker(10);
    broker.create("t", 2).unwrap();
    for partition in [0, 0, 1] {
        broker.publish("t", partition, "x").unwrap();
    }
    broker.join("t", "g", "m").unwrap();
    // The answer to this poll is lost: the member never saw these records.
    assert_eq!(
        positions(&broker.poll("t", "g", "m", 64).unwrap()),
        [(0, 0), (1, 0)]
    );
    // Polling again never hands an in-flight record to its owner a second time.
    assert!(broker.poll("t", "g", "m", 64).unwrap().is_empty());
    let again = broker.redeliver("t", "g", "m", 64).unwrap();
    assert_eq!(positions(&again), [(0, 0), (1, 0)]);
    // They are in flight again, and acknowledging them moves on as usual.
    assert!(broker.ack("t", "g", "m", 0, 0).unwrap());
    assert!(broker.ack("t", "g", "m", 1, 0).unwrap());
    assert_eq!(
        positions(&broker.poll("t", "g", "m", 64).unwrap()),
        [(0, 1)]
    );
}

#[test]
fn partitions_with_nothing_in_flight_are_polled_as_usual() {
    let broker = broker(10);
    broker.create("t", 3).unwrap();
    for partition in [0, 1, 2] {
        broker.publish("t", partition, "x").unwrap();
    }
    broker.join("t", "g", "m").unwrap();
    assert_eq!(positions(&broker.poll("t", "g", "m", 1).unwrap()), [(0, 0)]);
    let again = broker.redeliver("t", "g", "m", 64).unwrap();
    assert_eq!(positions(&again), [(0, 0), (1, 0), (2, 0)]);
}

#[test]
fn a_smaller_max_records_leaves_the_rest_eligible_for_the_next_poll() {
    let broker = broker(10);
    broker.create("t", 2).unwrap();
    broker.publish("t", 0, "x").unwrap();
    broker.publish("t", 1, "y").unwrap();
    broker.join("t", "g", "m").unwrap();
    broker.poll("t", "g", "m", 64).unwrap();
    assert_eq!(
        positions(&broker.redeliver("t", "g", "m", 1).unwrap()),
        [(0, 0)]
    );
    assert_eq!(
        positions(&broker.poll("t", "g", "m", 64).unwrap()),
        [(1, 0)]
    );
}

#[test]
fn other_members_deliveries_are_untouched() {
    let broker = broker(10);
    broker.create("t", 2).unwrap();
    broker.publish("t", 0, "x").unwrap();
    broker.publish("t", 1, "y").unwrap();
    broker.join("t", "g", "a").unwrap();
    broker.join("t", "g", "b").unwrap();
    assert_eq!(
        positions(&broker.poll("t", "g", "a", 64).unwrap()),
        [(0, 0)]
    );
    assert_eq!(
        positions(&broker.poll("t", "g", "b", 64).unwrap()),
        [(1, 0)]
    );
    assert_eq!(
        positions(&broker.redeliver("t", "g", "a", 64).unwrap()),
        [(0, 0)]
    );
    // b's delivery is still in flight: only b may acknowledge it.
    assert!(broker.ack("t", "g", "b", 1, 0).unwrap());
}

#[test]
fn nothing_in_flight_and_nothing_eligible_changes_nothing() {
    let broker = broker(10);
    broker.create("t", 1).unwrap();
    broker.join("t", "g", "m").unwrap();
    assert_no_change(&broker, Vec::new(), |b| b.redeliver("t", "g", "m", 8));
    // An absent member or group gets nothing and changes nothing.
    assert_no_change(&broker, Vec::new(), |b| b.redeliver("t", "g", "nobody", 8));
    assert_no_change(&broker, Vec::new(), |b| b.redeliver("t", "nogroup", "m", 8));
}

#[test]
fn bad_arguments_are_refused_and_change_nothing() {
    let broker = broker(10);
    broker.create("t", 1).unwrap();
    broker.publish("t", 0, "x").unwrap();
    broker.join("t", "g", "m").unwrap();
    broker.poll("t", "g", "m", 1).unwrap();
    assert_invalid(&broker, |b| b.redeliver("t", "g", "m", 0));
    assert_invalid(&broker, |b| b.redeliver("t", "g", "m", 65));
    assert_invalid(&broker, |b| b.redeliver("nope", "g", "m", 1));
    assert_invalid(&broker, |b| b.redeliver("t", "g g", "m", 1));
    assert_invalid(&broker, |b| b.redeliver("t", "g", "", 1));
}
