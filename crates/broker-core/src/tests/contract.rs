//! The core contract's rules, one test each, and its two worked examples step by step.

use bytes::Bytes;

use super::{assert_no_change, broker, positions};
use crate::{BrokerError, BrokerRecord, EventBroker};

/// A record as a first poll delivers it.
fn record(topic: &str, partition: i32, offset: i64, payload: &'static str) -> BrokerRecord {
    BrokerRecord {
        topic: topic.to_owned(),
        partition,
        offset,
        key: None,
        payload: Bytes::from_static(payload.as_bytes()),
        timestamp_ms: 0,
        headers: Vec::new(),
        delivery_count: 1,
    }
}

/// `record` delivered for the `count`th time.
fn redelivered(record: BrokerRecord, count: u32) -> BrokerRecord {
    BrokerRecord {
        delivery_count: count,
        ..record
    }
}

/// The in-flight offset of `group` on `partition` of `topic`, as `describe()` shows it.
fn in_flight(broker: &EventBroker, topic: &str, group: &str, partition: i32) -> Option<i64> {
    group_partition(broker, topic, group, partition).in_flight
}

fn group_partition(
    broker: &EventBroker,
    topic: &str,
    group: &str,
    partition: i32,
) -> crate::GroupPartitionDescription {
    let description = broker.describe();
    let topic = description.topics.iter().find(|t| t.name == topic).unwrap();
    let group = topic.groups.iter().find(|g| g.name == group).unwrap();
    group.partitions[partition as usize].clone()
}

fn earliest(broker: &EventBroker, topic: &str, partition: i32) -> i64 {
    let description = broker.describe();
    let topic = description.topics.iter().find(|t| t.name == topic).unwrap();
    topic.partitions[partition as usize].earliest_offset
}

#[test]
fn worked_example_with_capacity_2() {
    let b = broker(2);
    assert!(b.create("orders", 1).unwrap());
    assert_eq!(b.publish("orders", 0, "a").unwrap(), 0);
    assert_eq!(b.publish("orders", 0, "b").unwrap(), 1);
    assert_eq!(b.join("orders", "billing", "m1").unwrap(), vec![0]);
    let a = record("orders", 0, 0, "a");
    assert_eq!(
        b.poll("orders", "billing", "m1", 2).unwrap(),
        vec![a.clone()]
    );
    assert!(b.retry("orders", "billing", "m1", 0, 0).unwrap());
    // The same record again, counted as its second delivery.
    assert_eq!(
        b.poll("orders", "billing", "m1", 2).unwrap(),
        vec![redelivered(a, 2)]
    );
    assert!(b.ack("orders", "billing", "m1", 0, 0).unwrap());
    assert_eq!(
        b.poll("orders", "billing", "m1", 2).unwrap(),
        vec![record("orders", 0, 1, "b")]
    );
}

#[test]
fn worked_example_three_partitions_a_then_b() {
    let b = broker(10);
    assert!(b.create("t", 3).unwrap());
    for p in 0..3 {
        assert_eq!(b.publish("t", p, "x").unwrap(), 0);
    }
    assert_eq!(b.join("t", "g", "a").unwrap(), vec![0, 1, 2]);
    assert_eq!(
        positions(&b.poll("t", "g", "a", 3).unwrap()),
        vec![(0, 0), (1, 0), (2, 0)]
    );
    assert_eq!(b.join("t", "g", "b").unwrap(), vec![1]);
    assert_eq!(b.assignment("t", "g", "a").unwrap(), vec![0, 2]);
    // a's delivery from partition 1 is canceled; b can poll that offset.
    assert_eq!(in_flight(&b, "t", "g", 1), None);
    assert_eq!(positions(&b.poll("t", "g", "b", 3).unwrap()), vec![(1, 0)]);
    assert!(!b.ack("t", "g", "a", 1, 0).unwrap());
    // a's deliveries on the partitions it kept are still in flight and its own to acknowledge.
    assert!(b.ack("t", "g", "a", 0, 0).unwrap());
    assert!(b.ack("t", "g", "a", 2, 0).unwrap());
    assert!(b.ack("t", "g", "b", 1, 0).unwrap());
}

#[test]
fn capacity_must_be_1_to_1000() {
    for bad in [i32::MIN, -1, 0, 1001, i32::MAX] {
        assert!(
            matches!(EventBroker::new(bad), Err(BrokerError::InvalidArgument(_))),
            "{bad}"
        );
    }
    for good in [1, 2, 999, 1000] {
        assert_eq!(
            EventBroker::new(good)
                .unwrap()
                .describe()
                .capacity_per_partition,
            good
        );
    }
}

