//! The broker's TCP daemon as a library: [`run`] serves a [`broker_core::EventBroker`] to many
//! connections over the length-prefixed protocol of [`broker_proto`] until a shutdown future
//! completes.
//!
//! The binary `broker-server` only parses flags, sets up logging, binds and calls [`run`], so
//! tests can run the whole server in-process on `127.0.0.1:0` with a oneshot as the shutdown
//! signal:
//!
//! ```no_run
//! # async fn example() -> Result<(), broker_server::ServerError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(broker_server::run(listener, Default::default(), async {
//!     let _ = stopped.await;
//! }));
//! // ... talk to the server ...
//! let _ = stop.send(());
//! # let _ = server;
//! # Ok(())
//! # }
//! ```
//!
//! Inside, in layers that depend on each other in one direction:
//!
//! - `server`: the accept loop (a connection permit before each `accept`), and per connection
//!   the TLS handshake, the hello, then batches of pipelined requests; beside it, with
//!   `--kafka-listen`, `kafka` accepts Kafka's clients and serves each connection with
//!   `broker_kafka`, its requests taking the same path as the broker's own;
//! - `intake`: what both listeners share: accepting with back-off, the TLS handshake, and
//!   submitting a batch of requests to the broker, its answers handed to the connection;
//! - `connection`: framing on one connection, and the writer that sends its answers in order;
//! - `dispatch`: a batch of requests applied under one lock of the broker; beside it `waiter`
//!   answers requests parked to wait for records (woken by per-topic `signals`), `reaper`
//!   removes members whose session timed out or whose connection closed, and `clock` lets time
//!   pass (age retention, acknowledgement timeouts);
//! - `reply`: what requests turn into on their way back (answers now or deferred, parked
//!   waits), shared by the layers above without their depending on each other;
//! - `broker`: the core's state and the member `sessions` behind one lock, with the journal
//!   (`broker_storage`) that makes changes durable; `audit` logs the administrative changes it
//!   applies (topics, groups, membership) at info level.
//!
//! Beside them, with `--metrics-listen`, `metrics` holds the counters the layers above update
//! and `exporter` serves them, with what the broker holds, at `/metrics`.
//!
//! Who may come in is settled before any request (`security`): the TLS handshake when a
//! [`ServerTls`] is configured, then the hello's token checked against the [`AuthToken`].

mod answers;
mod arrivals;
mod audit;
mod broker;
mod clock;
mod cluster_admin;
mod config;
mod connection;
mod console;
mod counted;
mod data_groups;
mod dispatch;
mod exporter;
mod http;
mod intake;
mod kafka;
mod listen;
mod metrics;
mod moves;
mod process_metrics;
mod reaper;
mod replicated;
mod reply;
mod security;
mod server;
mod sessions;
mod shards;
mod shared;
mod signals;
mod stores;
mod waiter;

use std::future::Future;

use tokio::net::TcpListener;

pub use broker_cluster::{parse_members, ClusterNode, NodeId};
pub use broker_storage::{Fsync, Storage};
pub use config::{default_request_memory, ClusterSettings, Config, MAX_SHARDS, SERVER_NAME};
pub use listen::resolve_listen_addr;
pub use replicated::bind_peer_port;
pub use security::{AuthToken, ServerTls};
pub use stores::Stores;

