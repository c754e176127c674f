//! Kafka-style consumption: the range assignor, keyed
//! publishes, fetch and commit, committed offsets and lag, and the decided edge cases.

use std::collections::BTreeMap;

use super::{assert_invalid, assert_no_change, broker, positions};
use crate::{Assignor, BrokerError, EventBroker, KeyHash, PartitionLag};

fn group_description(broker: &EventBroker, topic: &str, group: &str) -> crate::GroupDescription {
    let description = broker.describe();
    let topic = description.topics.iter().find(|t| t.name == topic).unwrap();
    topic
        .groups
        .iter()
        .find(|g| g.name == group)
        .unwrap()
        .clone()
}

fn position(broker: &EventBroker, topic: &str, group: &str, partition: i32) -> i64 {
    group_description(broker, topic, group).partitions[partition as usize].position
}

/// A topic "t" with `partitions` partitions and `per_partition` records in each, payload
/// "p{partition}-{offset}".
fn filled(partitions: i32, per_partition: i64) -> EventBroker {
    let b = broker(100);
    b.create("t", partitions).unwrap();
    for p in 0..partitions {
        for offset in 0..per_partition {
            assert_eq!(b.publish("t", p, format!("p{p}-{offset}")).unwrap(), offset);
        }
    }
    b
}

#[test]
fn range_assignor_gives_six_partitions_over_a_b_c_two_consecutive_each() {
    let b = broker(2);
    b.create("t", 6).unwrap();
    for member in ["C", "A", "B"] {
        b.join_with("t", "g", member, Assignor::Range).unwrap();
    }
    assert_eq!(b.assignment("t", "g", "A").unwrap(), vec![0, 1]);
    assert_eq!(b.assignment("t", "g", "B").unwrap(), vec![2, 3]);
    assert_eq!(b.assignment("t", "g", "C").unwrap(), vec![4, 5]);
}

#[test]
fn range_assignor_gives_the_first_members_one_extra() {
    let b = broker(2);
    b.create("t", 8).unwrap();
    for member in ["a", "b", "c"] {
        b.join_with("t", "g", member, Assignor::Range).unwrap();
    }
    assert_eq!(b.assignment("t", "g", "a").unwrap(), vec![0, 1, 2]);
    assert_eq!(b.assignment("t", "g", "b").unwrap(), vec![3, 4, 5]);
    assert_eq!(b.assignment("t", "g", "c").unwrap(), vec![6, 7]);
}

#[test]
fn range_members_past_the_partition_count_get_nothing() {
    let b = broker(2);
    b.create("t", 2).unwrap();
    for member in ["d", "c", "b", "a"] {
        b.join_with("t", "g", member, Assignor::Range).unwrap();
    }
    assert_eq!(b.assignment("t", "g", "a").unwrap(), vec![0]);
    assert_eq!(b.assignment("t", "g", "b").unwrap(), vec![1]);
    assert_eq!(b.assignment("t", "g", "c").unwrap(), Vec::<i32>::new());
    assert_eq!(b.join("t", "g", "d").unwrap(), Vec::<i32>::new());
}

#[test]
fn round_robin_members_past_the_partition_count_get_nothing() {
    let b = broker(2);
    b.create("t", 2).unwrap();
    for member in ["a", "b", "c"] {
        b.join("t", "g", member).unwrap();
    }
    assert_eq!(b.assignment("t", "g", "c").unwrap(), Vec::<i32>::new());
}

#[test]
fn new_group_defaults_to_round_robin_and_join_uses_the_groups_assignor() {
    let b = broker(2);
    b.create("t", 4).unwrap();
    b.join("t", "rr", "a").unwrap();
    b.join("t", "rr", "b").unwrap();
    assert_eq!(
        group_description(&b, "t", "rr").assignor,
        Assignor::RoundRobin
    );
    assert_eq!(b.assignment("t", "rr", "a").unwrap(), vec![0, 2]);
    b.join_with("t", "range", "a", Assignor::Range).unwrap();
    // A plain join on a range group uses range.
    assert_eq!(b.join("t", "range", "b").unwrap(), vec![2, 3]);
    assert_eq!(
        group_description(&b, "t", "range").assignor,
        Assignor::Range
    );
}

#[test]
fn join_with_naming_a_different_assignor_than_the_groups_is_invalid_argument() {
    let b = broker(2);
    b.create("t", 4).unwrap();
    b.join_with("t", "g", "a", Assignor::Range).unwrap();
    assert_invalid(&b, |b| b.join_with("t", "g", "b", Assignor::RoundRobin));
    assert_eq!(
        b.join_with("t", "g", "b", Assignor::Range).unwrap(),
        vec![2, 3]
    );
}

