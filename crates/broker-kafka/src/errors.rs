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

/// The error code of `error`, or 0 for none.
pub(crate) fn code(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |error| error.code())
}
