//! Options for a [`Client`], set before connecting.

use std::time::Duration;

use tokio::net::ToSocketAddrs;

use crate::connection::Identity;
use crate::{Client, Error};

/// The default request timeout: 30 seconds.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The default connect timeout: 10 seconds.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default number of calls one client has in flight at once: 1,024.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// Builds a [`Client`] with options; [`Client::builder`] starts one.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), broker_client::Error> {
/// let client = broker_client::Client::builder()
///     .request_timeout(Duration::from_secs(5))
///     .connect_timeout(Duration::from_secs(2))
///     .max_in_flight(256)
///     .client_name("billing-service")
///     .connect("127.0.0.1:9092")
///     .await?;
/// # drop(client);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) identity: Identity,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            identity: Identity {
                name: concat!("broker-client/", env!("CARGO_PKG_VERSION")).to_owned(),
                auth_token: None,
            },
        }
    }
}

impl ClientBuilder {
    /// How long each call may take, from the moment it is made (waiting for an in-flight slot
    /// and reconnecting included) to its answer; [`DEFAULT_REQUEST_TIMEOUT`] by default. A
    /// waiting call ([`Client::poll_wait`], [`Client::fetch_wait`]) gets its maximum wait on
    /// top. A call that runs out of time fails with [`Error::Timeout`].
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long opening a connection (TCP connect and hello exchange) may take;
    /// [`DEFAULT_CONNECT_TIMEOUT`] by default.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many calls the client has in flight at once, across all its clones;
    /// [`DEFAULT_MAX_IN_FLIGHT`] by default, at least 1. Callers beyond it wait for a slot.
    #[must_use]
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self
    }

    /// The client name sent in the hello, for the server's logs; `broker-client/<version>` by
    /// default.
    #[must_use]
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.identity.name = name.into();
        self
    }

    /// The shared secret sent in the hello, for servers that require one; none by default.
    #[must_use]
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.identity.auth_token = Some(token.into());
        self
    }

    /// Resolves `addr` and opens the client's connection to the first address that accepts.
    /// Later reconnections use the same resolved addresses.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the address does not resolve, no address accepts, or the hello exchange
    /// fails or outlasts the connect timeout; [`Error::Refused`] if the server refuses the
    /// hello; [`Error::Protocol`] if its answer makes no sense.
    pub async fn connect(self, addr: impl ToSocketAddrs) -> Result<Client, Error> {
        Client::open(self, addr).await
    }
}
