//! The errors a broker call can return.

use serde::{Deserialize, Serialize};

/// Why a broker call was refused.
///
/// Every variant but [`BrokerError::Storage`] means the call changed nothing: the broker
/// validates a call completely before it touches any state. Mismatches that the contract defines as ordinary outcomes (acknowledging a
/// delivery that is not in flight, leaving as an absent member) are not errors: those calls
/// return `false`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// An argument is outside its documented range: a malformed identifier, an unknown topic,
    /// a partition the topic does not have, a negative offset, a count out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A commit named a partition that the committing member does not own in the group's current
    /// assignment (or the member or group does not exist). Nothing was committed.
    #[error("partition {partition} is not assigned to this member")]
    NotAssigned {
        /// The first partition of the commit, in ascending order, that the member does not own.
        partition: i32,
    },
    /// Records held on disk could not be read (a file is missing, damaged or unreadable). A
    /// call that changes state and fails this way may have been applied in part, so the broker
    /// then refuses every call with this error until it is restarted and rebuilt from its log.
    #[error("storage failure: {0}")]
    Storage(String),
    /// The topic is moving to another part of a cluster (another of its groups) and takes no
    /// call here while it does: nothing was done. Asked again, the call reaches the topic where
    /// it is then.
    #[error("topic {topic:?} is moving to another group of the cluster; ask again")]
    Moving {
        /// The topic.
        topic: String,
    },
}

impl BrokerError {
    /// Shorthand for [`BrokerError::InvalidArgument`] with a formatted message.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        BrokerError::InvalidArgument(message.into())
    }
}
