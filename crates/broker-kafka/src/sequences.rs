//! Kafka's sequence numbers of idempotent producers on the broker's. Kafka numbers a
//! producer's records per partition from 0 to `i32::MAX` and then from 0 again; the broker
//! counts them on without end (a `u64`). The listener gives each Kafka sequence number the
//! broker's number nearest to where the producer stands on the partition, which it remembers
//! for producers that came within reach of the wrap: a record numbered 5 after 2^31 records is
//! the broker's 2^31 + 5, so that a long-lived producer goes on past the wrap, and a batch it
//! sends again there is still answered with the offsets it got the first time.
//!
//! What it remembers lives in the server's memory: after a restart, or on a cluster node that
//! has just become a partition's leader, a producer already past its wrap is answered
//! `OUT_OF_ORDER_SEQUENCE_NUMBER` once and goes on under a new epoch, as Kafka's clients do
//! after any sequence error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// How many sequence numbers Kafka's producers use before numbering from 0 again.
const SEQUENCE_SPAN: u64 = 1 << 31;

/// From this many records on a partition, a producer's position is remembered: far enough
/// from the wrap that no batch in flight reaches it unremembered.
const REMEMBER_FROM: u64 = SEQUENCE_SPAN / 2;

/// How many positions one generation of the table holds; the table holds two at most.
const GENERATION: usize = 50_000;

/// The broker's producer (see `records::native_producer`) on one partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Position {
    producer: u64,
    topic: String,
    partition: i32,
}

/// Where idempotent producers that passed 2^30 records on a partition stand there: the
/// broker's sequence number of their next record. At most twice 50,000 positions, those used
/// least recently forgotten first. Until the first producer gets that far, a lookup takes no
/// lock and allocates nothing.
#[derive(Debug, Default)]
pub struct ProducerSequences {
    table: Mutex<Generations>,
    /// Whether the table has ever held a position.
    used: AtomicBool,
}

/// Positions in two generations: a position used is moved to the current one, and once it is
/// full the previous one is forgotten. A bound without a list to keep in order.
#[derive(Debug, Default)]
struct Generations {
    current: HashMap<Position, u64>,
    previous: HashMap<Position, u64>,
}

impl Generations {
    fn get(&mut self, position: &Position) -> Option<u64> {
        if let Some(next) = self.current.get(position) {
            return Some(*next);
        }
        let next = self.previous.remove(position)?;
        self.insert(position.clone(), next);
        Some(next)
    }

    fn insert(&mut self, position: Position, next: u64) {
        if self.current.len() >= GENERATION && !self.current.contains_key(&position) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(position, next);
    }
}

