//! Options for a [`Client`], set before connecting.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::net::lookup_host;
use tokio_rustls::rustls::ClientConfig;

use crate::client::Settings;
use crate::connection::Identity;
use crate::tls::{Tls, TlsTrust};
use crate::{Client, Error, ServerAddress};

/// The default request timeout: 30 seconds.
///
/// ```no_run
/// # async fn run() -> Result<(), broker_client::Error> {
/// use broker_client::{Client, DEFAULT_REQUEST_TIMEOUT};
///
/// let client = Client::builder()
///     .request_timeout(DEFAULT_REQUEST_TIMEOUT * 2)
///     .connect("127.0.0.1:9092")
///     .await?;
/// # Ok(())
/// # }
/// ```
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The default connect timeout: 10 seconds.
///
/// ```no_run
/// # async fn run() -> Result<(), broker_client::Error> {
/// use broker_client::{Client, DEFAULT_CONNECT_TIMEOUT};
///
/// let client = Client::builder()
///     .connect_timeout(DEFAULT_CONNECT_TIMEOUT / 2)
///     .connect("127.0.0.1:9092")
///     .await?;
/// # Ok(())
/// # }
/// ```
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default number of calls one client has in flight at once: 1,024.
///
/// ```no_run
/// # async fn run() -> Result<(), broker_client::Error> {
/// use broker_client::{Client, DEFAULT_MAX_IN_FLIGHT};
///
/// let client = Client::builder()
///     .max_in_flight(DEFAULT_MAX_IN_FLIGHT / 4)
///     .connect("127.0.0.1:9092")
///     .await?;
/// # Ok(())
/// # }
/// ```
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
    pub(crate) tls: Option<TlsTrust>,
    pub(crate) tls_server_name: Option<String>,
    pub(crate) follow_leader: bool,
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
            tls: None,
            tls_server_name: None,
            follow_leader: false,
        }
    }
}