#[test]
fn second_member_resumes_from_the_groups_committed_offsets() {
    // The rebalance example: 4 partitions, one member owns all four and polls; a second member joins, the
    // assignment becomes 0,1 and 2,3, and the second member starts at the committed offsets of
    // partitions 2 and 3 as the first member left them.
    let b = filled(4, 5);
    assert_eq!(
        b.join_with("t", "g", "m1", Assignor::Range).unwrap(),
        vec![0, 1, 2, 3]
    );
    let first = b.fetch("t", "g", "m1", 12).unwrap();
    assert_eq!(first.len(), 12); // 5 from 0, 5 from 1, 2 from 2
    b.commit("t", "g", "m1", None).unwrap();
    let committed: Vec<i64> = (0..4).map(|p| b.committed("t", "g", p).unwrap()).collect();
    assert_eq!(committed, vec![5, 5, 2, 0]);
    assert_eq!(b.join("t", "g", "m2").unwrap(), vec![2, 3]);
    assert_eq!(b.assignment("t", "g", "m1").unwrap(), vec![0, 1]);
    let second = b.fetch("t", "g", "m2", 100).unwrap();
    let expected: Vec<(i32, i64)> = (2..5)
        .map(|o| (2, o))
        .chain((0..5).map(|o| (3, o)))
        .collect();
    assert_eq!(positions(&second), expected);
    assert_eq!(second[0].payload, "p2-2");
}

#[test]
fn fetch_advances_positions_and_commits_nothing() {
    let b = filled(2, 3);
    b.join("t", "g", "m").unwrap();
    let records = b.fetch("t", "g", "m", 4).unwrap();
    assert_eq!(positions(&records), vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
    assert_eq!(records[1].payload, "p0-1");
    assert_eq!(b.committed("t", "g", 0).unwrap(), 0);
    assert_eq!(b.committed("t", "g", 1).unwrap(), 0);
    assert_eq!(position(&b, "t", "g", 0), 3);
    assert_eq!(position(&b, "t", "g", 1), 1);
    // Nothing was committed, so nothing leaves and the lag is unchanged.
    assert_eq!(b.describe().topics[0].partitions[0].earliest_offset, 0);
    assert_eq!(b.lag("t", "g").unwrap()[0].lag, 3);
    // The next fetch continues at the positions.
    assert_eq!(
        positions(&b.fetch("t", "g", "m", 10).unwrap()),
        vec![(1, 1), (1, 2)]
    );
    assert_eq!(b.fetch("t", "g", "m", 10).unwrap(), vec![]);
}

#[test]
fn fetch_does_not_reserve_or_block_polls() {
    let b = filled(1, 2);
    b.join("t", "g", "m").unwrap();
    b.fetch("t", "g", "m", 10).unwrap();
    assert_eq!(
        group_description(&b, "t", "g").partitions[0].in_flight,
        None
    );
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(0, 0)]);
}

#[test]
fn commit_none_stores_the_members_positions() {
    let b = filled(3, 3);
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap(); // a: [0, 2], b: [1]
    b.fetch("t", "g", "a", 4).unwrap(); // (0,0..3), (2,0)
    b.fetch("t", "g", "b", 2).unwrap(); // (1,0..2)
    b.commit("t", "g", "a", None).unwrap();
    assert_eq!(b.committed("t", "g", 0).unwrap(), 3);
    assert_eq!(b.committed("t", "g", 1).unwrap(), 0); // b has not committed
    assert_eq!(b.committed("t", "g", 2).unwrap(), 1);
    b.commit("t", "g", "b", None).unwrap();
    assert_eq!(b.committed("t", "g", 1).unwrap(), 2);
}

#[test]
fn commit_some_stores_exactly_the_given_offsets() {
    let b = filled(3, 3);
    b.join("t", "g", "m").unwrap();
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 2), (2, 1)])))
        .unwrap();
    let lag = b.lag("t", "g").unwrap();
    assert_eq!(
        lag.iter().map(|l| l.committed).collect::<Vec<_>>(),
        vec![2, 0, 1]
    );
}

#[test]
fn commit_some_of_an_unowned_partition_is_not_assigned_and_stores_nothing() {
    let b = filled(3, 3);
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap(); // a: [0, 2], b: [1]
    let before = b.describe();
    assert_eq!(
        b.commit(
            "t",
            "g",
            "a",
            Some(BTreeMap::from([(0, 2), (1, 2), (2, 2)]))
        ),
        Err(BrokerError::NotAssigned { partition: 1 })
    );
    assert_eq!(b.describe(), before, "all or nothing");
    assert_eq!(
        b.commit("t", "g", "b", Some(BTreeMap::from([(0, 1), (2, 1)]))),
        Err(BrokerError::NotAssigned { partition: 0 })
    );
    assert_eq!(b.describe(), before);
}