#[test]
fn successful_publication_appends_with_the_next_partition_local_offset() {
    let b = broker(5);
    b.create("t", 2).unwrap();
    assert_eq!(b.publish("t", 0, "a").unwrap(), 0);
    assert_eq!(b.publish("t", 1, "b").unwrap(), 0);
    assert_eq!(b.publish("t", 0, "c").unwrap(), 1);
    assert_eq!(b.publish("t", 0, "d").unwrap(), 2);
    assert_eq!(b.end_offset("t", 0).unwrap(), 3);
    assert_eq!(b.end_offset("t", 1).unwrap(), 1);
}

#[test]
fn full_partition_returns_minus_one_without_consuming_an_offset() {
    let b = broker(2);
    b.create("t", 2).unwrap();
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.publish("t", 0, "a").unwrap(), 0);
    assert_eq!(b.publish("t", 0, "b").unwrap(), 1);
    let before = b.describe();
    assert_eq!(b.publish("t", 0, "c").unwrap(), -1);
    assert_eq!(b.publish("t", 0, "c").unwrap(), -1);
    assert_eq!(b.describe(), before);
    assert_eq!(b.end_offset("t", 0).unwrap(), 2);
    // The other partition is not affected.
    assert_eq!(b.publish("t", 1, "x").unwrap(), 0);
    // Once the only group acknowledges offset 0 it leaves, and the next offset is 2, not 4.
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    assert_eq!(b.publish("t", 0, "c").unwrap(), 2);
    assert_eq!(b.publish("t", 0, "d").unwrap(), -1);
}

#[test]
fn empty_payloads_are_valid() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    assert_eq!(b.publish("t", 0, "").unwrap(), 0);
    b.join("t", "g", "m").unwrap();
    assert_eq!(
        b.poll("t", "g", "m", 1).unwrap(),
        vec![record("t", 0, 0, "")]
    );
}

#[test]
fn payloads_are_arbitrary_bytes() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    let payload = vec![0_u8, 0xff, 0xfe, b'\n', 0];
    assert_eq!(b.publish("t", 0, payload.clone()).unwrap(), 0);
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.poll("t", "g", "m", 1).unwrap()[0].payload, payload);
}

#[test]
fn create_duplicate_returns_false_and_keeps_the_existing_topic() {
    let b = broker(2);
    assert!(b.create("t", 2).unwrap());
    b.publish("t", 1, "x").unwrap();
    assert_no_change(&b, false, |b| b.create("t", 5));
    assert_no_change(&b, false, |b| b.create("t", 2));
    assert_eq!(b.describe().topics[0].partitions.len(), 2);
    assert_eq!(b.end_offset("t", 1).unwrap(), 1);
}

#[test]
fn members_sorted_in_ascii_order_own_partition_p_mod_n() {
    let b = broker(2);
    b.create("t", 7).unwrap();
    // ASCII order: "-" < "0" < "B" < "_" < "a" < "b"; join in a scrambled order.
    let sorted = ["-", "0", "B", "_", "a", "b"];
    for member in ["b", "_", "a", "0", "B", "-"] {
        b.join("t", "g", member).unwrap();
    }
    for (index, member) in sorted.iter().enumerate() {
        let expected: Vec<i32> = (0..7).filter(|p| p % 6 == index as i32).collect();
        assert_eq!(
            b.assignment("t", "g", member).unwrap(),
            expected,
            "{member}"
        );
    }
}

#[test]
fn assignment_depends_on_membership_not_join_order() {
    let b = broker(2);
    b.create("t", 5).unwrap();
    for member in ["c", "a", "b"] {
        b.join("t", "g1", member).unwrap();
    }
    for member in ["a", "b", "c"] {
        b.join("t", "g2", member).unwrap();
    }
    for member in ["a", "b", "c"] {
        assert_eq!(
            b.assignment("t", "g1", member).unwrap(),
            b.assignment("t", "g2", member).unwrap()
        );
    }
    assert_eq!(b.assignment("t", "g1", "a").unwrap(), vec![0, 3]);
    assert_eq!(b.assignment("t", "g1", "b").unwrap(), vec![1, 4]);
    assert_eq!(b.assignment("t", "g1", "c").unwrap(), vec![2]);
}

