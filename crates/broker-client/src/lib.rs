//! The broker's typed async client.
//!
//! [`Client`] offers every call of `broker_core::EventBroker` as an async method with the same
//! name, arguments and results, over a TCP (or TLS) connection to a `broker-server` (one to
//! each node of a cluster it talks to). Clones share the connections; requests from any number
//! of tasks are pipelined on them and matched to their responses by correlation id. Broker errors arrive as [`Error::Broker`] with the core's own
//! [`BrokerError`].
//!
//! ```no_run
//! use std::time::Duration;
//! use broker_client::{BrokerError, Client, Error};
//!
//! # async fn run() -> Result<(), Error> {
//! let client = Client::connect("127.0.0.1:9092").await?;
//! client.create("orders", 2).await?;
//! client.publish("orders", 0, "first").await?;
//! client.join("orders", "billing", "m1").await?;
//! let records = client
//!     .poll_wait("orders", "billing", "m1", 8, Duration::from_secs(1))
//!     .await?;
//! for record in &records {
//!     client.ack("orders", "billing", "m1", record.partition, record.offset).await?;
//! }
//! match client.create("bad name!", 1).await {
//!     Err(Error::Broker(BrokerError::InvalidArgument(message))) => println!("{message}"),
//!     other => println!("{other:?}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Security
//!
//! A server that requires a token refuses a client without it (or with a wrong one) with
//! `Error::Refused(ErrorReply::Unauthenticated(_))` ([`Error::Refused`]); give it with
//! [`ClientBuilder::auth_token`]. A TLS server needs [`ClientBuilder::tls_ca_file`] (or
//! [`ClientBuilder::tls`]): the client then verifies the server's certificate against that CA
//! and against the host part of the address (or [`ClientBuilder::tls_server_name`]), and any
//! failure is an [`Error::Tls`] saying why. Reconnections use the same settings.
//!
//! # Design
//!
//! Each call encodes its request into the connection's outbox (bounded: callers wait for room,
//! in the order they came, while the writer has not taken a megabyte of requests), and a
//! writer task writes everything encoded since its last write with one write; a reader task
//! hands each response to the caller waiting for its correlation id. A call alone on a plain
//! TCP connection (no other call outstanding, and not one of several woken by the same
//! responses) writes a request of up to 64 KiB itself when the writer holds nothing, through a
//! second descriptor of the connection's socket (closed with the connection): it saves the
//! hand-off to the writer task, and pipelined calls still share the writer's writes. A call
//! keeps its command until it is answered, to send it again to a cluster's leader. At most [`ClientBuilder::max_in_flight`] calls are outstanding
//! at once. A call that times out or whose future is dropped is forgotten. When the connection
//! dies every outstanding call fails with [`Error::ConnectionLost`] and the next call
//! reconnects; see [`Client`] for what that means for consumer groups.

/// The crate's README, whose example is compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod address;
mod builder;
mod client;
mod connection;
mod consumer;
mod deadline;
mod error;
mod pending;
mod producer;
mod tls;

pub use address::ServerAddress;
pub use broker_core::{
    duration_text, parse_duration, Assignor, BrokerDescription, BrokerError, BrokerMetadata,
    BrokerRecord, ClusterMember, ClusterStatus, Command, Discard, DurationError, GroupDescription,
    GroupPartitionDescription, GroupSetting, GroupSettings, GroupStatus, Header,
    KafkaGroupDescription, KafkaMemberDescription, KeyHash, MemberDescription, NameRules,
    NodeAddress, NodeRole, Outcome, PartitionBatch, PartitionDescription, PartitionLag,
    PartitionRead, ProducerState, PublishRecord, ResetTo, Retention, StartAt, TopicDescription,
    TopicName, TopicPartitions, TopicPlacement, TopicSetting, TopicSettings, MAX_ACKS,
    MAX_BATCH_RECORDS, MAX_FETCH_RECORDS, MAX_POLL_RECORDS,
};
pub use broker_proto::{ErrorReply, ServerLimits};
pub use builder::{
    ClientBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_IN_FLIGHT, DEFAULT_REQUEST_TIMEOUT,
};
pub use client::Client;
pub use consumer::{ConsumeMode, Consumer, ConsumerBuilder, ConsumerStatus, Delivery};
pub use error::{Error, ProducerError};
pub use producer::{DeliveryReport, Producer, ProducerBuilder, Stored};
/// The rustls version [`ClientBuilder::tls`] takes its configuration from.
pub use tokio_rustls::rustls;
