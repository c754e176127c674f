//! A TCP proxy on an ephemeral port that forwards each connection to a backend it can change,
//! and can cut every connection through it: a network failure, or a server restarted
//! elsewhere, as a client sees it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

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