#[test]
fn commit_some_by_a_non_member_or_on_an_absent_group_is_not_assigned() {
    let b = filled(2, 2);
    b.join("t", "g", "a").unwrap();
    let before = b.describe();
    assert_eq!(
        b.commit("t", "g", "stranger", Some(BTreeMap::from([(0, 1)]))),
        Err(BrokerError::NotAssigned { partition: 0 })
    );
    assert_eq!(
        b.commit("t", "nogroup", "a", Some(BTreeMap::from([(1, 1)]))),
        Err(BrokerError::NotAssigned { partition: 1 })
    );
    assert_eq!(b.describe(), before);
}

#[test]
fn commit_some_by_a_member_that_lost_the_partition_is_not_assigned() {
    let b = filled(2, 4);
    b.join("t", "g", "b").unwrap();
    b.fetch("t", "g", "b", 8).unwrap();
    b.join("t", "g", "a").unwrap(); // a: [0], b: [1]
    let before = b.describe();
    assert_eq!(
        b.commit("t", "g", "b", Some(BTreeMap::from([(0, 4)]))),
        Err(BrokerError::NotAssigned { partition: 0 })
    );
    assert_eq!(b.describe(), before);
}

#[test]
fn commit_none_by_a_non_member_succeeds_and_stores_nothing() {
    let b = filled(2, 2);
    b.join("t", "g", "a").unwrap();
    b.fetch("t", "g", "a", 10).unwrap();
    assert_no_change(&b, (), |b| b.commit("t", "g", "stranger", None));
    assert_no_change(&b, (), |b| b.commit("t", "nogroup", "a", None));
    assert!(b.describe().topics[0].groups.iter().all(|g| g.name == "g"));
}

#[test]
fn explicit_commit_does_not_move_the_fetch_position() {
    let b = filled(1, 5);
    b.join("t", "other", "m").unwrap(); // holds retention, so committing releases nothing
    b.join("t", "g", "m").unwrap();
    b.fetch("t", "g", "m", 2).unwrap();
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 4)])))
        .unwrap();
    assert_eq!(position(&b, "t", "g", 0), 2);
    assert_eq!(positions(&b.fetch("t", "g", "m", 1).unwrap()), vec![(0, 2)]);
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 0)])))
        .unwrap();
    assert_eq!(position(&b, "t", "g", 0), 3);
}

