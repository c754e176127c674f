//! Consuming: ack mode, where `poll` reserves one record per partition and `ack` or `retry`
//! settles it, and fetch mode, where `fetch` reads from the member's positions and `commit`
//! stores offsets for the group. Both modes move the same committed offsets, which is what
//! interest retention follows; a reset moves them for the whole group at once.

use std::collections::{BTreeMap, HashMap};

use super::group::{is_overdue, Group, GroupPartition};
use super::log::StoredRecord;
use super::memory::Held;
use super::topic::Topic;
use super::{member_of, topic_in, BrokerState, DeadLetterReason};
use crate::validate::{
    check_acks_len, check_fetch_max_records, check_offset, check_poll_max_records,
};
use crate::{Assignor, BrokerError, BrokerRecord, GroupSettings, PartitionLag, ResetTo, StartAt};

impl BrokerState {
    /// See [`crate::EventBroker::poll_limited`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::poll`].
    pub fn poll(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        check_poll_max_records(max_records)?;
        let now = self.clock_ms;
        let later_not_overdue = self.rules.later_delivery_not_overdue;
        let exhausted_on_every_release = self.rules.exhausted_on_every_release;
        let header_wire_bytes = self.rules.header_wire_bytes;
        let topic_name = topic;
        let group_name = group;
        let Topic {
            partitions, groups, ..
        } = self.topic_for_member(topic, group, member)?;
        let Some((group, member)) = member_of(groups, group, member) else {
            return Ok(Vec::new());
        };
        let ack_timeout = group.settings.ack_timeout_ms;
        let max_deliveries = group.settings.max_deliveries;
        let mut budget = Budget::new(max_records, max_bytes, header_wire_bytes);
        let mut delivered = Vec::new();
        // Overdue deliveries that had the group's last chance: released here, and moved to the
        // dead-letter topic below, as the clock's tick would (the poll came first).
        let mut last_chances = Vec::new();
        for &partition in &group.members[member].partitions {
            let partition = partition as usize;
            let state = &mut group.partitions[partition];
            let log = &partitions[partition];
            let offset = state.committed.max(log.base);
            // A delivery unacknowledged past the group's timeout is released, and taken again.
            let overdue = ack_timeout.is_some_and(|timeout| {
                is_overdue(state.delivered_at_ms, timeout, now, later_not_overdue)
            });
            if exhausted_on_every_release
                && overdue
                && state.in_flight.is_some()
                && max_deliveries.is_some_and(|max| state.deliveries >= max)
            {
                state.release();
                last_chances.push(partition);
                continue;
            }
            if (state.in_flight.is_some() && !overdue) || offset >= log.end() || state.is_held(now)
            {
                continue;
            }
            if budget.spent() {
                break;
            }
            // A record the budget has no room for ends the poll, and is not read: its size
            // (without its headers' overhead, so it never turns away one that fits) says so.
            if let Some(room) = budget.room_after_first() {
                if log.record_size(offset)?.is_some_and(|size| size > room) {
                    break;
                }
            }
            let Some(record) = log.run(offset, 1, None)?.next() else {
                continue;
            };
            if !budget.take_record(&record) {
                break;
            }
            state.in_flight = Some(offset);
            state.delivered_at_ms = now;
            state.deliveries = state.deliveries.saturating_add(1);
            delivered.push(StoredRecord::delivered(
                record,
                topic_name,
                partition,
                offset,
                state.deliveries,
            ));
        }
        for partition in last_chances {
            self.dead_letter_if_exhausted(
                topic_name,
                group_name,
                partition,
                DeadLetterReason::AckTimeout,
            )?;
        }
        Ok(delivered)
    }

