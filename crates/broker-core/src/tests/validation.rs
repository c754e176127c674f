//! The validation rules, one test each; every invalid call must also leave `describe()`
//! unchanged.

use std::collections::BTreeMap;

use super::{assert_invalid, broker};
use crate::{
    Assignor, BrokerError, BrokerState, EventBroker, GroupSetting, KeyHash, NameRules, TopicName,
    MAX_FETCH_RECORDS,
};

/// Identifiers every method must refuse.
fn bad_identifiers() -> Vec<String> {
    [
        "", " a", "a ", " ", "a.b", "a/b", "a:b", "é", "a\0", "a\n", "a b", "*",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain(std::iter::once("x".repeat(65)))
    .collect()
}

/// A broker with a topic "t" of 2 partitions holding records, a group "g" with members "a" and
/// "b", a delivery in flight and a fetch position, so that side effects would show.
fn populated() -> EventBroker {
    let b = broker(3);
    b.create("t", 2).unwrap();
    for p in 0..2 {
        b.publish("t", p, "x").unwrap();
        b.publish("t", p, "y").unwrap();
    }
    b.join("t", "g", "a").unwrap();
    b.join("t", "g", "b").unwrap();
    b.poll("t", "g", "a", 1).unwrap();
    b.fetch("t", "g", "b", 1).unwrap();
    b
}

/// Runs every method that takes a (topic, group, member) with `topic`, `group`, `member`
/// and asserts each is refused without side effects.
fn assert_every_member_call_invalid(b: &EventBroker, topic: &str, group: &str, member: &str) {
    let some_offsets = || Some(BTreeMap::from([(0, 0)]));
    assert_invalid(b, |b| b.join(topic, group, member));
    assert_invalid(b, |b| b.join_with(topic, group, member, Assignor::Range));
    assert_invalid(b, |b| b.leave(topic, group, member));
    assert_invalid(b, |b| b.poll(topic, group, member, 1));
    assert_invalid(b, |b| b.poll_limited(topic, group, member, 1, Some(1)));
    assert_invalid(b, |b| b.ack(topic, group, member, 0, 0));
    assert_invalid(b, |b| b.retry(topic, group, member, 0, 0));
    assert_invalid(b, |b| b.fetch(topic, group, member, 1));
    assert_invalid(b, |b| b.fetch_limited(topic, group, member, 1, Some(1)));
    assert_invalid(b, |b| b.commit(topic, group, member, None));
    assert_invalid(b, |b| b.commit(topic, group, member, some_offsets()));
    assert_invalid(b, |b| b.assignment(topic, group, member));
    assert_invalid(b, |b| b.committed(topic, group, 0));
    assert_invalid(b, |b| b.lag(topic, group));
}

#[test]
fn invalid_topic_identifier_is_invalid_argument_on_every_method() {
    let b = populated();
    for bad in bad_identifiers() {
        assert_invalid(&b, |b| b.create(&bad, 1));
        assert_invalid(&b, |b| b.create_with(&bad, 1, KeyHash::Fnv1a));
        assert_invalid(&b, |b| b.publish(&bad, 0, "x"));
        assert_invalid(&b, |b| b.publish_keyed(&bad, Some(b"k"), "x"));
        assert_invalid(&b, |b| b.publish_keyed(&bad, None, "x"));
        assert_invalid(&b, |b| b.end_offset(&bad, 0));
        assert_every_member_call_invalid(&b, &bad, "g", "a");
    }
}

#[test]
fn invalid_group_identifier_is_invalid_argument_on_every_method() {
    let b = populated();
    for bad in bad_identifiers() {
        assert_every_member_call_invalid(&b, "t", &bad, "a");
    }
}

#[test]
fn invalid_member_identifier_is_invalid_argument_on_every_method() {
    let b = populated();
    for bad in bad_identifiers() {
        let some_offsets = || Some(BTreeMap::from([(0, 0)]));
        assert_invalid(&b, |b| b.join("t", "g", &bad));
        assert_invalid(&b, |b| b.join_with("t", "g", &bad, Assignor::RoundRobin));
        assert_invalid(&b, |b| b.leave("t", "g", &bad));
        assert_invalid(&b, |b| b.poll("t", "g", &bad, 1));
        assert_invalid(&b, |b| b.ack("t", "g", &bad, 0, 0));
        assert_invalid(&b, |b| b.retry("t", "g", &bad, 0, 0));
        assert_invalid(&b, |b| b.fetch("t", "g", &bad, 1));
        assert_invalid(&b, |b| b.commit("t", "g", &bad, None));
        assert_invalid(&b, |b| b.commit("t", "g", &bad, some_offsets()));
        assert_invalid(&b, |b| b.assignment("t", "g", &bad));
    }
}

#[test]
fn identifiers_of_1_to_64_letters_digits_underscore_dash_are_valid() {
    let b = broker(3);
    let long = "Az09_-".repeat(10) + "abcd";
    assert_eq!(long.len(), 64);
    for id in ["a", "Z", "0", "_", "-", "orders-2_EU", long.as_str()] {
        assert!(b.create(id, 1).unwrap(), "{id}");
        assert_eq!(b.join(id, id, id).unwrap(), vec![0]);
        assert_eq!(b.publish(id, 0, "x").unwrap(), 0);
        assert_eq!(b.poll(id, id, id, 1).unwrap().len(), 1);
    }
}

#[test]
fn identifiers_are_case_sensitive_and_not_trimmed() {
    let b = broker(3);
    assert!(b.create("orders", 1).unwrap());
    assert!(b.create("Orders", 2).unwrap());
    assert!(b.create("ORDERS", 3).unwrap());
    assert_eq!(b.describe().topics.len(), 3);
    assert_eq!(b.join("Orders", "g", "m").unwrap(), vec![0, 1]);
    assert_eq!(b.join("Orders", "G", "m").unwrap(), vec![0, 1]);
    assert_eq!(b.join("Orders", "g", "M").unwrap(), vec![0]);
    assert_eq!(b.assignment("Orders", "g", "m").unwrap(), vec![1]);
    // Padding is not trimmed away: it makes the identifier invalid.
    assert_invalid(&b, |b| b.publish(" orders", 0, "x"));
    assert_invalid(&b, |b| b.join("orders", "g ", "m"));
}

#[test]
fn unknown_topic_is_invalid_argument_on_every_method_but_create() {
    let b = populated();
    assert_invalid(&b, |b| b.publish("nope", 0, "x"));
    assert_invalid(&b, |b| b.publish_keyed("nope", Some(b"k"), "x"));
    assert_invalid(&b, |b| b.publish_keyed("nope", None, "x"));
    assert_invalid(&b, |b| b.end_offset("nope", 0));
    assert_every_member_call_invalid(&b, "nope", "g", "a");
    // Topics are case-sensitive: "T" is unknown too.
    assert_every_member_call_invalid(&b, "T", "g", "a");
    assert!(b.create("nope", 1).unwrap());
}

#[test]
fn partition_count_must_be_1_to_64() {
    let b = populated();
    for bad in [i32::MIN, -1, 0, 65, 1000, i32::MAX] {
        assert_invalid(&b, |b| b.create("fresh", bad));
        assert_invalid(&b, |b| b.create_with("fresh", bad, KeyHash::Fnv1a));
        // Also on a duplicate: validation comes before the duplicate check.
        assert_invalid(&b, |b| b.create("t", bad));
    }
    assert!(b.create("one", 1).unwrap());
    assert!(b.create("max", 64).unwrap());
    assert_eq!(
        b.join("max", "g", "m").unwrap(),
        (0..64).collect::<Vec<_>>()
    );
}

#[test]
fn poll_max_records_must_be_1_to_64() {
    let b = populated();
    for bad in [i32::MIN, -1, 0, 65, i32::MAX] {
        assert_invalid(&b, |b| b.poll("t", "g", "b", bad));
        assert_invalid(&b, |b| b.poll_limited("t", "g", "b", bad, None));
        // Also for an absent group or member, which would otherwise answer [].
        assert_invalid(&b, |b| b.poll("t", "nogroup", "b", bad));
    }
    assert_eq!(b.poll("t", "g", "b", 64).unwrap().len(), 1);
}

#[test]
fn fetch_max_records_must_be_positive_and_allows_at_least_1000() {
    let b = populated();
    for bad in [i32::MIN, -1, 0, MAX_FETCH_RECORDS + 1, i32::MAX] {
        assert_invalid(&b, |b| b.fetch("t", "g", "b", bad));
        assert_invalid(&b, |b| b.fetch_limited("t", "g", "b", bad, None));
        assert_invalid(&b, |b| b.fetch("t", "nogroup", "b", bad));
    }
    assert_eq!(b.fetch("t", "g", "b", 1000).unwrap().len(), 1);
    assert_eq!(b.fetch("t", "g", "b", MAX_FETCH_RECORDS).unwrap().len(), 0);
}

#[test]
fn partition_outside_the_topic_is_invalid_argument() {
    let b = populated();
    for bad in [i32::MIN, -1, 2, 3, 64, i32::MAX] {
        assert_invalid(&b, |b| b.publish("t", bad, "x"));
        assert_invalid(&b, |b| b.ack("t", "g", "a", bad, 0));
        assert_invalid(&b, |b| b.retry("t", "g", "a", bad, 0));
        assert_invalid(&b, |b| b.committed("t", "g", bad));
        assert_invalid(&b, |b| b.committed("t", "nogroup", bad));
        assert_invalid(&b, |b| b.end_offset("t", bad));
        assert_invalid(&b, |b| {
            b.commit("t", "g", "a", Some(BTreeMap::from([(0, 0), (bad, 0)])))
        });
        // A non-member naming a bad partition: the bad argument wins over NotAssigned.
        assert_invalid(&b, |b| {
            b.commit("t", "nogroup", "a", Some(BTreeMap::from([(bad, 0)])))
        });
    }
}

#[test]
fn negative_ack_or_retry_offset_is_invalid_argument() {
    let b = populated();
    for bad in [-1, -2, i64::MIN] {
        assert_invalid(&b, |b| b.ack("t", "g", "a", 0, bad));
        assert_invalid(&b, |b| b.retry("t", "g", "a", 0, bad));
        // Even where a non-negative offset would merely be a mismatch.
        assert_invalid(&b, |b| b.ack("t", "nogroup", "z", 1, bad));
        assert_invalid(&b, |b| b.retry("t", "nogroup", "z", 1, bad));
    }
}

#[test]
fn negative_commit_offset_is_invalid_argument() {
    let b = populated();
    for bad in [-1, i64::MIN] {
        // b owns partition 1; a owns partition 0.
        assert_invalid(&b, |b| {
            b.commit("t", "g", "b", Some(BTreeMap::from([(1, bad)])))
        });
        assert_invalid(&b, |b| {
            b.commit("t", "g", "a", Some(BTreeMap::from([(0, 1), (1, bad)])))
        });
    }
}

#[test]
fn invalid_publish_keyed_does_not_advance_round_robin() {
    let b = broker(5);
    b.create("t", 3).unwrap();
    assert_eq!(b.publish_keyed("t", None, "x").unwrap(), (0, 0));
    assert_invalid(&b, |b| b.publish_keyed("T", None, "x"));
    assert_invalid(&b, |b| b.publish_keyed("", None, "x"));
    assert_eq!(b.publish_keyed("t", None, "x").unwrap(), (1, 0));
}

#[test]
fn join_with_a_different_assignor_is_invalid_and_changes_nothing() {
    let b = populated(); // "g" was created round-robin by join
    assert_invalid(&b, |b| b.join_with("t", "g", "c", Assignor::Range));
    // Even for a member already present.
    assert_invalid(&b, |b| b.join_with("t", "g", "a", Assignor::Range));
    assert_eq!(
        b.join_with("t", "g", "a", Assignor::RoundRobin).unwrap(),
        vec![0]
    );
}

/// A broker taking Kafka's names, with a topic "orders.v1" of 2 partitions.
fn kafka_names() -> EventBroker {
    let state = BrokerState::new(3).unwrap().with_names(NameRules::Kafka);
    let b = EventBroker::from_state(state);
    assert!(b.create("orders.v1", 2).unwrap());
    b
}

#[test]
fn a_broker_taking_kafkas_names_takes_them_in_every_call() {
    let b = kafka_names();
    let long = "x.".repeat(124) + "y";
    assert_eq!(long.len(), 249);
    assert!(b.create(&long, 1).unwrap());
    assert_eq!(b.publish("orders.v1", 0, "a").unwrap(), 0);
    assert_eq!(
        b.join("orders.v1", "billing.eu", "worker.1").unwrap(),
        [0, 1]
    );
    let polled = b.poll("orders.v1", "billing.eu", "worker.1", 1).unwrap();
    assert_eq!(polled.len(), 1);
    assert!(b.ack("orders.v1", "billing.eu", "worker.1", 0, 0).unwrap());
    let dead_letter = TopicName::with_rules("orders.v1.dlq", NameRules::Kafka).unwrap();
    b.join_group(
        "orders.v1",
        "audit.eu",
        "a",
        None,
        &[
            GroupSetting::MaxDeliveries(3),
            GroupSetting::DeadLetter(dead_letter),
        ],
    )
    .unwrap();
    let names: Vec<String> = b.describe().topics.into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["orders.v1".to_owned(), long]);
    // Still refused, as names of topics, groups and members: `.` and `..`, and longer names.
    for bad in [".", "..", &"x".repeat(250), "a b", "a/b"] {
        let Err(BrokerError::InvalidArgument(why)) = b.create(bad, 1) else {
            panic!("{bad:?} created");
        };
        assert!(why.contains("not a valid name"), "{why}");
        assert_every_member_call_invalid(&b, "orders.v1", bad, "m");
        assert_invalid(&b, |b| b.join("orders.v1", "billing.eu", bad));
        assert_invalid(&b, |b| b.poll("orders.v1", "billing.eu", bad, 1));
        assert_invalid(&b, |b| b.leave("orders.v1", "billing.eu", bad));
    }
}

