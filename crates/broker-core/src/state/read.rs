//! The read-only calls: a group's committed offsets and lag, a partition's end offset and the
//! offset of a time, reading a partition from an offset, and the description of topics and
//! groups that admin tools show. None of them changes anything.

use std::borrow::Cow;

use super::consume::Budget;
use super::group::Group;
use super::log::{ColdRun, StoredRecord};
use super::topic::Topic;
use super::BrokerState;
use crate::describe::{
    BrokerDescription, GroupDescription, GroupPartitionDescription, MemberDescription,
    PartitionDescription, TopicDescription,
};
use crate::validate::{check_fetch_max_records, check_offset};
use crate::{BrokerError, PartitionLag, PartitionRead};

impl BrokerState {
    /// Whether `member` is a member of `group` on `topic` (all three exist). Never an error:
    /// for a server keeping its books of members (their sessions) in step with the state.
    pub fn is_member(&self, topic: &str, group: &str, member: &str) -> bool {
        self.topics
            .get(topic)
            .and_then(|topic| topic.groups.get(group))
            .is_some_and(|group| group.member_index(member).is_some())
    }

    /// The members of `group` on `topic`, each with its partitions, as `describe` shows them;
    /// none when the group or the topic does not exist. It looks at that group alone, whatever
    /// else the topic holds: the server logs it at every join and leave.
    pub fn members(&self, topic: &str, group: &str) -> Vec<MemberDescription> {
        self.topics
            .get(topic)
            .and_then(|topic| topic.groups.get(group))
            .map(describe_members)
            .unwrap_or_default()
    }

    /// See [`crate::EventBroker::committed`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::committed`].
    pub fn committed(&self, topic: &str, group: &str, partition: i32) -> Result<i64, BrokerError> {
        self.names.check("group", group)?;
        let topic = self.topic(topic)?;
        let partition = topic.partition(partition)?;
        Ok(committed_offset(topic, group, partition))
    }

    /// See [`crate::EventBroker::stored_offsets`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::stored_offsets`].
    pub fn stored_offsets(
        &self,
        topic: &str,
        group: &str,
    ) -> Result<Vec<Option<i64>>, BrokerError> {
        self.names.check("group", group)?;
        let topic = self.topic(topic)?;
        Ok(match topic.groups.get(group) {
            Some(group) => group
                .partitions
                .iter()
                .map(|progress| progress.has_commit.then_some(progress.committed))
                .collect(),
            None => vec![None; topic.partitions.len()],
        })
    }

    /// See [`crate::EventBroker::end_offset`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::end_offset`].
    pub fn end_offset(&self, topic: &str, partition: i32) -> Result<i64, BrokerError> {
        let topic = self.topic(topic)?;
        let partition = topic.partition(partition)?;
        Ok(topic.partitions[partition].end())
    }

    /// See [`crate::EventBroker::read`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::read`].
    pub fn read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<PartitionRead, BrokerError> {
        self.begin_read(topic, partition, offset, max_records, max_bytes)?
            .finish()
    }

    /// [`BrokerState::read`] in two steps: this one takes the records held in memory (no more
    /// than the read's budget takes) and where the others lie, and [`PendingRead::finish`]
    /// reads those from the cold store without the state, so that a caller holding the state
    /// behind a lock lets it go before reading from disk. Changes nothing.
    ///
    /// # Errors
    /// As [`crate::EventBroker::read`].
    pub fn begin_read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<PendingRead, BrokerError> {
        check_offset(offset)?;
        check_fetch_max_records(max_records)?;
        let topic_name = topic;
        let topic = self.topic(topic)?;
        let index = topic.partition(partition)?;
        let log = &topic.partitions[index];
        if offset > log.end() {
            return Err(BrokerError::invalid(format!(
                "offset {offset} is past the end of partition {partition} of topic \
                 {topic_name:?}: its next record gets offset {}",
                log.end()
            )));
        }
        let first = offset.max(log.base);
        let to = log.run_end(first, max_records as usize);
        // The records read from the cold store come first and take from the same budget: those
        // of memory the answer takes are among the first a budget of their own takes.
        let header_wire_bytes = self.rules.header_wire_bytes;
        let mut budget = Budget::new(max_records, max_bytes, header_wire_bytes);
        let memory = log
            .memory_run(first, to)
            .take_while(|record| budget.take_record(record))
            .cloned()
            .collect();
        Ok(PendingRead {
            topic: topic_name.to_owned(),
            partition: index,
            first,
            to,
            max_records,
            max_bytes,
            header_wire_bytes,
            cold: log.cold_run(first, to),
            memory_from: first.max(log.cold_end()),
            memory,
            start_offset: log.base,
            end_offset: log.end(),
        })
    }

