//! Consumer groups: membership, the assignment of partitions to members, and rebalancing.
//!
//! Members are kept sorted by id, so the assignment depends only on who is in the group, never
//! on the order they joined. Every membership change replaces the whole assignment at once
//! (an eager rebalance): a partition that changes owner loses its delivery in flight and keeps
//! its committed offset, and every fetch position restarts at the committed offset.

use super::log::PartitionLog;
use super::{member_of, topic_in, BrokerState};
use crate::revision::Rules;
use crate::{Assignor, BrokerError, GroupSetting, GroupSettings, StartAt};

/// A consumer group of one topic.
#[derive(Debug, Clone)]
pub(super) struct Group {
    /// Fixed by the join that creates the group.
    pub(super) assignor: Assignor,
    /// Fixed by the join that creates the group.
    pub(super) settings: GroupSettings,
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
    /// When the delivery in flight was made (the broker's clock then). With nothing in flight,
    /// a delayed retry: the record at `committed` is held back until then, and once that time
    /// has passed the clock's next tick sets it back to 0 (waking waiting polls); 0 otherwise.
    pub(super) delivered_at_ms: i64,
    /// How many times the record at `committed` has been delivered (ack mode).
    pub(super) deliveries: u32,
    /// Records the group never consumed because they left the partition first.
    pub(super) skipped: u64,
    /// Whether `committed` was ever stored by the group's consumption: a commit, an
    /// acknowledgement, a reset or a record moved to the dead-letter topic, rather than only
    /// by where the group started (and retention moving it); a deletion of its offsets there
    /// clears it. What Kafka calls a committed offset: its OffsetFetch answers `-1` where there
    /// is none.
    pub(super) has_commit: bool,
}

impl GroupPartition {
    /// A partition a group starts consuming at `offset`.
    pub(super) fn starting_at(offset: i64) -> GroupPartition {
        GroupPartition {
            owner: None,
            committed: offset,
            position: offset,
            in_flight: None,
            delivered_at_ms: 0,
            deliveries: 0,
            skipped: 0,
            has_commit: false,
        }
    }

    /// Settles the delivery in flight, `offset`, as acknowledged: the group has consumed it.
    #[inline]
    pub(super) fn commit_delivery(&mut self, offset: i64) {
        self.has_commit = true;
        self.in_flight = None;
        self.deliveries = 0;
        self.delivered_at_ms = 0;
        self.committed = offset + 1;
        self.position = self.position.max(offset + 1);
    }

    /// Moves the committed offset to `offset` (a commit or a reset), which the group has stored
    /// from now on even if it is where it was: a delivery in flight from
    /// the old offset can no longer be acknowledged, and the record now next has not been
    /// delivered.
    pub(super) fn move_committed(&mut self, offset: i64) {
        self.has_commit = true;
        if self.committed != offset {
            self.in_flight = None;
            self.deliveries = 0;
            self.delivered_at_ms = 0;
            self.committed = offset;
        }
    }

    /// [`GroupPartition::move_committed`] that also cancels the delivery in flight (and a
    /// delayed retry), starting the record's deliveries over, where `offset` is the committed
    /// offset already.
    pub(super) fn restart_at(&mut self, offset: i64) {
        self.in_flight = None;
        self.deliveries = 0;
        self.delivered_at_ms = 0;
        self.move_committed(offset);
    }

    /// Whether a delayed retry holds the record at `committed` back at `now_ms`.
    #[inline]
    pub(super) fn is_held(&self, now_ms: i64) -> bool {
        self.in_flight.is_none() && self.delivered_at_ms > now_ms
    }

    /// Whether a delayed retry has ended at `now_ms` and the clock has not yet said so.
    fn hold_ended(&self, now_ms: i64) -> bool {
        self.in_flight.is_none() && self.delivered_at_ms != 0 && self.delivered_at_ms <= now_ms
    }

    /// Releases the delivery in flight, if any, for redelivery at once.
    pub(super) fn release(&mut self) {
        if self.in_flight.take().is_some() {
            self.delivered_at_ms = 0;
        }
    }

    /// The partition's records below `base` have left: if the group had not consumed them, it
    /// skips them (counted) and its delivery in flight of one of them is gone.
    pub(super) fn skip_to(&mut self, base: i64) {
        if self.committed < base {
            self.skipped += (base - self.committed) as u64;
            self.in_flight = None;
            self.deliveries = 0;
            self.delivered_at_ms = 0;
            self.committed = base;
        }
        self.position = self.position.max(base);
    }
}

