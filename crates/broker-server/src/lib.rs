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
//! Inside: an accept loop (`server`) takes a connection permit before each `accept` and spawns
//! one task per connection; a `Connection` owns the framing (`connection`); each batch of
//! pipelined requests is applied under one lock of the core (`dispatch`); poll and fetch
//! requests that ask to wait are parked on per-topic signals (`waiter`); members joined over a
//! connection are tracked and expire after a session timeout (`session`).
//!
//! Who may come in is settled before any request (`security`): the TLS handshake when a
//! [`ServerTls`] is configured, then the hello's token checked against the [`AuthToken`].

mod config;
mod connection;
mod dispatch;
mod durability;
mod listen;
mod security;
mod server;
mod session;
mod waiter;

use std::future::Future;

use tokio::net::TcpListener;

pub use config::{Config, SERVER_NAME};
pub use durability::{Fsync, Storage};
pub use listen::{normalize_listen_addr, resolve_listen_addr};
pub use security::{AuthToken, ServerTls};

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
    /// A socket operation failed (binding, reading the local address).
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The data directory is locked by another server, damaged, or cannot be read or
    /// written.
    #[error(transparent)]
    Storage(#[from] broker_storage::StorageError),
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

/// [`run`] with a data directory already opened and recovered by [`Storage::open`] (so that a
/// refusal comes before the address is announced). With `storage` `None`, opens
/// `config.data_dir` itself when it is set; without a data directory the broker is purely in
/// memory.
///
/// # Errors
/// As [`run`], and [`ServerError::Storage`] if the data directory cannot be opened, recovered
/// or written.
pub async fn run_with_storage(
    listener: TcpListener,
    config: Config,
    storage: Option<Storage>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    config.validate()?;
    let storage = match storage {
        Some(storage) => Some(storage),
        None => Storage::open(&config)?,
    };
    if config.auth_token.is_none() {
        if let Ok(local) = listener.local_addr() {
            if !local.ip().is_loopback() {
                tracing::warn!(
                    address = %local,
                    "no auth token is configured and the server listens beyond loopback: \
                     anyone who can reach it may read and delete every record"
                );
            }
        }
    }
    server::serve(listener, config, storage, shutdown).await
}
