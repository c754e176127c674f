//! The errors that travel in responses, each with a code that is never reused.

use std::fmt;

use broker_core::BrokerError;
use serde::de::{self, EnumAccess, VariantAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use strum::{EnumDiscriminants, EnumIter, IntoEnumIterator, IntoStaticStr};

/// Why a request (or a hello) was refused.
///
/// On the wire an error is its code (a `u32`, [`ErrorReply::code`]) followed by its fields.
/// Codes are numbered explicitly, never by the order of the variants: a code keeps its meaning
/// forever and new ones are only added. Codes 0 and 1 are the broker's own errors; the rest are
/// the server's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, EnumDiscriminants)]
#[strum_discriminants(name(ErrorKind), derive(EnumIter, IntoStaticStr))]
#[strum_discriminants(doc = "An [`ErrorReply`] without its fields.")]
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
    /// Code 4: a frame, a payload or a response exceeds the server's limit.
    #[error("too large: {}", too_large_text(what, *size, *limit))]
    TooLarge {
        /// What was too large: `frame`, `payload` or `response`.
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
    /// Code 7: the server could not store the change durably: the log cannot take entries and
    /// the change was not applied, or it was applied but may not be on disk (after a failed
    /// fsync); or, in a cluster of several groups, a change forwarded to its group's leader got
    /// no answer once sent, and may or may not have been applied.
    #[error("storage error: {0}")]
    Storage(String),
    /// Code 8: the node is a follower (or a candidate) of a cluster and did not apply the
    /// request; `leader` is the client address of the leader when the node knows it. The client
    /// sends the request again to the leader.
    #[error("this node is not the cluster's leader{}", leader_hint(.leader))]
    NotLeader {
        /// The leader's client address, if known.
        leader: Option<String>,
    },
    /// Code 9 (protocol version 12; earlier versions get it as [`ErrorReply::InvalidArgument`]
    /// with the same text): a change that takes several steps was made in part, and the rest
    /// was not done when the server stopped waiting for it: a node added to (or removed from)
    /// a cluster's first group that some data groups have not followed yet. The text says what
    /// is pending. Asking for the same change again waits for the rest.
    #[error("pending: {0}")]
    Pending(String),
}

fn leader_hint(leader: &Option<String>) -> String {
    match leader {
        Some(address) => format!("; the leader is at {address}"),
        None => "; it knows no leader now: an election is under way, or a majority of the \
                 nodes cannot be reached"
            .to_owned(),
    }
}

impl ErrorKind {
    /// The code of this kind of error on the wire: fixed forever, never reused.
    pub fn code(self) -> u32 {
        match self {
            ErrorKind::InvalidArgument => 0,
            ErrorKind::NotAssigned => 1,
            ErrorKind::MalformedRequest => 2,
            ErrorKind::UnsupportedProtocol => 3,
            ErrorKind::TooLarge => 4,
            ErrorKind::ShuttingDown => 5,
            ErrorKind::Unauthenticated => 6,
            ErrorKind::Storage => 7,
            ErrorKind::NotLeader => 8,
            ErrorKind::Pending => 9,
        }
    }

    /// The kind's name, as in [`ErrorReply`] (`"TooLarge"`).
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The kind whose code is `code`, if any.
    pub fn of_code(code: u32) -> Option<ErrorKind> {
        ErrorKind::iter().find(|kind| kind.code() == code)
    }
}

/// What [`ErrorReply::TooLarge`] says: a `payload` counts the record's key and headers too.
fn too_large_text(what: &str, size: u64, limit: u64) -> String {
    match what {
        "payload" => {
            format!("a record's payload, key and headers are {size} bytes, the limit is {limit}")
        }
        other => format!("{other} is {size} bytes, the limit is {limit}"),
    }
}

impl ErrorReply {
    /// The error's code on the wire ([`ErrorKind::code`]).
    pub fn code(&self) -> u32 {
        ErrorKind::from(self).code()
    }

    /// The error's name, as in [`ErrorReply`] (`"TooLarge"`).
    pub fn name(&self) -> &'static str {
        ErrorKind::from(self).name()
    }

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

impl From<BrokerError> for ErrorReply {
    fn from(error: BrokerError) -> Self {
        match error {
            BrokerError::InvalidArgument(message) => ErrorReply::InvalidArgument(message),
            BrokerError::NotAssigned { partition } => ErrorReply::NotAssigned { partition },
            BrokerError::Storage(message) => ErrorReply::Storage(message),
            // As during an election: the client asks again, and reaches the topic where the
            // cluster serves it then.
            BrokerError::Moving { .. } => ErrorReply::NotLeader { leader: None },
            // BrokerError is non-exhaustive; a variant added later must get a code of its own.
            other => ErrorReply::InvalidArgument(other.to_string()),
        }
    }
}

/// The fields of [`ErrorReply::NotAssigned`], as encoded.
#[derive(Serialize, Deserialize)]
struct NotAssignedFields {
    partition: i32,
}

/// The fields of [`ErrorReply::NotLeader`], as encoded.
#[derive(Serialize, Deserialize)]
struct NotLeaderFields {
    leader: Option<String>,
}

/// The fields of [`ErrorReply::TooLarge`], as encoded.
#[derive(Serialize, Deserialize)]
struct TooLargeFields {
    what: String,
    size: u64,
    limit: u64,
}

const NAME: &str = "ErrorReply";

/// Every variant's name (for decoders that report what they expected).
const VARIANTS: &[&str] = &[
    "InvalidArgument",
    "NotAssigned",
    "MalformedRequest",
    "UnsupportedProtocol",
    "TooLarge",
    "ShuttingDown",
    "Unauthenticated",
    "Storage",
    "NotLeader",
    "Pending",
];

impl Serialize for ErrorReply {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (code, name) = (self.code(), self.name());
        match self {
            ErrorReply::InvalidArgument(message)
            | ErrorReply::MalformedRequest(message)
            | ErrorReply::UnsupportedProtocol(message)
            | ErrorReply::Unauthenticated(message)
            | ErrorReply::Storage(message)
            | ErrorReply::Pending(message) => {
                serializer.serialize_newtype_variant(NAME, code, name, message)
            }
            ErrorReply::NotAssigned { partition } => serializer.serialize_newtype_variant(
                NAME,
                code,
                name,
                &NotAssignedFields {
                    partition: *partition,
                },
            ),
            ErrorReply::TooLarge { what, size, limit } => serializer.serialize_newtype_variant(
                NAME,
                code,
                name,
                &TooLargeFields {
                    what: what.clone(),
                    size: *size,
                    limit: *limit,
                },
            ),
            ErrorReply::ShuttingDown => serializer.serialize_unit_variant(NAME, code, name),
            ErrorReply::NotLeader { leader } => serializer.serialize_newtype_variant(
                NAME,
                code,
                name,
                &NotLeaderFields {
                    leader: leader.clone(),
                },
            ),
        }
    }
}

