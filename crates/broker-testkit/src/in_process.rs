//! The server in this process, on `127.0.0.1:0`, with a oneshot as its shutdown signal.

use std::net::SocketAddr;

use broker_client::Client;
use broker_server::{Config, ServerError};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server running in this process until stopped (or dropped, which signals it to stop).
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
}

impl TestServer {
    /// Starts a server with `config` on `127.0.0.1:0`. A config that sets no shards takes them
    /// from `BROKER_SHARDS`, as the binary does, so that a test suite can be run against a
    /// broker of several shards (`BROKER_SHARDS=3 cargo test ...`).
    pub async fn start(mut config: Config) -> TestServer {
        if config.shards.is_none() && config.cluster.is_none() {
            config.shards = std::env::var("BROKER_SHARDS")
                .ok()
                .and_then(|shards| shards.parse().ok());
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(broker_server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts a server whose partitions hold `capacity` records, other options default.
    pub async fn with_capacity(capacity: i32) -> TestServer {
        TestServer::start(Config {
            capacity,
            ..Config::default()
        })
        .await
    }

    /// A client connected to this server.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await.unwrap()
    }

    /// Shuts the server down gracefully and returns what `run` returned.
    ///
    /// # Errors
    /// What the server returned: a configuration it refused, say.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        self.signal_stop();
        match self.task.take() {
            Some(task) => task.await.unwrap(),
            None => Ok(()),
        }
    }

    fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.signal_stop();
    }
}
