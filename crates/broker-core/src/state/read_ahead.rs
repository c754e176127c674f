//! Reading a delivery's records on disk before the state's lock is taken to apply it.
//!
//! A delivery to a group member (`Fetch`, `Poll`, `AckAndPoll`, `Redeliver`) changes the state
//! and reads records (a `Read` only reads them, but in a cluster it is applied from the log as
//! every command is): those evicted to the cold store are read while the caller holds the
//! state, and every other call waits meanwhile. A caller that would rather read them first
//! asks the state where they lie ([`BrokerState::cold_reads_of`], which changes nothing), lets
//! the state go, reads them ([`ColdReads::read`]), takes the state again and hands them over
//! ([`BrokerState::read_ahead`]) for the delivery to take them from memory, then takes back
//! what it did not use ([`BrokerState::forget_read_ahead`]).
//!
//! It is a guess, never a rule: records in a cold store never change, so whatever the state
//! did meanwhile, a record read ahead is the record at its offset; a delivery that now starts
//! elsewhere reads the rest from the store as before. Nothing a command answers depends on
//! whether its records were read ahead.

use std::ops::Range;
use std::sync::Arc;

use super::group::is_overdue;
use super::log::{PartitionLog, ReadAheadRun, StoredRecord};
use super::BrokerState;
use crate::cold::{ColdStore, LogId};
use crate::validate::{check_fetch_max_records, check_offset, check_poll_max_records};
use crate::Command;

/// Where the records a delivery would take from the cold store lie, by the state when it was
/// asked ([`BrokerState::cold_reads_of`]).
#[derive(Debug)]
pub struct ColdReads {
    runs: Vec<PlannedRun>,
    /// The byte budget shared by the runs in order.
    max_bytes: Option<u64>,
    /// Whether the runs are a poll's, one record each, which it takes whole while the budget
    /// has room for it (the first always): a record the budget has no room for ends the
    /// reading (a fetch's budget ends within a run).
    whole_records: bool,
}

/// One partition's part of [`ColdReads`].
struct PlannedRun {
    topic: String,
    partition: usize,
    store: Arc<dyn ColdStore>,
    log: LogId,
    offsets: Range<i64>,
    /// The bytes of the records the delivery takes from memory between the run before this
    /// one (or its start) and this one: they spend the budget first.
    memory_before: u64,
    /// Whether the delivery takes no record before this run's: its first record is then the
    /// delivery's first, which comes whatever the budget.
    takes_first: bool,
}

impl PlannedRun {
    /// `records`, read from the start of this run, as the state takes them (with the size of
    /// the record after them when the budget stopped there).
    fn ahead_of(
        self,
        records: Vec<crate::image::RecordImage>,
        next_size: Option<u64>,
    ) -> (String, usize, ReadFrom, ReadAheadRun) {
        (
            self.topic,
            self.partition,
            ReadFrom {
                store: std::panic::AssertUnwindSafe(self.store),
                log: self.log,
            },
            ReadAheadRun {
                first: self.offsets.start,
                records: Arc::new(records.into_iter().map(StoredRecord::from).collect()),
                next_size,
            },
        )
    }
}

impl std::fmt::Debug for PlannedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedRun")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("offsets", &self.offsets)
            .finish_non_exhaustive()
    }
}

/// Records read by [`ColdReads::read`], for [`BrokerState::read_ahead`].
#[derive(Debug, Default)]
pub struct ReadAhead {
    runs: Vec<(String, usize, ReadFrom, ReadAheadRun)>,
}

/// The store and log a run was read from: records read ahead go only to a partition whose
/// cold part is that log of that store (a state rebuilt from nothing numbers its logs anew).
#[derive(Debug)]
struct ReadFrom {
    /// (Compared by address only: nothing of it is used across a panic.)
    store: std::panic::AssertUnwindSafe<Arc<dyn ColdStore>>,
    log: LogId,
}

/// Where [`BrokerState::read_ahead`] put records, for [`BrokerState::forget_read_ahead`].
#[derive(Debug, Default)]
#[must_use = "records read ahead stay in memory until forgotten"]
pub struct ReadAheadAt(Vec<(String, usize, Arc<Vec<StoredRecord>>)>);

