//! The limits on topics, groups and members: past them a call is refused and changes nothing.

use super::*;
use crate::{BrokerState, Limits};

fn limited() -> EventBroker {
    let state = BrokerState::new(10).unwrap().with_limits(Limits {
        max_topics: 2,
        max_partitions: 64,
        max_groups_per_topic: 2,
        max_members_per_group: 2,
    });
    EventBroker::from_state(state)
}

#[test]
fn creating_a_topic_past_the_limit_is_refused_but_a_duplicate_is_still_false() {
    let b = limited();
    assert!(b.create("a", 1).unwrap());
    assert!(b.create("b", 1).unwrap());
    assert_invalid(&b, |b| b.create("c", 1));
    assert!(!b.create("a", 1).unwrap(), "a duplicate is not a new topic");
}

#[test]
fn a_group_past_the_limit_is_refused_and_existing_groups_still_take_members() {
    let b = limited();
    b.create("t", 1).unwrap();
    b.join("t", "g1", "m").unwrap();
    b.join("t", "g2", "m").unwrap();
    assert_invalid(&b, |b| b.join("t", "g3", "m"));
    assert_eq!(b.join("t", "g1", "n").unwrap(), Vec::<i32>::new());
}

#[test]
fn a_member_past_the_limit_is_refused_and_a_repeated_join_still_answers() {
    let b = limited();
    b.create("t", 2).unwrap();
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    assert_invalid(&b, |b| b.join("t", "g", "c"));
    assert_eq!(b.join("t", "g", "a").unwrap(), vec![0], "already a member");
    assert!(b.leave("t", "g", "b").unwrap());
    assert_eq!(
        b.join("t", "g", "c").unwrap(),
        vec![1],
        "room again after a leave"
    );
}

#[test]
fn the_default_limits_are_far_above_the_seed_test_sizes() {
    let limits = Limits::default();
    assert!(limits.max_topics >= 32 * 100);
    assert!(limits.max_groups_per_topic >= 128 * 4);
    assert!(limits.max_members_per_group >= 64 * 4);
}
