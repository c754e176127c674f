//! The broker's refusals as Kafka error codes.

use broker_proto::ErrorReply;
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

#[cfg(test)]
mod tests {
    use super::*;

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
