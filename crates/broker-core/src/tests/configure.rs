//! Changing an existing topic's settings ([`Command::ConfigureTopic`]): what changes, what
//! cannot, and what leaves the partitions at once.

use super::*;
use crate::{Command, Discard, KeyHash, Outcome, Retention, TopicSetting};

/// A broker with topic `t` (one partition) created with `settings`, holding `count` records of
/// 10 bytes each, published at times 0, 1, 2, ...
fn topic_with(settings: &[TopicSetting], count: i64) -> EventBroker {
    let b = broker(100);
    b.create_topic("t", 1, KeyHash::default(), settings)
        .unwrap();
    for offset in 0..count {
        b.advance_clock(offset).unwrap();
        assert_eq!(b.publish("t", 0, "0123456789").unwrap(), offset);
    }
    b
}

/// Applies `ConfigureTopic` to `t`: the settings it answers.
fn configure(b: &EventBroker, settings: &[TopicSetting]) -> Result<Vec<TopicSetting>, BrokerError> {
    let command = Command::ConfigureTopic {
        topic: "t".into(),
        settings: settings.to_vec(),
    };
    b.apply(command).map(|outcome| match outcome {
        Outcome::TopicSettings(settings) => settings,
        other => panic!("ConfigureTopic answered {other:?}"),
    })
}

/// `t`'s partition 0 as (earliest offset, end offset, retained bytes).
fn partition(b: &EventBroker) -> (i64, i64, u64) {
    let description = b.describe();
    let p = &description.topics[0].partitions[0];
    (p.earliest_offset, p.end_offset, p.retained_bytes)
}

const LIMITS: TopicSetting = TopicSetting::Retention(Retention::Limits);

#[test]
fn a_change_keeps_the_settings_it_does_not_name_and_answers_them_all() {
    let b = topic_with(&[LIMITS, TopicSetting::MaxAgeMs(60_000)], 0);
    let now = configure(&b, &[TopicSetting::MaxRecords(5)]).unwrap();
    let expected = vec![
        LIMITS,
        TopicSetting::MaxRecords(5),
        TopicSetting::MaxAgeMs(60_000),
    ];
    assert_eq!(now, expected);
    assert_eq!(b.describe().topics[0].settings, expected);
}

#[test]
fn the_retention_cannot_change_and_the_refusal_names_both() {
    let b = topic_with(&[], 3);
    assert_invalid(&b, |b| configure(b, &[LIMITS]));
    let refused = configure(&b, &[LIMITS]).unwrap_err().to_string();
    assert!(
        refused.contains("interest retention") && refused.contains("limits retention"),
        "{refused}"
    );
}

#[test]
fn settings_refused_at_creation_are_refused_by_a_change_and_change_nothing() {
    let b = topic_with(&[LIMITS, TopicSetting::MaxRecords(5)], 3);
    assert_invalid(&b, |b| configure(b, &[TopicSetting::MaxRecords(0)]));
    assert_invalid(&b, |b| configure(b, &[TopicSetting::MaxBytes(0)]));
    let twice = [TopicSetting::MaxBytes(10), TopicSetting::MaxBytes(20)];
    assert_invalid(&b, |b| configure(b, &twice));
    let interest = topic_with(&[], 0);
    let old = [TopicSetting::Discard(Discard::Old)];
    assert_invalid(&interest, |b| configure(b, &old));
    assert_invalid(&b, |b| {
        b.apply(Command::ConfigureTopic {
            topic: "nosuch".into(),
            settings: Vec::new(),
        })
    });
}

#[test]
fn a_lowered_max_records_discards_the_oldest_records_at_once_with_discard_old() {
    let b = topic_with(&[LIMITS], 5);
    b.join("t", "g", "m").unwrap();
    assert_eq!(b.with_state(|state| state.retained_bytes()), 50);
    configure(&b, &[TopicSetting::MaxRecords(2)]).unwrap();
    assert_eq!(partition(&b), (3, 5, 20));
    assert_eq!(
        b.with_state(|state| state.retained_bytes()),
        20,
        "the memory budget counts what left"
    );
    // The group that had consumed nothing skips what left.
    assert_eq!(b.lag("t", "g").unwrap()[0].skipped, 3);
}

#[test]
fn a_lowered_max_bytes_discards_the_oldest_records_at_once_with_discard_old() {
    let b = topic_with(&[LIMITS], 5);
    configure(&b, &[TopicSetting::MaxBytes(25)]).unwrap();
    assert_eq!(partition(&b), (3, 5, 20));
    assert_eq!(b.with_state(|state| state.retained_bytes()), 20);
}

#[test]
fn a_lowered_max_age_lets_older_records_leave_at_once() {
    // Records at times 0 to 4, the clock at 4: an age of 2 ms keeps those at 2 and later.
    let b = topic_with(&[LIMITS], 5);
    configure(&b, &[TopicSetting::MaxAgeMs(2)]).unwrap();
    assert_eq!(partition(&b), (2, 5, 30));
    assert_eq!(b.with_state(|state| state.retained_bytes()), 30);
    let interest = topic_with(&[], 5);
    configure(&interest, &[TopicSetting::MaxAgeMs(2)]).unwrap();
    assert_eq!(
        partition(&interest),
        (2, 5, 30),
        "age applies in either retention"
    );
}

#[test]
fn lowered_limits_with_discard_new_lose_nothing_and_refuse_new_records() {
    let b = topic_with(&[LIMITS, TopicSetting::Discard(Discard::New)], 5);
    configure(
        &b,
        &[TopicSetting::MaxRecords(2), TopicSetting::MaxBytes(25)],
    )
    .unwrap();
    assert_eq!(partition(&b), (0, 5, 50));
    assert_eq!(b.publish("t", 0, "x").unwrap(), -1);
}

#[test]
fn lowered_limits_with_interest_retention_lose_nothing_until_consumers_catch_up() {
    let b = topic_with(&[], 5);
    b.join("t", "g", "m").unwrap();
    configure(&b, &[TopicSetting::MaxRecords(2)]).unwrap();
    assert_eq!(partition(&b), (0, 5, 50));
    assert_eq!(b.publish("t", 0, "x").unwrap(), -1, "full until consumed");
    b.commit("t", "g", "m", Some([(0, 4)].into())).unwrap();
    assert_eq!(b.publish("t", 0, "x").unwrap(), 5, "room once consumed");
    assert_eq!(partition(&b).0, 4);
}

#[test]
fn a_raised_limit_makes_room_for_new_records() {
    let b = topic_with(
        &[
            LIMITS,
            TopicSetting::MaxRecords(2),
            TopicSetting::Discard(Discard::New),
        ],
        2,
    );
    assert_eq!(b.publish("t", 0, "x").unwrap(), -1);
    configure(&b, &[TopicSetting::MaxRecords(3)]).unwrap();
    assert_eq!(b.publish("t", 0, "x").unwrap(), 2);
}