impl Group {
    /// A new group with no member, starting on each partition where `settings` says.
    pub(super) fn new(
        assignor: Assignor,
        settings: GroupSettings,
        partitions: &[PartitionLog],
    ) -> Self {
        Group {
            assignor,
            settings,
            members: Vec::new(),
            partitions: partitions
                .iter()
                .map(|log| {
                    GroupPartition::starting_at(match settings.start_at {
                        StartAt::Earliest => log.base,
                        StartAt::Latest => log.end(),
                    })
                })
                .collect(),
        }
    }

    /// Releases the deliveries in flight longer than the group's acknowledgement timeout at
    /// `now_ms`, as a retry would; the partitions where it did.
    pub(super) fn release_overdue(&mut self, now_ms: i64, rules: Rules) -> Vec<usize> {
        let Some(timeout) = self.settings.ack_timeout_ms else {
            return Vec::new();
        };
        let mut released = Vec::new();
        for (partition, state) in self.partitions.iter_mut().enumerate() {
            if state.in_flight.is_some()
                && is_overdue(
                    state.delivered_at_ms,
                    timeout,
                    now_ms,
                    rules.later_delivery_not_overdue,
                )
            {
                state.release();
                released.push(partition);
            }
        }
        released
    }

    /// Whether a delayed retry has ended at `now_ms` that [`Group::end_holds`] has not yet
    /// seen.
    pub(super) fn has_ended_hold(&self, now_ms: i64) -> bool {
        self.partitions.iter().any(|state| state.hold_ended(now_ms))
    }

    /// Forgets the delayed retries that have ended at `now_ms`; whether there were any. Their
    /// records may be delivered now: the clock reports their topic, so that waiting polls
    /// retry. (A hold is not ended by the commands that move the clock, only by a tick, so that
    /// no request between its end and the tick can hide it from the waiters.)
    pub(super) fn end_holds(&mut self, now_ms: i64) -> bool {
        let mut ended = false;
        for state in &mut self.partitions {
            if state.hold_ended(now_ms) {
                state.delivered_at_ms = 0;
                ended = true;
            }
        }
        ended
    }

    /// Whether a delivery is in flight longer than the group's acknowledgement timeout at
    /// `now_ms` ([`Group::release_overdue`] would release it).
    pub(super) fn has_overdue(&self, now_ms: i64, rules: Rules) -> bool {
        self.settings.ack_timeout_ms.is_some_and(|timeout| {
            self.partitions.iter().any(|state| {
                state.in_flight.is_some()
                    && is_overdue(
                        state.delivered_at_ms,
                        timeout,
                        now_ms,
                        rules.later_delivery_not_overdue,
                    )
            })
        })
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
    pub(super) fn rebalance(&mut self, previous_owners: &[Option<String>]) {
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
                // A delayed retry stays: the new owner gets the record when it ends.
                state.release();
            }
            state.owner = owner;
            state.position = state.committed;
            if let Some(index) = owner {
                self.members[index].partitions.push(partition as i32);
            }
        }
    }

    /// Each partition's owner by id.
    pub(super) fn owner_ids(&self) -> Vec<Option<String>> {
        self.partitions
            .iter()
            .map(|state| state.owner.map(|index| self.members[index].id.clone()))
            .collect()
    }
}