    /// See [`crate::EventBroker::ack`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::ack`].
    pub fn ack(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, BrokerError> {
        check_offset(offset)?;
        let topic = self.topic_for_member(topic, group, member)?;
        let partition = topic.partition(partition)?;
        let Some(state) = matching_delivery(&mut topic.groups, group, member, partition, offset)
        else {
            return Ok(false);
        };
        state.commit_delivery(offset);
        let freed = topic.release(partition)?;
        self.memory.remove(freed);
        Ok(true)
    }

    /// See [`crate::EventBroker::ack_and_poll`]; `max_bytes` bounds the poll as
    /// [`crate::EventBroker::poll_limited`]'s does.
    ///
    /// # Errors
    /// As [`crate::EventBroker::ack_and_poll`].
    pub fn ack_and_poll(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        acks: &[(i32, i64)],
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<(Vec<bool>, Vec<BrokerRecord>), BrokerError> {
        check_acks_len(acks.len())?;
        check_poll_max_records(max_records)?;
        self.names.check("group", group)?;
        self.names.check("member", member)?;
        let checked = topic_in(&mut self.topics, self.names, topic)?;
        for &(partition, offset) in acks {
            check_offset(offset)?;
            checked.partition(partition)?;
        }
        // What `ack` does for each, with the topic, group and member looked up once.
        let mut acked = vec![false; acks.len()];
        if let Some((group_state, member_index)) = member_of(&mut checked.groups, group, member) {
            for (hit, &(partition, offset)) in acked.iter_mut().zip(acks) {
                let state = &mut group_state.partitions[partition as usize];
                *hit = state.owner == Some(member_index) && state.in_flight == Some(offset);
                if *hit {
                    state.commit_delivery(offset);
                }
            }
        }
        for (&hit, &(partition, _)) in acked.iter().zip(acks) {
            if hit {
                self.memory.remove(checked.release(partition as usize)?);
            }
        }
        let records = self.poll(topic, group, member, max_records, max_bytes)?;
        Ok((acked, records))
    }

    /// See [`crate::EventBroker::retry`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::retry`].
    pub fn retry(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
    ) -> Result<bool, BrokerError> {
        self.retry_until(topic, group, member, partition, offset, None)
    }

    /// [`BrokerState::retry`], holding the record back until `until_ms` (by the broker's
    /// clock) when given: a delayed retry.
    pub(super) fn retry_until(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
        until_ms: Option<i64>,
    ) -> Result<bool, BrokerError> {
        check_offset(offset)?;
        let checked = self.topic_for_member(topic, group, member)?;
        let partition = checked.partition(partition)?;
        let Some(state) = matching_delivery(&mut checked.groups, group, member, partition, offset)
        else {
            return Ok(false);
        };
        state.release();
        if let Some(until) = until_ms {
            state.delivered_at_ms = until;
        }
        self.dead_letter_if_exhausted(topic, group, partition, DeadLetterReason::Retried)?;
        Ok(true)
    }

    /// See [`crate::EventBroker::redeliver`]; `max_bytes` bounds the poll as
    /// [`crate::EventBroker::poll_limited`]'s does.
    ///
    /// # Errors
    /// As [`crate::EventBroker::redeliver`].
    pub fn redeliver(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        check_poll_max_records(max_records)?;
        let checked = self.topic_for_member(topic, group, member)?;
        let mut released = Vec::new();
        if let Some((group_state, member_index)) = member_of(&mut checked.groups, group, member) {
            for &partition in &group_state.members[member_index].partitions {
                let state = &mut group_state.partitions[partition as usize];
                if state.in_flight.is_some() {
                    released.push(partition as usize);
                }
                state.release();
            }
        }
        if self.rules.exhausted_on_every_release {
            for partition in released {
                self.dead_letter_if_exhausted(topic, group, partition, DeadLetterReason::Released)?;
            }
        }
        // Every released record is eligible again (unless it went to the dead-letter topic, which
        // `dead_letter_events` tells) and the first is always taken, so a result of `[]` with no
        // such event means nothing was in flight and nothing changed.
        self.poll(topic, group, member, max_records, max_bytes)
    }

    /// See [`crate::EventBroker::fetch_limited`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::fetch`].
    pub fn fetch(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Result<Vec<BrokerRecord>, BrokerError> {
        check_fetch_max_records(max_records)?;
        let topic_name = topic;
        let header_wire_bytes = self.rules.header_wire_bytes;
        let Topic {
            partitions, groups, ..
        } = self.topic_for_member(topic, group, member)?;
        let Some((group, member)) = member_of(groups, group, member) else {
            return Ok(Vec::new());
        };
        let mut budget = Budget::new(max_records, max_bytes, header_wire_bytes);
        let mut records = Vec::new();
        'partitions: for &partition in &group.members[member].partitions {
            let partition = partition as usize;
            let state = &mut group.partitions[partition];
            let log = &partitions[partition];
            // Records below the log's base were released by every group: skip to what remains.
            // The position moves only when a record is taken, so a fetch that returns nothing
            // changes nothing (a write-ahead log need not record it).
            let mut position = state.position.max(log.base);
            if budget.spent() {
                break;
            }
            for record in log.run(position, budget.records_left, budget.bytes_left)? {
                if !budget.take_record(&record) {
                    break 'partitions;
                }
                records.push(StoredRecord::delivered(
                    record, topic_name, partition, position, 0,
                ));
                position += 1;
                state.position = position;
            }
            if position < log.end() {
                // The run ended before the partition did: the budget is spent (a record read
                // from disk would not have fitted, or no record count is left).
                break;
            }
        }
        Ok(records)
    }

    /// See [`crate::EventBroker::commit_group`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::commit_group`].
    pub fn commit_group(
        &mut self,
        topic: &str,
        group: &str,
        offsets: &[(i32, i64)],
    ) -> Result<(), BrokerError> {
        self.names.check("group", group)?;
        let max_groups = self.limits.max_groups_per_topic;
        let checked = topic_in(&mut self.topics, self.names, topic)?;
        let mut selected = Vec::with_capacity(offsets.len());
        let mut named = vec![false; checked.partitions.len()];
        for &(partition, offset) in offsets {
            let index = checked.partition(partition)?;
            check_offset(offset)?;
            if std::mem::replace(&mut named[index], true) {
                return Err(BrokerError::invalid(format!(
                    "partition {partition} is named twice"
                )));
            }
            selected.push((index, offset));
        }
        match checked.groups.get(group) {
            Some(existing) if !existing.members.is_empty() => {
                return Err(BrokerError::invalid(format!(
                    "group {group:?} of topic {topic:?} has members of its own: they commit its \
                     offsets"
                )));
            }
            Some(_) => {}
            None if checked.groups.len() >= max_groups => {
                return Err(BrokerError::invalid(format!(
                    "the topic already has its maximum of {max_groups} groups"
                )));
            }
            None => {
                let created = Group::new(
                    Assignor::default(),
                    GroupSettings::default(),
                    &checked.partitions,
                );
                checked.groups.insert(group.to_owned(), created);
            }
        }
        if let Some(state) = checked.groups.get_mut(group) {
            for &(partition, offset) in &selected {
                let log = &checked.partitions[partition];
                let progress = &mut state.partitions[partition];
                progress.move_committed(offset.clamp(log.base, log.end()));
                progress.position = progress.committed;
            }
        }
        for &(partition, _) in &selected {
            self.memory.remove(checked.release(partition)?);
        }
        Ok(())
    }

    /// See [`crate::EventBroker::commit`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::commit`].
    pub fn commit(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        offsets: Option<&BTreeMap<i32, i64>>,
    ) -> Result<(), BrokerError> {
        let topic = self.topic_for_member(topic, group, member)?;
        if let Some(offsets) = offsets {
            for (&partition, &offset) in offsets {
                topic.partition(partition)?;
                check_offset(offset)?;
            }
            let owner = topic
                .groups
                .get(group)
                .and_then(|g| Some((g, g.member_index(member)?)));
            if let Some(&partition) = offsets.keys().find(|&&partition| {
                !owner.is_some_and(|(g, member)| g.owns(member, partition as usize))
            }) {
                return Err(BrokerError::NotAssigned { partition });
            }
            for (&partition, &offset) in offsets {
                let end = topic.partitions[partition as usize].end();
                if offset > end {
                    return Err(BrokerError::invalid(format!(
                        "offset {offset} is past the end of partition {partition} ({end}): a \
                         group commits at most the offset the next record will get"
                    )));
                }
            }
        }
        let Some((group, member)) = member_of(&mut topic.groups, group, member) else {
            // Only `offsets: None` gets here: a non-member has no positions to store.
            return Ok(());
        };
        let changed: Vec<(usize, i64)> = match offsets {
            Some(offsets) => offsets
                .iter()
                .map(|(&partition, &offset)| (partition as usize, offset))
                .collect(),
            None => group.members[member]
                .partitions
                .iter()
                .map(|&partition| {
                    let partition = partition as usize;
                    (partition, group.partitions[partition].position)
                })
                .collect(),
        };
        for &(partition, offset) in &changed {
            // A poll delivered the record at the old committed offset; progress now restarts
            // elsewhere, so that delivery can no longer be acknowledged.
            group.partitions[partition].move_committed(offset);
        }
        let mut freed = Held::default();
        for (partition, _) in changed {
            freed += topic.release(partition)?;
        }
        self.memory.remove(freed);
        Ok(())
    }
}

impl BrokerState {
    /// See [`crate::EventBroker::reset_group`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::reset_group`].
    pub fn reset_group(
        &mut self,
        topic: &str,
        group: &str,
        partitions: Option<&[i32]>,
        to: ResetTo,
    ) -> Result<Vec<PartitionLag>, BrokerError> {
        self.move_group(topic, group, partitions, Move::To(to))
    }

    /// See [`crate::EventBroker::delete_offsets`].
    ///
    /// # Errors
    /// As [`crate::EventBroker::delete_offsets`].
    pub fn delete_offsets(
        &mut self,
        topic: &str,
        group: &str,
        partitions: &[i32],
    ) -> Result<Vec<PartitionLag>, BrokerError> {
        self.move_group(topic, group, Some(partitions), Move::Forget)
    }

    /// Moves `group`'s committed offsets on `partitions` (every partition with `None`) as
    /// `how` says, all at once: its members' fetch positions follow and its deliveries in
    /// flight there are cancelled. Returns the group's new progress on each partition moved.
    fn move_group(
        &mut self,
        topic: &str,
        group: &str,
        partitions: Option<&[i32]>,
        how: Move,
    ) -> Result<Vec<PartitionLag>, BrokerError> {
        self.names.check("group", group)?;
        let cancels_in_place = self.rules.reset_cancels_in_place;
        let checked = topic_in(&mut self.topics, self.names, topic)?;
        if let Move::To(ResetTo::Offset(offset)) = how {
            check_offset(offset)?;
        }
        let selected: Vec<usize> = match partitions {
            Some(partitions) => {
                let mut selected = Vec::with_capacity(partitions.len());
                let mut named = vec![false; checked.partitions.len()];
                for &partition in partitions {
                    let index = checked.partition(partition)?;
                    if std::mem::replace(&mut named[index], true) {
                        return Err(BrokerError::invalid(format!(
                            "partition {partition} is named twice"
                        )));
                    }
                    selected.push(index);
                }
                selected.sort_unstable();
                selected
            }
            None => (0..checked.partitions.len()).collect(),
        };
        let Some(state) = checked.groups.get_mut(group) else {
            return Err(BrokerError::invalid(format!(
                "group {group:?} does not exist on topic {topic:?} (a group exists once a member \
                 joined it)"
            )));
        };
        if matches!(how, Move::Forget) && !state.members.is_empty() {
            return Err(BrokerError::invalid(format!(
                "group {group:?} has members on topic {topic:?}: they commit its offsets"
            )));
        }
        let start_at = state.settings.start_at;
        for &partition in &selected {
            let log = &checked.partitions[partition];
            let progress = &mut state.partitions[partition];
            let target = match how {
                Move::To(ResetTo::Earliest) => log.base,
                Move::To(ResetTo::Latest) => log.end(),
                Move::To(ResetTo::Offset(offset)) => offset,
                Move::To(ResetTo::Timestamp(timestamp_ms)) => {
                    log.first_at_or_after(timestamp_ms)?
                }
                Move::To(ResetTo::ShiftBy(shift)) => progress.committed.saturating_add(shift),
                Move::Forget => match start_at {
                    StartAt::Earliest => log.base,
                    StartAt::Latest => log.end(),
                },
            };
            let target = target.clamp(log.base, log.end());
            match cancels_in_place {
                true => progress.restart_at(target),
                false => progress.move_committed(target),
            }
            progress.position = progress.committed;
            if matches!(how, Move::Forget) {
                progress.has_commit = false;
            }
        }
        for &partition in &selected {
            self.memory.remove(checked.release(partition)?);
        }
        let progress = &checked.groups[group].partitions;
        let rows = selected
            .iter()
            .map(|&partition| {
                let end_offset = checked.partitions[partition].end();
                let state = &progress[partition];
                PartitionLag {
                    partition: partition as i32,
                    committed: state.committed,
                    end_offset,
                    lag: (end_offset - state.committed).max(0),
                    skipped: state.skipped,
                }
            })
            .collect();
        Ok(rows)
    }
}

/// How [`BrokerState::move_group`] moves a group's committed offsets.
#[derive(Debug, Clone, Copy)]
enum Move {
    /// Where a reset says.
    To(ResetTo),
    /// Back to where the group starts on a partition (its `start_at`), with no offset stored
    /// there any more: as a group that never committed there.
    Forget,
}

/// The group's state on `partition` when `member` owns it and `offset` is the delivery in
/// flight there: the only case in which an ack or a retry takes effect.
fn matching_delivery<'a>(
    groups: &'a mut HashMap<String, Group>,
    group: &str,
    member: &str,
    partition: usize,
    offset: i64,
) -> Option<&'a mut GroupPartition> {
    let (group, member) = member_of(groups, group, member)?;
    let state = &mut group.partitions[partition];
    (state.owner == Some(member) && state.in_flight == Some(offset)).then_some(state)
}

