//! A fault-injecting relay between the nodes of a cluster: every node's peer address (what the
//! members list gives) is a port of the relay, which forwards each connection to the node's real
//! peer port and can cut or delay any one link, in one direction. A link is told apart by the
//! node id that opens every peer connection: the first 12 bytes are the hello frame's length
//! (`u32`) and the connecting node's id (`u64`, little-endian).
//!
//! Node A's requests to B, and B's answers to them, travel on A's connection to B: the link
//! `(A, B)`. Cutting `(A, B)` and `(B, A)` separates two nodes; [`PeerLinks::isolate`] cuts a
//! node off from every other.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// One directed link: the node that connects, and the node it connects to.
pub type Link = (u64, u64);

#[derive(Default)]
struct Faults {
    cut: HashSet<Link>,
    delay: HashMap<Link, Duration>,
}

/// The relay of a cluster's links; stops relaying when dropped.
pub struct PeerLinks {
    /// Node id to (the address peers are given, the address the node must listen on).
    nodes: HashMap<u64, (SocketAddr, SocketAddr)>,
    faults: Arc<Mutex<Faults>>,
    /// Bumped on every change of the faults, so that live connections look again.
    changed: watch::Sender<u64>,
    tasks: Vec<JoinHandle<()>>,
}

impl PeerLinks {
    /// A relay for nodes `1..=count`, each with an advertised address and a listen address of
    /// its own on 127.0.0.1.
    pub async fn start(count: u64) -> PeerLinks {
        let faults = Arc::new(Mutex::new(Faults::default()));
        let (changed, _) = watch::channel(0);
        let mut nodes = HashMap::new();
        let mut tasks = Vec::new();
        for node in 1..=count {
            let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let back = TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap()
                .local_addr()
                .unwrap();
            nodes.insert(node, (front.local_addr().unwrap(), back));
            tasks.push(tokio::spawn(relay(
                front,
                node,
                back,
                Arc::clone(&faults),
                changed.subscribe(),
            )));
        }
        PeerLinks {
            nodes,
            faults,
            changed,
            tasks,
        }
    }

    /// The address the other nodes are given for `node` (its `PEER_ADDR`).
    pub fn advertised(&self, node: u64) -> SocketAddr {
        self.nodes[&node].0
    }

    /// The address `node` must listen on for its peers (its `--cluster-listen`).
    pub fn listen(&self, node: u64) -> SocketAddr {
        self.nodes[&node].1
    }

    fn change(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.faults.lock().unwrap());
        self.changed.send_modify(|version| *version += 1);
    }

    /// Cuts `from`'s connections to `to`: open ones close, new ones are closed at once.
    pub fn cut(&self, from: u64, to: u64) {
        self.change(|faults| {
            faults.cut.insert((from, to));
        });
    }

    /// Cuts `node` off from every other node, both ways.
    pub fn isolate(&self, node: u64) {
        let others: Vec<u64> = self.nodes.keys().copied().filter(|&n| n != node).collect();
        self.change(|faults| {
            for other in others {
                faults.cut.insert((node, other));
                faults.cut.insert((other, node));
            }
        });
    }

    /// Delays everything on the link `from` → `to` (both its directions) by `delay`.
    pub fn delay(&self, from: u64, to: u64, delay: Duration) {
        self.change(|faults| {
            faults.delay.insert((from, to), delay);
        });
    }

    /// Ends every cut and delay.
    pub fn heal(&self) {
        self.change(|faults| *faults = Faults::default());
    }
}

impl Drop for PeerLinks {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Accepts connections for node `to` and relays each to `back` while its link is not cut.
async fn relay(
    front: TcpListener,
    to: u64,
    back: SocketAddr,
    faults: Arc<Mutex<Faults>>,
    changed: watch::Receiver<u64>,
) {
    // Dropped (aborting every connection) when the relay task is aborted.
    let mut connections = JoinSet::new();
    while let Ok((mut incoming, _)) = front.accept().await {
        while connections.try_join_next().is_some() {}
        let faults = Arc::clone(&faults);
        let changed = changed.clone();
        connections.spawn(async move {
            let mut opening = [0; 12];
            if incoming.read_exact(&mut opening).await.is_err() {
                return;
            }
            let mut id = [0; 8];
            id.copy_from_slice(&opening[4..]);
            let link = (u64::from_le_bytes(id), to);
            if faults.lock().unwrap().cut.contains(&link) {
                return;
            }
            let Ok(mut outgoing) = broker_net::connect(back).await else {
                return;
            };
            if outgoing.write_all(&opening).await.is_err() {
                return;
            }
            let _ = incoming.set_nodelay(true);
            let _ = outgoing.set_nodelay(true);
            let (incoming_read, incoming_write) = incoming.into_split();
            let (outgoing_read, outgoing_write) = outgoing.into_split();
            // The connection ends when either direction ends or the link is cut.
            tokio::select! {
                () = forward(incoming_read, outgoing_write, link, &faults, changed.clone()) => {}
                () = forward(outgoing_read, incoming_write, link, &faults, changed) => {}
            }
        });
    }
}

/// Copies `from` to `to` for `link` until either end closes or the link is cut, holding each
/// chunk for the link's delay.
async fn forward(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    link: Link,
    faults: &Mutex<Faults>,
    mut changed: watch::Receiver<u64>,
) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            },
            changed_now = changed.changed() => {
                if changed_now.is_err() || faults.lock().unwrap().cut.contains(&link) {
                    return;
                }
                continue;
            }
        };
        let delay = {
            let faults = faults.lock().unwrap();
            if faults.cut.contains(&link) {
                return;
            }
            faults.delay.get(&link).copied()
        };
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
