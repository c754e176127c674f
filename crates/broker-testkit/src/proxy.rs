//! A TCP proxy on an ephemeral port that forwards each connection to a backend it can change,
//! and can cut every connection through it (a network failure, or a server restarted
//! elsewhere, as a client sees it) or hold the server's replies (a server that answers late).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A TCP proxy on an ephemeral port forwarding each connection to the current backend.
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    backend: Arc<Mutex<SocketAddr>>,
    cut: watch::Sender<u64>,
    held: watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    to_server: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

/// Copies `from` to `to` until either end closes, counting the bytes in `count`; while `held`
/// (when given) says so, what was read waits before it is written.
async fn forward(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    count: Option<Arc<AtomicU64>>,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if let Some(count) = &count {
            count.fetch_add(read as u64, Ordering::SeqCst);
        }
        if let Some(held) = &mut held {
            if held.wait_for(|held| !*held).await.is_err() {
                return;
            }
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// A proxy to `backend`.
    pub async fn start(backend: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let backend = Arc::new(Mutex::new(backend));
        let (cut, _) = watch::channel(0u64);
        let (held, _) = watch::channel(false);
        let accepted = Arc::new(AtomicUsize::new(0));
        let to_server = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let backend = Arc::clone(&backend);
            let cut = cut.clone();
            let held = held.clone();
            let accepted = Arc::clone(&accepted);
            let to_server = Arc::clone(&to_server);
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let target = *backend.lock().unwrap();
                    let mut cut = cut.subscribe();
                    let held = held.subscribe();
                    let to_server = Arc::clone(&to_server);
                    tokio::spawn(async move {
                        let Ok(server) = broker_net::connect(target).await else {
                            return;
                        };
                        let (from_client, to_client) = client.into_split();
                        let (from_server, to_server_half) = server.into_split();
                        tokio::select! {
                            () = forward(from_client, to_server_half, Some(to_server), None) => {}
                            () = forward(from_server, to_client, None, Some(held)) => {}
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
            held,
            accepted,
            to_server,
            task,
        }
    }

    /// Holds every reply of the server (on every connection) until
    /// [`Proxy::release_replies`]: requests still reach the server, their answers come late.
    pub fn hold_replies(&self) {
        self.held.send_replace(true);
    }

    /// Lets the held replies go, in order, and the next ones through.
    pub fn release_replies(&self) {
        self.held.send_replace(false);
    }

    /// How many bytes clients sent to the server through the proxy.
    pub fn bytes_to_server(&self) -> u64 {
        self.to_server.load(Ordering::SeqCst)
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