    /// See [`crate::EventBroker::lag`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::lag`].
    pub fn lag(&self, topic: &str, group: &str) -> Result<Vec<PartitionLag>, BrokerError> {
        self.names.check("group", group)?;
        let topic = self.topic(topic)?;
        Ok((0..topic.partitions.len())
            .map(|partition| {
                let committed = committed_offset(topic, group, partition);
                let end_offset = topic.partitions[partition].end();
                PartitionLag {
                    partition: partition as i32,
                    committed,
                    end_offset,
                    lag: lag(end_offset, committed),
                    skipped: topic
                        .groups
                        .get(group)
                        .map_or(0, |g| g.partitions[partition].skipped),
                }
            })
            .collect())
    }

    /// See [`crate::EventBroker::offset_for_time`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::offset_for_time`].
    pub fn offset_for_time(
        &self,
        topic: &str,
        partition: i32,
        timestamp_ms: i64,
    ) -> Result<i64, BrokerError> {
        let topic = self.topic(topic)?;
        let partition = topic.partition(partition)?;
        topic.partitions[partition].first_at_or_after(timestamp_ms)
    }

    /// A description of one topic (`Some`) or of every topic (`None`), sorted by name; see
    /// [`crate::EventBroker::describe`].
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed or unknown topic.
    pub fn describe(&self, topic: Option<&str>) -> Result<BrokerDescription, BrokerError> {
        match topic {
            Some(name) => Ok(BrokerDescription {
                capacity_per_partition: self.capacity_per_partition(),
                topics: vec![describe_topic(name, self.topic(name)?)],
            }),
            None => Ok(self.describe_all()),
        }
    }

    /// See [`crate::EventBroker::describe`].
    pub fn describe_all(&self) -> BrokerDescription {
        let mut topics: Vec<TopicDescription> = self
            .topics
            .iter()
            .map(|(name, topic)| describe_topic(name, topic))
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        BrokerDescription {
            capacity_per_partition: self.capacity_per_partition(),
            topics,
        }
    }
}

/// Records a group has yet to consume: never negative (0 for a group that committed past the
/// end, as brokers before commits were bounded allowed).
fn lag(end_offset: i64, committed: i64) -> i64 {
    (end_offset - committed).max(0)
}

fn committed_offset(topic: &Topic, group: &str, partition: usize) -> i64 {
    topic
        .groups
        .get(group)
        .map_or(topic.partitions[partition].base, |g| {
            g.partitions[partition].committed
        })
}

fn describe_members(group: &Group) -> Vec<MemberDescription> {
    group
        .members
        .iter()
        .map(|m| MemberDescription {
            member: m.id.clone(),
            partitions: m.partitions.clone(),
        })
        .collect()
}

fn describe_topic(name: &str, topic: &Topic) -> TopicDescription {
    let partitions: Vec<PartitionDescription> = topic
        .partitions
        .iter()
        .enumerate()
        .map(|(partition, log)| PartitionDescription {
            partition: partition as i32,
            earliest_offset: log.base,
            end_offset: log.end(),
            records: log.len(),
            retained_bytes: log.retained_bytes(),
            earliest_timestamp_ms: log.earliest_timestamp(),
        })
        .collect();
    let mut groups: Vec<GroupDescription> = topic
        .groups
        .iter()
        .map(|(group_name, group)| GroupDescription {
            name: group_name.clone(),
            assignor: group.assignor,
            settings: group.settings.to_list(),
            members: describe_members(group),
            partitions: group
                .partitions
                .iter()
                .enumerate()
                .map(|(partition, state)| GroupPartitionDescription {
                    partition: partition as i32,
                    owner: state.owner.map(|index| group.members[index].id.clone()),
                    committed: state.committed,
                    position: state.position,
                    in_flight: state.in_flight,
                    lag: lag(topic.partitions[partition].end(), state.committed),
                    deliveries: state.deliveries,
                    skipped: state.skipped,
                })
                .collect(),
        })
        .collect();
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    TopicDescription {
        name: name.to_owned(),
        key_hash: topic.key_hash,
        settings: topic.settings.to_list(),
        retained_bytes: partitions.iter().map(|p| p.retained_bytes).sum(),
        partitions,
        groups,
    }
}