/// Whether a delivery made at `delivered_at_ms` is older than `timeout_ms` at `now_ms`. With
/// `later_not_overdue` (see [`Rules::later_delivery_not_overdue`]) a delivery made later than
/// `now_ms` has had no time yet; without, as the first releases did, the negative time elapsed
/// reads as a huge one, and it is overdue at once.
pub(super) fn is_overdue(
    delivered_at_ms: i64,
    timeout_ms: u64,
    now_ms: i64,
    later_not_overdue: bool,
) -> bool {
    let elapsed = now_ms.saturating_sub(delivered_at_ms);
    if later_not_overdue && elapsed < 0 {
        return timeout_ms == 0;
    }
    elapsed as u128 >= u128::from(timeout_ms)
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
    /// Refuses a dead-letter topic that `wanted` names for a group of `topic` when it is
    /// `topic` itself, or a name these rules do not take (a setting decoded from the wire may
    /// hold any name a broker could).
    fn check_dead_letter(&self, topic: &str, wanted: &GroupSettings) -> Result<(), BrokerError> {
        let Some(dead_letter) = wanted.dead_letter else {
            return Ok(());
        };
        if dead_letter.as_str() == topic {
            return Err(BrokerError::invalid(format!(
                "topic {topic:?} cannot be its own groups' dead-letter topic"
            )));
        }
        self.names.check("topic", dead_letter.as_str())
    }

    /// See [`crate::EventBroker::join_with`] (with `Some(assignor)`) and
    /// [`crate::EventBroker::join`] (with `None`), and [`crate::EventBroker::join_group`] (with
    /// settings).
    ///
    /// # Errors
    /// As [`crate::EventBroker::join_group`], and `InvalidArgument` past the group and member
    /// [`super::Limits`].
    pub fn join(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        assignor: Option<Assignor>,
        settings: &[GroupSetting],
    ) -> Result<Vec<i32>, BrokerError> {
        let limits = self.limits;
        let (topic_name, group_name) = (topic, group);
        let wanted = GroupSettings::from_list(settings)?;
        self.names.check("group", group)?;
        self.names.check("member", member)?;
        self.check_dead_letter(topic, &wanted)?;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        match topic.groups.get(group) {
            Some(existing) => {
                if let Some(wanted) = assignor.filter(|wanted| *wanted != existing.assignor) {
                    return Err(BrokerError::invalid(format!(
                        "group {group:?} uses the {} assignor, not {wanted}",
                        existing.assignor
                    )));
                }
                if !settings.is_empty() && wanted != existing.settings {
                    return Err(BrokerError::invalid(format!(
                        "group {group:?} was created with other settings ({}); join it without \
                         settings or with its own, or change them first (`broker group \
                         configure`)",
                        existing.settings
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
        let created = !topic.groups.contains_key(group);
        let partitions = &topic.partitions;
        let group = topic
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| Group::new(assignor.unwrap_or_default(), wanted, partitions));
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
        let assigned = group.members[index].partitions.clone();
        if created && wanted.start_at == StartAt::Latest {
            // A group that starts past every record has consumed them: if it is the topic's
            // only group, they leave now.
            self.memory.remove(topic.release_all()?);
        }
        // A partition that changed owner released its delivery: one that had its last chance
        // goes to the dead-letter topic.
        self.dead_letter_group(topic_name, group_name)?;
        Ok(assigned)
    }

    /// Replaces the settings of `group` on `topic` with `settings` (an empty list: the
    /// defaults), as a group created with them would have them: its acknowledgement timeout,
    /// maximum of deliveries and dead-letter topic. Where it starts matters only when it is
    /// created and cannot change: a list that names another start is refused. A maximum lowered
    /// below a record's deliveries moves that record to the dead-letter topic now, if it is not
    /// in flight. Returns the group's settings now.
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown topic or group, settings [`GroupSettings::from_list`]
    /// refuses, another start, or the topic as its own dead-letter topic.
    pub fn configure_group(
        &mut self,
        topic: &str,
        group: &str,
        settings: &[GroupSetting],
    ) -> Result<Vec<GroupSetting>, BrokerError> {
        self.names.check("group", group)?;
        let mut wanted = GroupSettings::from_list(settings)?;
        self.check_dead_letter(topic, &wanted)?;
        let checked = topic_in(&mut self.topics, self.names, topic)?;
        let Some(existing) = checked.groups.get_mut(group) else {
            return Err(BrokerError::invalid(format!(
                "group {group:?} does not exist on topic {topic:?}"
            )));
        };
        let names_start = settings
            .iter()
            .any(|setting| matches!(setting, GroupSetting::StartAt(_)));
        if names_start && wanted.start_at != existing.settings.start_at {
            return Err(BrokerError::invalid(format!(
                "group {group:?} started at the {}; where a group starts cannot change",
                existing.settings.start_at.name()
            )));
        }
        wanted.start_at = existing.settings.start_at;
        existing.settings = wanted;
        let now = existing.settings.to_list();
        self.dead_letter_group(topic, group)?;
        Ok(now)
    }

    /// See [`crate::EventBroker::leave`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::leave`].
    pub fn leave(&mut self, topic: &str, group: &str, member: &str) -> Result<bool, BrokerError> {
        let checked = self.topic_for_member(topic, group, member)?;
        let Some(group_state) = checked.groups.get_mut(group) else {
            return Ok(false);
        };
        let Some(index) = group_state.member_index(member) else {
            return Ok(false);
        };
        let previous = group_state.owner_ids();
        group_state.members.remove(index);
        group_state.rebalance(&previous);
        self.dead_letter_group(topic, group)?;
        Ok(true)
    }

    /// See [`crate::EventBroker::delete_group`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::delete_group`].
    pub fn delete_group(&mut self, topic: &str, group: &str) -> Result<bool, BrokerError> {
        self.names.check("group", group)?;
        let topic = topic_in(&mut self.topics, self.names, topic)?;
        let Some(existing) = topic.groups.get(group) else {
            return Ok(false);
        };
        if !existing.members.is_empty() {
            return Err(BrokerError::invalid(format!(
                "group {group:?} still has members ({}); a group is deleted once they have \
                 all left",
                existing
                    .members
                    .iter()
                    .map(|member| member.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        topic.groups.remove(group);
        // The records it alone held back can go now.
        self.memory.remove(topic.release_all()?);
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