impl ClientBuilder {
    /// How long each call may take, from the moment it is made (waiting for an in-flight slot
    /// and reconnecting included) to its answer; [`DEFAULT_REQUEST_TIMEOUT`] by default. A
    /// waiting call ([`Client::poll_wait`], [`Client::fetch_wait`]) gets its maximum wait on
    /// top. A call that runs out of time fails with [`Error::Timeout`], at most 20 ms after its
    /// deadline (the connection checks deadlines every 20 ms instead of setting a timer per
    /// call).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    /// use std::time::Duration;
    ///
    /// let client = Client::builder()
    ///     .request_timeout(Duration::from_secs(5))
    ///     .connect("127.0.0.1:9092")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long opening a connection (TCP connect and hello exchange) may take;
    /// [`DEFAULT_CONNECT_TIMEOUT`] by default.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    /// use std::time::Duration;
    ///
    /// let client = Client::builder()
    ///     .connect_timeout(Duration::from_secs(2))
    ///     .connect("broker.internal:9092")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many calls the client has in flight at once, across all its clones;
    /// [`DEFAULT_MAX_IN_FLIGHT`] by default, at least 1. Callers beyond it wait for a slot.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// let client = Client::builder().max_in_flight(64).connect("127.0.0.1:9092").await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self
    }

    /// The client name sent in the hello, for the server's logs; `broker-client/<version>` by
    /// default.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// // The server's logs and `broker top` show it.
    /// let client = Client::builder().client_name("billing").connect("127.0.0.1:9092").await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.identity.name = name.into();
        self
    }

    /// The shared secret sent in the hello, for servers that require one; none by default.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// let token = std::env::var("BROKER_AUTH_TOKEN").unwrap_or_default();
    /// let client = Client::builder().auth_token(token).connect("127.0.0.1:9092").await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn auth_token(mut self, token: impl Into<String>) -> Self {
        self.identity.auth_token = Some(token.into());
        self
    }

    /// Connects with TLS, trusting the CA certificates in the PEM file at `path` (read when
    /// connecting) and no others; the server's certificate must also carry the server name
    /// (see [`ClientBuilder::tls_server_name`]). Without this or [`ClientBuilder::tls`] the
    /// client speaks plain TCP.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// let client = Client::builder()
    ///     .tls_ca_file("/etc/broker/ca.pem")
    ///     .connect("broker.example:9092")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls = Some(TlsTrust::CaFile(path.into()));
        self
    }

    /// Connects with TLS using a complete rustls configuration (other roots, client
    /// certificates, ...); the server name is verified as with [`ClientBuilder::tls_ca_file`].
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    /// use std::sync::Arc;
    ///
    /// let config: Arc<broker_client::rustls::ClientConfig> = my_tls_config();
    /// let client = Client::builder().tls(config).connect("broker.example:9092").await?;
    /// # fn my_tls_config() -> Arc<broker_client::rustls::ClientConfig> { unimplemented!() }
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn tls(mut self, config: Arc<ClientConfig>) -> Self {
        self.tls = Some(TlsTrust::Config(config));
        self
    }

    /// The name (DNS name or IP address) the server's TLS certificate must carry; by default
    /// the host part of the address given to [`ClientBuilder::connect`]. Ignored without TLS.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// // Reached by address; its certificate names it "broker.example".
    /// let client = Client::builder()
    ///     .tls_ca_file("/etc/broker/ca.pem")
    ///     .tls_server_name("broker.example")
    ///     .connect("10.0.0.5:9092")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// Sends a call that a cluster's follower refuses (`ErrorReply::NotLeader`) again to the
    /// leader, even when the client was given a single address (it otherwise does so only when
    /// given several addresses, or once a follower refused a call). For tools that make one
    /// call per connection, such as a command line.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// // Given one node of a cluster: its very first call already goes to its topic's leader.
    /// let client = Client::builder().follow_leader(true).connect("10.0.0.5:9092").await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn follow_leader(mut self, follow: bool) -> Self {
        self.follow_leader = follow;
        self
    }

    /// Resolves `addr` and opens the client's connection to the first address that welcomes
    /// it. Later reconnections use the same resolved addresses (and the same TLS settings).
    ///
    /// Text may list several addresses separated by commas: the nodes of a cluster
    /// (`"10.0.0.1:9092,10.0.0.2:9092,10.0.0.3:9092"`). The client then finds the leader by
    /// itself: a call that reaches a node which does not lead is sent again to the leader it
    /// names (or, during an election, to the next node), so callers see no difference; a
    /// reconnection tries the node it lost last. In a cluster whose topics have leaders of their
    /// own (`--cluster-data-groups`), the client remembers each topic's leader and sends that
    /// topic's calls there, over one connection per node it needs. The addresses are tried in order, each beside
    /// those before it: the next one at once when an attempt fails, or when one is overdue (no
    /// connection within a quarter of a second, or no welcome within four times as long as
    /// connecting took, at least a quarter of a second), so a node that is down or frozen (it
    /// accepts the connection but never answers) does not hold the client up; a slow one keeps
    /// the whole connect timeout to answer.
    /// The names are resolved at once, each within the connect timeout; one that does not
    /// resolve (the name of a node that is down, in some setups) is left out, with a warning
    /// logged through `tracing` naming it (the `broker` command prints it). With a
    /// single address, a call a follower refuses fails with `ErrorReply::NotLeader` and the
    /// client moves to the leader for the calls after it. With TLS, every node's certificate
    /// must carry the server name (the host of the first address unless
    /// [`ClientBuilder::tls_server_name`] sets it).
    ///
    /// # Errors
    ///
    /// When every address fails, or the connect timeout ends first, the error is that of the
    /// most telling failure (a refusal, a TLS or protocol error rather than an I/O error),
    /// naming the address when there are several: [`Error::Io`] if no address
    /// resolves, no address accepts, or the hello exchange fails or outlasts the connect
    /// timeout; [`Error::Tls`] if the TLS settings are unusable
    /// or the TLS handshake fails (an untrusted certificate, a wrong server name, a server
    /// without TLS); [`Error::Refused`] if the server refuses the hello (such as
    /// `ErrorReply::Unauthenticated` for a missing or wrong auth token); [`Error::Protocol`] if
    /// its answer makes no sense.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    /// use std::time::Duration;
    ///
    /// let client = Client::builder()
    ///     .request_timeout(Duration::from_secs(5))
    ///     .connect("127.0.0.1:9092")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self, addr: impl ServerAddress) -> Result<Client, Error> {
        let tls = match &self.tls {
            None => None,
            Some(trust) => {
                let server_name = self
                    .tls_server_name
                    .clone()
                    .or_else(|| addr.host())
                    .ok_or_else(|| {
                        Error::Tls(
                            "the address has no host part to verify; set a TLS server name"
                                .to_owned(),
                        )
                    })?;
                Some(Tls::new(trust, &server_name)?)
            }
        };
        let mut nodes = 1;
        let mut named: Vec<(String, Vec<SocketAddr>)> = Vec::new();
        let found = match addr.as_text() {
            Some(text) => {
                let list = broker_net::connect_addresses(text).map_err(|error| {
                    Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, error))
                })?;
                let names: Vec<&str> = list.split(',').collect();
                nodes = names.len();
                let failure;
                (named, failure) = resolve_nodes(&names, self.connect_timeout).await;
                let found: Vec<SocketAddr> =
                    named.iter().flat_map(|(_, found)| found.clone()).collect();
                match found.is_empty() {
                    true => Err(failure.unwrap_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("{list} did not resolve within the connect timeout"),
                        )
                    })),
                    false => Ok(found),
                }
            }
            None => lookup_host(addr).await.map(Iterator::collect),
        };
        Client::start(Settings {
            addrs: found.map_err(Error::Io)?,
            named,
            cluster: nodes > 1 || self.follow_leader,
            identity: self.identity,
            tls,
            request_timeout: self.request_timeout,
            connect_timeout: self.connect_timeout,
            max_in_flight: self.max_in_flight,
        })
        .await
    }
}

