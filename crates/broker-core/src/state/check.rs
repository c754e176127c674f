//! The invariants that tie logs, groups and members together, checked for a state that did not
//! come from this crate's methods (one read back from a snapshot); a state built by the methods
//! always passes.

use super::group::Group;
use super::log::StoredRecord;
use super::memory::Held;
use super::topic::Topic;
use super::BrokerState;
use crate::NameRules;

impl BrokerState {
    /// Checks the invariants every method relies on (the lengths and indexes that tie logs,
    /// groups and members together, and the byte accounting), for a state that did not come
    /// from this build's methods: one decoded from a snapshot. A state built by the methods
    /// always passes.
    ///
    /// # Errors
    /// A description of the first invariant broken.
    pub fn check_consistency(&self) -> Result<(), String> {
        if !(1..=crate::MAX_PRODUCT_CAPACITY as u64).contains(&self.capacity) {
            return Err(format!("capacity {} out of range", self.capacity));
        }
        let mut retained = Held::default();
        for (name, topic) in &self.topics {
            retained += check_topic(name, topic)?;
        }
        if retained.bytes != self.memory.retained {
            return Err(format!(
                "{} retained bytes counted, {} held",
                self.memory.retained, retained.bytes
            ));
        }
        if retained.records != self.memory.records {
            return Err(format!(
                "{} retained records counted, {} held",
                self.memory.records, retained.records
            ));
        }
        Ok(())
    }
}

/// The invariants of [`BrokerState::check_consistency`] for one topic named `name`; what it
/// retains.
pub(super) fn check_topic(name: &str, topic: &Topic) -> Result<Held, String> {
    let mut retained = Held::default();
    // Any name a broker may take: rules narrower than the ones a topic was created under
    // refuse calls naming it, but never the state that holds it.
    NameRules::Kafka
        .check("topic", name)
        .map_err(|error| error.to_string())?;
    let count = topic.partitions.len();
    if !(1..=crate::MAX_PARTITIONS_LIMIT as usize).contains(&count) {
        return Err(format!("topic {name:?} has {count} partitions"));
    }
    topic
        .settings
        .check()
        .map_err(|why| format!("topic {name:?}: {why}"))?;
    for (partition, log) in topic.partitions.iter().enumerate() {
        let bytes: u64 = log.records.iter().map(StoredRecord::size).sum();
        // `end()` must not overflow: offsets are added to, never wrapped.
        let ends = log
            .cold_end()
            .checked_add(log.records.len() as i64)
            .is_some();
        // Evicted records, when there are any, are the oldest retained ones.
        let cold_ok = log.cold.as_ref().is_none_or(|cold| cold.end > log.base);
        // Times never decrease, up to the last one appended (time lookups search them).
        let times_ok = log
            .earliest_timestamp()
            .into_iter()
            .chain(log.records.iter().map(|record| record.timestamp_ms))
            .chain(std::iter::once(log.last_timestamp_ms))
            .try_fold(i64::MIN, |last, time| (time >= last).then_some(time))
            .is_some();
        if log.base < 0 || !ends || !cold_ok || !times_ok || bytes != log.memory_bytes {
            return Err(format!("topic {name:?} partition {partition}: bad log"));
        }
        retained += Held {
            bytes: log.retained_bytes(),
            records: log.len(),
        };
    }
    for (group_name, group) in &topic.groups {
        group
            .check_consistency(topic)
            .map_err(|why| format!("topic {name:?} group {group_name:?}: {why}"))?;
    }
    Ok(retained)
}

impl Group {
    /// [`BrokerState::check_consistency`] for one group of `topic`.
    fn check_consistency(&self, topic: &Topic) -> Result<(), String> {
        if self.partitions.len() != topic.partitions.len() {
            return Err("a state per partition expected".to_owned());
        }
        if !self.members.windows(2).all(|pair| pair[0].id < pair[1].id) {
            return Err("members not sorted by id".to_owned());
        }
        for (index, member) in self.members.iter().enumerate() {
            let owned = member.partitions.iter().all(|&partition| {
                usize::try_from(partition)
                    .ok()
                    .and_then(|partition| self.partitions.get(partition))
                    .is_some_and(|state| state.owner == Some(index))
            });
            if !owned || !member.partitions.windows(2).all(|pair| pair[0] < pair[1]) {
                return Err(format!("member {:?}: bad partitions", member.id));
            }
        }
        for (partition, state) in self.partitions.iter().enumerate() {
            let log = &topic.partitions[partition];
            let owner_ok = state.owner.is_none_or(|owner| {
                self.members
                    .get(owner)
                    .is_some_and(|member| member.partitions.contains(&(partition as i32)))
            });
            let in_flight_ok = state
                .in_flight
                .is_none_or(|offset| (log.base..log.end()).contains(&offset));
            // Offsets are never negative: lag and positions subtract them from log ends.
            let offsets_ok = state.committed >= 0 && state.position >= 0;
            if !owner_ok || !in_flight_ok || !offsets_ok {
                return Err(format!(
                    "partition {partition}: bad owner, delivery or offsets"
                ));
            }
        }
        Ok(())
    }
}
