//! The broker's refusals as Kafka error codes.

use broker_proto::ErrorReply;
use kafka_protocol::messages::ResponseKind;
use kafka_protocol::ResponseError;

/// The Kafka error a refusal of the broker is answered with, for a request about a topic or
/// partition. `InvalidArgument` there means the topic or partition is not one the broker has
/// (or its name is not one it accepts): Kafka's clients then refresh their metadata.
pub(crate) fn kafka_error(refusal: &ErrorReply) -> ResponseError {
    match refusal {
        ErrorReply::InvalidArgument(_) | ErrorReply::NotAssigned { .. } => {
            ResponseError::UnknownTopicOrPartition
        }
        ErrorReply::MalformedRequest(_) | ErrorReply::UnsupportedProtocol(_) => {
            ResponseError::InvalidRequest
        }
        ErrorReply::TooLarge { .. } => ResponseError::MessageTooLarge,
        // Retriable: the client tries again, elsewhere or later.
        ErrorReply::NotLeader { .. } => ResponseError::NotLeaderOrFollower,
        ErrorReply::ShuttingDown => ResponseError::NotLeaderOrFollower,
        ErrorReply::Storage(_) => ResponseError::KafkaStorageError,
        ErrorReply::Unauthenticated(_) => ResponseError::SaslAuthenticationFailed,
        // A cluster's membership change, which no Kafka request makes.
        ErrorReply::Pending(_) => ResponseError::UnknownServerError,
    }
}

/// [`kafka_error`] for a request to a group's coordinator: a node that does not lead (any
/// more) is not the coordinator, which Kafka's consumers answer by finding it again
/// (`NOT_LEADER_OR_FOLLOWER` is no error of these APIs: the Java client gives up on it).
pub(crate) fn coordinator_error(refusal: &ErrorReply) -> ResponseError {
    match kafka_error(refusal) {
        ResponseError::NotLeaderOrFollower => ResponseError::NotCoordinator,
        other => other,
    }
}

/// The error code of `error`, or 0 for none.
pub(crate) fn code(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |error| error.code())
}

/// Every error an answer carries, in its order: its own error code and those of its topics,
/// partitions, groups or members, for the server's metrics. None for an answer that succeeded
/// everywhere.
pub(crate) fn answered_errors(response: &ResponseKind) -> Vec<ResponseError> {
    error_codes(response)
        .unwrap_or_default()
        .into_iter()
        .filter_map(ResponseError::try_from_code)
        .collect()
}

