//! A group's committed offsets: OffsetCommit, OffsetFetch and OffsetDelete, kept with the
//! broker's group of the same name on each topic.

use std::collections::{BTreeMap, BTreeSet};

use broker_core::{Command, CommandKind, Outcome, TopicDescription};
use broker_proto::ErrorReply;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::{
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::elsewhere::offset_fetch_refused;
use crate::errors::{code, coordinator_error};
use crate::Backend;

use super::{in_turns, kafka_topic, topic_name, unexpected, Handler};

impl<B: Backend> Handler<'_, B> {
    pub(super) async fn offset_commit(&self, request: OffsetCommitRequest) -> OffsetCommitResponse {
        let group = request.group_id.as_str();
        // The generation checked here still holds when the offsets are stored: no member
        // joins meanwhile, so no new owner's commit can land before this one.
        let _turn = self.state.groups.commit_turn(group).await;
        let allowed = if self.is_group_id(group) {
            let member = (
                request.member_id.as_str(),
                request.generation_id_or_member_epoch,
            );
            let may_adopt = self.may_adopt(group, member).await;
            self.state.groups.may_commit(
                group,
                request.member_id.as_str(),
                request.generation_id_or_member_epoch,
                may_adopt,
            )
        } else {
            Err(ResponseError::InvalidGroupId)
        };
        let topics = request.topics.into_iter().map(|topic| async move {
            let offsets: Vec<(i32, i64)> = topic
                .partitions
                .iter()
                .map(|p| (p.partition_index, p.committed_offset))
                .collect();
            let errors = match allowed {
                Err(error) => vec![Some(error); offsets.len()],
                Ok(()) => {
                    self.commit_offsets(group, topic_name(&topic.name), &offsets)
                        .await
                }
            };
            OffsetCommitResponseTopic::default()
                .with_name(topic.name)
                .with_partitions(
                    offsets
                        .iter()
                        .zip(errors)
                        .map(|(&(partition, _), error)| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(partition)
                                .with_error_code(code(error))
                        })
                        .collect(),
                )
        });
        OffsetCommitResponse::default().with_topics(in_turns(topics).await)
    }

    /// Stores `group`'s committed `offsets` (partition, offset) on `topic`; each one's error,
    /// if any. A partition the topic does not have is refused with
    /// `UNKNOWN_TOPIC_OR_PARTITION`. An offset past its partition's end, or negative, is refused with
    /// `OFFSET_OUT_OF_RANGE` and the others are stored: the broker keeps no committed offset
    /// past the end or below zero (it would store the end, or zero), and a consumer that
    /// resumed from the end would read nothing where Kafka's consumer resumes from its
    /// `auto.offset.reset`.
    async fn commit_offsets(
        &self,
        group: &str,
        topic: String,
        offsets: &[(i32, i64)],
    ) -> Vec<Option<ResponseError>> {
        // The group's lag gives every partition's end offset in one call. Offsets only grow, so
        // an offset within the end when read is still within it when stored.
        let lag = Command::Lag {
            topic: topic.clone(),
            group: group.to_owned(),
        };
        let ends = match self.call(lag).await {
            Ok(Outcome::Lag(rows)) => rows,
            Ok(other) => return vec![Some(coordinator_error(&unexpected(&other))); offsets.len()],
            Err(refusal) => return vec![Some(coordinator_error(&refusal)); offsets.len()],
        };
        // One row per partition, in order. A negative offset is no position either.
        let past_end = |&(partition, offset): &(i32, i64)| {
            offset < 0
                || usize::try_from(partition)
                    .ok()
                    .and_then(|index| ends.get(index))
                    .is_some_and(|row| offset > row.end_offset)
        };
        // A partition the topic does not have is refused alone, as Kafka does: the others are
        // stored.
        let unknown = |&(partition, _): &(i32, i64)| {
            usize::try_from(partition)
                .ok()
                .and_then(|index| ends.get(index))
                .is_none()
        };
        let stored: Vec<(i32, i64)> = offsets
            .iter()
            .copied()
            .filter(|o| !past_end(o) && !unknown(o))
            .collect();
        let error = if stored.is_empty() {
            None
        } else {
            let command = Command::CommitGroup {
                topic,
                group: group.to_owned(),
                offsets: stored,
            };
            match self.call(command).await {
                Ok(_) => None,
                // The broker's group has members of its own: as in Kafka, only a group's
                // members commit while it has some.
                Err(ErrorReply::InvalidArgument(text)) if text.contains("members of its own") => {
                    Some(ResponseError::UnknownMemberId)
                }
                Err(refusal) => Some(coordinator_error(&refusal)),
            }
        };
        offsets
            .iter()
            .map(|offset| {
                if unknown(offset) {
                    Some(ResponseError::UnknownTopicOrPartition)
                } else if past_end(offset) {
                    Some(ResponseError::OffsetOutOfRange)
                } else {
                    error
                }
            })
            .collect()
    }

    pub(super) async fn offset_fetch(&self, request: OffsetFetchRequest) -> OffsetFetchResponse {
        let group = request.group_id.as_str();
        let refused = |error: ResponseError| offset_fetch_refused(&request, error.code());
        if !self.is_group_id(group) {
            return refused(ResponseError::InvalidGroupId);
        }
        // The topics asked for, each once, or every topic the group has offsets on (described).
        let (names, described): (BTreeSet<String>, _) = match &request.topics {
            Some(topics) => {
                let names = topics.iter().map(|topic| topic_name(&topic.name)).collect();
                (names, None)
            }
            None => match self.describe(None).await {
                Ok(topics) => {
                    let topics: Vec<TopicDescription> = topics
                        .into_iter()
                        .filter(|topic| topic.groups.iter().any(|g| g.name == group))
                        .collect();
                    let names = topics.iter().map(|topic| topic.name.clone()).collect();
                    (names, Some(topics))
                }
                Err(refusal) => return refused(coordinator_error(&refusal)),
            },
        };
        // What the group stored on each partition of each topic; -1 where it stored nothing
        // (the client then applies its reset policy).
        let speaks = self
            .backend
            .speaks(CommandKind::StoredOffsets.since_version())
            .await;
        let stored = match speaks {
            true => self.stored_offsets(group, names).await,
            false => self.offsets_as_before(group, names, described).await,
        };
        let stored = match stored {
            Ok(stored) => stored,
            Err(error) => return refused(error),
        };
        let committed = |topic: &str, partition: i32| -> i64 {
            stored
                .get(topic)
                .zip(usize::try_from(partition).ok())
                .and_then(|(offsets, partition)| offsets.get(partition).copied().flatten())
                .unwrap_or(-1)
        };
        let wanted: Vec<(String, Vec<i32>)> = match request.topics {
            Some(topics) => topics
                .iter()
                .map(|topic| (topic_name(&topic.name), topic.partition_indexes.clone()))
                .collect(),
            // Every partition the group committed on.
            None => stored
                .iter()
                .filter_map(|(topic, offsets)| {
                    let partitions: Vec<i32> = (0..offsets.len())
                        .filter(|&p| offsets[p].is_some())
                        .filter_map(|p| i32::try_from(p).ok())
                        .collect();
                    (!partitions.is_empty()).then(|| (topic.clone(), partitions))
                })
                .collect(),
        };
        OffsetFetchResponse::default().with_topics(
            wanted
                .into_iter()
                .map(|(topic, partitions)| {
                    let answers = partitions
                        .iter()
                        .map(|&partition| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(partition)
                                .with_committed_offset(committed(&topic, partition))
                                .with_metadata(Some(StrBytes::default()))
                        })
                        .collect();
                    OffsetFetchResponseTopic::default()
                        .with_name(kafka_topic(&topic))
                        .with_partitions(answers)
                })
                .collect(),
        )
    }
}