#[test]
fn committed_offsets_belong_to_the_group_not_the_member() {
    let b = filled(1, 4);
    b.join("t", "g", "a").unwrap();
    b.fetch("t", "g", "a", 3).unwrap();
    b.commit("t", "g", "a", None).unwrap();
    b.leave("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    assert_eq!(b.committed("t", "g", 0).unwrap(), 3);
    assert_eq!(
        positions(&b.fetch("t", "g", "b", 10).unwrap()),
        vec![(0, 3)]
    );
}

#[test]
fn groups_are_independent() {
    let b = filled(1, 3);
    b.join("t", "billing", "m").unwrap();
    b.join("t", "analytics", "m").unwrap();
    b.fetch("t", "billing", "m", 3).unwrap();
    b.commit("t", "billing", "m", None).unwrap();
    assert_eq!(b.committed("t", "billing", 0).unwrap(), 3);
    assert_eq!(b.committed("t", "analytics", 0).unwrap(), 0);
    assert_eq!(b.fetch("t", "analytics", "m", 10).unwrap().len(), 3);
}

#[test]
fn every_rebalance_resets_every_position_to_the_committed_offset() {
    let b = filled(2, 4);
    b.join("t", "g", "a").unwrap();
    b.fetch("t", "g", "a", 8).unwrap();
    b.commit("t", "g", "a", Some(BTreeMap::from([(0, 1), (1, 2)])))
        .unwrap();
    assert_eq!(position(&b, "t", "g", 0), 4);
    // "z" joins: round-robin keeps partition 0 with a, and still a's position is reset.
    assert_eq!(b.join("t", "g", "z").unwrap(), vec![1]);
    assert_eq!(position(&b, "t", "g", 0), 1);
    assert_eq!(position(&b, "t", "g", 1), 2);
    assert_eq!(
        positions(&b.fetch("t", "g", "a", 10).unwrap()),
        vec![(0, 1), (0, 2), (0, 3)]
    );
    // Leaving is a rebalance too: a's uncommitted fetch is replayed.
    b.leave("t", "g", "z").unwrap();
    assert_eq!(
        positions(&b.fetch("t", "g", "a", 10).unwrap()),
        vec![(0, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    );
}

#[test]
fn repeated_join_is_not_a_rebalance_and_keeps_positions() {
    let b = filled(1, 4);
    b.join("t", "g", "a").unwrap();
    b.fetch("t", "g", "a", 2).unwrap();
    b.join("t", "g", "a").unwrap();
    assert_eq!(position(&b, "t", "g", 0), 2);
}

#[test]
fn committed_and_lag_of_an_absent_group_answer_the_earliest_retained_offset() {
    let b = filled(2, 3);
    b.join("t", "g", "m").unwrap();
    b.fetch("t", "g", "m", 2).unwrap();
    b.commit("t", "g", "m", None).unwrap(); // partition 0 committed at 2: offsets 0, 1 leave
    assert_eq!(b.describe().topics[0].partitions[0].earliest_offset, 2);
    let before = b.describe();
    assert_eq!(b.committed("t", "nogroup", 0).unwrap(), 2);
    assert_eq!(b.committed("t", "nogroup", 1).unwrap(), 0);
    assert_eq!(
        b.lag("t", "nogroup").unwrap(),
        vec![
            PartitionLag {
                partition: 0,
                committed: 2,
                end_offset: 3,
                lag: 1,
                skipped: 0
            },
            PartitionLag {
                partition: 1,
                committed: 0,
                end_offset: 3,
                lag: 3,
                skipped: 0
            },
        ]
    );
    assert_eq!(
        b.describe(),
        before,
        "asking about a group must not create it"
    );
}

#[test]
fn committed_is_zero_on_a_fresh_partition() {
    let b = broker(5);
    b.create("t", 2).unwrap();
    assert_eq!(b.committed("t", "g", 1).unwrap(), 0);
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.committed("t", "g", 1).unwrap(), 0);
}

#[test]
fn lag_is_end_offset_minus_committed_per_partition_ascending() {
    let b = filled(3, 4);
    b.join("t", "g", "m").unwrap();
    b.commit("t", "g", "m", Some(BTreeMap::from([(1, 3), (2, 4)])))
        .unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    let lag = b.lag("t", "g").unwrap();
    assert_eq!(
        lag.iter()
            .map(|l| (l.partition, l.committed, l.end_offset, l.lag))
            .collect::<Vec<_>>(),
        vec![(0, 1, 4, 3), (1, 3, 4, 1), (2, 4, 4, 0)]
    );
    let description = group_description(&b, "t", "g");
    assert_eq!(
        description
            .partitions
            .iter()
            .map(|p| p.lag)
            .collect::<Vec<_>>(),
        vec![3, 1, 0]
    );
}

#[test]
fn end_offset_is_the_offset_the_next_record_gets() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    assert_eq!(b.end_offset("t", 0).unwrap(), 0);
    b.publish("t", 0, "a").unwrap();
    assert_eq!(b.end_offset("t", 0).unwrap(), 1);
}

#[test]
fn fetch_by_a_non_member_or_on_an_absent_group_is_empty() {
    let b = filled(2, 2);
    b.join("t", "g", "m").unwrap();
    assert_no_change(&b, vec![], |b| b.fetch("t", "g", "stranger", 10));
    assert_no_change(&b, vec![], |b| b.fetch("t", "nogroup", "m", 10));
}

#[test]
fn assignment_of_an_unknown_group_or_member_is_empty() {
    let b = filled(2, 0);
    b.join("t", "g", "m").unwrap();
    assert_no_change(&b, vec![], |b| b.assignment("t", "g", "stranger"));
    assert_no_change(&b, vec![], |b| b.assignment("t", "nogroup", "m"));
}

#[test]
fn commit_frees_records_for_shared_retention_like_acks() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "a").unwrap();
    b.publish("t", 0, "b").unwrap();
    b.join("t", "polling", "m").unwrap();
    b.join("t", "fetching", "m").unwrap();
    b.fetch("t", "fetching", "m", 2).unwrap();
    b.commit("t", "fetching", "m", None).unwrap();
    assert_eq!(b.publish("t", 0, "c").unwrap(), -1); // "polling" still holds both
    b.poll("t", "polling", "m", 1).unwrap();
    assert!(b.ack("t", "polling", "m", 0, 0).unwrap());
    assert_eq!(b.publish("t", 0, "c").unwrap(), 2);
}

#[test]
fn keyed_publish_lands_on_kafkas_murmur2_partition() {
    // Kafka: murmur2("21") = -973932308; partition = (hash & 0x7fffffff) % n.
    let positive = i64::from(-973_932_308_i32 & 0x7fff_ffff);
    let b = broker(10);
    for n in [1, 2, 3, 7, 10, 64] {
        let topic = format!("t{n}");
        b.create(&topic, n).unwrap();
        let expected = (positive % i64::from(n)) as i32;
        assert_eq!(
            b.publish_keyed(&topic, Some(b"21"), "x").unwrap(),
            (expected, 0),
            "{n} partitions"
        );
        // The same key always lands on the same partition.
        assert_eq!(
            b.publish_keyed(&topic, Some(b"21"), "y").unwrap(),
            (expected, 1)
        );
    }
}