/// The record and byte limits of one poll or fetch. The first record always fits, so a record
/// larger than the byte budget can still be consumed.
pub(super) struct Budget {
    records_left: usize,
    bytes_left: Option<u64>,
    taken: usize,
    /// What each header of a record counts besides its name and value.
    header_wire_bytes: u64,
}

impl Budget {
    /// At most `max_records` records, and `max_bytes` bytes past the first record, each record
    /// counting its size and `header_wire_bytes` for each header (see
    /// [`crate::HEADER_WIRE_BYTES`]).
    pub(super) fn new(max_records: i32, max_bytes: Option<u64>, header_wire_bytes: u64) -> Self {
        Budget {
            records_left: max_records as usize,
            bytes_left: max_bytes,
            taken: 0,
            header_wire_bytes,
        }
    }

    /// Takes `record` if it fits (see [`Budget::take`]).
    pub(super) fn take_record(&mut self, record: &StoredRecord) -> bool {
        let headers = record.headers().len() as u64;
        self.take(
            record
                .size()
                .saturating_add(headers.saturating_mul(self.header_wire_bytes)),
        )
    }

    /// The bytes a record after the first may take, if the budget bounds them.
    pub(super) fn room_after_first(&self) -> Option<u64> {
        self.bytes_left.filter(|_| self.taken > 0)
    }

    /// Whether no further record can fit, whatever its size: nothing more need be read.
    pub(super) fn spent(&self) -> bool {
        self.records_left == 0 || (self.taken > 0 && self.bytes_left == Some(0))
    }

    /// Takes one record of `size` bytes if it fits; `false` when the budget is spent.
    pub(super) fn take(&mut self, size: u64) -> bool {
        if self.records_left == 0 {
            return false;
        }
        if let Some(bytes_left) = &mut self.bytes_left {
            if self.taken > 0 && (*bytes_left == 0 || size > *bytes_left) {
                return false;
            }
            *bytes_left = bytes_left.saturating_sub(size);
        }
        self.records_left -= 1;
        self.taken += 1;
        true
    }
}