impl ColdReads {
    /// Reads the records from the cold store, the runs in order within the byte budget (as
    /// the delivery would). A run that cannot be read ends the reading: the delivery reads
    /// it again, and answers the error as it would have.
    pub fn read(self) -> ReadAhead {
        let mut left = self.max_bytes;
        let mut read = ReadAhead::default();
        for run in self.runs {
            // The delivery's first record is taken whatever the budget: it is read whole, and
            // the others only while there is room for them, after what memory gave before.
            left = left.map(|left| left.saturating_sub(run.memory_before));
            let first = run.takes_first;
            let budget = match self.whole_records {
                true => None,
                false => left,
            };
            // Where the reading stops before this run: with the size of its first record when
            // that is why, noted so that the poll need not ask the index again under the lock.
            let stop: Option<Option<u64>> = match (self.whole_records, left) {
                (_, None) => None,
                (true, Some(_)) if first => None,
                // A poll's next record: its size, from the index alone, says whether it fits.
                (true, Some(left)) => match run.store.bytes(run.log, run.offsets.clone()) {
                    Ok(size) if size <= left => None,
                    Ok(size) => Some(Some(size)),
                    Err(_) => Some(None),
                },
                (false, Some(left)) => (!first && left == 0).then_some(None),
            };
            if let Some(size) = stop {
                if size.is_some() {
                    read.runs.push(run.ahead_of(Vec::new(), size));
                }
                break;
            }
            let Ok(records) = run.store.read(run.log, run.offsets.clone(), budget) else {
                break;
            };
            let bytes: u64 = records.iter().map(crate::image::RecordImage::size).sum();
            left = left.map(|left| left.saturating_sub(bytes));
            let end = run.offsets.start + records.len() as i64;
            let short = end < run.offsets.end;
            // The budget ends here: the size of the record that does not fit tells the
            // delivery so, without reading anything under the lock.
            let next_size = short
                .then(|| run.store.bytes(run.log, end..end + 1).ok())
                .flatten();
            read.runs.push(run.ahead_of(records, next_size));
            if short {
                break;
            }
        }
        read
    }
}

impl ReadAhead {
    /// How many records were read.
    pub fn len(&self) -> usize {
        self.runs
            .iter()
            .map(|(_, _, _, run)| run.records.len())
            .sum()
    }

    /// Whether no record was read.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl BrokerState {
    /// Where the records `command` would deliver from the cold store lie, if it is a delivery
    /// (`Fetch`, `Poll`, `AckAndPoll`, `Redeliver`) whose next records, by the state now, were
    /// evicted, or a `Read` of records that were: to read before applying it (see the module's
    /// documentation). Changes nothing, and reads nothing.
    pub fn cold_reads_of(&self, command: &Command) -> Option<ColdReads> {
        if let Command::Read {
            topic,
            partition,
            offset,
            max_records,
            max_bytes,
        } = command
        {
            return self.cold_reads_of_read(topic, *partition, *offset, *max_records, *max_bytes);
        }
        let delivery = Delivery::of(command)?;
        let header_wire_bytes = self.rules.header_wire_bytes;
        let mut runs = Vec::new();
        let mut memory_before = 0u64;
        let mut taken_before = false;
        for (partition, log, offsets) in self.delivered_ranges(&delivery)? {
            // A range's records on the cold store come before those in memory.
            if let Some(run) = log.cold_run(offsets.start, offsets.end) {
                runs.push(PlannedRun {
                    topic: delivery.topic.to_owned(),
                    partition,
                    store: Arc::clone(&run.store),
                    log: run.id,
                    offsets: run.offsets,
                    memory_before: std::mem::take(&mut memory_before),
                    takes_first: !taken_before,
                });
            }
            let in_memory: u64 = log
                .memory_run(offsets.start, offsets.end)
                .map(|record| {
                    let headers = record.headers().len() as u64;
                    record
                        .size()
                        .saturating_add(headers.saturating_mul(header_wire_bytes))
                })
                .sum();
            memory_before = memory_before.saturating_add(in_memory);
            taken_before |= !offsets.is_empty();
        }
        (!runs.is_empty()).then_some(ColdReads {
            runs,
            max_bytes: delivery.max_bytes,
            whole_records: matches!(delivery.kind, DeliveryKind::Poll { .. }),
        })
    }

