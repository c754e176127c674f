//! The messages of the protocol: handshake, request and response frames.

use broker_core::{Command, Outcome};
use serde::{Deserialize, Serialize};

use crate::ErrorReply;

/// The four bytes every [`Hello`] starts with: ASCII `BRKR`.
pub const MAGIC: [u8; 4] = *b"BRKR";

/// The largest hello and hello reply either side takes, in bytes of body (64 KiB): a hello is a
/// few dozen bytes, so a peer that has not yet identified itself cannot make the other buffer a
/// request-sized frame. A server answers a bigger first frame with
/// `HelloReply::Refused(TooLarge)` and closes.
pub const MAX_HELLO_FRAME: usize = 64 * 1024;

/// The newest protocol version this crate speaks, the one its clients ask for. Version 2 adds
/// record times and headers, topic and group settings, delivery counts and skipped records, and
/// the commands that delete, purge, reset and look up by time; version 3 adds idempotent
/// publishing; version 4 delayed retries and the group settings of dead letters; version 5 the
/// commands about a cluster (its status, adding and removing nodes, metadata); version 6
/// reading a partition from an offset without a group; version 7 handing a cluster's
/// leadership over; version 8 publishing a batch that stops at a partition's first refusal;
/// version 9 changing an existing topic's settings; version 10 the status of each Raft group of
/// a cluster that spreads its topics over several; version 11 dead-letter topics named under
/// Kafka's rules (`--names kafka`); version 12 the error code `Pending`; version 13 moving a
/// topic to another Raft group; version 14 listing the idempotent producers a partition
/// remembers; version 15 listing the consumer groups of Kafka's clients. A command belongs to the version that added it
/// ([`broker_core::Command::since_version`]).
pub const PROTOCOL_VERSION: u16 = 15;

/// The oldest protocol version a server still speaks: a client asking for any version from
/// this one to [`PROTOCOL_VERSION`] is answered in the version it asked for, byte for byte as
/// that version's documentation says.
pub const OLDEST_PROTOCOL_VERSION: u16 = 1;

/// The first frame of every connection, from the client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must be [`MAGIC`].
    pub magic: [u8; 4],
    /// The newest protocol version the client speaks; a server speaks the same one back if it
    /// can ([`OLDEST_PROTOCOL_VERSION`] to [`PROTOCOL_VERSION`]).
    pub version: u16,
    /// A free-form client name for the server's logs, such as `broker-client/0.1.0`.
    pub client: String,
    /// The shared secret, when the server requires one; `None` otherwise.
    pub auth_token: Option<String>,
}

impl Hello {
    /// A hello for the newest protocol version ([`PROTOCOL_VERSION`]).
    pub fn new(client: impl Into<String>, auth_token: Option<String>) -> Self {
        Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            client: client.into(),
            auth_token,
        }
    }
}

/// The server's answer to a [`Hello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// The connection is open for requests.
    Welcome {
        /// The protocol version of the rest of the connection: the client's, or the server's
        /// newest if the client's is newer still (a client that does not speak it closes).
        version: u16,
        /// The server's name and version, such as `broker-server/0.1.0`.
        server: String,
        /// The limits the server enforces on this connection.
        limits: ServerLimits,
    },
    /// The connection is refused and the server closes it after this frame.
    Refused(ErrorReply),
}

/// Limits a server announces in its [`HelloReply::Welcome`], so a client can respect them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerLimits {
    /// Largest frame body the server accepts or sends, in bytes.
    pub max_frame_bytes: u32,
    /// Largest payload, key and headers of one published record, in bytes.
    pub max_payload_bytes: u32,
    /// Most requests of one connection the server works on at once; more wait unread.
    pub max_in_flight: u32,
    /// Longest wait a waiting poll or fetch may ask for, in milliseconds.
    pub max_wait_ms: u32,
    /// A member joined over a connection is removed after this long without a call naming it,
    /// in milliseconds.
    pub session_timeout_ms: u32,
}

/// One request: a broker command, with the id its response will carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFrame {
    /// Chosen by the client; the response carries it back. Ids need not be sequential, but a
    /// client should not reuse one while its request is outstanding.
    pub correlation_id: u64,
    /// For `Poll` and `Fetch`: when nothing is available, wait up to this many milliseconds for
    /// a record before answering (the answer comes as soon as one is). 0 answers at once.
    /// Ignored by every other command.
    pub max_wait_ms: u32,
    /// The call.
    pub command: Command,
}

/// A [`RequestFrame`] whose command is borrowed: encoded to the same bytes, so that a client
/// can send a command it keeps (to send again after a lost connection) without copying it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RequestFrameRef<'a> {
    /// As in [`RequestFrame`].
    pub correlation_id: u64,
    /// As in [`RequestFrame`].
    pub max_wait_ms: u32,
    /// The call.
    pub command: &'a Command,
}

/// The answer to one [`RequestFrame`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseFrame {
    /// The request's correlation id; 0 answers a frame whose id could not be read.
    pub correlation_id: u64,
    /// The command's outcome, or why it was refused.
    pub result: Result<Outcome, ErrorReply>,
}

/// The request and response frames of protocol version 1, whose commands and outcomes are the
/// frozen shapes of [`broker_core::v1`]. A server decodes a version 1 client's requests with
/// these and answers with them ([`crate::ServerCodec`] does both).
pub mod v1 {
    use broker_core::v1::{Command, Outcome};
    use serde::{Deserialize, Serialize};

    use crate::ErrorReply;

    /// One request of version 1.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct RequestFrame {
        /// As in [`crate::RequestFrame`].
        pub correlation_id: u64,
        /// As in [`crate::RequestFrame`].
        pub max_wait_ms: u32,
        /// The call.
        pub command: Command,
    }

    /// The answer to one [`RequestFrame`] of version 1.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct ResponseFrame {
        /// As in [`crate::ResponseFrame`].
        pub correlation_id: u64,
        /// The command's outcome, or why it was refused.
        pub result: Result<Outcome, ErrorReply>,
    }

    impl From<RequestFrame> for crate::RequestFrame {
        fn from(frame: RequestFrame) -> crate::RequestFrame {
            crate::RequestFrame {
                correlation_id: frame.correlation_id,
                max_wait_ms: frame.max_wait_ms,
                command: frame.command.into(),
            }
        }
    }

    impl From<crate::ResponseFrame> for ResponseFrame {
        /// The answer in version 1's shape; an outcome version 1 has no shape for (it answers
        /// only commands version 1 does not have) becomes an `InvalidArgument` refusal.
        fn from(frame: crate::ResponseFrame) -> ResponseFrame {
            ResponseFrame {
                correlation_id: frame.correlation_id,
                result: frame.result.and_then(|outcome| {
                    Outcome::try_from(outcome)
                        .map_err(|error| ErrorReply::InvalidArgument(error.to_string()))
                }),
            }
        }
    }
}