#[test]
fn keyed_publish_on_an_fnv1a_topic_uses_fnv1a_mod_n() {
    // FNV-1a 32-bit reference vectors: "foobar" = 0xbf9cf968, "a" = 0xe40c292c.
    let b = broker(10);
    for n in [3_i32, 7, 64] {
        let topic = format!("f{n}");
        assert!(b.create_with(&topic, n, KeyHash::Fnv1a).unwrap());
        for (key, hash) in [(&b"foobar"[..], 0xbf9c_f968_u32), (b"a", 0xe40c_292c)] {
            let expected = (hash % n as u32) as i32;
            assert_eq!(b.publish_keyed(&topic, Some(key), "x").unwrap().0, expected);
        }
    }
    assert_eq!(b.describe().topics[0].key_hash, KeyHash::Fnv1a);
}

#[test]
fn keyed_record_carries_its_key_and_keyless_records_none() {
    let b = broker(10);
    b.create("t", 1).unwrap();
    b.publish_keyed("t", Some(b"k"), "x").unwrap();
    b.publish_keyed("t", None, "y").unwrap();
    b.publish("t", 0, "z").unwrap();
    b.join("t", "g", "m").unwrap();
    let records = b.fetch("t", "g", "m", 10).unwrap();
    assert_eq!(
        records.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
        vec![Some(bytes::Bytes::from_static(b"k")), None, None]
    );
}