    /// Where the records a `Read` of `partition` of `topic` from `offset` would take from the
    /// cold store lie (as [`BrokerState::begin_read`] finds them); `None` for a read the state
    /// would refuse, or that takes nothing from the cold store.
    fn cold_reads_of_read(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_records: i32,
        max_bytes: Option<u64>,
    ) -> Option<ColdReads> {
        check_offset(offset).ok()?;
        check_fetch_max_records(max_records).ok()?;
        let state = self.topics.get(topic)?;
        let index = state.partition(partition).ok()?;
        let log = &state.partitions[index];
        if offset > log.end() {
            return None;
        }
        let first = offset.max(log.base);
        let run = log.cold_run(
            first,
            log.run_end(first, usize::try_from(max_records).ok()?),
        )?;
        Some(ColdReads {
            runs: vec![PlannedRun {
                topic: topic.to_owned(),
                partition: index,
                store: Arc::clone(&run.store),
                log: run.id,
                offsets: run.offsets,
                memory_before: 0,
                takes_first: true,
            }],
            max_bytes,
            whole_records: false,
        })
    }

    /// Whether `command` may deliver records if applied now: `false` only for a delivery
    /// (`Fetch`, `Poll`, `AckAndPoll`, `Redeliver`) of a member that, by the state now, has
    /// nothing to take (every partition it owns read to its end, or holding a delivery in
    /// flight that is not released, or held back by a delayed retry). A request waiting for
    /// records asks this before it is tried again, so that one that would find nothing is not
    /// applied (in a cluster, not proposed): it waits for the next change instead. Anything
    /// else (another command, a member or group that does not exist, a count the command
    /// refuses) may: trying it answers what it answers.
    pub fn may_deliver(&self, command: &Command) -> bool {
        Delivery::of(command)
            .and_then(|delivery| self.delivered_ranges(&delivery))
            .is_none_or(|ranges| ranges.iter().any(|(_, _, offsets)| !offsets.is_empty()))
    }

    /// The offsets a delivery would take, by the state now, in each partition it would take
    /// some from (its index and log, in the order the delivery takes them); `None` when the
    /// delivery would be refused (no such topic, group or member, or a count out of range).
    fn delivered_ranges(
        &self,
        delivery: &Delivery<'_>,
    ) -> Option<Vec<(usize, &PartitionLog, Range<i64>)>> {
        let Delivery {
            topic,
            group,
            member,
            max_records,
            kind,
            ..
        } = *delivery;
        let state = self.topics.get(topic)?;
        let group = state.groups.get(group)?;
        let member = group.member_index(member)?;
        // A count the command will refuse reads nothing.
        match kind {
            DeliveryKind::Fetch => check_fetch_max_records(max_records).ok()?,
            DeliveryKind::Poll { .. } => check_poll_max_records(max_records).ok()?,
        }
        let mut records_left = usize::try_from(max_records).ok()?;
        let mut ranges = Vec::new();
        for &partition in &group.members[member].partitions {
            if records_left == 0 {
                break;
            }
            let index = partition as usize;
            let (Some(log), Some(progress)) =
                (state.partitions.get(index), group.partitions.get(index))
            else {
                continue;
            };
            let (from, to) = if let DeliveryKind::Poll { acks, redeliver } = kind {
                // The record a poll would take: past an acknowledgement of the delivery in
                // flight, or the one in flight again when redelivered.
                let acked = acks
                    .iter()
                    .find(|&&(acked, offset)| {
                        acked == partition && progress.in_flight == Some(offset)
                    })
                    .map(|&(_, offset)| offset + 1);
                let overdue = group.settings.ack_timeout_ms.is_some_and(|timeout| {
                    is_overdue(
                        progress.delivered_at_ms,
                        timeout,
                        self.clock_ms,
                        self.rules.later_delivery_not_overdue,
                    )
                });
                let released = acked.is_some() || redeliver || overdue;
                let eligible = match progress.in_flight {
                    Some(_) => released,
                    // Not held back by a delayed retry.
                    None => !progress.is_held(self.clock_ms),
                };
                if !eligible {
                    continue;
                }
                let from = acked.unwrap_or(progress.committed).max(log.base);
                (from, log.run_end(from, 1))
            } else {
                let from = progress.position.max(log.base);
                (from, log.run_end(from, records_left))
            };
            records_left -= usize::try_from(to - from).unwrap_or(0);
            ranges.push((index, log, from..to));
            if kind == DeliveryKind::Fetch && to < log.end() {
                // The fetch's record budget ends in this partition.
                break;
            }
        }
        Some(ranges)
    }

