//! `ack_and_poll`: acknowledgements then a poll, in one atomic call.

use super::{assert_invalid, broker, positions};
use crate::MAX_ACKS;

#[test]
fn acks_the_last_round_and_polls_the_next_in_one_call() {
    let broker = broker(10);
    broker.create("t", 2).unwrap();
    for partition in [0, 0, 1, 1] {
        broker.publish("t", partition, "x").unwrap();
    }
    broker.join("t", "g", "m").unwrap();
    let (acked, first) = broker.ack_and_poll("t", "g", "m", &[], 64).unwrap();
    assert!(acked.is_empty());
    assert_eq!(positions(&first), [(0, 0), (1, 0)]);
    // Only partition 0's delivery is settled: partition 1 stays in flight, so the poll that
    // follows takes the next record of partition 0 only.
    let (acked, second) = broker
        .ack_and_poll("t", "g", "m", &[(0, 0), (1, 5)], 64)
        .unwrap();
    assert_eq!(acked, [true, false]);
    assert_eq!(positions(&second), [(0, 1)]);
    let (acked, third) = broker
        .ack_and_poll("t", "g", "m", &[(0, 1), (1, 0)], 64)
        .unwrap();
    assert_eq!(acked, [true, true]);
    assert_eq!(positions(&third), [(1, 1)]);
}

#[test]
fn the_acks_are_applied_before_the_poll_even_when_it_takes_nothing() {
    let broker = broker(10);
    broker.create("t", 1).unwrap();
    broker.publish("t", 0, "x").unwrap();
    broker.join("t", "g", "m").unwrap();
    let (_, taken) = broker.ack_and_poll("t", "g", "m", &[], 1).unwrap();
    assert_eq!(positions(&taken), [(0, 0)]);
    let (acked, next) = broker.ack_and_poll("t", "g", "m", &[(0, 0)], 1).unwrap();
    assert_eq!((acked, next.len()), (vec![true], 0));
    assert_eq!(broker.lag("t", "g").unwrap()[0].lag, 0);
}

#[test]
fn one_bad_argument_refuses_the_whole_call() {
    let broker = broker(10);
    broker.create("t", 2).unwrap();
    broker.publish("t", 0, "x").unwrap();
    broker.join("t", "g", "m").unwrap();
    broker.poll("t", "g", "m", 1).unwrap();
    // The first ack would match, but the second names a partition the topic does not have:
    // nothing is acknowledged and nothing is polled.
    assert_invalid(&broker, |b| {
        b.ack_and_poll("t", "g", "m", &[(0, 0), (2, 0)], 1)
    });
    assert_invalid(&broker, |b| {
        b.ack_and_poll("t", "g", "m", &[(0, 0), (0, -1)], 1)
    });
    assert_invalid(&broker, |b| b.ack_and_poll("t", "g", "m", &[(0, 0)], 0));
    assert_invalid(&broker, |b| b.ack_and_poll("t", "g", "m", &[(0, 0)], 65));
    assert_invalid(&broker, |b| b.ack_and_poll("t", "g", "m m", &[(0, 0)], 1));
    assert_invalid(&broker, |b| b.ack_and_poll("nope", "g", "m", &[], 1));
    let too_many = vec![(0, 0); MAX_ACKS + 1];
    assert_invalid(&broker, |b| b.ack_and_poll("t", "g", "m", &too_many, 1));
    let at_most = vec![(0, 0); MAX_ACKS];
    let (acked, _) = broker.ack_and_poll("t", "g", "m", &at_most, 1).unwrap();
    assert_eq!(acked.iter().filter(|&&hit| hit).count(), 1);
}