#[test]
fn keyless_publishes_go_to_consecutive_partitions() {
    let b = broker(10);
    b.create("t", 3).unwrap();
    let mut partitions = Vec::new();
    for i in 0..7 {
        // Keyed publishes in between do not disturb the round-robin.
        b.publish_keyed("t", Some(b"21"), "k").unwrap();
        b.publish("t", 2, "direct").unwrap_or(-1);
        let (partition, _) = b.publish_keyed("t", None, format!("{i}")).unwrap();
        partitions.push(partition);
    }
    assert_eq!(partitions, vec![0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn keyless_publishes_cover_every_partition_even_when_one_is_full() {
    let b = broker(1);
    b.create("t", 3).unwrap();
    b.publish("t", 1, "fill").unwrap();
    let results: Vec<(i32, i64)> = (0..3)
        .map(|_| b.publish_keyed("t", None, "x").unwrap())
        .collect();
    assert_eq!(results, vec![(0, 0), (1, -1), (2, 0)]);
}

#[test]
fn full_partition_on_keyed_publish_gives_offset_minus_one() {
    let b = broker(1);
    b.create("t", 4).unwrap();
    let (partition, offset) = b.publish_keyed("t", Some(b"21"), "x").unwrap();
    assert_eq!(offset, 0);
    let before = b.describe();
    assert_eq!(
        b.publish_keyed("t", Some(b"21"), "y").unwrap(),
        (partition, -1)
    );
    assert_eq!(b.describe(), before);
}

#[test]
fn last_member_leaving_cancels_in_flight_and_a_later_member_gets_them_again() {
    let b = filled(2, 2);
    b.join("t", "g", "a").unwrap();
    assert_eq!(b.poll("t", "g", "a", 2).unwrap().len(), 2);
    assert!(b.leave("t", "g", "a").unwrap());
    let group = group_description(&b, "t", "g");
    assert!(group.partitions.iter().all(|p| p.in_flight.is_none()));
    assert!(!b.ack("t", "g", "a", 0, 0).unwrap());
    b.join("t", "g", "b").unwrap();
    assert_eq!(
        positions(&b.poll("t", "g", "b", 2).unwrap()),
        vec![(0, 0), (1, 0)]
    );
    // The same member rejoining gets them again as well.
    b.leave("t", "g", "b").unwrap();
    b.join("t", "g", "a").unwrap();
    assert_eq!(
        positions(&b.poll("t", "g", "a", 2).unwrap()),
        vec![(0, 0), (1, 0)]
    );
}

#[test]
fn poll_cut_short_by_max_records_serves_lowest_partitions_first() {
    let b = filled(4, 2);
    b.join("t", "g", "m").unwrap();
    assert_eq!(
        positions(&b.poll("t", "g", "m", 2).unwrap()),
        vec![(0, 0), (1, 0)]
    );
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(2, 0)]);
}

#[test]
fn fetch_cut_short_by_max_records_serves_lowest_partitions_first() {
    let b = filled(3, 2);
    b.join("t", "g", "m").unwrap();
    assert_eq!(
        positions(&b.fetch("t", "g", "m", 3).unwrap()),
        vec![(0, 0), (0, 1), (1, 0)]
    );
}

#[test]
fn byte_budgets_always_return_at_least_one_record() {
    let b = broker(10);
    b.create("t", 2).unwrap();
    for p in 0..2 {
        b.publish("t", p, "0123456789").unwrap();
        b.publish("t", p, "0123456789").unwrap();
    }
    b.join("t", "g", "m").unwrap();
    assert_eq!(
        positions(&b.poll_limited("t", "g", "m", 64, Some(0)).unwrap()),
        vec![(0, 0)]
    );
    assert_eq!(
        positions(&b.poll_limited("t", "g", "m", 64, Some(15)).unwrap()),
        vec![(1, 0)]
    );
    assert_eq!(
        positions(&b.fetch_limited("t", "g", "m", 64, Some(1)).unwrap()),
        vec![(0, 0)]
    );
    assert_eq!(
        positions(&b.fetch_limited("t", "g", "m", 64, Some(20)).unwrap()),
        vec![(0, 1), (1, 0)]
    );
    assert_eq!(
        positions(&b.fetch_limited("t", "g", "m", 64, None).unwrap()),
        vec![(1, 1)]
    );
}

#[test]
fn byte_budget_counts_key_and_payload_bytes() {
    let b = broker(10);
    b.create("t", 1).unwrap();
    b.publish_keyed("t", Some(b"kk"), "123").unwrap(); // 5 bytes
    b.publish_keyed("t", Some(b"kk"), "123").unwrap(); // 5 bytes
    b.publish_keyed("t", Some(b"kk"), "123").unwrap();
    b.join("t", "g", "m").unwrap();
    assert_eq!(
        b.fetch_limited("t", "g", "m", 64, Some(9)).unwrap().len(),
        1
    );
    assert_eq!(
        b.fetch_limited("t", "g", "m", 64, Some(10)).unwrap().len(),
        2
    );
}

#[test]
fn describe_shows_retained_bytes_per_partition_and_topic_which_drop_on_release() {
    let b = broker(10);
    b.create("t", 2).unwrap();
    b.publish("t", 0, "abc").unwrap();
    b.publish("t", 0, "defgh").unwrap();
    b.publish_keyed("t", Some(b"k"), "").unwrap();
    b.publish("t", 1, "xy").unwrap();
    let key_partition = b.publish_keyed("t", Some(b"k"), "").unwrap().0;
    let topic = &b.describe().topics[0];
    let mut expected = [8_u64, 2];
    expected[key_partition as usize] += 2;
    assert_eq!(
        topic
            .partitions
            .iter()
            .map(|p| p.retained_bytes)
            .collect::<Vec<_>>(),
        expected
    );
    assert_eq!(topic.retained_bytes, expected.iter().sum::<u64>());
    b.join("t", "g", "m").unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    assert!(b.ack("t", "g", "m", 0, 0).unwrap());
    let topic = &b.describe().topics[0];
    assert_eq!(topic.partitions[0].retained_bytes, expected[0] - 3);
    assert_eq!(topic.partitions[0].earliest_offset, 1);
    assert_eq!(topic.retained_bytes, expected.iter().sum::<u64>() - 3);
    b.fetch("t", "g", "m", 100).unwrap();
    b.commit("t", "g", "m", None).unwrap();
    let topic = &b.describe().topics[0];
    assert_eq!(topic.retained_bytes, 0);
    assert!(topic.partitions.iter().all(|p| p.records == 0));
}

/// A commit past the partition's end is refused and changes nothing: it would make the group
/// skip, unseen, every record published below it later. A commit up to the end is accepted.
#[test]
fn a_commit_past_the_end_is_refused() {
    let b = broker(2);
    b.create("t", 1).unwrap();
    b.join("t", "g", "m").unwrap();
    assert_invalid(&b, |b| {
        b.commit("t", "g", "m", Some(BTreeMap::from([(0, 10)])))
    });
    for offset in 0..2 {
        assert_eq!(b.publish("t", 0, "x").unwrap(), offset);
    }
    assert_invalid(&b, |b| {
        b.commit("t", "g", "m", Some(BTreeMap::from([(0, 3)])))
    });
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 2)])))
        .unwrap();
    assert_eq!(b.lag("t", "g").unwrap()[0].lag, 0);
    let partition = b.describe().topics[0].partitions[0];
    assert_eq!((partition.earliest_offset, partition.records), (2, 0));
}

