//! Reaching the broker-server: its address, the auth token and TLS settings of every connection
//! a command opens, and one-line errors that say how to fix a failed connection.

use std::path::PathBuf;

use anyhow::anyhow;
use broker_client::{Client, ClientBuilder, Error, ErrorReply};

/// Where the broker-server is and how to get in: its address, the auth token, TLS.
#[derive(Debug, Clone)]
pub struct Server {
    /// `HOST:PORT`, from `--addr`.
    pub addr: String,
    /// The shared secret sent in the hello, if any.
    pub auth_token: Option<String>,
    /// The CA file to trust: TLS when set.
    pub tls_ca: Option<PathBuf>,
    /// The name the server's certificate must carry instead of the host of `addr`.
    pub tls_server_name: Option<String>,
}

impl Server {
    /// A client builder with the auth token and TLS settings.
    pub fn builder(&self) -> ClientBuilder {
        let mut builder = Client::builder();
        if let Some(token) = &self.auth_token {
            builder = builder.auth_token(token.clone());
        }
        if let Some(ca) = &self.tls_ca {
            builder = builder.tls_ca_file(ca);
        }
        if let Some(name) = &self.tls_server_name {
            builder = builder.tls_server_name(name.clone());
        }
        builder
    }

    /// Connects, saying in one line what went wrong and how to fix it when it fails.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        let addr = &self.addr;
        // A command makes its call once: one refused by a cluster's follower goes to the leader.
        self.builder()
            .follow_leader(true)
            .connect(addr.as_str())
            .await
            .map_err(|error| match error {
                Error::Refused(ErrorReply::Unauthenticated(why)) => anyhow!(
                    "broker-server at {addr} refused the connection: {why} (set \
                 --auth-token-file, BROKER_AUTH_TOKEN_FILE or BROKER_AUTH_TOKEN)"
                ),
                Error::Tls(_) if self.tls_ca.is_none() => anyhow!(
                    "cannot reach broker-server at {addr} without TLS: the server speaks TLS \
                 (give its certificate authority with --tls-ca or BROKER_TLS_CA)"
                ),
                Error::Tls(why) => anyhow!(
                    "cannot reach broker-server at {addr} over TLS: {why} (check --tls-ca and \
                 --tls-server-name, or leave out --tls-ca for a server without TLS)"
                ),
                Error::Protocol(why) => anyhow!("cannot talk to broker-server at {addr}: {why}"),
                other => anyhow!(other).context(format!(
                "cannot reach broker-server at {addr} (is it running? set --addr or BROKER_ADDR)"
            )),
            })
    }
}
