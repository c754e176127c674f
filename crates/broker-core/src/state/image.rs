//! The state as a [`StateImage`] and back.

use std::collections::{HashMap, VecDeque};

use super::group::{Group, GroupPartition, Member};
use super::log::{PartitionLog, StoredRecord};
use super::retention::Memory;
use super::topic::Topic;
use super::{BrokerState, Limits};
use crate::image::{
    GroupImage, GroupPartitionImage, MemberImage, PartitionImage, RecordImage, StateImage,
    TopicImage,
};
use crate::{Assignor, KeyHash};

impl BrokerState {
    /// The whole state as plain data, topics and groups sorted by name (so equal states give
    /// equal images). Records are shared, not copied.
    pub fn to_image(&self) -> StateImage {
        let mut topics: Vec<(String, TopicImage)> = self
            .topics
            .iter()
            .map(|(name, topic)| (name.clone(), topic_image(topic)))
            .collect();
        topics.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        StateImage {
            capacity: self.capacity as u64,
            topics,
            memory_budget: self.memory.budget,
            retained_bytes: self.memory.retained,
            max_topics: self.limits.max_topics as u64,
            max_groups_per_topic: self.limits.max_groups_per_topic as u64,
            max_members_per_group: self.limits.max_members_per_group as u64,
        }
    }

    /// The state an image describes, once every invariant the methods rely on is checked (see
    /// [`BrokerState::check_consistency`]): an image from a damaged or hand-edited file is
    /// refused here instead of failing later.
    ///
    /// # Errors
    /// A description of the first thing wrong.
    pub fn from_image(image: StateImage) -> Result<BrokerState, String> {
        let usize_of = |value: u64, what: &str| {
            usize::try_from(value).map_err(|_| format!("{what} {value} out of range"))
        };
        let mut topics = HashMap::with_capacity(image.topics.len());
        for (name, topic) in image.topics {
            let topic = topic_from(topic).map_err(|why| format!("topic {name:?}: {why}"))?;
            if topics.insert(name.clone(), topic).is_some() {
                return Err(format!("topic {name:?} appears twice"));
            }
        }
        let state = BrokerState {
            capacity: usize_of(image.capacity, "capacity")?,
            topics,
            memory: Memory {
                budget: image.memory_budget,
                retained: image.retained_bytes,
            },
            limits: Limits {
                max_topics: usize_of(image.max_topics, "max topics")?,
                max_groups_per_topic: usize_of(image.max_groups_per_topic, "max groups")?,
                max_members_per_group: usize_of(image.max_members_per_group, "max members")?,
            },
        };
        state.check_consistency()?;
        Ok(state)
    }
}

fn topic_image(topic: &Topic) -> TopicImage {
    let mut groups: Vec<(String, GroupImage)> = topic
        .groups
        .iter()
        .map(|(name, group)| (name.clone(), group_image(group)))
        .collect();
    groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    TopicImage {
        key_hash: match topic.key_hash {
            KeyHash::Murmur2 => 0,
            KeyHash::Fnv1a => 1,
        },
        next_keyless: topic.next_keyless as u64,
        partitions: topic
            .partitions
            .iter()
            .map(|log| PartitionImage {
                base: log.base,
                records: log
                    .records
                    .iter()
                    .map(|record| RecordImage {
                        key: record.key.clone(),
                        payload: record.payload.clone(),
                    })
                    .collect(),
                retained_bytes: log.retained_bytes,
            })
            .collect(),
        groups,
    }
}

fn group_image(group: &Group) -> GroupImage {
    GroupImage {
        assignor: match group.assignor {
            Assignor::RoundRobin => 0,
            Assignor::Range => 1,
        },
        members: group
            .members
            .iter()
            .map(|member| MemberImage {
                id: member.id.clone(),
                partitions: member.partitions.clone(),
            })
            .collect(),
        partitions: group
            .partitions
            .iter()
            .map(|state| GroupPartitionImage {
                owner: state.owner.map(|owner| owner as u64),
                committed: state.committed,
                position: state.position,
                in_flight: state.in_flight,
            })
            .collect(),
    }
}

fn topic_from(image: TopicImage) -> Result<Topic, String> {
    let key_hash = match image.key_hash {
        0 => KeyHash::Murmur2,
        1 => KeyHash::Fnv1a,
        code => return Err(format!("unknown key hash code {code}")),
    };
    let mut groups = HashMap::with_capacity(image.groups.len());
    for (name, group) in image.groups {
        let group = group_from(group).map_err(|why| format!("group {name:?}: {why}"))?;
        if groups.insert(name.clone(), group).is_some() {
            return Err(format!("group {name:?} appears twice"));
        }
    }
    Ok(Topic {
        key_hash,
        next_keyless: usize::try_from(image.next_keyless)
            .map_err(|_| "next keyless partition out of range".to_owned())?,
        partitions: image
            .partitions
            .into_iter()
            .map(|log| PartitionLog {
                base: log.base,
                records: log
                    .records
                    .into_iter()
                    .map(|record| StoredRecord {
                        key: record.key,
                        payload: record.payload,
                    })
                    .collect::<VecDeque<_>>(),
                retained_bytes: log.retained_bytes,
            })
            .collect(),
        groups,
    })
}

fn group_from(image: GroupImage) -> Result<Group, String> {
    let assignor = match image.assignor {
        0 => Assignor::RoundRobin,
        1 => Assignor::Range,
        code => return Err(format!("unknown assignor code {code}")),
    };
    let mut partitions = Vec::with_capacity(image.partitions.len());
    for state in image.partitions {
        partitions.push(GroupPartition {
            owner: state
                .owner
                .map(|owner| usize::try_from(owner).map_err(|_| "owner out of range".to_owned()))
                .transpose()?,
            committed: state.committed,
            position: state.position,
            in_flight: state.in_flight,
        });
    }
    Ok(Group {
        assignor,
        members: image
            .members
            .into_iter()
            .map(|member| Member {
                id: member.id,
                partitions: member.partitions,
            })
            .collect(),
        partitions,
    })
}
