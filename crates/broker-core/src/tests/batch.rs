//! `publish_batch`: the same placement as one publish per record, validated as a whole.

use super::*;
use crate::{KeyHash, PublishRecord, MAX_BATCH_RECORDS};

#[test]
fn a_batch_places_each_record_as_the_single_publishes_would() {
    let one_by_one = broker(10);
    let batched = broker(10);
    for b in [&one_by_one, &batched] {
        b.create_with("t", 3, KeyHash::Murmur2).unwrap();
    }
    let expected = vec![
        (2, one_by_one.publish("t", 2, "explicit").unwrap()),
        one_by_one.publish_keyed("t", Some(b"21"), "keyed").unwrap(),
        one_by_one
            .publish_keyed("t", None, "round-robin 1")
            .unwrap(),
        one_by_one
            .publish_keyed("t", None, "round-robin 2")
            .unwrap(),
    ];
    let placed = batched
        .publish_batch(
            "t",
            vec![
                PublishRecord::to_partition(2, "explicit"),
                PublishRecord::keyed(Some(b"21"), "keyed"),
                PublishRecord::keyed(None, "round-robin 1"),
                PublishRecord::keyed(None, "round-robin 2"),
            ],
        )
        .unwrap();
    assert_eq!(placed, expected);
    assert_eq!(batched.describe(), one_by_one.describe());
}

#[test]
fn a_full_partition_answers_minus_one_for_that_record_only() {
    let b = broker(1);
    b.create("t", 2).unwrap();
    let placed = b
        .publish_batch(
            "t",
            vec![
                PublishRecord::to_partition(0, "a"),
                PublishRecord::to_partition(0, "b"),
                PublishRecord::to_partition(1, "c"),
            ],
        )
        .unwrap();
    assert_eq!(placed, vec![(0, 0), (0, -1), (1, 0)]);
    assert_eq!(b.end_offset("t", 0).unwrap(), 1, "no offset consumed");
}

#[test]
fn an_invalid_record_refuses_the_whole_batch_without_side_effects() {
    let b = broker(10);
    b.create("t", 2).unwrap();
    assert_invalid(&b, |b| {
        b.publish_batch(
            "t",
            vec![
                PublishRecord::keyed(None, "would advance round-robin"),
                PublishRecord::to_partition(2, "no such partition"),
            ],
        )
    });
    assert_invalid(&b, |b| {
        b.publish_batch("t", vec![PublishRecord::to_partition(-1, "x")])
    });
    assert_invalid(&b, |b| b.publish_batch("nope", Vec::new()));
    assert_invalid(&b, |b| {
        b.publish_batch(
            "t",
            vec![PublishRecord::to_partition(0, ""); MAX_BATCH_RECORDS + 1],
        )
    });
    assert_eq!(
        b.publish_keyed("t", None, "x").unwrap().0,
        0,
        "round-robin untouched"
    );
}

#[test]
fn an_empty_batch_publishes_nothing() {
    let b = broker(10);
    b.create("t", 1).unwrap();
    assert_eq!(b.publish_batch("t", Vec::new()).unwrap(), Vec::new());
}

#[test]
fn until_full_a_partition_takes_nothing_after_the_record_it_refused() {
    use crate::{Discard, Retention, TopicSetting};
    let b = broker(10);
    let settings = [
        TopicSetting::Retention(Retention::Limits),
        TopicSetting::MaxBytes(10),
        TopicSetting::Discard(Discard::New),
    ];
    b.create_topic("t", 2, KeyHash::default(), &settings)
        .unwrap();
    let records = || {
        vec![
            PublishRecord::to_partition(0, "aaaaa"),
            PublishRecord::to_partition(0, "bbbbbbbb"),
            PublishRecord::to_partition(1, "dd"),
            // It would fit after "aaaaa", but "bbbbbbbb" before it was refused.
            PublishRecord::to_partition(0, "cc"),
        ]
    };
    let placed = b.publish_until_full("t", records()).unwrap();
    assert_eq!(placed, vec![(0, 0), (0, -1), (1, 0), (0, -1)]);
    assert_eq!(b.end_offset("t", 0).unwrap(), 1);
    // A batch publish tries every record on its own, and stores the small one.
    let other = broker(10);
    other
        .create_topic("t", 2, KeyHash::default(), &settings)
        .unwrap();
    let placed = other.publish_batch("t", records()).unwrap();
    assert_eq!(placed, vec![(0, 0), (0, -1), (1, 0), (0, 1)]);
}

#[test]
fn every_record_of_a_batch_is_reported_appended_even_one_its_own_batch_pushed_out() {
    let mut state = crate::BrokerState::new(10).unwrap();
    let one_record = [
        crate::TopicSetting::Retention(crate::Retention::Limits),
        crate::TopicSetting::MaxRecords(1),
    ];
    state
        .create("t", 1, KeyHash::default(), &one_record)
        .unwrap();
    state.record_appends(true);
    let placed = state
        .publish_batch(
            "t",
            ["a", "b", "c"]
                .map(|payload| PublishRecord::to_partition(0, payload))
                .to_vec(),
        )
        .unwrap();
    assert_eq!(placed, [(0, 0), (0, 1), (0, 2)]);
    let appended: Vec<(u32, i64, bytes::Bytes)> = state
        .take_appended()
        .into_iter()
        .map(|noted| (noted.log.partition, noted.offset, noted.record.payload))
        .collect();
    assert_eq!(
        appended,
        [(0, 0, "a".into()), (0, 1, "b".into()), (0, 2, "c".into())]
    );
    state.record_appends(false);
    state.publish("t", 0, "d".into()).unwrap();
    assert!(
        state.take_appended().is_empty(),
        "nothing noted once asked not to"
    );
}
