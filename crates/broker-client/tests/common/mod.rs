//! Helpers shared by the end-to-end tests: an in-process `broker-server` on an ephemeral port,
//! and a TCP proxy that can cut every connection through it and change its backend, to stand
//! for a network failure or a server restarted elsewhere.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use broker_client::Client;
use broker_server::{Config, ServerError};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// A server running in this process until stopped (or dropped).
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
}

impl TestServer {
    /// Starts a server with `config` on `127.0.0.1:0`.
    pub async fn start(config: Config) -> TestServer {
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

    /// Shuts the server down gracefully and waits until it has finished.
    pub async fn stop(mut self) {
        self.signal_stop();
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
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

/// A TCP proxy on an ephemeral port forwarding each connection to the current backend.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    backend: Arc<Mutex<SocketAddr>>,
    cut: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// A proxy to `backend`.
    pub async fn start(backend: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let backend = Arc::new(Mutex::new(backend));
        let (cut, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let backend = Arc::clone(&backend);
            let cut = cut.clone();
            let accepted = Arc::clone(&accepted);
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let target = *backend.lock().unwrap();
                    let mut cut = cut.subscribe();
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(target).await else {
                            return;
                        };
                        let (mut client, mut server) = (client, server);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            }
        });
        Proxy {
            addr,
            backend,
            cut,
            accepted,
            task,
        }
    }

    /// Closes every connection through the proxy, as a network failure would.
    pub fn cut(&self) {
        self.cut.send_modify(|generation| *generation += 1);
    }

    /// Sends new connections to `backend`.
    pub fn set_backend(&self, backend: SocketAddr) {
        *self.backend.lock().unwrap() = backend;
    }

    /// How many connections the proxy has accepted.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
