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

/// Every command that publishes lists its records in the order its outcome places them: each
/// taken out and put back from what the broker stored is the command it was, and a record
/// with a key or headers cannot be put into a command whose records have none.
#[test]
fn a_published_record_taken_out_of_its_command_is_put_back_from_what_was_stored() {
    use crate::{Command, PartitionBatch};
    let record = |n: u8| PublishRecord {
        partition: Some(i32::from(n % 2)),
        key: n.is_multiple_of(3).then(|| bytes::Bytes::from(vec![n; 2])),
        payload: bytes::Bytes::from(vec![n; 5]),
        headers: vec![crate::Header {
            name: format!("h{n}"),
            value: Some(bytes::Bytes::from_static(b"v")),
        }],
        timestamp_ms: Some(i64::from(n)),
    };
    let commands = [
        Command::Publish {
            topic: "t".into(),
            partition: 1,
            payload: "one".into(),
        },
        Command::PublishKeyed {
            topic: "t".into(),
            key: Some("k".into()),
            payload: "keyed".into(),
        },
        Command::PublishBatch {
            topic: "t".into(),
            records: (0..4).map(record).collect(),
        },
        Command::PublishUntilFull {
            topic: "t".into(),
            records: (4..7).map(record).collect(),
        },
        Command::PublishIdempotent {
            topic: "t".into(),
            producer: 9,
            batches: vec![PartitionBatch {
                partition: 0,
                sequence: 0,
                records: (7..9)
                    .map(|n| PublishRecord {
                        partition: None,
                        ..record(n)
                    })
                    .collect(),
            }],
        },
    ];
    for command in commands {
        let mut state = crate::BrokerState::new(10).unwrap();
        state.create("t", 2, KeyHash::default(), &[]).unwrap();
        state.record_appends(true);
        let outcome = state.apply_at(100, command.clone()).unwrap();
        let placements = command.placements(&outcome).unwrap();
        let stored = state.take_appended();
        assert_eq!(stored.len(), placements.len(), "{command:?}");
        for (noted, &(partition, offset)) in stored.iter().zip(&placements) {
            assert_eq!(
                (noted.log.partition as i32, noted.offset),
                (partition, offset)
            );
        }
        let mut logged = command.clone();
        for parts in &mut logged.published_records_mut() {
            parts.take();
        }
        assert_ne!(logged, command);
        for (parts, noted) in logged.published_records_mut().iter_mut().zip(&stored) {
            assert!(parts.put(noted.record.clone()));
        }
        assert_eq!(logged, command);
    }
    let mut single = Command::Publish {
        topic: "t".into(),
        partition: 0,
        payload: "p".into(),
    };
    let keyed = crate::image::RecordImage {
        key: Some("k".into()),
        payload: "p".into(),
        headers: Vec::new(),
        timestamp_ms: 0,
    };
    assert!(!single.published_records_mut()[0].put(keyed));
    assert!(Command::Describe { topic: None }
        .published_records_mut()
        .is_empty());
}