/// The error codes of an answer of an API the listener serves (zero where it succeeded);
/// `None` for an answer of any other API.
pub(crate) fn error_codes(response: &ResponseKind) -> Option<Vec<i16>> {
    Some(match response {
        ResponseKind::Produce(answer) => answer
            .responses
            .iter()
            .flat_map(|topic| &topic.partition_responses)
            .map(|partition| partition.error_code)
            .collect(),
        ResponseKind::Fetch(answer) => std::iter::once(answer.error_code)
            .chain(
                answer
                    .responses
                    .iter()
                    .flat_map(|topic| &topic.partitions)
                    .map(|partition| partition.error_code),
            )
            .collect(),
        ResponseKind::ListOffsets(answer) => answer
            .topics
            .iter()
            .flat_map(|topic| &topic.partitions)
            .map(|partition| partition.error_code)
            .collect(),
        ResponseKind::Metadata(answer) => answer
            .topics
            .iter()
            .flat_map(|topic| {
                std::iter::once(topic.error_code).chain(
                    topic
                        .partitions
                        .iter()
                        .map(|partition| partition.error_code),
                )
            })
            .collect(),
        ResponseKind::CreateTopics(answer) => {
            answer.topics.iter().map(|topic| topic.error_code).collect()
        }
        ResponseKind::DeleteTopics(answer) => answer
            .responses
            .iter()
            .map(|topic| topic.error_code)
            .collect(),
        ResponseKind::LeaveGroup(answer) => std::iter::once(answer.error_code)
            .chain(answer.members.iter().map(|member| member.error_code))
            .collect(),
        ResponseKind::OffsetCommit(answer) => answer
            .topics
            .iter()
            .flat_map(|topic| &topic.partitions)
            .map(|partition| partition.error_code)
            .collect(),
        ResponseKind::OffsetFetch(answer) => std::iter::once(answer.error_code)
            .chain(
                answer
                    .topics
                    .iter()
                    .flat_map(|topic| &topic.partitions)
                    .map(|partition| partition.error_code),
            )
            .collect(),
        ResponseKind::DescribeGroups(answer) => {
            answer.groups.iter().map(|group| group.error_code).collect()
        }
        ResponseKind::DeleteRecords(answer) => answer
            .topics
            .iter()
            .flat_map(|topic| &topic.partitions)
            .map(|partition| partition.error_code)
            .collect(),
        ResponseKind::DescribeConfigs(answer) => answer
            .results
            .iter()
            .map(|result| result.error_code)
            .collect(),
        ResponseKind::AlterConfigs(answer) => answer
            .responses
            .iter()
            .map(|resource| resource.error_code)
            .collect(),
        ResponseKind::IncrementalAlterConfigs(answer) => answer
            .responses
            .iter()
            .map(|resource| resource.error_code)
            .collect(),
        ResponseKind::ApiVersions(answer) => vec![answer.error_code],
        ResponseKind::InitProducerId(answer) => vec![answer.error_code],
        ResponseKind::FindCoordinator(answer) => vec![answer.error_code],
        ResponseKind::JoinGroup(answer) => vec![answer.error_code],
        ResponseKind::SyncGroup(answer) => vec![answer.error_code],
        ResponseKind::Heartbeat(answer) => vec![answer.error_code],
        ResponseKind::ListGroups(answer) => vec![answer.error_code],
        ResponseKind::SaslHandshake(answer) => vec![answer.error_code],
        ResponseKind::SaslAuthenticate(answer) => vec![answer.error_code],
        ResponseKind::CreatePartitions(answer) => answer
            .results
            .iter()
            .map(|topic| topic.error_code)
            .collect(),
        ResponseKind::DeleteGroups(answer) => answer
            .results
            .iter()
            .map(|group| group.error_code)
            .collect(),
        ResponseKind::OffsetDelete(answer) => std::iter::once(answer.error_code)
            .chain(
                answer
                    .topics
                    .iter()
                    .flat_map(|topic| topic.partitions.iter().map(|p| p.error_code)),
            )
            .collect(),
        ResponseKind::DescribeCluster(answer) => vec![answer.error_code],
        ResponseKind::DescribeProducers(answer) => answer
            .topics
            .iter()
            .flat_map(|topic| &topic.partitions)
            .map(|partition| partition.error_code)
            .collect(),
        ResponseKind::DescribeLogDirs(answer) => std::iter::once(answer.error_code)
            .chain(answer.results.iter().map(|result| result.error_code))
            .collect(),
        // Every API `apis::supported_apis` lists has its arm above, as a test checks.
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };
    use kafka_protocol::messages::{HeartbeatResponse, ProduceResponse};

    use super::*;

    #[test]
    fn an_answers_errors_are_its_own_and_its_partitions() {
        let produced =
            ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
                .with_partition_responses(vec![
                    PartitionProduceResponse::default(),
                    PartitionProduceResponse::default()
                        .with_error_code(ResponseError::MessageTooLarge.code()),
                ])]);
        assert_eq!(
            answered_errors(&ResponseKind::Produce(produced)),
            [ResponseError::MessageTooLarge]
        );
        let beat = HeartbeatResponse::default();
        assert!(answered_errors(&ResponseKind::Heartbeat(beat)).is_empty());
    }

    #[test]
    fn a_node_that_no_longer_leads_is_no_coordinator_to_group_requests() {
        let moved = ErrorReply::NotLeader {
            leader: Some("127.0.0.1:9102".to_owned()),
        };
        assert_eq!(kafka_error(&moved), ResponseError::NotLeaderOrFollower);
        assert_eq!(coordinator_error(&moved), ResponseError::NotCoordinator);
        assert_eq!(
            coordinator_error(&ErrorReply::ShuttingDown),
            ResponseError::NotCoordinator
        );
        let storage = ErrorReply::Storage("disk".to_owned());
        assert_eq!(coordinator_error(&storage), kafka_error(&storage));
    }
}