/// An explicit commit that moves a partition's committed offset cancels the delivery that a
/// poll made from the old offset: its ack is a mismatch (false) and cannot move the committed
/// offset back; the next poll delivers from the new committed offset.
#[test]
fn ack_after_a_commit_past_the_delivery_does_not_move_committed_back() {
    let b = filled(1, 5);
    b.join("t", "other", "m").unwrap();
    b.join("t", "g", "m").unwrap();
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(0, 0)]);
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 3)])))
        .unwrap();
    assert!(
        !b.ack("t", "g", "m", 0, 0).unwrap(),
        "the commit cancelled the delivery"
    );
    assert_eq!(b.committed("t", "g", 0).unwrap(), 3);
    assert_eq!(positions(&b.poll("t", "g", "m", 1).unwrap()), vec![(0, 3)]);
}

#[test]
fn a_fetch_that_returns_nothing_changes_nothing() {
    // A position below the earliest retained offset: the group committed 3, then committed 0
    // explicitly (records below 3 are gone), and a rebalance reset the position to 0.
    let b = filled(1, 3);
    b.join("t", "g", "m").unwrap();
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 3)])))
        .unwrap();
    b.commit("t", "g", "m", Some(BTreeMap::from([(0, 0)])))
        .unwrap();
    b.join("t", "g", "n").unwrap();
    b.leave("t", "g", "n").unwrap();
    assert_eq!(position(&b, "t", "g", 0), 0);
    assert_no_change(&b, Vec::new(), |b| b.fetch("t", "g", "m", 10));
    // A fetch that does return records still skips to what remains.
    assert_eq!(b.publish("t", 0, "x").unwrap(), 3);
    assert_eq!(
        positions(&b.fetch("t", "g", "m", 10).unwrap()),
        vec![(0, 3)]
    );
    assert_eq!(position(&b, "t", "g", 0), 4);
}

#[test]
fn a_state_survives_a_serde_round_trip_of_its_image() {
    let b = filled(2, 2);
    b.join("t", "g", "m").unwrap();
    b.poll("t", "g", "m", 1).unwrap();
    let image = b.with_state(|state| state.to_image());
    let json = serde_json::to_string(&image).unwrap();
    let back = crate::BrokerState::from_image(serde_json::from_str(&json).unwrap(), None).unwrap();
    assert_eq!(EventBroker::from_state(back).describe(), b.describe());
}

#[test]
fn read_returns_records_from_an_offset_without_a_group_and_changes_nothing() {
    let b = filled(2, 5);
    let read = b.read("t", 1, 2, 2, None).unwrap();
    assert_no_change(&b, read.clone(), |b| b.read("t", 1, 2, 2, None));
    assert_eq!(positions(&read.records), vec![(1, 2), (1, 3)]);
    assert_eq!(read.records[0].payload, "p1-2");
    assert_eq!(read.records[0].delivery_count, 0);
    assert_eq!((read.start_offset, read.end_offset), (0, 5));
    // At the end: nothing yet, with the bounds.
    let at_end = b.read("t", 1, 5, 10, None).unwrap();
    assert!(at_end.records.is_empty());
    assert_eq!(at_end.end_offset, 5);
    // A byte budget stops after the first record that fills it (the first always comes).
    assert_eq!(b.read("t", 0, 0, 10, Some(1)).unwrap().records.len(), 1);
    assert_eq!(b.read("t", 0, 0, 10, Some(8)).unwrap().records.len(), 2);
}

#[test]
fn read_below_the_earliest_retained_offset_starts_there() {
    let b = filled(1, 5);
    assert_eq!(b.purge("t", 0, 3).unwrap(), 3);
    let read = b.read("t", 0, 0, 10, None).unwrap();
    assert_eq!(positions(&read.records), vec![(0, 3), (0, 4)]);
    assert_eq!((read.start_offset, read.end_offset), (3, 5));
}

#[test]
fn read_refuses_bad_arguments() {
    let b = filled(1, 2);
    assert_invalid(&b, |b| b.read("t", 0, 3, 1, None));
    assert_invalid(&b, |b| b.read("t", 0, -1, 1, None));
    assert_invalid(&b, |b| b.read("t", 1, 0, 1, None));
    assert_invalid(&b, |b| b.read("u", 0, 0, 1, None));
    assert_invalid(&b, |b| b.read("t", 0, 0, 0, None));
    assert_invalid(&b, |b| {
        b.read("t", 0, 0, crate::MAX_FETCH_RECORDS + 1, None)
    });
}

