//! The broker's state and every rule that changes it.
//!
//! [`BrokerState`] is a plain, single-threaded value: each method validates its arguments
//! completely before it mutates anything, so a call that returns an error changes nothing.
//! [`crate::EventBroker`] wraps it in a mutex to make each call atomic; a server applies
//! [`crate::Command`]s to it through [`BrokerState::apply`].
//!
//! The rules are split by what they are about:
//!
//! | module | what |
//! |--------|------|
//! | `log` | one partition's records: offsets, times, appends, trimming, eviction to a cold store |
//! | `topic` | topics: creation, more partitions, deletion, purges; publishing: placement by key, appends within the topic's limits |
//! | `group` | consumer groups: membership, assignment (and the `assignment` call), rebalancing |
//! | `consume` | ack mode (poll, ack, retry, redeliver) and fetch mode (fetch, commit), and resetting a group's offsets |
//! | `retention` | what leaves a partition (consumed by every group, past a limit, too old), and the groups that skip what left |
//! | `memory` | the memory budget: the bytes retained across the broker, and the budget they stay within |
//! | `idempotence` | publishes numbered by their producer, stored once however often they are sent |
//! | `time` | the broker's clock, and what happens as it advances (age, acknowledgement deadlines) |
//! | `read` | read-only calls: committed, end offset, lag, and `describe` (whose types are in the crate's `describe` module) |
//! | `read_ahead` | a delivery's records on disk, read before the state is taken to apply it |
//! | `check` | the invariants, checked for a state that did not come from these methods |
//! | `apply` | one command in, one outcome out |
//! | `image` | the state as a [`crate::image::StateImage`] and back |

mod apply;
mod check;
mod consume;
mod dead_letter;
mod group;
mod idempotence;
mod image;
mod log;
mod memory;
mod read;
mod read_ahead;
mod retention;
mod time;
mod topic;

use std::collections::HashMap;
use std::sync::Arc;

use crate::cold::{Appended, ColdStore, LogId};
use crate::revision::{Revision, Rules};
use crate::validate::{
    check_capacity, check_product_capacity, NameRules, MAX_PARTITIONS, MAX_PARTITIONS_LIMIT,
};
use crate::BrokerError;

pub use dead_letter::{DeadLetterReason, DeadLettered, DEAD_LETTER_HEADER_BYTES};
use group::Group;
pub use idempotence::{MAX_PRODUCERS, RECENT_BATCHES};
pub use image::TopicExport;
use memory::Memory;
pub use read::PendingRead;
pub use read_ahead::{ColdReads, ReadAhead, ReadAheadAt};
use topic::Topic;

/// The whole broker: its topics, their partition logs and their consumer groups.
///
/// Every method documents the rule it applies by linking to the [`crate::EventBroker`] method of
/// the same name; methods that take more (a byte budget) say what the extra argument does.
///
/// The state reads no clock: time enters through [`BrokerState::apply_at`] and
/// [`BrokerState::advance_clock`], so that the same commands at the same times always give the
/// same state (a log replays them, replicas apply them).
#[derive(Debug, Clone)]
pub struct BrokerState {
    /// Records each partition of an interest-retention topic retains at most, unless the topic
    /// says otherwise.
    capacity: u64,
    /// The broker's time, in milliseconds since the Unix epoch: the latest time it was given.
    clock_ms: i64,
    /// The id the next topic created gets: ids are never reused, so a cold store never mixes
    /// the records of a deleted topic with those of a new one of the same name.
    next_topic_id: u64,
    /// Where evicted records are read from, once a storage layer set one.
    cold: Option<Arc<dyn ColdStore>>,
    /// Why every command is refused: the cold store failed while a change was being applied,
    /// which may have applied it in part.
    failure: Option<String>,
    topics: HashMap<String, Topic>,
    memory: Memory,
    limits: Limits,
    /// Which names of topics, groups and members calls may use.
    names: NameRules,
    /// The rules commands are applied under, and what they decide.
    revision: Revision,
    rules: Rules,
    /// Records moved to dead-letter topics and not yet taken ([`BrokerState::take_dead_letters`]).
    dead_letters: Vec<DeadLettered>,
    /// How many records went past their last delivery since the state was made
    /// ([`BrokerState::dead_letter_events`]).
    dead_letter_events: u64,
    /// Every record appended and not yet taken ([`BrokerState::take_appended`]), once a storage
    /// layer asked for them ([`BrokerState::record_appends`]); `None` notes nothing.
    appended: Option<Vec<Appended>>,
}

/// How many topics, partitions, groups and members the broker holds at most, so that no client
/// can grow its metadata (which the memory budget does not count) without bound. A call that
/// would pass a limit is refused with `InvalidArgument` and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Topics in the broker.
    pub max_topics: usize,
    /// Partitions of one topic (at least 1, at most [`MAX_PARTITIONS_LIMIT`]).
    pub max_partitions: usize,
    /// Consumer groups of one topic.
    pub max_groups_per_topic: usize,
    /// Members of one group.
    pub max_members_per_group: usize,
}