/// A read begun by [`BrokerState::begin_read`]: the records it found in memory, and where in
/// the cold store the others lie.
pub struct PendingRead {
    topic: String,
    partition: usize,
    first: i64,
    to: i64,
    max_records: i32,
    max_bytes: Option<u64>,
    /// See [`crate::HEADER_WIRE_BYTES`]: under the rules of the state it was begun from.
    header_wire_bytes: u64,
    cold: Option<ColdRun>,
    memory_from: i64,
    memory: Vec<StoredRecord>,
    start_offset: i64,
    end_offset: i64,
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRead")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("offsets", &(self.first..self.to))
            .field("reads_cold_store", &self.reads_cold_store())
            .finish_non_exhaustive()
    }
}

impl PendingRead {
    /// Whether [`PendingRead::finish`] reads from the cold store (from disk): a caller may then
    /// do it off the threads that must not block.
    pub fn reads_cold_store(&self) -> bool {
        self.cold.is_some()
    }

    /// The read's answer, as [`BrokerState::read`] gives it when it was begun.
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if records in the cold store cannot be read (or were no longer
    /// retained when read: reading again with the state gives what it holds now).
    pub fn finish(self) -> Result<PartitionRead, BrokerError> {
        let cold = ColdRun::read_all(self.cold.as_ref(), self.first, self.max_bytes)?;
        let to = cold.run_end(self.to);
        let in_memory = usize::try_from(to.max(self.memory_from) - self.memory_from).unwrap_or(0);
        let mut budget = Budget::new(self.max_records, self.max_bytes, self.header_wire_bytes);
        let mut records = Vec::new();
        let run = cold
            .records
            .into_iter()
            .chain(self.memory.into_iter().take(in_memory));
        for (at, record) in (self.first..).zip(run) {
            if !budget.take_record(&record) {
                break;
            }
            records.push(StoredRecord::delivered(
                Cow::Owned(record),
                &self.topic,
                self.partition,
                at,
                0,
            ));
        }
        Ok(PartitionRead {
            records,
            start_offset: self.start_offset,
            end_offset: self.end_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{BrokerState, KeyHash};

    #[test]
    fn is_member_needs_the_topic_the_group_and_the_member() {
        let mut state = BrokerState::new(10).unwrap();
        state.create("t", 1, KeyHash::default(), &[]).unwrap();
        state.join("t", "g", "m", None, &[]).unwrap();
        assert!(state.is_member("t", "g", "m"));
        for (topic, group, member) in [("t", "g", "n"), ("t", "h", "m"), ("u", "g", "m")] {
            assert!(!state.is_member(topic, group, member));
        }
        state.leave("t", "g", "m").unwrap();
        assert!(!state.is_member("t", "g", "m"));
    }

    #[test]
    fn members_are_those_of_the_group_named_as_describe_shows_them() {
        let mut state = BrokerState::new(10).unwrap();
        state.create("t", 3, KeyHash::default(), &[]).unwrap();
        for (group, member) in [("g", "b"), ("g", "a"), ("h", "c")] {
            state.join("t", group, member, None, &[]).unwrap();
        }
        let described = state.describe(Some("t")).unwrap().topics.remove(0);
        for group in ["g", "h"] {
            let members = &described
                .groups
                .iter()
                .find(|g| g.name == group)
                .unwrap()
                .members;
            assert_eq!(&state.members("t", group), members, "{group}");
        }
        assert_eq!(state.members("t", "g").len(), 2);
        assert!(state.members("t", "nobody").is_empty());
        assert!(state.members("nowhere", "g").is_empty());
    }
}