#[test]
fn commit_group_creates_a_memberless_group_whose_offsets_hold_records() {
    let b = filled(2, 3);
    b.commit_group("t", "kafka", &[(0, 2), (1, 9)]).unwrap();
    let group = group_description(&b, "t", "kafka");
    assert!(group.members.is_empty());
    // Past the end: moved to the end.
    assert_eq!(
        (group.partitions[0].committed, group.partitions[1].committed),
        (2, 3)
    );
    let lag = b.lag("t", "kafka").unwrap();
    assert_eq!((lag[0].lag, lag[1].lag), (1, 0));
    // Interest retention: the group holds what it has not committed past, and nothing else.
    let description = b.describe();
    let partitions = &description.topics[0].partitions;
    assert_eq!(
        (partitions[0].earliest_offset, partitions[1].earliest_offset),
        (2, 3)
    );
    // A group with members of its own is theirs to commit.
    b.join("t", "native", "m").unwrap();
    assert_invalid(&b, |b| b.commit_group("t", "native", &[(0, 1)]));
    assert_invalid(&b, |b| b.commit_group("t", "kafka", &[(0, 1), (0, 2)]));
    assert_invalid(&b, |b| b.commit_group("t", "kafka", &[(2, 1)]));
    assert_invalid(&b, |b| b.commit_group("t", "kafka", &[(0, -1)]));
}

#[test]
fn stored_offsets_are_those_a_group_committed_acknowledged_or_reset_and_none_elsewhere() {
    let b = filled(4, 5);
    assert_eq!(b.stored_offsets("t", "g").unwrap(), vec![None; 4]);
    // A commit from outside creates the group at the earliest records: only the partition
    // committed on has an offset stored, even one at the start.
    b.commit_group("t", "g", &[(1, 0)]).unwrap();
    assert_eq!(
        b.stored_offsets("t", "g").unwrap(),
        vec![None, Some(0), None, None]
    );
    // Retention moving the group's start stores nothing.
    b.purge("t", 0, 2).unwrap();
    assert_eq!(b.committed("t", "g", 0).unwrap(), 2);
    assert_eq!(b.stored_offsets("t", "g").unwrap()[0], None);
    // An acknowledgement stores its record's next offset.
    let acked = broker(100);
    acked.create("t", 2).unwrap();
    acked.publish("t", 0, "x").unwrap();
    acked.join("t", "g", "m").unwrap();
    let polled = acked.poll("t", "g", "m", 1).unwrap();
    assert_eq!(acked.stored_offsets("t", "g").unwrap(), vec![None, None]);
    acked.ack("t", "g", "m", 0, polled[0].offset).unwrap();
    assert_eq!(acked.stored_offsets("t", "g").unwrap(), vec![Some(1), None]);
    // A reset stores every partition it moves.
    b.reset_group("t", "g", Some(&[2]), crate::ResetTo::Latest)
        .unwrap();
    assert_eq!(
        b.stored_offsets("t", "g").unwrap(),
        vec![None, Some(0), Some(5), None]
    );
    // Deleting the offsets of a partition: back where the group starts, stored no more; a
    // group with members keeps its offsets.
    let rows = b.delete_offsets("t", "g", &[1]).unwrap();
    assert_eq!((rows[0].partition, rows[0].committed), (1, 0));
    assert_eq!(
        b.stored_offsets("t", "g").unwrap(),
        vec![None, None, Some(5), None]
    );
    let busy = acked.delete_offsets("t", "g", &[0]).unwrap_err();
    assert!(busy.to_string().contains("members"), "{busy}");
    assert_eq!(acked.stored_offsets("t", "g").unwrap(), vec![Some(1), None]);
    b.commit_group("t", "g", &[(1, 0)]).unwrap();
    // Kept in an image; an offset in an image of version 4 counts as stored.
    let image = b.with_state(|state| state.to_image());
    let back =
        EventBroker::from_state(crate::BrokerState::from_image(image.clone(), None).unwrap());
    assert_eq!(
        back.stored_offsets("t", "g").unwrap(),
        b.stored_offsets("t", "g").unwrap()
    );
    let old = crate::image::v4::GroupImage {
        assignor: 0,
        start_at: 0,
        ack_timeout_ms: None,
        max_deliveries: None,
        dead_letter: None,
        members: Vec::new(),
        partitions: vec![crate::image::v4::GroupPartitionImage {
            owner: None,
            committed: 3,
            position: 3,
            in_flight: None,
            delivered_at_ms: 0,
            deliveries: 0,
            skipped: 0,
        }],
    };
    let upgraded = crate::image::GroupImage::from(old);
    assert!(upgraded.partitions[0].has_commit);
    // Refusals.
    for (topic, group) in [("nothing", "g"), ("t", "bad group")] {
        let refused = b.stored_offsets(topic, group).unwrap_err();
        assert!(
            matches!(refused, BrokerError::InvalidArgument(_)),
            "{refused}"
        );
    }
}