    /// Hands records read ahead to the partitions they were read from, for the next command
    /// to take them from memory instead of the cold store; records of a partition whose log
    /// is no longer the one they were read from are dropped. A partition holds one run at a
    /// time: records handed to it replace those another caller handed over before.
    pub fn read_ahead(&mut self, ahead: ReadAhead) -> ReadAheadAt {
        let mut at = ReadAheadAt::default();
        for (topic, partition, from, run) in ahead.runs {
            let cold = self
                .topics
                .get_mut(&topic)
                .and_then(|state| state.partitions.get_mut(partition))
                .and_then(|log| log.cold.as_mut())
                .filter(|cold| cold.id == from.log && Arc::ptr_eq(&cold.store, &from.store.0));
            if let Some(cold) = cold {
                at.0.push((topic, partition, Arc::clone(&run.records)));
                cold.ahead = Some(run);
            }
        }
        at
    }

    /// Drops the records [`BrokerState::read_ahead`] handed over at `at`, where no later
    /// call replaced them.
    pub fn forget_read_ahead(&mut self, at: ReadAheadAt) {
        for (topic, partition, records) in at.0 {
            let cold = self
                .topics
                .get_mut(&topic)
                .and_then(|state| state.partitions.get_mut(partition))
                .and_then(|log| log.cold.as_mut());
            if let Some(cold) = cold {
                if cold
                    .ahead
                    .as_ref()
                    .is_some_and(|ahead| Arc::ptr_eq(&ahead.records, &records))
                {
                    cold.ahead = None;
                }
            }
        }
    }
}

/// What a delivery command asks, as far as reading ahead goes.
struct Delivery<'a> {
    topic: &'a str,
    group: &'a str,
    member: &'a str,
    max_records: i32,
    max_bytes: Option<u64>,
    kind: DeliveryKind<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeliveryKind<'a> {
    /// Records from the member's positions, as many as the budget takes.
    Fetch,
    /// One record per partition, after acknowledging `acks` or releasing the deliveries in
    /// flight (`redeliver`).
    Poll {
        acks: &'a [(i32, i64)],
        redeliver: bool,
    },
}

impl<'a> Delivery<'a> {
    /// The delivery `command` asks for, if it is one.
    fn of(command: &'a Command) -> Option<Delivery<'a>> {
        let (topic, group, member, max_records, max_bytes, kind) = match command {
            Command::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            }
            | Command::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            }
            | Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => {
                let kind = match command {
                    Command::Fetch { .. } => DeliveryKind::Fetch,
                    _ => DeliveryKind::Poll {
                        acks: &[],
                        redeliver: matches!(command, Command::Redeliver { .. }),
                    },
                };
                (topic, group, member, max_records, max_bytes, kind)
            }
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            } => {
                let kind = DeliveryKind::Poll {
                    acks,
                    redeliver: false,
                };
                (topic, group, member, max_records, max_bytes, kind)
            }
            _ => return None,
        };
        Some(Delivery {
            topic,
            group,
            member,
            max_records: *max_records,
            max_bytes: *max_bytes,
            kind,
        })
    }
}
