//! A cluster of real `broker-server` processes on loopback ports, for the tests of
//! replication: start, kill and restart nodes, add one, and find the leader.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use broker_client::Client;

use crate::peer_links::PeerLinks;
use crate::process::{try_refused_start, Refusal, ServerProcess};

/// How long [`Nodes::leader`] waits for a leader before it fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A free port on 127.0.0.1 for a node to bind later, each call in a process a different one
/// (two test processes at once start from different ports, after their process ids, but are
/// not kept apart otherwise).
///
/// It is taken below the kernel's range of ephemeral ports, when that leaves room: the local
/// ends of outgoing connections come from that range, so none can take the port before the
/// node binds it. (Not even a client retrying the node before it listens, whose connection
/// to a port of that range can land on itself and hold the port.)
pub fn free_addr() -> SocketAddr {
    /// The lowest port handed out.
    const LOWEST: u32 = 20_000;
    /// The next candidate, as an offset from `LOWEST`; starts from the process id, so that two
    /// test processes at once mostly try different ports.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(0);
    let span = ephemeral_start.saturating_sub(LOWEST);
    if span >= 1_000 {
        let _ = NEXT.compare_exchange(
            u32::MAX,
            std::process::id().wrapping_mul(7_919) % span,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        for _ in 0..span {
            let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
            let port = u16::try_from(LOWEST + offset).expect("below the ephemeral range");
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                return listener.local_addr().unwrap();
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A cluster's nodes as separate `broker-server` processes on loopback ports: their addresses
/// and directories (in a temporary directory removed on drop), and the processes running now
/// (killed on drop). Node `index` has id `index + 1`.
pub struct Nodes {
    _dir: tempfile::TempDir,
    dirs: Vec<PathBuf>,
    /// Each node's client address, by index (node id = index + 1).
    pub client_addrs: Vec<SocketAddr>,
    /// Where each node listens for its peers when that is not its advertised peer address
    /// (behind a relay).
    peer_listens: Vec<Option<SocketAddr>>,
    members: String,
    /// The nodes started to join the running cluster (`--cluster-join`), with the members
    /// list each was given.
    joiners: BTreeMap<usize, String>,
    /// Flags every node is started with besides the cluster's.
    extra_flags: Vec<String>,
    /// Each node's process, while it runs.
    pub running: Vec<Option<ServerProcess>>,
}

impl Nodes {
    /// `count` nodes forming a new cluster, each started.
    pub fn start(count: usize) -> Nodes {
        Nodes::start_through(count, None)
    }

    /// `count` nodes whose peer links go through `links`, when given.
    pub fn start_through(count: usize, links: Option<&PeerLinks>) -> Nodes {
        Nodes::start_with(count, links, &[])
    }

    /// [`Nodes::start_through`], every node also given the flags `extra`.
    pub fn start_with(count: usize, links: Option<&PeerLinks>, extra: &[&str]) -> Nodes {
        let dir = tempfile::tempdir().unwrap();
        let client_addrs: Vec<SocketAddr> = (0..count).map(|_| free_addr()).collect();
        let id = |index: usize| index as u64 + 1;
        let members = client_addrs
            .iter()
            .enumerate()
            .map(|(index, client)| {
                let peer = links.map_or_else(free_addr, |links| links.advertised(id(index)));
                format!("{}={peer}/{client}", id(index))
            })
            .collect::<Vec<_>>()
            .join(",");
        let peer_listens = (0..count)
            .map(|index| links.map(|links| links.listen(id(index))))
            .collect();
        let dirs = (1..=count)
            .map(|id| dir.path().join(format!("node-{id}")))
            .collect();
        let mut nodes = Nodes {
            _dir: dir,
            dirs,
            client_addrs,
            peer_listens,
            members,
            joiners: BTreeMap::new(),
            extra_flags: extra.iter().map(ToString::to_string).collect(),
            running: (0..count).map(|_| None).collect(),
        };
        for index in 0..count {
            nodes.restart(index);
        }
        nodes
    }

    /// Starts every node from its next (re)start on with the flags `extra` besides the
    /// cluster's, instead of those it was given so far.
    pub fn set_extra_flags(&mut self, extra: &[&str]) {
        self.extra_flags = extra.iter().map(ToString::to_string).collect();
    }

    /// Starts node `index` (again) on its addresses and directory.
    pub fn restart(&mut self, index: usize) {
        let flags = self.flags(index);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let node = ServerProcess::start_on(self.client_addrs[index], &flags);
        self.running[index] = Some(node);
    }

    /// Starts node `index` again as [`Nodes::restart`] does, expecting it to refuse; returns
    /// why, or `None` (the node killed) if it started.
    pub fn refused_restart(&self, index: usize) -> Option<Refusal> {
        let flags = self.flags(index);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        try_refused_start(&flags, &[], PATIENCE)
    }

    /// The flags node `index` starts with, but its client address.
    fn flags(&self, index: usize) -> Vec<String> {
        let id = (index + 1).to_string();
        let dir = self.dirs[index].to_str().unwrap().to_owned();
        let members = self.joiners.get(&index).unwrap_or(&self.members).clone();
        let mut flags = vec![
            "--node-id".to_owned(),
            id,
            "--cluster-members".to_owned(),
            members,
            "--data-dir".to_owned(),
            dir,
            "--log-level".to_owned(),
            "warn".to_owned(),
        ];
        if self.joiners.contains_key(&index) {
            flags.push("--cluster-join".to_owned());
        }
        flags.extend(self.extra_flags.iter().cloned());
        if let Some(listen) = self.peer_listens[index] {
            flags.extend(["--cluster-listen".to_owned(), listen.to_string()]);
        }
        flags
    }

    /// Node `index`'s data directory.
    pub fn dir(&self, index: usize) -> &Path {
        &self.dirs[index]
    }

    /// Starts one more node, to join the running cluster; returns its index and what
    /// `broker cluster add` takes for it (`ID=PEER_ADDR/CLIENT_ADDR`).
    pub fn start_joiner(&mut self) -> (usize, String) {
        let index = self.running.len();
        let entry = format!("{}={}/{}", index + 1, free_addr(), free_addr());
        let client: SocketAddr = entry.rsplit_once('/').unwrap().1.parse().unwrap();
        self.client_addrs.push(client);
        self.dirs
            .push(self.dirs[0].with_file_name(format!("node-{}", index + 1)));
        self.peer_listens.push(None);
        self.joiners
            .insert(index, format!("{},{entry}", self.members));
        self.running.push(None);
        self.restart(index);
        (index, entry)
    }

    /// Kills node `index` (`kill -9`).
    pub fn kill(&mut self, index: usize) {
        self.running[index].take().unwrap().kill();
    }

    /// The address node `index`'s peers reach it on.
    pub fn peer_addr(&self, index: usize) -> String {
        let entry = self.members.split(',').nth(index).unwrap();
        let (_, addresses) = entry.split_once('=').unwrap();
        addresses.split_once('/').unwrap().0.to_owned()
    }

    /// Every node's client address, as a client is given them.
    pub fn addresses(&self) -> String {
        self.client_addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client given every node's address, with a request timeout of 5 s.
    pub async fn client(&self) -> Client {
        Client::builder()
            .request_timeout(Duration::from_secs(5))
            .connect(self.addresses().as_str())
            .await
            .expect("connect to the cluster")
    }

    /// The samples of the metric `broker_<family>` on node `index`'s metrics endpoint (the
    /// nodes started with `--metrics-listen`), by their one label's value; none for a node
    /// not running.
    pub fn samples(&self, index: usize, family: &str) -> BTreeMap<String, i64> {
        let Some(node) = &self.running[index] else {
            return BTreeMap::new();
        };
        let metrics = node.metrics_addr.expect("the node's metrics address");
        let (_, _, text) = crate::http::get(metrics, "/metrics", "");
        text.lines()
            .filter_map(|line| line.strip_prefix(&format!("broker_{family}{{")))
            .filter_map(|rest| {
                let (label, value) = rest.split_once("} ")?;
                let (_, label) = label.split_once('=')?;
                Some((label.trim_matches('"').to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// [`Nodes::samples`] of node `index` once it holds a sample for each of `keys`, waiting
    /// up to `within` for its copy of the cluster to apply what the samples say (a node that
    /// does not lead applies each change a moment after the call that made it answered).
    pub fn samples_of(
        &self,
        index: usize,
        family: &str,
        keys: &[&str],
        within: Duration,
    ) -> BTreeMap<String, i64> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let samples = self.samples(index, family);
            if keys.iter().all(|key| samples.contains_key(*key))
                || std::time::Instant::now() >= deadline
            {
                return samples;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits, `within` at most, until the running nodes (started with `--cluster-data-groups`
    /// and `--metrics-listen`) hold copies of `groups` groups in all, each with a leader that
    /// every node holding a copy of it agrees on, and no node leads more than one; returns each
    /// group's leader's id by group.
    pub fn spread(&self, groups: usize, within: Duration) -> BTreeMap<String, i64> {
        let deadline = Instant::now() + within;
        loop {
            let seen: Vec<BTreeMap<String, i64>> = (0..self.running.len())
                .filter(|index| self.running[*index].is_some())
                .map(|index| self.samples(index, "cluster_group_leader_id"))
                .collect();
            let mut leaders: BTreeMap<String, i64> = BTreeMap::new();
            let agreed = seen
                .iter()
                .flatten()
                .all(|(group, leader)| *leaders.entry(group.clone()).or_insert(*leader) == *leader);
            let distinct: std::collections::BTreeSet<&i64> = leaders.values().collect();
            if leaders.len() == groups
                && agreed
                && !distinct.contains(&0)
                && distinct.len() == groups.min(self.running.iter().flatten().count())
            {
                return leaders;
            }
            assert!(
                Instant::now() < deadline,
                "the groups' leaders did not spread: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The running node that leads now (the one that says so, and answers a read itself);
    /// fails after [`PATIENCE`] without one. In a cluster of several groups, the first group's
    /// leader, which also leads the group of the first topic created.
    pub async fn leader(&self) -> usize {
        let deadline = Instant::now() + PATIENCE;
        loop {
            for (index, node) in self.running.iter().enumerate() {
                let Some(node) = node else { continue };
                let Ok(client) = Client::connect(node.addr_string().as_str()).await else {
                    continue;
                };
                let leads = client
                    .cluster_status()
                    .await
                    .is_ok_and(|status| status.leader == Some(status.node_id));
                if leads && client.describe().await.is_ok() {
                    return index;
                }
            }
            assert!(Instant::now() < deadline, "no node leads");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for node in self.running.iter_mut().flatten() {
            node.kill();
        }
    }
}
