//! The errors that travel in responses, each with a number that is never reused.

use broker_core::BrokerError;
use serde::{Deserialize, Serialize};

/// Why a request (or a hello) was refused.
///
/// On the wire the variant index is the error code; variants are only ever appended, so a code
/// keeps its meaning forever. Codes 0 and 1 are the broker's own errors; the rest are the
/// server's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ErrorReply {
    /// Code 0: [`BrokerError::InvalidArgument`].
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Code 1: [`BrokerError::NotAssigned`].
    #[error("partition {partition} is not assigned to this member")]
    NotAssigned {
        /// The first partition the member does not own.
        partition: i32,
    },
    /// Code 2: the frame's body could not be decoded (unknown command, truncated fields,
    /// trailing bytes). The connection stays open: frame boundaries are intact.
    #[error("malformed request: {0}")]
    MalformedRequest(String),
    /// Code 3: the hello's magic or version is not one this server speaks. The connection is
    /// closed.
    #[error("unsupported protocol: {0}")]
    UnsupportedProtocol(String),
    /// Code 4: a frame or a payload exceeds the server's limit.
    #[error("too large: {what} is {size} bytes, the limit is {limit}")]
    TooLarge {
        /// What was too large: `frame` or `payload`.
        what: String,
        /// Its size in bytes.
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// Code 5: the server is shutting down and did not apply the request.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// Code 6: the hello carried no token, or the wrong one.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// Code 7: the server could not store the change durably; it was not applied.
    #[error("storage error: {0}")]
    Storage(String),
}

impl From<BrokerError> for ErrorReply {
    fn from(error: BrokerError) -> Self {
        match error {
            BrokerError::InvalidArgument(message) => ErrorReply::InvalidArgument(message),
            BrokerError::NotAssigned { partition } => ErrorReply::NotAssigned { partition },
            // BrokerError is non-exhaustive; a variant added later must get a code of its own.
            other => ErrorReply::InvalidArgument(other.to_string()),
        }
    }
}

impl ErrorReply {
    /// The broker error this reply carries, if it is one of the broker's own (codes 0 and 1).
    pub fn to_broker_error(&self) -> Option<BrokerError> {
        match self {
            ErrorReply::InvalidArgument(message) => {
                Some(BrokerError::InvalidArgument(message.clone()))
            }
            ErrorReply::NotAssigned { partition } => Some(BrokerError::NotAssigned {
                partition: *partition,
            }),
            _ => None,
        }
    }
}
