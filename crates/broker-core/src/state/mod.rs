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
//! | `log` | one partition's records: offsets, appends, trimming |
//! | `topic` | topics and publishing: creation, placement by key, appends within limits |
//! | `group` | consumer groups: membership, assignment (and the `assignment` call), rebalancing |
//! | `consume` | ack mode (poll, ack, retry, redeliver) and fetch mode (fetch, commit) |
//! | `retention` | what leaves a partition, and the memory budget |
//! | `read` | read-only calls: committed, end offset, lag, and `describe` (whose types are in the crate's `describe` module) |
//! | `check` | the invariants, checked for a state that did not come from these methods |
//! | `apply` | one command in, one outcome out |
//! | `image` | the state as a [`crate::image::StateImage`] and back |

mod apply;
mod check;
mod consume;
mod group;
mod image;
mod log;
mod read;
mod retention;
mod topic;

use std::collections::HashMap;

use crate::validate::{check_capacity, check_identifier};
use crate::BrokerError;

use group::Group;
use retention::Memory;
use topic::Topic;

/// The whole broker: its topics, their partition logs and their consumer groups.
///
/// Every method documents the rule it applies by linking to the [`crate::EventBroker`] method of
/// the same name; methods that take more (a byte budget) say what the extra argument does.
#[derive(Debug, Clone)]
pub struct BrokerState {
    /// Records each partition retains at most.
    capacity: usize,
    topics: HashMap<String, Topic>,
    memory: Memory,
    limits: Limits,
}

/// How many topics, groups and members the broker holds at most, so that no client can grow
/// its metadata (which the memory budget does not count) without bound. A call that would pass
/// a limit is refused with `InvalidArgument` and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Topics in the broker.
    pub max_topics: usize,
    /// Consumer groups of one topic.
    pub max_groups_per_topic: usize,
    /// Members of one group.
    pub max_members_per_group: usize,
}

impl Default for Limits {
    /// 10,000 topics, 1,000 groups per topic, 1,000 members per group: room for thousands of
    /// services, while bounding what a misbehaving client can make the broker hold.
    fn default() -> Self {
        Limits {
            max_topics: 10_000,
            max_groups_per_topic: 1_000,
            max_members_per_group: 1_000,
        }
    }
}

impl BrokerState {
    /// An empty broker; see [`crate::EventBroker::new`].
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] unless the capacity is 1 to 1,000.
    pub fn new(capacity_per_partition: i32) -> Result<Self, BrokerError> {
        check_capacity(capacity_per_partition)?;
        Ok(BrokerState {
            capacity: capacity_per_partition as usize,
            topics: HashMap::new(),
            memory: Memory::default(),
            limits: Limits::default(),
        })
    }

    /// This state with other [`Limits`]. Topics, groups and members already present stay, even
    /// past lowered limits; only new ones are refused.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The per-partition capacity this broker was created with.
    pub fn capacity_per_partition(&self) -> i32 {
        // At most 1,000 (checked by `new` and by `from_image`).
        self.capacity as i32
    }

    /// The topic named `topic`, validated.
    #[inline]
    fn topic(&self, topic: &str) -> Result<&Topic, BrokerError> {
        check_identifier("topic", topic)?;
        self.topics.get(topic).ok_or_else(|| unknown_topic(topic))
    }

    /// [`BrokerState::topic`], mutable.
    #[inline]
    fn topic_mut(&mut self, topic: &str) -> Result<&mut Topic, BrokerError> {
        topic_in(&mut self.topics, topic)
    }

    /// Validates topic, group and member identifiers and looks up the topic.
    #[inline]
    fn topic_for_member(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
    ) -> Result<&mut Topic, BrokerError> {
        check_identifier("group", group)?;
        check_identifier("member", member)?;
        self.topic_mut(topic)
    }
}

/// The topic named `topic` in `topics`, validated: for methods that also borrow another field
/// of the state.
#[inline]
fn topic_in<'a>(
    topics: &'a mut HashMap<String, Topic>,
    topic: &str,
) -> Result<&'a mut Topic, BrokerError> {
    check_identifier("topic", topic)?;
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