#[test]
fn join_returns_the_members_current_partitions_ascending() {
    let b = broker(2);
    b.create("t", 5).unwrap();
    assert_eq!(b.join("t", "g", "b").unwrap(), vec![0, 1, 2, 3, 4]);
    assert_eq!(b.join("t", "g", "a").unwrap(), vec![0, 2, 4]);
    // A repeated join answers the current partitions, which the other join changed.
    assert_eq!(b.join("t", "g", "b").unwrap(), vec![1, 3]);
}

#[test]
fn non_empty_group_assigns_every_partition_to_exactly_one_member() {
    let b = broker(2);
    b.create("t", 9).unwrap();
    let members = ["m1", "m2", "m3", "m4"];
    let check = |present: &[&str]| {
        let mut all: Vec<i32> = present
            .iter()
            .flat_map(|m| b.assignment("t", "g", m).unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..9).collect::<Vec<_>>(), "{present:?}");
    };
    for n in 1..=members.len() {
        b.join("t", "g", members[n - 1]).unwrap();
        check(&members[..n]);
    }
    for n in 1..members.len() {
        b.leave("t", "g", members[n - 1]).unwrap();
        check(&members[n..]);
    }
}

#[test]
fn repeated_join_and_absent_leave_change_nothing() {
    let b = broker(4);
    b.create("t", 3).unwrap();
    b.publish("t", 0, "x").unwrap();
    b.publish("t", 1, "y").unwrap();
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    b.poll("t", "g", "a", 3).unwrap();
    b.fetch("t", "g", "b", 3).unwrap();
    assert_no_change(&b, vec![0, 2], |b| b.join("t", "g", "a"));
    assert_no_change(&b, vec![1], |b| b.join("t", "g", "b"));
    assert_no_change(&b, false, |b| b.leave("t", "g", "c"));
    assert_no_change(&b, false, |b| b.leave("t", "nogroup", "a"));
    // Case matters: "A" is not "a".
    assert_no_change(&b, false, |b| b.leave("t", "g", "A"));
    // The in-flight delivery of a is untouched, so a can still acknowledge it.
    assert!(b.ack("t", "g", "a", 0, 0).unwrap());
}

#[test]
fn leave_removes_an_existing_member_and_rebalances() {
    let b = broker(2);
    b.create("t", 3).unwrap();
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    assert!(b.leave("t", "g", "a").unwrap());
    assert_eq!(b.assignment("t", "g", "a").unwrap(), Vec::<i32>::new());
    assert_eq!(b.assignment("t", "g", "b").unwrap(), vec![0, 1, 2]);
    assert!(!b.leave("t", "g", "a").unwrap());
}

#[test]
fn member_polls_only_its_assigned_partitions() {
    let b = broker(4);
    b.create("t", 4).unwrap();
    for p in 0..4 {
        b.publish("t", p, "x").unwrap();
    }
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    assert_eq!(
        positions(&b.poll("t", "g", "b", 64).unwrap()),
        vec![(1, 0), (3, 0)]
    );
    assert_eq!(
        positions(&b.poll("t", "g", "a", 64).unwrap()),
        vec![(0, 0), (2, 0)]
    );
}

#[test]
fn only_one_record_in_flight_per_group_partition() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    for payload in ["a", "b", "c"] {
        b.publish("t", 0, payload).unwrap();
    }
    b.join("t", "g", "m").unwrap();
    assert_eq!(positions(&b.poll("t", "g", "m", 64).unwrap()), vec![(0, 0)]);
    assert_no_change(&b, vec![], |b| b.poll("t", "g", "m", 64));
    // Another member of the same group cannot take it either: it owns nothing here.
    b.join("t", "g", "z").unwrap();
    assert_eq!(b.poll("t", "g", "z", 64).unwrap(), vec![]);
    assert_eq!(b.poll("t", "g", "m", 64).unwrap(), vec![]);
}

#[test]
fn different_groups_each_reserve_the_same_record() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "g1", "m").unwrap();
    b.join("t", "g2", "m").unwrap();
    assert_eq!(positions(&b.poll("t", "g1", "m", 1).unwrap()), vec![(0, 0)]);
    assert_eq!(positions(&b.poll("t", "g2", "m", 1).unwrap()), vec![(0, 0)]);
}