impl<'de> Deserialize<'de> for ErrorReply {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_enum(NAME, VARIANTS, ErrorVisitor)
    }
}

/// A variant identified by its code (compact encodings) or its name (self-describing ones).
struct Code(u32);

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(CodeVisitor)
    }
}

struct CodeVisitor;

impl Visitor<'_> for CodeVisitor {
    type Value = Code;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an error code")
    }

    fn visit_u64<E: de::Error>(self, code: u64) -> Result<Code, E> {
        u32::try_from(code)
            .map(Code)
            .map_err(|_| E::custom(format!("error code {code} out of range")))
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<Code, E> {
        ErrorKind::iter()
            .find(|kind| kind.name() == name)
            .map(|kind| Code(kind.code()))
            .ok_or_else(|| E::unknown_variant(name, VARIANTS))
    }
}

struct ErrorVisitor;

impl<'de> Visitor<'de> for ErrorVisitor {
    type Value = ErrorReply;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an error reply")
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<ErrorReply, A::Error> {
        let (Code(code), variant) = data.variant::<Code>()?;
        let Some(kind) = ErrorKind::of_code(code) else {
            return Err(de::Error::custom(format!("unknown error code {code}")));
        };
        Ok(match kind {
            ErrorKind::InvalidArgument => ErrorReply::InvalidArgument(variant.newtype_variant()?),
            ErrorKind::NotAssigned => {
                let NotAssignedFields { partition } = variant.newtype_variant()?;
                ErrorReply::NotAssigned { partition }
            }
            ErrorKind::MalformedRequest => ErrorReply::MalformedRequest(variant.newtype_variant()?),
            ErrorKind::UnsupportedProtocol => {
                ErrorReply::UnsupportedProtocol(variant.newtype_variant()?)
            }
            ErrorKind::TooLarge => {
                let TooLargeFields { what, size, limit } = variant.newtype_variant()?;
                ErrorReply::TooLarge { what, size, limit }
            }
            ErrorKind::ShuttingDown => {
                variant.unit_variant()?;
                ErrorReply::ShuttingDown
            }
            ErrorKind::Unauthenticated => ErrorReply::Unauthenticated(variant.newtype_variant()?),
            ErrorKind::Storage => ErrorReply::Storage(variant.newtype_variant()?),
            ErrorKind::NotLeader => {
                let NotLeaderFields { leader } = variant.newtype_variant()?;
                ErrorReply::NotLeader { leader }
            }
            ErrorKind::Pending => ErrorReply::Pending(variant.newtype_variant()?),
        })
    }
}
