//! Kafka's wire protocol in front of the broker, so that Kafka clients and tools (librdkafka
//! and everything built on it, kafka-python, the Java client, `kcat`) produce to and consume
//! from the broker's topics, beside the broker's own clients.
//!
//! The listener speaks Kafka's protocol on its socket and the broker's commands behind it:
//! each Kafka request becomes one or more [`broker_core::Command`]s, run by a [`Backend`] (the
//! server, which applies them exactly as it applies a native client's: the same log, the same
//! waits, the same cluster), and their outcomes become the Kafka response. So Kafka offsets are
//! the broker's offsets, a record produced through Kafka is consumed natively with the same key,
//! payload, headers and time, and the other way round.
//!
//! In layers that depend on each other in one direction:
//!
//! - `frame`: a request's header and body out of a frame, a response into one, and the answer
//!   to a request that cannot be decoded;
//! - `apis`: the API keys and versions the listener speaks, and the `ApiVersions` answer;
//! - `batch`: Kafka's record batch format, read and written byte for byte;
//! - `records`: Kafka's record batches to the broker's records and back;
//! - `sequences`: idempotent producers' sequence numbers, which wrap, on the broker's;
//! - `assignment`: a Kafka consumer's assignment, read to show who consumes what;
//! - `errors`: the broker's refusals as Kafka error codes;
//! - `configs`: Kafka's topic configs and the broker's topic settings;
//! - `elsewhere`: a cluster node's answers to group requests while another node leads;
//! - `native_groups`: which groups have native members, looked at once for many requests;
//! - `handler`: what each request does, through the [`Backend`];
//! - `connection`: one client's connection, request after request, answered in order.
//!
//! Messages are encoded and decoded by the `kafka-protocol` crate, generated from Kafka's own
//! message schemas; the record batches they carry by `batch`, whose records keep a header name
//! as often as a record repeats it.

mod apis;
mod assignment;
mod backend;
mod batch;
mod configs;
mod connection;
mod decompress;
mod elsewhere;
mod errors;
mod frame;
mod groups;
mod handler;
mod ids;
mod native_groups;
mod records;
mod sasl;
mod sequences;
mod settings;
#[cfg(test)]
mod testing;

pub use apis::{supported_apis, SupportedApi};
pub use backend::{Backend, ClusterView};
pub use connection::serve_connection;
pub use groups::Coordinator;
pub use kafka_protocol::messages::ApiKey;
pub use kafka_protocol::ResponseError;
pub use sequences::ProducerSequences;
pub use settings::KafkaSettings;

/// What a server's Kafka connections share, for as long as the server runs.
#[derive(Debug, Default)]
pub struct KafkaState {
    /// The consumer groups of Kafka's clients: their members and generations.
    pub groups: Coordinator,
    /// Where idempotent producers near the wrap of their sequence numbers stand.
    pub sequences: ProducerSequences,
    /// The broker's groups with native members, as last looked at.
    native_groups: native_groups::NativeGroups<broker_proto::ErrorReply>,
    /// When a JoinGroup refused for a group with native members was last logged as a
    /// warning: at most one every few seconds, whatever clients retry.
    refusal_warned: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl KafkaState {
    /// The state of a server whose groups' coordinator is `groups`, no producer known yet.
    pub fn new(groups: Coordinator) -> KafkaState {
        KafkaState {
            groups,
            sequences: ProducerSequences::default(),
            native_groups: Default::default(),
            refusal_warned: Default::default(),
        }
    }
}

/// Why a Kafka connection ended before its client closed it.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// Reading or writing the socket failed.
    #[error("connection error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame announced more bytes than the listener accepts (or a negative length).
    #[error("a request of {size} bytes is larger than the limit of {limit} bytes")]
    FrameTooLarge {
        /// The length the frame announced.
        size: u64,
        /// The largest frame accepted.
        limit: usize,
    },
    /// A request whose first bytes arrived was not whole within the read timeout (a client
    /// sending a byte now and then, holding its buffer).
    #[error("a request did not arrive whole within {limit:?}")]
    ReadTimeout {
        /// The read timeout.
        limit: std::time::Duration,
    },
    /// The peer spoke another protocol: HTTP or Redis's (told so in its own protocol), or the
    /// broker's own (answered as a Kafka request of an unknown API).
    #[error("the client speaks {}, not Kafka's protocol", .0.name())]
    Foreign(broker_net::Foreign),
    /// The client took none of an answer within the write timeout.
    #[error("the client did not read its answer in time")]
    WriteTimeout,
    /// The client did not authenticate: a request before SASL, or a SASL handshake of version
    /// 0, which the listener does not serve.
    #[error("the client did not authenticate")]
    Unauthenticated,
    /// The client's SASL/PLAIN password is not the server's token.
    #[error("the client's password is not the auth token")]
    WrongPassword,
    /// A response could not be encoded (a bug: every response built is encodable in the
    /// version it is built for).
    #[error("cannot encode the response: {0}")]
    Encode(String),
}