impl<B: Backend> Handler<'_, B> {
    /// The offsets `group` stored on each partition of each topic of `names` (a topic that does
    /// not exist is left out), or the coordinator's error.
    async fn stored_offsets(
        &self,
        group: &str,
        names: BTreeSet<String>,
    ) -> Result<BTreeMap<String, Vec<Option<i64>>>, ResponseError> {
        let mut stored = BTreeMap::new();
        for name in names {
            let command = Command::StoredOffsets {
                topic: name.clone(),
                group: group.to_owned(),
            };
            match self.call(command).await {
                Ok(Outcome::StoredOffsets(offsets)) => {
                    stored.insert(name, offsets);
                }
                // A topic that does not exist: nothing committed there.
                Err(ErrorReply::InvalidArgument(_)) => {}
                Ok(other) => return Err(coordinator_error(&unexpected(&other))),
                Err(refusal) => return Err(coordinator_error(&refusal)),
            }
        }
        Ok(stored)
    }

    /// [`Handler::stored_offsets`] as the releases before protocol version 14 answered it,
    /// while a node of the cluster runs one of them: the group's committed offset on every
    /// partition of each topic it has offsets on, stored or not, from `described` (every such
    /// topic, when the request named none) or from a description of each topic named.
    async fn offsets_as_before(
        &self,
        group: &str,
        names: BTreeSet<String>,
        described: Option<Vec<TopicDescription>>,
    ) -> Result<BTreeMap<String, Vec<Option<i64>>>, ResponseError> {
        let described = match described {
            Some(described) => described,
            None => {
                let mut described = Vec::with_capacity(names.len());
                for name in names {
                    match self.describe(Some(name)).await {
                        Ok(found) => described.extend(found),
                        // A topic that does not exist: nothing committed there.
                        Err(ErrorReply::InvalidArgument(_)) => {}
                        Err(refusal) => return Err(coordinator_error(&refusal)),
                    }
                }
                described
            }
        };
        Ok(described
            .into_iter()
            .filter_map(|topic| {
                let held = topic.groups.iter().find(|g| g.name == group)?;
                let offsets = held.partitions.iter().map(|p| Some(p.committed)).collect();
                Some((topic.name.clone(), offsets))
            })
            .collect())
    }
}