impl Default for Limits {
    /// 10,000 topics of up to 64 partitions, 1,000 groups per topic, 1,000 members per group:
    /// room for thousands of services, while bounding what a misbehaving client can make the
    /// broker hold.
    fn default() -> Self {
        Limits {
            max_topics: 10_000,
            max_partitions: MAX_PARTITIONS as usize,
            max_groups_per_topic: 1_000,
            max_members_per_group: 1_000,
        }
    }
}

impl BrokerState {
    /// An empty broker whose interest-retention partitions each keep at most
    /// `capacity_per_partition` records, 1 to 2,147,483,647 ([`crate::EventBroker::new`] keeps
    /// the contract's 1 to 1,000).
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] for a capacity out of that range.
    pub fn new(capacity_per_partition: i32) -> Result<Self, BrokerError> {
        check_product_capacity(capacity_per_partition)?;
        Ok(BrokerState {
            capacity: capacity_per_partition as u64,
            clock_ms: 0,
            next_topic_id: 0,
            cold: None,
            failure: None,
            topics: HashMap::new(),
            memory: Memory {
                rules: Revision::NEWEST.rules().budget,
                ..Memory::default()
            },
            limits: Limits::default(),
            names: NameRules::default(),
            revision: Revision::NEWEST,
            rules: Revision::NEWEST.rules(),
            dead_letters: Vec::new(),
            dead_letter_events: 0,
            appended: None,
        })
    }

    /// An empty broker with this one's settings: its capacity per partition, memory budget,
    /// limits, name rules and revision, but no topic, no cold store and its clock at 0.
    #[must_use]
    pub fn emptied(&self) -> Self {
        BrokerState {
            capacity: self.capacity,
            clock_ms: 0,
            next_topic_id: 0,
            cold: None,
            failure: None,
            topics: HashMap::new(),
            memory: Memory {
                budget: self.memory.budget,
                retained: 0,
                records: 0,
                rules: self.memory.rules,
            },
            limits: self.limits,
            names: self.names,
            revision: self.revision,
            rules: self.rules,
            dead_letters: Vec::new(),
            dead_letter_events: 0,
            appended: self.appended.as_ref().map(|_| Vec::new()),
        }
    }

    /// [`BrokerState::new`] with the contract's capacity range, 1 to 1,000.
    pub(crate) fn with_contract_capacity(capacity_per_partition: i32) -> Result<Self, BrokerError> {
        check_capacity(capacity_per_partition)?;
        BrokerState::new(capacity_per_partition)
    }

    /// This state with other [`Limits`]. Topics, partitions, groups and members already present
    /// stay, even past lowered limits; only new ones are refused. A partition limit above
    /// [`MAX_PARTITIONS_LIMIT`] (or 0) is taken as that limit (or 1).
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = Limits {
            max_partitions: limits
                .max_partitions
                .clamp(1, MAX_PARTITIONS_LIMIT as usize),
            ..limits
        };
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// This state checking names of topics, groups and members by `names`. Every call checks
    /// every name it is given by these rules, those of topics and groups already present
    /// included: a state given narrower rules than it had keeps its topics but refuses calls
    /// naming those the new rules do not allow.
    #[must_use]
    pub fn with_names(mut self, names: NameRules) -> Self {
        self.names = names;
        self
    }

    /// The name rules in force.
    pub fn names(&self) -> NameRules {
        self.names
    }

    /// Checks names by `names` from now on, as [`BrokerState::with_names`]; the rules it had.
    pub fn set_names(&mut self, names: NameRules) -> NameRules {
        std::mem::replace(&mut self.names, names)
    }

    /// Applies commands, and lets time pass, under `revision` from now on; the revision it
    /// had. A new state applies [`Revision::NEWEST`]; a log replays each entry under the
    /// revision it was written under (see [`Revision`]). Like the name rules, the revision is
    /// not part of the state's image.
    pub fn set_revision(&mut self, revision: Revision) -> Revision {
        self.rules = revision.rules();
        self.memory.rules = self.rules.budget;
        std::mem::replace(&mut self.revision, revision)
    }

    /// The revision commands are applied under.
    pub fn revision(&self) -> Revision {
        self.revision
    }

    /// The broker's default capacity per partition (interest retention).
    pub fn capacity_per_partition(&self) -> i32 {
        // At most 2,147,483,647 (checked by `new` and by `from_image`).
        self.capacity as i32
    }

    /// This state with another default capacity per partition: topics that set no capacity of
    /// their own keep this many records at most from now on (partitions holding more keep them,
    /// and refuse publishes until they are consumed below it). A capacity below 1 is taken as
    /// 1.
    #[must_use]
    pub fn with_capacity(mut self, capacity_per_partition: i32) -> Self {
        self.capacity = capacity_per_partition.max(1) as u64;
        self
    }

    /// This state reading evicted records from `store`: the records [`BrokerState::evict`]
    /// names leave memory and are read from it from then on. Replaces the store records already
    /// evicted are read from.
    #[must_use]
    pub fn with_cold_store(mut self, store: Arc<dyn ColdStore>) -> Self {
        for topic in self.topics.values_mut() {
            for log in &mut topic.partitions {
                if let Some(cold) = &mut log.cold {
                    cold.store = Arc::clone(&store);
                }
            }
        }
        self.cold = Some(store);
        self
    }

    /// The id of topic `topic` (see [`LogId`]), if the broker has it.
    pub fn topic_id(&self, topic: &str) -> Option<u64> {
        self.topics.get(topic).map(|topic| topic.id)
    }

    /// From now on (`true`), notes every record appended to any partition (by a publish, a
    /// dead letter or a produce) for [`BrokerState::take_appended`], so that a storage layer
    /// can write each record once, as it comes; `false` stops and drops what was noted.
    /// Nothing is noted by default: a state without a storage layer pays nothing.
    pub fn record_appends(&mut self, record: bool) {
        self.appended = record.then(Vec::new);
    }

    /// The records appended since the last call, in the order they were appended (every
    /// partition's in offset order), when [`BrokerState::record_appends`] asked for them; none
    /// otherwise. A record appended and dropped again by the same command (a partition at its
    /// limits) is among them: it had its offset.
    pub fn take_appended(&mut self) -> Vec<Appended> {
        self.appended
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Makes room for `count` more records noted appended, when they are noted: a batch's
    /// records are noted one at a time.
    fn reserve_appended(&mut self, count: usize) {
        if let Some(appended) = &mut self.appended {
            appended.reserve(count);
        }
    }

    /// For each `(log, offset)` of `evicted`: the records of `log` below `offset` are in the cold
    /// store now (which holds every retained record of `log` below it), so they leave memory.
    /// Changes where records are read from, never what any command does. Without a cold store,
    /// or for logs or offsets the state no longer retains, nothing happens.
    pub fn evict(&mut self, evicted: &[(LogId, i64)]) {
        let Some(store) = &self.cold else {
            return;
        };
        let mut by_id: HashMap<u64, &mut Topic> = self
            .topics
            .values_mut()
            .map(|topic| (topic.id, topic))
            .collect();
        for &(log, offset) in evicted {
            let partition = by_id
                .get_mut(&log.topic)
                .and_then(|topic| topic.partitions.get_mut(log.partition as usize));
            if let Some(partition) = partition {
                partition.evict(store, log, offset);
            }
        }
    }

    /// Whether a topic named `topic` exists.
    pub fn holds_topic(&self, topic: &str) -> bool {
        self.topics.contains_key(topic)
    }

    /// The names of the topics that exist, in no particular order.
    pub fn topic_names(&self) -> impl Iterator<Item = &str> {
        self.topics.keys().map(String::as_str)
    }

    /// Why the state refuses every command, if it does: its cold store failed while a change
    /// was being applied, so the state may hold half of that change. The state must be rebuilt
    /// from its log.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The topic named `topic`, validated.
    #[inline]
    fn topic(&self, topic: &str) -> Result<&Topic, BrokerError> {
        self.names.check("topic", topic)?;
        self.topics.get(topic).ok_or_else(|| unknown_topic(topic))
    }

    /// [`BrokerState::topic`], mutable.
    #[inline]
    fn topic_mut(&mut self, topic: &str) -> Result<&mut Topic, BrokerError> {
        topic_in(&mut self.topics, self.names, topic)
    }

    /// Validates topic, group and member identifiers and looks up the topic.
    #[inline]
    fn topic_for_member(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<&mut Topic, BrokerError> {
        self.names.check("group", group)?;
        self.names.check("member", member)?;
        self.topic_mut(topic)
    }
}

/// The topic named `topic` in `topics`, validated: for methods that also borrow another field
/// of the state.
#[inline]
fn topic_in<'a>(
    topics: &'a mut HashMap<String, Topic>,
    names: NameRules,
    topic: &str,
) -> Result<&'a mut Topic, BrokerError> {
    names.check("topic", topic)?;
    topics.get_mut(topic).ok_or_else(|| unknown_topic(topic))
}

#[cold]
fn unknown_topic(topic: &str) -> BrokerError {
    BrokerError::invalid(format!("unknown topic {topic:?}"))
}

/// The group and the member's index in it, when both exist.
#[inline]
fn member_of<'a>(
    groups: &'a mut HashMap<String, Group>,
    group: &str,
    member: &str,
) -> Option<(&'a mut Group, usize)> {
    let group = groups.get_mut(group)?;
    let member = group.member_index(member)?;
    Some((group, member))
}
