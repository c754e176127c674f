//! Topics and their records: CreateTopics, CreatePartitions, DeleteTopics, DeleteRecords and
//! DescribeLogDirs.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use broker_core::{Command, KeyHash, Outcome};
use broker_proto::ErrorReply;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeLogDirsRequest, DescribeLogDirsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::configs;
use crate::errors::{code, kafka_error};
use crate::Backend;

use super::{
    in_turns, kafka_topic, message, named_more_than_once, topic_name, unexpected, Handler,
};

impl<B: Backend> Handler<'_, B> {
    pub(super) async fn create_topics(&self, request: CreateTopicsRequest) -> CreateTopicsResponse {
        let validate_only = request.validate_only;
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let answer = CreatableTopicResult::default().with_name(topic.name.clone());
            let refused = |error: ResponseError, text: String| {
                answer
                    .clone()
                    .with_error_code(error.code())
                    .with_error_message(message(text))
            };
            if let Err(error) = self.settings.names.check("topic", &name) {
                return refused(ResponseError::InvalidTopicException, error.to_string());
            }
            let partition_count = match topic.num_partitions {
                -1 => 1,
                count if count >= 1 => count,
                count => {
                    return refused(
                        ResponseError::InvalidPartitions,
                        format!("a topic needs at least one partition, not {count}"),
                    )
                }
            };
            if partition_count > self.settings.max_partitions {
                return refused(
                    ResponseError::InvalidPartitions,
                    format!(
                        "a topic has at most {} partitions on this broker, not {partition_count}",
                        self.settings.max_partitions
                    ),
                );
            }
            // The copies are the group's, not chosen per topic: a factor up to what every
            // topic gets is kept (at least), a larger one would be a promise not kept.
            let copies = self
                .backend
                .cluster()
                .map_or(1, |view| view.new_topic_copies.max(1));
            let factor_kept = usize::try_from(topic.replication_factor)
                .is_ok_and(|factor| (1..=copies).contains(&factor));
            if topic.replication_factor != -1 && !factor_kept {
                return refused(
                    ResponseError::InvalidReplicationFactor,
                    format!(
                        "replication factor {} is not kept here: {}; use -1 or 1 to {copies}",
                        topic.replication_factor,
                        match copies {
                            1 => "a single broker keeps one copy".to_owned(),
                            _ => format!(
                                "a new topic gets {copies} copies, one on each node of its group"
                            ),
                        }
                    ),
                );
            }
            if !topic.assignments.is_empty() {
                return refused(
                    ResponseError::InvalidReplicaAssignment,
                    "replica assignments are not supported: every node keeps every partition"
                        .to_owned(),
                );
            }
            let settings = match configs::topic_settings(&topic.configs) {
                Ok(settings) => settings,
                Err(text) => return refused(ResponseError::InvalidConfig, text),
            };
            if validate_only {
                // What the creation would answer for a topic that exists already.
                return match self.describe(Some(name.clone())).await {
                    Ok(found) if !found.is_empty() => refused(
                        ResponseError::TopicAlreadyExists,
                        format!("topic {:?} already exists", topic.name.as_str()),
                    ),
                    _ => answer
                        .with_num_partitions(partition_count)
                        .with_replication_factor(i16::try_from(copies).unwrap_or(i16::MAX)),
                };
            }
            let command = Command::Create {
                topic: name,
                partition_count,
                key_hash: KeyHash::Murmur2,
                settings,
            };
            match self.call(command).await {
                Ok(Outcome::Created(true)) => answer
                    .with_num_partitions(partition_count)
                    .with_replication_factor(i16::try_from(copies).unwrap_or(i16::MAX)),
                Ok(Outcome::Created(false)) => refused(
                    ResponseError::TopicAlreadyExists,
                    format!("topic {:?} already exists", topic.name.as_str()),
                ),
                Ok(other) => {
                    let refusal = unexpected(&other);
                    refused(kafka_error(&refusal), refusal.to_string())
                }
                Err(ErrorReply::InvalidArgument(text)) => {
                    refused(ResponseError::PolicyViolation, text)
                }
                Err(refusal) => refused(kafka_error(&refusal), refusal.to_string()),
            }
        });
        CreateTopicsResponse::default().with_topics(in_turns(topics).await)
    }

    pub(super) async fn delete_records(
        &self,
        request: DeleteRecordsRequest,
    ) -> DeleteRecordsResponse {
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let partitions = topic.partitions.iter().map(|wanted| {
                let name = name.clone();
                async move {
                    let answer = DeleteRecordsPartitionResult::default()
                        .with_partition_index(wanted.partition_index)
                        .with_low_watermark(-1);
                    if wanted.offset < -1 {
                        return answer.with_error_code(ResponseError::OffsetOutOfRange.code());
                    }
                    let end = match self
                        .call(Command::EndOffset {
                            topic: name.clone(),
                            partition: wanted.partition_index,
                        })
                        .await
                    {
                        Ok(Outcome::Offset(end)) => end,
                        Ok(other) => {
                            return answer.with_error_code(kafka_error(&unexpected(&other)).code())
                        }
                        Err(refusal) => {
                            return answer.with_error_code(kafka_error(&refusal).code())
                        }
                    };
                    // -1 deletes up to the end. Past the end, Kafka refuses and deletes
                    // nothing (offsets only grow, so what was past the end when read could
                    // only have become valid later).
                    let before = match wanted.offset {
                        -1 => end,
                        offset if offset <= end => offset,
                        _ => return answer.with_error_code(ResponseError::OffsetOutOfRange.code()),
                    };
                    let command = Command::Purge {
                        topic: name,
                        partition: wanted.partition_index,
                        before,
                    };
                    match self.call(command).await {
                        Ok(Outcome::Offset(earliest)) => answer.with_low_watermark(earliest),
                        Ok(other) => {
                            answer.with_error_code(kafka_error(&unexpected(&other)).code())
                        }
                        Err(refusal) => answer.with_error_code(kafka_error(&refusal).code()),
                    }
                }
            });
            DeleteRecordsTopicResult::default()
                .with_name(topic.name.clone())
                .with_partitions(in_turns(partitions).await)
        });
        DeleteRecordsResponse::default().with_topics(in_turns(topics).await)
    }

    /// Adds partitions to topics, as `broker create` of more partitions does: the new
    /// partitions start empty, and keys map to partitions anew (as in Kafka). A topic asked to
    /// have no more partitions than it has is refused with `INVALID_PARTITIONS`, as Kafka
    /// refuses it; replica assignments are refused (every node keeps every partition).
    pub(super) async fn create_partitions(
        &self,
        request: CreatePartitionsRequest,
    ) -> CreatePartitionsResponse {
        let validate_only = request.validate_only;
        let twice: HashSet<String> =
            named_more_than_once(request.topics.iter().map(|topic| topic.name.as_str()))
                .into_iter()
                .map(str::to_owned)
                .collect();
        let twice = &twice;
        let topics = request.topics.into_iter().map(|topic| async move {
            let name = topic_name(&topic.name);
            let answer = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
            let refused = |error: ResponseError, text: String| {
                answer
                    .clone()
                    .with_error_code(error.code())
                    .with_error_message(message(text))
            };
            if twice.contains(topic.name.as_str()) {
                return refused(
                    ResponseError::InvalidRequest,
                    format!("topic {name:?} is named more than once in the request"),
                );
            }
            if topic
                .assignments
                .as_ref()
                .is_some_and(|assigned| !assigned.is_empty())
            {
                return refused(
                    ResponseError::InvalidReplicaAssignment,
                    "replica assignments are not supported: every node keeps every partition"
                        .to_owned(),
                );
            }
            let current = match self.describe(Some(name.clone())).await {
                Ok(described) => described.first().map_or(0, |topic| topic.partitions.len()),
                Err(ErrorReply::InvalidArgument(_)) => 0,
                Err(refusal) => return refused(kafka_error(&refusal), refusal.to_string()),
            };
            if current == 0 {
                return refused(
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                );
            }
            let wanted = usize::try_from(topic.count).unwrap_or(0);
            if wanted <= current {
                return refused(
                    ResponseError::InvalidPartitions,
                    format!(
                        "topic {name:?} has {current} partition{}: it can only grow, and {} is \
                         not more",
                        if current == 1 { "" } else { "s" },
                        topic.count
                    ),
                );
            }
            if topic.count > self.settings.max_partitions {
                return refused(
                    ResponseError::InvalidPartitions,
                    format!(
                        "a topic has at most {} partitions on this broker, not {}",
                        self.settings.max_partitions, topic.count
                    ),
                );
            }
            if validate_only {
                return answer;
            }
            let command = Command::AddPartitions {
                topic: name,
                partition_count: topic.count,
            };
            match self.call(command).await {
                Ok(Outcome::PartitionCount(_)) => answer,
                Ok(other) => {
                    let refusal = unexpected(&other);
                    refused(kafka_error(&refusal), refusal.to_string())
                }
                // The broker's partition limit, or the topic deleted meanwhile.
                Err(ErrorReply::InvalidArgument(text)) => {
                    refused(ResponseError::InvalidPartitions, text)
                }
                Err(refusal) => refused(kafka_error(&refusal), refusal.to_string()),
            }
        });
        CreatePartitionsResponse::default().with_results(in_turns(topics).await)
    }

    /// The one log directory (the data directory, or memory) with the partitions asked for
    /// (`None`: every partition of every topic), each sized by the bytes of records it retains
    /// (payload, key and headers). Sizes of the directory's disk are not known (`-1`).
    pub(super) async fn describe_log_dirs(
        &self,
        request: DescribeLogDirsRequest,
    ) -> DescribeLogDirsResponse {
        let response = DescribeLogDirsResponse::default();
        let described = match self.describe(None).await {
            Ok(described) => described,
            Err(refusal) => return response.with_error_code(kafka_error(&refusal).code()),
        };
        // The partitions asked for, by topic (each once, however many times it is named).
        let asked: Option<BTreeMap<&str, BTreeSet<i32>>> = request.topics.as_ref().map(|topics| {
            let mut asked: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
            for topic in topics {
                asked
                    .entry(topic.topic.as_str())
                    .or_default()
                    .extend(topic.partitions.iter().copied());
            }
            asked
        });
        let wanted = |topic: &str, partition: i32| {
            asked.as_ref().is_none_or(|asked| {
                asked
                    .get(topic)
                    .is_some_and(|partitions| partitions.contains(&partition))
            })
        };
        let topics = described
            .iter()
            .map(|topic| {
                DescribeLogDirsTopic::default()
                    .with_name(kafka_topic(&topic.name))
                    .with_partitions(
                        topic
                            .partitions
                            .iter()
                            .filter(|partition| wanted(&topic.name, partition.partition))
                            .map(|partition| {
                                DescribeLogDirsPartition::default()
                                    .with_partition_index(partition.partition)
                                    .with_partition_size(
                                        i64::try_from(partition.retained_bytes).unwrap_or(i64::MAX),
                                    )
                            })
                            .collect(),
                    )
            })
            .filter(|topic| !topic.partitions.is_empty())
            .collect();
        response.with_results(vec![DescribeLogDirsResult::default()
            .with_log_dir(StrBytes::from_string(self.settings.log_dir.clone()))
            .with_topics(topics)
            .with_total_bytes(-1)
            .with_usable_bytes(-1)])
    }

    pub(super) async fn delete_topics(&self, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
        let topics = request.topic_names.into_iter().map(|name| async move {
            let answer = DeletableTopicResult::default().with_name(Some(name.clone()));
            let command = Command::DeleteTopic {
                topic: topic_name(&name),
            };
            let error = match self.call(command).await {
                Ok(Outcome::Deleted(true)) => None,
                Ok(Outcome::Deleted(false)) | Err(ErrorReply::InvalidArgument(_)) => {
                    Some(ResponseError::UnknownTopicOrPartition)
                }
                Ok(other) => Some(kafka_error(&unexpected(&other))),
                Err(refusal) => Some(kafka_error(&refusal)),
            };
            answer.with_error_code(code(error))
        });
        DeleteTopicsResponse::default().with_responses(in_turns(topics).await)
    }
}
