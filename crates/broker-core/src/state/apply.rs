//! One command in, one outcome out: the single entry point through which a server applies
//! requests and a log replays them, so every call has one implementation.

use super::BrokerState;
use crate::{BrokerError, Command, Outcome};

impl BrokerState {
    /// Applies one command: the single entry point the server and a log replay use.
    ///
    /// # Errors
    /// As the method that `command` names.
    pub fn apply(&mut self, command: Command) -> Result<Outcome, BrokerError> {
        if let Some(failure) = &self.failure {
            return Err(BrokerError::Storage(failure.clone()));
        }
        let read_only = command.kind().is_read_only();
        let result = self.apply_unchecked(command);
        if let Err(BrokerError::Storage(why)) = &result {
            if !read_only {
                // The change may be half applied: nothing more is, until a rebuild from the log.
                self.failure = Some(why.clone());
            }
        }
        result
    }

    /// [`BrokerState::apply`] without the failure bookkeeping.
    fn apply_unchecked(&mut self, command: Command) -> Result<Outcome, BrokerError> {
        match command {
            Command::Create {
                topic,
                partition_count,
                key_hash,
                settings,
            } => self
                .create(&topic, partition_count, key_hash, &settings)
                .map(Outcome::Created),
            Command::Join {
                topic,
                group,
                member,
                assignor,
                settings,
            } => self
                .join(&topic, &group, &member, assignor, &settings)
                .map(Outcome::Partitions),
            Command::Leave {
                topic,
                group,
                member,
            } => self.leave(&topic, &group, &member).map(Outcome::Left),
            Command::Publish {
                topic,
                partition,
                payload,
            } => self
                .publish(&topic, partition, payload)
                .map(Outcome::Published),
            Command::PublishKeyed {
                topic,
                key,
                payload,
            } => self
                .publish_keyed(&topic, key, payload)
                .map(|(partition, offset)| Outcome::PublishedKeyed { partition, offset }),
            Command::PublishBatch { topic, records } => self
                .publish_batch(&topic, records)
                .map(Outcome::PublishedBatch),
            Command::PublishUntilFull { topic, records } => self
                .publish_until_full(&topic, records)
                .map(Outcome::PublishedBatch),
            Command::Poll {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => self
                .poll(&topic, &group, &member, max_records, max_bytes)
                .map(Outcome::Records),
            Command::Ack {
                topic,
                group,
                member,
                partition,
                offset,
            } => self
                .ack(&topic, &group, &member, partition, offset)
                .map(Outcome::Acked),
            Command::AckAndPoll {
                topic,
                group,
                member,
                acks,
                max_records,
                max_bytes,
            } => self
                .ack_and_poll(&topic, &group, &member, &acks, max_records, max_bytes)
                .map(|(acked, records)| Outcome::AckedAndPolled { acked, records }),
            Command::Retry {
                topic,
                group,
                member,
                partition,
                offset,
            } => self
                .retry(&topic, &group, &member, partition, offset)
                .map(Outcome::Retried),
            Command::ConfigureGroup {
                topic,
                group,
                settings,
            } => self
                .configure_group(&topic, &group, &settings)
                .map(Outcome::GroupSettings),
            Command::ConfigureTopic { topic, settings } => self
                .configure_topic(&topic, &settings)
                .map(Outcome::TopicSettings),
            Command::ClusterStatus
            | Command::GroupsStatus
            | Command::AddNode { .. }
            | Command::RemoveNode { .. }
            | Command::TransferLeadership { .. }
            | Command::MoveTopic { .. }
            | Command::Metadata { .. } => Err(BrokerError::InvalidArgument(format!(
                "{} is answered by a server about its cluster, not by the broker's state",
                command.kind().name()
            ))),
            Command::KafkaGroups => Err(BrokerError::InvalidArgument(format!(
                "{} is answered by a server about its Kafka listener, not by the broker's state",
                command.kind().name()
            ))),
            Command::RetryAfter {
                topic,
                group,
                member,
                partition,
                offset,
                delay_ms,
            } => self
                .retry_after(&topic, &group, &member, partition, offset, delay_ms)
                .map(Outcome::Retried),
            Command::Redeliver {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => self
                .redeliver(&topic, &group, &member, max_records, max_bytes)
                .map(Outcome::Records),
            Command::Fetch {
                topic,
                group,
                member,
                max_records,
                max_bytes,
            } => self
                .fetch(&topic, &group, &member, max_records, max_bytes)
                .map(Outcome::Records),
            Command::Commit {
                topic,
                group,
                member,
                offsets,
            } => self
                .commit(&topic, &group, &member, offsets.as_ref())
                .map(|()| Outcome::Committed),
            Command::Assignment {
                topic,
                group,
                member,
            } => self
                .assignment(&topic, &group, &member)
                .map(Outcome::Partitions),
            Command::Committed {
                topic,
                group,
                partition,
            } => self
                .committed(&topic, &group, partition)
                .map(Outcome::Offset),
            Command::EndOffset { topic, partition } => {
                self.end_offset(&topic, partition).map(Outcome::Offset)
            }
            Command::Lag { topic, group } => self.lag(&topic, &group).map(Outcome::Lag),
            Command::Describe { topic } => {
                self.describe(topic.as_deref()).map(Outcome::Description)
            }
            Command::AddPartitions {
                topic,
                partition_count,
            } => self
                .add_partitions(&topic, partition_count)
                .map(Outcome::PartitionCount),
            Command::DeleteTopic { topic } => self.delete_topic(&topic).map(Outcome::Deleted),
            Command::DeleteGroup { topic, group } => {
                self.delete_group(&topic, &group).map(Outcome::Deleted)
            }
            Command::Purge {
                topic,
                partition,
                before,
            } => self.purge(&topic, partition, before).map(Outcome::Offset),
            Command::ResetGroup {
                topic,
                group,
                partitions,
                to,
            } => self
                .reset_group(&topic, &group, partitions.as_deref(), to)
                .map(Outcome::Lag),
            Command::OffsetForTime {
                topic,
                partition,
                timestamp_ms,
            } => self
                .offset_for_time(&topic, partition, timestamp_ms)
                .map(Outcome::Offset),
            Command::CommitGroup {
                topic,
                group,
                offsets,
            } => self
                .commit_group(&topic, &group, &offsets)
                .map(|()| Outcome::Committed),
            Command::Read {
                topic,
                partition,
                offset,
                max_records,
                max_bytes,
            } => self
                .read(&topic, partition, offset, max_records, max_bytes)
                .map(Outcome::Read),
            Command::PublishIdempotent {
                topic,
                producer,
                batches,
            } => self
                .publish_idempotent(&topic, producer, batches)
                .map(Outcome::PublishedBatch),
            Command::Producers { topic, partition } => {
                self.producers(&topic, partition).map(Outcome::Producers)
            }
            Command::StoredOffsets { topic, group } => self
                .stored_offsets(&topic, &group)
                .map(Outcome::StoredOffsets),
            Command::DeleteOffsets {
                topic,
                group,
                partitions,
            } => self
                .delete_offsets(&topic, &group, &partitions)
                .map(Outcome::Lag),
        }
    }
}