#[test]
fn later_offset_only_after_the_current_one_is_acknowledged() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    b.join("t", "g", "m").unwrap();
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(0, 0)]);
    assert_eq!(b.poll("t", "g", "m", 1).unwrap(), vec![]);
    assert!(b.retry("t", "g", "m", 0, 0).unwrap());
    // Retried, not acknowledged: the same offset again, never offset 1.
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(0, 0)]);
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(0, 1)]);
}

#[test]
fn poll_results_use_ascending_partition_order() {
    let b = broker(5);
    b.create("t", 5).unwrap();
    for p in (0..5).rev() {
        b.publish("t", p, "x").unwrap();
    }
    b.join("t", "g", "m").unwrap();
    assert_eq!(
        positions(&b.poll("t", "g", "m", 64).unwrap()),
        vec![(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)]
    );
}

#[test]
fn poll_of_an_absent_group_or_member_is_empty_and_creates_nothing() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "x").unwrap();
    assert_no_change(&b, vec![], |b| b.poll("t", "nogroup", "m", 1));
    b.join("t", "g", "m").unwrap();
    assert_no_change(&b, vec![], |b| b.poll("t", "g", "stranger", 1));
}

#[test]
fn poll_with_nothing_eligible_is_empty() {
    let b = broker(5);
    b.create("t", 2).unwrap();
    b.join("t", "g", "m").unwrap();
    assert_no_change(&b, vec![], |b| b.poll("t", "g", "m", 5));
}

#[test]
fn ack_advances_committed_progress_by_one() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.committed("t", "g", 0).unwrap(), 0);
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    assert_eq!(b.committed("t", "g", 0).unwrap(), 1);
    assert_eq!(in_flight(&b, "t", "g", 0), None);
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 1).unwrap());
    assert_eq!(b.committed("t", "g", 0).unwrap(), 2);
}

#[test]
fn retry_clears_the_delivery_without_advancing_committed() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "g", "m").unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    assert_eq!(in_flight(&b, "t", "g", 0), Some(0));
    assert!(b.retry("t", "g", "m", 0, 0).unwrap());
    assert_eq!(in_flight(&b, "t", "g", 0), None);
    assert_eq!(b.committed("t", "g", 0).unwrap(), 0);
    // The record stays retained: nothing was acknowledged.
    assert_eq!(earliest(&b, "t", 0), 0);
}

#[test]
fn ack_of_a_mismatched_delivery_is_false_and_changes_nothing() {
    let b = broker(5);
    b.create("t", 2).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    b.publish("t", 1, "c").unwrap();
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    b.poll("t", "g", "a", 1).unwrap(); // a has (0, 0) in flight; b owns 1, nothing polled.
    assert_no_change(&b, false, |b| b.ack("t", "g", "a", 0, 1)); // wrong offset
    assert_no_change(&b, false, |b| b.ack("t", "g", "a", 0, 99)); // past the end
    assert_no_change(&b, false, |b| b.ack("t", "g", "a", 1, 0)); // not its partition
    assert_no_change(&b, false, |b| b.ack("t", "g", "b", 1, 0)); // nothing in flight there
    assert_no_change(&b, false, |b| b.ack("t", "g", "b", 0, 0)); // not the owner
    assert_no_change(&b, false, |b| b.ack("t", "g", "zed", 0, 0)); // not a member
    assert_no_change(&b, false, |b| b.ack("t", "other", "a", 0, 0)); // absent group
    assert!(b.ack("t", "g", "a", 0, 0).unwrap());
    assert_no_change(&b, false, |b| b.ack("t", "g", "a", 0, 0)); // already acknowledged
}

#[test]
fn retry_of_a_mismatched_delivery_is_false_and_changes_nothing() {
    let b = broker(5);
    b.create("t", 2).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 1, "c").unwrap();
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    b.poll("t", "g", "a", 1).unwrap();
    assert_no_change(&b, false, |b| b.retry("t", "g", "a", 0, 1));
    assert_no_change(&b, false, |b| b.retry("t", "g", "a", 1, 0));
    assert_no_change(&b, false, |b| b.retry("t", "g", "b", 0, 0));
    assert_no_change(&b, false, |b| b.retry("t", "g", "b", 1, 0));
    assert_no_change(&b, false, |b| b.retry("t", "g", "zed", 0, 0));
    assert_no_change(&b, false, |b| b.retry("t", "other", "a", 0, 0));
    assert!(b.retry("t", "g", "a", 0, 0).unwrap());
    assert_no_change(&b, false, |b| b.retry("t", "g", "a", 0, 0));
}

