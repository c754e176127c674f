//! Consumer groups: membership, the assignment of partitions to members, and rebalancing.
//!
//! Members are kept sorted by id, so the assignment depends only on who is in the group, never
//! on the order they joined. Every membership change replaces the whole assignment at once
//! (an eager rebalance): a partition that changes owner loses its delivery in flight and keeps
//! its committed offset, and every fetch position restarts at the committed offset.

use super::log::PartitionLog;
use super::{member_of, BrokerState};
use crate::{Assignor, BrokerError};

/// A consumer group of one topic.
#[derive(Debug, Clone)]
pub(super) struct Group {
    /// Fixed by the join that creates the group.
    pub(super) assignor: Assignor,
    /// Sorted by id, so an index into this vector is stable between membership changes.
    pub(super) members: Vec<Member>,
    /// Indexed by partition number.
    pub(super) partitions: Vec<GroupPartition>,
}

/// A member and the partitions it owns.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) id: String,
    /// Ascending.
    pub(super) partitions: Vec<i32>,
}

/// A group's progress on one partition.
#[derive(Debug, Clone)]
pub(super) struct GroupPartition {
    /// Index into [`Group::members`] of the owner; `None` when the group has no member for it.
    pub(super) owner: Option<usize>,
    /// The next offset the group has yet to consume; every record below it is done.
    pub(super) committed: i64,
    /// Where the owner's next `fetch` starts; reset to `committed` on every rebalance.
    pub(super) position: i64,
    /// The offset `poll` delivered and that awaits `ack` or `retry`.
    pub(super) in_flight: Option<i64>,
}

impl GroupPartition {
    /// Settles the delivery in flight, `offset`, as acknowledged: the group has consumed it.
    #[inline]
    pub(super) fn commit_delivery(&mut self, offset: i64) {
        self.in_flight = None;
        self.committed = offset + 1;
        self.position = self.position.max(offset + 1);
    }
}

impl Group {
    /// A new group with no member, starting at each partition's earliest retained record.
    pub(super) fn new(assignor: Assignor, partitions: &[PartitionLog]) -> Self {
        Group {
            assignor,
            members: Vec::new(),
            partitions: partitions
                .iter()
                .map(|log| GroupPartition {
                    owner: None,
                    committed: log.base,
                    position: log.base,
                    in_flight: None,
                })
                .collect(),
        }
    }

    /// The index of `member` in [`Group::members`].
    #[inline]
    pub(super) fn member_index(&self, member: &str) -> Option<usize> {
        self.members
            .binary_search_by(|m| m.id.as_str().cmp(member))
            .ok()
    }

    /// Whether the member at `member` owns `partition`.
    #[inline]
    pub(super) fn owns(&self, member: usize, partition: usize) -> bool {
        self.partitions[partition].owner == Some(member)
    }

    /// Replaces the complete assignment after a membership change. `previous_owners` names each
    /// partition's owner before the change: a partition that changes hands loses its in-flight
    /// delivery. Every position restarts at the committed offset (an eager rebalance).
    fn rebalance(&mut self, previous_owners: &[Option<String>]) {
        let partition_count = self.partitions.len();
        let member_count = self.members.len();
        for member in &mut self.members {
            member.partitions.clear();
        }
        for (partition, state) in self.partitions.iter_mut().enumerate() {
            let owner = match (member_count, self.assignor) {
                (0, _) => None,
                (n, Assignor::RoundRobin) => Some(partition % n),
                (n, Assignor::Range) => Some(range_owner(partition, partition_count, n)),
            };
            let owner_id = owner.map(|index| self.members[index].id.as_str());
            if owner_id != previous_owners[partition].as_deref() {
                state.in_flight = None;
            }
            state.owner = owner;
            state.position = state.committed;
            if let Some(index) = owner {
                self.members[index].partitions.push(partition as i32);
            }
        }
    }

    /// Each partition's owner by id.
    fn owner_ids(&self) -> Vec<Option<String>> {
        self.partitions
            .iter()
            .map(|state| state.owner.map(|index| self.members[index].id.clone()))
            .collect()
    }
}

/// Kafka's range assignor for one topic: the first `partitions % members` members take
/// `partitions / members + 1` consecutive partitions, the rest `partitions / members`.
fn range_owner(partition: usize, partition_count: usize, member_count: usize) -> usize {
    let share = partition_count / member_count;
    let extra = partition_count % member_count;
    let boundary = extra * (share + 1);
    if partition < boundary {
        partition / (share + 1)
    } else {
        extra + (partition - boundary) / share
    }
}

impl BrokerState {
    /// See [`crate::EventBroker::join_with`] (with `Some(assignor)`) and
    /// [`crate::EventBroker::join`] (with `None`).
    ///
    /// # Errors
    /// As [`crate::EventBroker::join_with`], and `InvalidArgument` past the group and member
    /// [`super::Limits`].
    pub fn join(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Option<Assignor>,
    ) -> Result<Vec<i32>, BrokerError> {
        let limits = self.limits;
        let topic = self.topic_for_member(topic, group, member)?;
        match topic.groups.get(group) {
            Some(existing) => {
                if let Some(wanted) = assignor.filter(|wanted| *wanted != existing.assignor) {
                    return Err(BrokerError::invalid(format!(
                        "group {group:?} uses the {:?} assignor, not {wanted:?}",
                        existing.assignor
                    )));
                }
                if existing.member_index(member).is_none()
                    && existing.members.len() >= limits.max_members_per_group
                {
                    return Err(BrokerError::invalid(format!(
                        "group {group:?} already has its maximum of {} members",
                        limits.max_members_per_group
                    )));
                }
            }
            None if topic.groups.len() >= limits.max_groups_per_topic => {
                return Err(BrokerError::invalid(format!(
                    "the topic already has its maximum of {} groups",
                    limits.max_groups_per_topic
                )));
            }
            None => {}
        }
        let partitions = &topic.partitions;
        let group = topic
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| Group::new(assignor.unwrap_or_default(), partitions));
        let index = match group.member_index(member) {
            Some(index) => index,
            None => {
                let previous = group.owner_ids();
                let index = group.members.partition_point(|m| m.id.as_str() < member);
                group.members.insert(
                    index,
                    Member {
                        id: member.to_owned(),
                        partitions: Vec::new(),
                    },
                );
                group.rebalance(&previous);
                index
            }
        };
        Ok(group.members[index].partitions.clone())
    }

    /// See [`crate::EventBroker::leave`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::leave`].
    pub fn leave(&mut self, topic: &str, group: &str, member: &str) -> Result<bool, BrokerError> {
        let topic = self.topic_for_member(topic, group, member)?;
        let Some(group) = topic.groups.get_mut(group) else {
            return Ok(false);
        };
        let Some(index) = group.member_index(member) else {
            return Ok(false);
        };
        let previous = group.owner_ids();
        group.members.remove(index);
        group.rebalance(&previous);
        Ok(true)
    }

    /// See [`crate::EventBroker::assignment`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::assignment`].
    pub fn assignment(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<Vec<i32>, BrokerError> {
        let topic = self.topic_for_member(topic, group, member)?;
        Ok(member_of(&mut topic.groups, group, member)
            .map(|(group, member)| group.members[member].partitions.clone())
            .unwrap_or_default())
    }
}