#[test]
fn a_broker_with_its_own_names_refuses_kafkas_wider_ones_even_from_the_wire() {
    let b = broker(3);
    assert_invalid(&b, |b| b.create("orders.v1", 1));
    b.create("t", 1).unwrap();
    // A dead-letter topic decoded from the wire may hold any name some broker takes.
    let dead_letter = TopicName::with_rules("t.dlq", NameRules::Kafka).unwrap();
    assert!(
        TopicName::new("t.dlq").is_err(),
        "not a name of these rules"
    );
    assert_invalid(&b, |b| {
        b.join_group(
            "t",
            "g",
            "m",
            None,
            &[GroupSetting::DeadLetter(dead_letter)],
        )
    });
}

#[test]
fn a_dead_letter_topic_is_created_whatever_the_rules_in_force_when_a_record_moves() {
    // The rules narrowed after the group took its dead-letter topic: the record still moves,
    // as time passing (which carries no rules) moves it on every replica.
    for narrowed in [false, true] {
        let b = kafka_names();
        let dead_letter = TopicName::with_rules("orders.v1.dlq", NameRules::Kafka).unwrap();
        let settings = [
            GroupSetting::AckTimeoutMs(10),
            GroupSetting::MaxDeliveries(1),
            GroupSetting::DeadLetter(dead_letter),
        ];
        b.join_group("orders.v1", "g", "m", None, &settings)
            .unwrap();
        b.publish("orders.v1", 0, "a").unwrap();
        assert_eq!(b.poll("orders.v1", "g", "m", 1).unwrap().len(), 1);
        if narrowed {
            b.with_state(|state| state.set_names(NameRules::Broker));
        }
        let names = |b: &EventBroker| -> Vec<String> {
            b.describe().topics.into_iter().map(|t| t.name).collect()
        };
        // The delivery's acknowledgement timeout passes: the record moves.
        let clock = b.with_state(|state| state.clock_ms());
        b.with_state(|state| state.advance_clock(clock + 1_000))
            .unwrap();
        assert_eq!(
            names(&b),
            ["orders.v1", "orders.v1.dlq"],
            "narrowed: {narrowed}"
        );
    }
}

#[test]
fn narrower_names_keep_the_topics_named_otherwise_but_refuse_calls_naming_them() {
    let b = kafka_names();
    b.publish("orders.v1", 1, "a").unwrap();
    // A group whose dead-letter topic has a Kafka name travels in the image too.
    let dead_letter = TopicName::with_rules("orders.v1.dlq", NameRules::Kafka).unwrap();
    let settings = [
        GroupSetting::MaxDeliveries(1),
        GroupSetting::DeadLetter(dead_letter),
    ];
    b.join_group("orders.v1", "g", "m", None, &settings)
        .unwrap();
    // An image does not carry the rules: the broker opening it sets them.
    let image = b.with_state(|state| state.to_image());
    let reopened = EventBroker::from_state(BrokerState::from_image(image.clone(), None).unwrap());
    assert_eq!(reopened.describe().topics[0].name, "orders.v1");
    assert_invalid(&reopened, |b| b.publish("orders.v1", 0, "b"));
    let state = BrokerState::from_image(image, None).unwrap();
    let widened = EventBroker::from_state(state.with_names(NameRules::Kafka));
    assert_eq!(widened.publish("orders.v1", 1, "b").unwrap(), 1);
}