#[test]
fn ack_and_retry_of_one_delivery_never_both_succeed() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "g", "m").unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    assert!(!b.retry("t", "g", "m", 0, 0).unwrap());
    b.publish("t", 0, "b").unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.retry("t", "g", "m", 0, 1).unwrap());
    assert!(!b.ack("t", "g", "m", 0, 1).unwrap());
}

#[test]
fn only_the_current_owner_may_ack_or_retry() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "g", "b").unwrap();
    b.poll("t", "g", "b", 1).unwrap();
    // "a" sorts first and takes partition 0; b's delivery is canceled.
    b.join("t", "g", "a").unwrap();
    assert!(!b.ack("t", "g", "b", 0, 0).unwrap());
    assert!(!b.retry("t", "g", "b", 0, 0).unwrap());
    // The delivery was canceled, not kept for the new owner.
    assert!(!b.ack("t", "g", "a", 0, 0).unwrap());
    assert_eq!(positions(&b.poll("t", "g", "a", 1).unwrap()), vec![(0, 0)]);
    assert!(b.ack("t", "g", "a", 0, 0).unwrap());
}

#[test]
fn rebalance_cancels_in_flight_of_moved_partitions_and_keeps_committed() {
    let b = broker(5);
    b.create("t", 2).unwrap();
    for p in 0..2 {
        b.publish("t", p, "x").unwrap();
        b.publish("t", p, "y").unwrap();
    }
    b.join("t", "g", "a").unwrap();
    b.poll("t", "g", "a", 2).unwrap();
    assert!(b.ack("t", "g", "a", 1, 0).unwrap());
    b.poll("t", "g", "a", 2).unwrap(); // (1, 1) in flight, (0, 0) still in flight
    b.join("t", "g", "b").unwrap(); // partition 1 moves to b
    assert_eq!(in_flight(&b, "t", "g", 1), None);
    assert_eq!(b.committed("t", "g", 1).unwrap(), 1);
    // The new owner continues at the committed offset: nothing replayed, nothing skipped.
    assert_eq!(positions(&b.poll("t", "g", "b", 2).unwrap()), vec![(1, 1)]);
    assert!(!b.ack("t", "g", "a", 1, 1).unwrap());
    assert!(b.ack("t", "g", "b", 1, 1).unwrap());
    assert_eq!(b.committed("t", "g", 1).unwrap(), 2);
}

#[test]
fn rebalance_keeps_in_flight_of_partitions_that_stay_with_their_owner() {
    let b = broker(5);
    b.create("t", 3).unwrap();
    b.publish("t", 0, "x").unwrap();
    b.join("t", "g", "a").unwrap();
    b.poll("t", "g", "a", 1).unwrap();
    b.join("t", "g", "b").unwrap(); // a keeps partition 0
    assert_eq!(in_flight(&b, "t", "g", 0), Some(0));
    assert_eq!(b.poll("t", "g", "a", 1).unwrap(), vec![]);
    assert!(b.ack("t", "g", "a", 0, 0).unwrap());
}

#[test]
fn rebalance_replaces_the_complete_assignment_atomically() {
    let b = broker(5);
    b.create("t", 4).unwrap();
    b.join("t", "g", "c").unwrap();
    b.join("t", "g", "a").unwrap();
    let description = b.describe();
    let group = &description.topics[0].groups[0];
    let owners: Vec<Option<String>> = group.partitions.iter().map(|p| p.owner.clone()).collect();
    let a = Some("a".to_owned());
    let c = Some("c".to_owned());
    assert_eq!(owners, vec![a.clone(), c.clone(), a, c]);
    for member in &group.members {
        for &p in &member.partitions {
            assert_eq!(
                group.partitions[p as usize].owner.as_deref(),
                Some(member.member.as_str())
            );
        }
    }
}

#[test]
fn group_outlives_its_last_member() {
    let b = broker(5);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    b.join("t", "g", "m").unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    assert!(b.leave("t", "g", "m").unwrap());
    let description = b.describe();
    let group = &description.topics[0].groups[0];
    assert_eq!(group.name, "g");
    assert!(group.members.is_empty());
    assert_eq!(group.partitions[0].owner, None);
    assert_eq!(b.committed("t", "g", 0).unwrap(), 1);
    // A later member resumes from the group's progress.
    assert_eq!(b.join("t", "g", "n").unwrap(), vec![0]);
    assert_eq!(positions(&b.poll("t", "g", "n", 1).unwrap()), vec![(0, 1)]);
}