impl ProducerSequences {
    fn lock(&self) -> MutexGuard<'_, Generations> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The broker's sequence number of a record `producer` numbered `sequence` (never
    /// negative) on `partition` of `topic`: `sequence` itself for a producer that never came
    /// near the wrap, else the number nearest to where it stands.
    pub(crate) fn broker_sequence(
        &self,
        producer: u64,
        topic: &str,
        partition: i32,
        sequence: i32,
    ) -> u64 {
        let sequence = u64::from(sequence.unsigned_abs());
        if !self.used.load(Ordering::Acquire) {
            return sequence;
        }
        let position = Position {
            producer,
            topic: topic.to_owned(),
            partition,
        };
        match self.lock().get(&position) {
            Some(next) => nearest(next, sequence),
            None => sequence,
        }
    }

    /// Remembers that the broker answered the records `producer` sent on `partition` of
    /// `topic` up to the broker's sequence number `next`, excluded (stored, answered again, or
    /// refused by a full partition: the position is only needed within 2^30 of the truth).
    /// Positions far from the wrap are not kept: they need nothing.
    pub(crate) fn stored(&self, producer: u64, topic: &str, partition: i32, next: u64) {
        if next < REMEMBER_FROM {
            return;
        }
        let position = Position {
            producer,
            topic: topic.to_owned(),
            partition,
        };
        let mut table = self.lock();
        self.used.store(true, Ordering::Release);
        // Batches answered out of order never move a position back.
        let next = table.get(&position).map_or(next, |known| known.max(next));
        table.insert(position, next);
    }
}

/// The number congruent to `sequence` modulo 2^31 nearest to `next` (the lower one of two
/// as near, which cannot happen for a batch within half the span of its producer's position).
fn nearest(next: u64, sequence: u64) -> u64 {
    let start = next - next % SEQUENCE_SPAN;
    let candidates = [
        start
            .checked_sub(SEQUENCE_SPAN)
            .map(|earlier| earlier + sequence),
        Some(start + sequence),
        start.checked_add(SEQUENCE_SPAN + sequence),
    ];
    candidates
        .into_iter()
        .flatten()
        .min_by_key(|candidate| candidate.abs_diff(next))
        .unwrap_or(sequence)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: i32 = i32::MAX;

    #[test]
    fn a_producer_far_from_the_wrap_keeps_its_numbers_and_is_not_remembered() {
        let sequences = ProducerSequences::default();
        assert_eq!(sequences.broker_sequence(7, "t", 0, 12), 12);
        sequences.stored(7, "t", 0, 1_000);
        assert!(sequences.lock().current.is_empty());
        assert_eq!(sequences.broker_sequence(7, "t", 0, 1_000), 1_000);
    }

    #[test]
    fn past_the_wrap_a_number_is_the_one_nearest_to_the_producers_position() {
        let sequences = ProducerSequences::default();
        let span = SEQUENCE_SPAN;
        sequences.stored(7, "t", 0, span - 3);
        // The last numbers before the wrap, and a batch sent again from before them.
        assert_eq!(sequences.broker_sequence(7, "t", 0, MAX - 2), span - 3);
        assert_eq!(sequences.broker_sequence(7, "t", 0, MAX - 40), span - 41);
        // After it: numbered from 0 again, the broker's numbers go on.
        assert_eq!(sequences.broker_sequence(7, "t", 0, 0), span);
        assert_eq!(sequences.broker_sequence(7, "t", 0, 5), span + 5);
        sequences.stored(7, "t", 0, span + 6);
        assert_eq!(sequences.broker_sequence(7, "t", 0, 6), span + 6);
        // A batch answered late never moves the position back.
        sequences.stored(7, "t", 0, span - 1);
        assert_eq!(sequences.broker_sequence(7, "t", 0, MAX - 2), span - 3);
        assert_eq!(sequences.broker_sequence(7, "t", 0, 6), span + 6);
        // The third time round, and positions kept apart per partition, topic and producer.
        sequences.stored(7, "t", 0, 2 * span + 10);
        assert_eq!(sequences.broker_sequence(7, "t", 0, 11), 2 * span + 11);
        assert_eq!(sequences.broker_sequence(7, "t", 0, MAX), 2 * span - 1);
        assert_eq!(sequences.broker_sequence(7, "t", 1, 11), 11);
        assert_eq!(sequences.broker_sequence(7, "u", 0, 11), 11);
        assert_eq!(sequences.broker_sequence(8, "t", 0, 11), 11);
    }

    #[test]
    fn the_table_forgets_the_positions_used_least_recently() {
        let sequences = ProducerSequences::default();
        let far = SEQUENCE_SPAN + 100;
        sequences.stored(0, "t", 0, far);
        for producer in 1..GENERATION as u64 {
            sequences.stored(producer, "t", 0, far);
        }
        // The first generation is full: one more starts the next, keeping the first.
        sequences.stored(u64::MAX, "t", 0, far);
        assert_eq!(sequences.broker_sequence(0, "t", 0, 100), far);
        // Producer 0, used again, moved to the new generation; the others are forgotten once
        // it fills in turn.
        for producer in 1..GENERATION as u64 {
            sequences.stored(producer + GENERATION as u64, "t", 0, far);
        }
        assert_eq!(sequences.broker_sequence(0, "t", 0, 100), far);
        assert_eq!(sequences.broker_sequence(1, "t", 0, 100), 100);
        let table = sequences.lock();
        assert!(table.current.len() + table.previous.len() <= 2 * GENERATION);
    }
}