impl<B: Backend> Handler<'_, B> {
    /// Deletes a group's committed offsets on the partitions named, as Kafka's OffsetDelete.
    /// A group with members (joined through Kafka, or natively on the topic) is answered
    /// `GROUP_SUBSCRIBED_TO_TOPIC` on each partition and changes nothing (the broker does not
    /// read which topics a Kafka member subscribed to, so it never moves a live group's
    /// offsets); a group with no members that the broker holds on no topic is
    /// `GROUP_ID_NOT_FOUND`. When every partition of a topic is named, the broker's group on
    /// that topic is deleted (under interest retention it no longer holds the topic's
    /// records); when some are, their offsets are deleted (back where the group starts, as
    /// on a partition it never committed on). OffsetFetch then answers -1 there. A partition
    /// of a topic the group never committed on has nothing to delete.
    pub(super) async fn offset_delete(&self, request: OffsetDeleteRequest) -> OffsetDeleteResponse {
        let group = request.group_id.as_str();
        let refused =
            |error: ResponseError| OffsetDeleteResponse::default().with_error_code(error.code());
        if !self.is_group_id(group) {
            return refused(ResponseError::InvalidGroupId);
        }
        // No member joins until the offsets are deleted, so the members checked here are
        // still the group's when they are.
        let _turn = self.state.groups.turn(group).await;
        let described = match self.describe(None).await {
            Ok(topics) => topics,
            Err(refusal) => return refused(coordinator_error(&refusal)),
        };
        let kafka_members = self.state.groups.has_members(group);
        let holding = described
            .iter()
            .any(|topic| topic.groups.iter().any(|g| g.name == group));
        if !kafka_members && !holding {
            return refused(ResponseError::GroupIdNotFound);
        }
        // Each topic once, with every partition any of its entries names.
        let mut asked: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
        for topic in &request.topics {
            asked
                .entry(topic_name(&topic.name))
                .or_default()
                .extend(topic.partitions.iter().map(|p| p.partition_index));
        }
        let mut outcomes: BTreeMap<String, BTreeMap<i32, Option<ResponseError>>> = BTreeMap::new();
        for (name, partitions) in asked {
            let named: Vec<i32> = partitions.into_iter().collect();
            let errors = match described.iter().find(|described| described.name == name) {
                None => vec![Some(ResponseError::UnknownTopicOrPartition); named.len()],
                Some(described) => {
                    self.delete_offsets(group, described, kafka_members, &named)
                        .await
                }
            };
            outcomes.insert(name, named.into_iter().zip(errors).collect());
        }
        let topics = request
            .topics
            .into_iter()
            .map(|topic| {
                let outcome = outcomes.get(&topic_name(&topic.name));
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|partition| {
                        let error = outcome
                            .and_then(|outcome| outcome.get(&partition.partition_index))
                            .copied()
                            .flatten();
                        OffsetDeleteResponsePartition::default()
                            .with_partition_index(partition.partition_index)
                            .with_error_code(code(error))
                    })
                    .collect();
                OffsetDeleteResponseTopic::default()
                    .with_name(topic.name)
                    .with_partitions(partitions)
            })
            .collect();
        OffsetDeleteResponse::default().with_topics(topics)
    }

    /// Deletes what `group` committed on the partitions `named` of `topic` (see
    /// [`Handler::offset_delete`]); each partition's error, in the order named.
    pub(super) async fn delete_offsets(
        &self,
        group: &str,
        topic: &TopicDescription,
        kafka_members: bool,
        named: &[i32],
    ) -> Vec<Option<ResponseError>> {
        let count = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
        let exists = |partition: i32| (0..count).contains(&partition);
        let held = topic.groups.iter().find(|g| g.name == group);
        let subscribed = kafka_members || held.is_some_and(|g| !g.members.is_empty());
        let per_partition = |error: Option<ResponseError>| {
            named
                .iter()
                .map(|&partition| match exists(partition) {
                    true => error,
                    false => Some(ResponseError::UnknownTopicOrPartition),
                })
                .collect()
        };
        if subscribed {
            return per_partition(Some(ResponseError::GroupSubscribedToTopic));
        }
        if held.is_none() {
            return per_partition(None);
        }
        let partitions: BTreeSet<i32> = named.iter().copied().filter(|p| exists(*p)).collect();
        if partitions.is_empty() {
            return per_partition(None);
        }
        // Both commands are refused, changing nothing, if members joined the group since the
        // description was read: a live group's offsets never move back.
        let every = partitions.len() == topic.partitions.len();
        let speaks = every
            || self
                .backend
                .speaks(CommandKind::DeleteOffsets.since_version())
                .await;
        let command = match (every, speaks) {
            (true, _) => Command::DeleteGroup {
                topic: topic.name.clone(),
                group: group.to_owned(),
            },
            // Back where the group starts, with no offset stored there.
            (false, true) => Command::DeleteOffsets {
                topic: topic.name.clone(),
                group: group.to_owned(),
                partitions: partitions.into_iter().collect(),
            },
            // While a node of the cluster runs a release before protocol version 14, as those
            // releases did: committed from outside the group at each partition's earliest
            // record (OffsetFetch then answers that offset there).
            (false, false) => Command::CommitGroup {
                topic: topic.name.clone(),
                group: group.to_owned(),
                offsets: partitions
                    .into_iter()
                    .filter_map(|p| {
                        let earliest = topic.partitions.get(usize::try_from(p).ok()?)?;
                        Some((p, earliest.earliest_offset))
                    })
                    .collect(),
            },
        };
        let error = match self.call(command).await {
            Ok(Outcome::Deleted(_) | Outcome::Lag(_) | Outcome::Committed) => None,
            // Members joined meanwhile, or the topic or the group went away meanwhile.
            Err(ErrorReply::InvalidArgument(_)) => self.why_not_deleted(group, &topic.name).await,
            Ok(other) => Some(coordinator_error(&unexpected(&other))),
            Err(refusal) => Some(coordinator_error(&refusal)),
        };
        per_partition(error)
    }

    /// Why a deletion of `group`'s offsets on `topic` was refused, as the topic is now: the
    /// topic is gone, members joined the group there, or (the group gone too) nothing is left
    /// to delete.
    async fn why_not_deleted(&self, group: &str, topic: &str) -> Option<ResponseError> {
        let described = match self.describe(Some(topic.to_owned())).await {
            Ok(described) => described,
            Err(ErrorReply::InvalidArgument(_)) => {
                return Some(ResponseError::UnknownTopicOrPartition)
            }
            Err(refusal) => return Some(coordinator_error(&refusal)),
        };
        let members = described
            .iter()
            .flat_map(|topic| &topic.groups)
            .any(|held| held.name == group && !held.members.is_empty());
        members.then_some(ResponseError::GroupSubscribedToTopic)
    }
}