/// Why the server could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A `--listen` address could not be parsed or resolved.
    #[error("invalid listen address {address:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// Why it was refused.
        reason: String,
    },
    /// A socket or file operation failed (binding, reading the local address, announcing the
    /// start).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The auth token could not be loaded.
    #[error(transparent)]
    Token(#[from] broker_net::TokenError),
    /// The data directory is locked by another server, damaged, or cannot be read or
    /// written.
    #[error(transparent)]
    Storage(#[from] broker_storage::StorageError),
    /// A cluster node could not start: its settings, its files, the consensus engine, or a
    /// directory that lost the node's log.
    #[error(transparent)]
    Cluster(#[from] broker_cluster::ClusterError),
}

/// Serves the broker on `listener` until `shutdown` completes, then shuts down gracefully: stops
/// accepting, lets batches being applied finish, answers parked waiting requests at once with
/// their current result, flushes responses and closes connections. Returns within
/// `config.shutdown_grace` of `shutdown` completing, abandoning whatever has not finished by
/// then.
///
/// # Errors
/// [`ServerError::InvalidConfig`] if `config` does not [`Config::validate`]. Errors of single
/// connections, and `accept` errors, are logged and never end the server.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    run_with_storage(listener, config, None, shutdown).await
}

/// [`run`] with a data directory already opened and recovered by [`open_storage`] (so that a
/// refusal comes before the address is announced). With `storage` `None`, opens
/// `config.data_dir` itself when it is set; without a data directory the broker is purely in
/// memory.
///
/// # Errors
/// As [`run`], and as [`open_storage`].
pub async fn run_with_storage(
    listener: TcpListener,
    config: Config,
    storage: Option<Stores>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    run_with_metrics(listener, None, config, storage, shutdown).await
}

/// [`run_with_storage`] that also serves metrics in Prometheus's text format at `/metrics` over
/// HTTP on `metrics_listener`, when given: requests, errors and latency by command,
/// connections, bytes, records published, delivered, acknowledged and retried, expired
/// sessions, fsync latency, and per partition and group what the broker holds. Without it
/// nothing is counted.
///
/// # Errors
/// As [`run_with_storage`].
pub async fn run_with_metrics(
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    config: Config,
    storage: Option<Stores>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let listeners = Listeners {
        broker: listener,
        metrics: metrics_listener,
        kafka: None,
        console: None,
    };
    run_with_listeners(listeners, config, storage, shutdown).await
}

/// The sockets a server accepts on: the broker's own protocol, and optionally metrics and
/// Kafka's protocol.
#[derive(Debug)]
pub struct Listeners {
    /// Clients of the broker's own protocol.
    pub broker: TcpListener,
    /// HTTP for `/metrics` (see [`run_with_metrics`]); `None` counts nothing.
    pub metrics: Option<TcpListener>,
    /// Kafka's clients, speaking Kafka's protocol to the same topics: produce, fetch, offsets,
    /// metadata, consumer groups and topic administration (see docs/kafka.md, "Using Kafka
    /// clients"); `None` for none. With an auth token, Kafka's clients authenticate with
    /// SASL/PLAIN, the token as the password; with TLS, they speak TLS with the same
    /// certificate. In a cluster, each node's Kafka listener sends clients to the leader,
    /// which serves every partition and group.
    pub kafka: Option<TcpListener>,
    /// HTTP (HTTPS with the configuration's TLS identity) for the read-only web console: topics,
    /// groups and their lag over the last minutes, dead-letter topics, the cluster, and each
    /// partition's latest records; `None` for none. With an auth token, the console asks for it.
    pub console: Option<TcpListener>,
}

/// [`run_with_metrics`] on every listener of `listeners`.
///
/// # Errors
/// As [`run_with_storage`]; [`ServerError::InvalidConfig`] for a Kafka listener in a cluster
/// whose node ids are not Kafka broker ids (see [`Config::check_kafka`]).
pub async fn run_with_listeners(
    listeners: Listeners,
    config: Config,
    storage: Option<Stores>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    run_announced(listeners, config, storage, shutdown, || Ok(())).await
}

/// [`run_with_listeners`] that calls `started` once nothing can refuse the start any more (a
/// cluster node has asked its peers whether it lost its log, and joined them), before the
/// broker's listener accepts its first connection: the moment to tell whoever waits for the
/// server that it serves. (The metrics and Kafka listeners may serve a moment earlier.)
///
/// # Errors
/// As [`run_with_listeners`], and [`ServerError::Io`] with the error `started` returns: the
/// server then stops what it started (the cluster node, the other listeners, the log) as on a
/// shutdown, and returns.
pub async fn run_announced(
    listeners: Listeners,
    config: Config,
    storage: Option<Stores>,
    shutdown: impl Future<Output = ()>,
    started: impl FnOnce() -> std::io::Result<()>,
) -> Result<(), ServerError> {
    config.validate()?;
    if listeners.kafka.is_some() {
        config.check_kafka()?;
    }
    let listener = &listeners.broker;
    let storage = match storage {
        Some(storage) => Some(storage),
        None => open_storage(&config)?,
    };
    if config.auth_token.is_none() {
        let open = std::iter::once(listener).chain(listeners.kafka.as_ref());
        for local in open.filter_map(|listener| listener.local_addr().ok()) {
            if !local.ip().is_loopback() {
                tracing::warn!(
                    address = %local,
                    "no auth token is configured and the server listens beyond loopback: \
                     anyone who can reach it may read and delete every record"
                );
            }
        }
    }
    server::serve(listeners, config, storage, shutdown, started).await
}

/// Locks `config.data_dir` and rebuilds the broker from it (the latest snapshot, then the log
/// through the core's `apply`), shard by shard (see [`Config::shards`]); `None` without a data
/// directory.
///
/// # Errors
/// [`ServerError::Storage`] if the directory is locked by another server, damaged, written by
/// an incompatible version or with another capacity, or cannot be read;
/// [`ServerError::InvalidConfig`] if it retains a record larger than `config.max_payload_bytes`
/// (records are delivered whole, so a poll could reserve one that no answer can carry), or
/// holds more shards than `config.shards`.
pub fn open_storage(config: &Config) -> Result<Option<Stores>, ServerError> {
    let Some(path) = &config.data_dir else {
        return Ok(None);
    };
    // A cluster node keeps its state in its replicated log (see `replicated`).
    if let Some(cluster) = &config.cluster {
        replicated::check_directory(path, cluster.node_id)?;
        return Ok(None);
    }
    if path.join(replicated::CLUSTER_DIR).exists() {
        return Err(ServerError::InvalidConfig(format!(
            "{} holds the data of a cluster node ({}/): start it with its cluster settings \
             (--node-id, --cluster-members), or give a single broker a directory of its own",
            path.display(),
            replicated::CLUSTER_DIR
        )));
    }
    let started = std::time::Instant::now();
    let stores = stores::open(path, config, |dir, storage| {
        check_recovered(config, dir, storage, started)
    })?;
    Ok(Some(stores))
}

/// Logs what recovering the shard in `dir` found, and refuses a shard that retains a record
/// larger than `config.max_payload_bytes`.
fn check_recovered(
    config: &Config,
    path: &std::path::Path,
    storage: &Storage,
    started: std::time::Instant,
) -> Result<(), ServerError> {
    let recovery = storage.recovery();
    tracing::info!(
        data_dir = %path.display(),
        snapshot = ?recovery.snapshot_seq,
        replayed = recovery.replayed,
        next_entry = recovery.next_seq,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "recovered the broker from its data directory"
    );
    let largest = recovery
        .state
        .largest_retained_record()
        .map_err(|error| ServerError::InvalidConfig(format!("{}: {error}", path.display())))?;
    // A record moved to a dead-letter topic is its publish plus the headers that say where it
    // came from: it may pass the payload limit by that much (a frame has room for it).
    let allowed = config.max_payload_bytes as u64 + broker_core::DEAD_LETTER_HEADER_BYTES;
    if largest > allowed {
        return Err(ServerError::InvalidConfig(format!(
            "{} holds a record of {largest} bytes (payload and key), more than the configured \
             max payload bytes ({}); records are delivered whole, so start with \
             --max-payload-bytes {largest} or more",
            path.display(),
            config.max_payload_bytes
        )));
    }
    Ok(())
}

impl From<broker_net::AddressError> for ServerError {
    fn from(error: broker_net::AddressError) -> Self {
        ServerError::InvalidAddress {
            address: error.address,
            reason: error.reason,
        }
    }
}
