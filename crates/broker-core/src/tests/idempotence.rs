//! What the broker remembers of an idempotent producer's batches, and how it keeps it in an
//! image.

use super::broker;
use crate::{BrokerState, EventBroker, PartitionBatch, ProducerState, PublishRecord};

const PRODUCER: u64 = 7;

/// A batch of `count` records for `partition`, numbered from `sequence`.
fn batch(partition: i32, sequence: u64, count: usize) -> PartitionBatch {
    PartitionBatch {
        partition,
        sequence,
        records: (0..count)
            .map(|i| PublishRecord::to_partition(partition, format!("r{}", sequence + i as u64)))
            .collect(),
    }
}

/// Publishes `batches` of [`PRODUCER`] to `t`.
fn publish(b: &EventBroker, batches: Vec<PartitionBatch>) -> Vec<(i32, i64)> {
    b.publish_idempotent("t", PRODUCER, batches).unwrap()
}

/// A broker whose topic `t` (2 partitions, 100 records each) holds two batches of
/// [`PRODUCER`] on partition 0 behind records of another publisher, and one on partition 1.
fn with_batches() -> (EventBroker, Vec<(i32, i64)>) {
    let b = broker(100);
    b.create("t", 2).unwrap();
    b.publish("t", 0, "other").unwrap();
    let mut placed = publish(&b, vec![batch(0, 0, 3), batch(1, 0, 2)]);
    b.publish("t", 0, "other").unwrap();
    placed.extend(publish(&b, vec![batch(0, 3, 4)]));
    (b, placed)
}

#[test]
fn a_repeated_batch_is_answered_with_the_offsets_its_records_got() {
    let (b, placed) = with_batches();
    assert_eq!(
        placed,
        vec![
            (0, 1),
            (0, 2),
            (0, 3),
            (1, 0),
            (1, 1),
            (0, 5),
            (0, 6),
            (0, 7),
            (0, 8)
        ]
    );
    let before = b.describe();
    // The batches again, and a repeat that starts inside the first one.
    let again = publish(&b, vec![batch(0, 0, 3), batch(1, 0, 2)]);
    assert_eq!(again, placed[..5]);
    assert_eq!(publish(&b, vec![batch(0, 3, 4)]), placed[5..]);
    assert_eq!(
        publish(&b, vec![batch(0, 2, 3)]),
        vec![(0, 3), (0, 5), (0, 6)]
    );
    assert_eq!(b.describe(), before, "a repeat stored something");
    // A repeat that runs past what was stored stores only the new records.
    assert_eq!(
        publish(&b, vec![batch(0, 6, 3)]),
        vec![(0, 8), (0, 9), (0, 10)]
    );
}

#[test]
fn the_records_of_a_batch_refused_as_full_are_not_remembered_as_stored() {
    let b = broker(3);
    b.create("t", 1).unwrap();
    assert_eq!(
        publish(&b, vec![batch(0, 0, 5)]),
        vec![(0, 0), (0, 1), (0, 2), (0, -1), (0, -1)]
    );
    // The stored ones are answered again; the refused ones are still expected next.
    assert_eq!(publish(&b, vec![batch(0, 1, 2)]), vec![(0, 1), (0, 2)]);
    let gap = b
        .publish_idempotent("t", PRODUCER, vec![batch(0, 4, 1)])
        .unwrap_err();
    assert!(gap.to_string().contains("expects 3"), "{gap}");
}

#[test]
fn an_image_lists_the_offsets_of_each_recent_batch_and_answers_repeats_once_read_back() {
    let (b, placed) = with_batches();
    let image = b.with_state(|state| state.to_image());
    let producer = &image.topics[0].1.producers[0];
    assert_eq!(producer.id, PRODUCER);
    assert_eq!(
        producer.partitions[0].recent,
        vec![(0, vec![1, 2, 3]), (3, vec![5, 6, 7, 8])]
    );
    assert_eq!(producer.partitions[1].recent, vec![(0, vec![0, 1])]);
    let back = EventBroker::from_state(BrokerState::from_image(image, None).unwrap());
    assert_eq!(
        publish(&back, vec![batch(0, 0, 3), batch(1, 0, 2)]),
        placed[..5]
    );
    assert_eq!(publish(&back, vec![batch(0, 3, 4)]), placed[5..]);
    assert_eq!(back.describe(), b.describe());
}

#[test]
fn an_image_whose_batch_offsets_do_not_follow_each_other_is_refused() {
    let (b, _) = with_batches();
    for offsets in [vec![5, 6, 8, 9], vec![i64::MAX, i64::MIN], vec![-2, -1]] {
        let mut image = b.with_state(|state| state.to_image());
        image.topics[0].1.producers[0].partitions[0].recent[1].1 = offsets;
        let refused = BrokerState::from_image(image, None).unwrap_err();
        assert!(refused.contains("bad sequences"), "{refused}");
    }
}

#[test]
fn an_image_batch_that_stored_nothing_is_left_out() {
    let (b, placed) = with_batches();
    let mut image = b.with_state(|state| state.to_image());
    image.topics[0].1.producers[0].partitions[0]
        .recent
        .insert(1, (3, Vec::new()));
    let back = EventBroker::from_state(BrokerState::from_image(image, None).unwrap());
    assert_eq!(publish(&back, vec![batch(0, 3, 4)]), placed[5..]);
    assert_eq!(
        back.with_state(|state| state.to_image()),
        b.with_state(|state| state.to_image())
    );
}

#[test]
fn each_partition_lists_the_producers_it_remembers_with_their_next_sequence_and_last_offset() {
    let (b, _) = with_batches();
    b.advance_clock(5_000).unwrap();
    b.publish_idempotent("t", 3, vec![batch(0, 0, 2)]).unwrap();
    let state = |producer, next_sequence, last_offset, last_seen_ms| ProducerState {
        producer,
        next_sequence,
        last_offset,
        last_seen_ms,
    };
    assert_eq!(
        b.producers("t", 0).unwrap(),
        vec![state(3, 2, Some(10), 5_000), state(PRODUCER, 7, Some(8), 0)]
    );
    assert_eq!(
        b.producers("t", 1).unwrap(),
        vec![state(PRODUCER, 2, Some(1), 0)]
    );
    // Read back from an image, the same.
    let back = EventBroker::from_state(
        BrokerState::from_image(b.with_state(|state| state.to_image()), None).unwrap(),
    );
    assert_eq!(
        back.producers("t", 0).unwrap(),
        b.producers("t", 0).unwrap()
    );
    for (topic, partition, refusal) in [
        ("t", 2, "partition"),
        ("t", -1, "partition"),
        ("none", 0, "topic"),
        ("bad name", 0, "topic"),
    ] {
        let refused = b.producers(topic, partition).unwrap_err();
        assert!(refused.to_string().contains(refusal), "{refused}");
    }
}

#[test]
fn a_producer_whose_records_were_all_refused_has_no_last_offset() {
    let b = broker(1);
    b.create("t", 1).unwrap();
    b.publish("t", 0, "fills it").unwrap();
    assert_eq!(publish(&b, vec![batch(0, 0, 2)]), vec![(0, -1), (0, -1)]);
    assert_eq!(
        b.producers("t", 0).unwrap(),
        vec![ProducerState {
            producer: PRODUCER,
            next_sequence: 0,
            last_offset: None,
            last_seen_ms: 0,
        }]
    );
}