#[test]
fn record_leaves_only_after_every_group_acknowledged_it() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    b.join("t", "g1", "m").unwrap();
    b.join("t", "g2", "m").unwrap();
    b.poll("t", "g1", "m", 1).unwrap();
    assert!(b.ack("t", "g1", "m", 0, 0).unwrap());
    assert_eq!(earliest(&b, "t", 0), 0);
    assert_eq!(b.publish("t", 0, "c").unwrap(), -1);
    b.poll("t", "g2", "m", 1).unwrap();
    assert!(b.ack("t", "g2", "m", 0, 0).unwrap());
    assert_eq!(earliest(&b, "t", 0), 1);
    assert_eq!(b.publish("t", 0, "c").unwrap(), 2);
}

#[test]
fn empty_groups_hold_retention() {
    let b = broker(1);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "idle", "m").unwrap();
    assert!(b.leave("t", "idle", "m").unwrap()); // "idle" now has no members
    b.join("t", "busy", "m").unwrap();
    b.poll("t", "busy", "m", 1).unwrap();
    assert!(b.ack("t", "busy", "m", 0, 0).unwrap());
    assert_eq!(earliest(&b, "t", 0), 0);
    assert_eq!(b.publish("t", 0, "b").unwrap(), -1);
}

#[test]
fn with_no_groups_records_remain_retained() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    assert_eq!(b.publish("t", 0, "c").unwrap(), -1);
    assert_eq!(earliest(&b, "t", 0), 0);
    assert_eq!(b.describe().topics[0].partitions[0].records, 2);
}

#[test]
fn groups_of_another_topic_do_not_count_for_retention() {
    let b = broker(1);
    b.create("t", 1).unwrap();
    b.create("u", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("u", "g", "m").unwrap(); // a group of u, not of t
    b.join("t", "g2", "m").unwrap();
    b.poll("t", "g2", "m", 1).unwrap();
    assert!(b.ack("t", "g2", "m", 0, 0).unwrap());
    assert_eq!(b.publish("t", 0, "b").unwrap(), 1);
}

#[test]
fn new_group_starts_at_earliest_retained_offset() {
    let b = broker(3);
    b.create("t", 2).unwrap();
    for payload in ["a", "b", "c"] {
        b.publish("t", 0, payload).unwrap();
    }
    b.join("t", "old", "m").unwrap();
    for offset in 0..2 {
        b.poll("t", "old", "m", 1).unwrap();
        assert!(b.ack("t", "old", "m", 0, offset).unwrap());
    }
    assert_eq!(earliest(&b, "t", 0), 2);
    b.join("t", "new", "m").unwrap();
    assert_eq!(b.committed("t", "new", 0).unwrap(), 2);
    assert_eq!(
        positions(&b.poll("t", "new", "m", 64).unwrap()),
        vec![(0, 2)]
    );
}

#[test]
fn new_group_on_an_emptied_partition_starts_at_its_next_offset() {
    let b = broker(3);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "old", "m").unwrap();
    b.poll("t", "old", "m", 1).unwrap();
    assert!(b.ack("t", "old", "m", 0, 0).unwrap());
    assert_eq!(b.describe().topics[0].partitions[0].records, 0);
    b.join("t", "new", "m").unwrap();
    assert_eq!(b.committed("t", "new", 0).unwrap(), 1);
    assert_eq!(b.publish("t", 0, "b").unwrap(), 1);
    assert_eq!(
        positions(&b.poll("t", "new", "m", 1).unwrap()),
        vec![(0, 1)]
    );
}

#[test]
fn returned_records_are_value_snapshots() {
    let b = broker(3);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.join("t", "g", "m").unwrap();
    let mut first = b.poll("t", "g", "m", 1).unwrap();
    first[0].payload = Bytes::from_static(b"changed");
    first[0].offset = 7;
    first[0].topic.push('!');
    assert!(b.retry("t", "g", "m", 0, 0).unwrap());
    assert_eq!(
        b.poll("t", "g", "m", 1).unwrap(),
        vec![redelivered(record("t", 0, 0, "a"), 2)]
    );
}

#[test]
fn event_broker_is_shared_by_threads_and_errors_are_std_errors() {
    fn shared<T: Send + Sync + 'static>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    shared::<EventBroker>();
    shared::<std::sync::Arc<EventBroker>>();
    error::<BrokerError>();
}
