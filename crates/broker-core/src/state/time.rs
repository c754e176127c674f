//! The broker's clock and what happens as it advances: records older than their topic's
//! maximum age leave, and deliveries unacknowledged past their group's acknowledgement timeout
//! are released for redelivery.
//!
//! The state reads no clock. Time is an argument: [`BrokerState::apply_at`] applies a command
//! at a time, [`BrokerState::advance_clock`] applies the passing of time alone. The clock never
//! goes back, so a replayed or replicated sequence of commands and times gives the same state.

use super::{BrokerState, DeadLetterReason};
use crate::{BrokerError, Command, Outcome};

impl BrokerState {
    /// The broker's time: the latest it was given, in milliseconds since the Unix epoch (0 if
    /// never).
    pub fn clock_ms(&self) -> i64 {
        self.clock_ms
    }

    /// Applies `command` at `now_ms` (milliseconds since the Unix epoch): the clock first moves
    /// to `now_ms` if that is later, then the command is applied, the records it appends
    /// stamped with the clock. Only the partitions the command touches see the passing of time
    /// (a publish first drops its partition's records past the topic's maximum age, a poll
    /// releases its member's overdue delivery); [`BrokerState::advance_clock`] applies it
    /// everywhere, and is what a server calls periodically.
    ///
    /// # Errors
    /// As the method that `command` names.
    pub fn apply_at(&mut self, now_ms: i64, command: Command) -> Result<Outcome, BrokerError> {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.apply(command)
    }

    /// Whether [`BrokerState::advance_clock`] to `now_ms` would change anything besides the
    /// clock: a record older than its topic's maximum age, a delivery older than its group's
    /// acknowledgement timeout, or a delayed retry that ends. A server advances the clock (and logs it) only then, so
    /// an idle broker writes nothing. Reads no evicted record. `false` once the state failed.
    pub fn is_due(&self, now_ms: i64) -> bool {
        if self.failure.is_some() {
            // Nothing moves any more (see `failure`).
            return false;
        }
        let now = self.clock_ms.max(now_ms);
        self.topics.values().any(|topic| {
            let aged = topic.settings.max_age_ms.is_some_and(|max_age| {
                let oldest_kept = now.saturating_sub(i64::try_from(max_age).unwrap_or(i64::MAX));
                topic.partitions.iter().any(|log| {
                    log.earliest_timestamp()
                        .is_some_and(|earliest| earliest < oldest_kept)
                })
            });
            aged || topic
                .groups
                .values()
                .any(|group| group.has_overdue(now, self.rules) || group.has_ended_hold(now))
        })
    }

    /// Moves the clock to `now_ms` if that is later than it, and applies what the passing of
    /// time does: in every topic with a maximum age the records older than it leave (groups
    /// skip them), in every group with an acknowledgement timeout the deliveries older than it
    /// are released for redelivery (or, past the group's maximum of deliveries, moved to its
    /// dead-letter topic), and delayed retries that end let their records be delivered again.
    /// Returns the topics where something changed, whose waiting consumers may now find
    /// records, sorted by name; empty when nothing did.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if the times of evicted records cannot be read; the state then
    /// refuses every command (see [`BrokerState::failure`]).
    pub fn advance_clock(&mut self, now_ms: i64) -> Result<Vec<String>, BrokerError> {
        if let Some(failure) = &self.failure {
            return Err(BrokerError::Storage(failure.clone()));
        }
        self.clock_ms = self.clock_ms.max(now_ms);
        let now = self.clock_ms;
        let rules = self.rules;
        let mut changed = Vec::new();
        let mut timed_out = Vec::new();
        for (name, topic) in &mut self.topics {
            let mut touched = false;
            for partition in 0..topic.partitions.len() {
                let base = topic.partitions[partition].base;
                match topic.expire(partition, now) {
                    Ok(freed) => self.memory.remove(freed),
                    Err(error) => {
                        if let BrokerError::Storage(why) = &error {
                            self.failure = Some(why.clone());
                        }
                        return Err(error);
                    }
                }
                touched |= topic.partitions[partition].base != base;
            }
            for (group_name, group) in &mut topic.groups {
                let released = group.release_overdue(now, rules);
                touched |= !released.is_empty();
                touched |= group.end_holds(now);
                if group.settings.max_deliveries.is_some() {
                    timed_out.extend(
                        released
                            .into_iter()
                            .map(|partition| (name.clone(), group_name.clone(), partition)),
                    );
                }
            }
            if touched {
                changed.push(name.clone());
            }
        }
        // Deliveries released by their timeout that had their group's last chance go to its
        // dead-letter topic, whose consumers may then find records: in the order of their
        // topic, group and partition, the same on every replica (the maps above are walked in
        // an order of each process's own).
        timed_out.sort_unstable();
        for (topic, group, partition) in timed_out {
            let moved = self.dead_letter_if_exhausted(
                &topic,
                &group,
                partition,
                DeadLetterReason::AckTimeout,
            );
            if let Err(BrokerError::Storage(why)) = &moved {
                self.failure = Some(why.clone());
            }
            moved?;
        }
        changed.extend(
            self.dead_letters
                .iter()
                .map(|moved| moved.dead_letter.clone()),
        );
        changed.sort_unstable();
        changed.dedup();
        Ok(changed)
    }
}