impl Client {
    /// Connects with the default options (see [`ClientBuilder`]).
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// let client = broker_client::Client::connect("127.0.0.1:9092").await?;
    /// println!("connected to {}", client.server_name());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(addr: impl ServerAddress) -> Result<Client, Error> {
        ClientBuilder::default().connect(addr).await
    }

    /// A builder for a client with options.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), broker_client::Error> {
    /// use broker_client::Client;
    ///
    /// let client = Client::builder().client_name("billing").connect(":9092").await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }
}

/// Resolves a cluster's node names at once, each with the addresses it resolved to, in the
/// order given. The name of a node that is down may take seconds to fail (a container's name,
/// behind a resolver that cannot reach upstream): once one name has resolved, the others get
/// [`LOOKUP_GRACE`] more, and those still unresolved are left out (a node the cluster names
/// later as its leader is looked up then, and each is named in a warning logged through
/// `tracing`, so that a mistyped name shows). Nothing waits past `timeout`. Also gives the first
/// failure, if a name failed.
async fn resolve_nodes(
    names: &[&str],
    timeout: Duration,
) -> (Vec<(String, Vec<SocketAddr>)>, Option<std::io::Error>) {
    let deadline = crate::deadline::after(tokio::time::Instant::now(), timeout);
    let mut lookups: FuturesUnordered<_> = names
        .iter()
        .enumerate()
        .map(|(index, name)| async move { (index, lookup_host(*name).await) })
        .collect();
    let mut resolved: Vec<Option<Vec<SocketAddr>>> = vec![None; names.len()];
    let mut failed: Vec<Option<String>> = vec![None; names.len()];
    let mut until = deadline;
    let mut failure = None;
    while let Ok(Some((index, found))) = tokio::time::timeout_at(until, lookups.next()).await {
        match found {
            Ok(found) => {
                resolved[index] = Some(found.collect());
                until = until.min(tokio::time::Instant::now() + LOOKUP_GRACE);
            }
            Err(error) => {
                failed[index] = Some(error.to_string());
                failure = failure.or(Some(error));
            }
        }
    }
    if resolved.iter().any(Option::is_some) {
        for ((name, found), failed) in names.iter().zip(&resolved).zip(failed) {
            if found.is_none() {
                let why = failed.unwrap_or_else(|| "it did not resolve in time".to_owned());
                tracing::warn!(
                    "leaving out cluster node {name}, whose name does not resolve ({why}): the \
                     client uses the other nodes"
                );
            }
        }
    }
    let named = names
        .iter()
        .zip(resolved)
        .filter_map(|(name, found)| Some(((*name).to_owned(), found?)))
        .collect();
    (named, failure)
}

/// How long the other names of a cluster's nodes may take to resolve once one has.
const LOOKUP_GRACE: Duration = Duration::from_millis(200);
