//! The broker's replicated cluster: every change to the broker goes through a Raft log
//! ([openraft](https://docs.rs/openraft), its 0.9 line) before it is applied, so every node
//! holds the same state and a change a majority has is never lost.
//!
//! - [`types`]: what the log carries ([`Proposal`]: a batch of commands with its time, or a
//!   tick of the clock) and what applying it gives ([`Applied`]);
//! - [`LogStore`]: the log (in segment files) and the vote on disk;
//! - [`StateMachine`]: applies committed entries to the broker (a [`Replica`]) and takes its
//!   snapshots, checkpoints that move its records to record segment files;
//! - [`SnapshotStream`]: a snapshot, segment files included, as it travels between nodes;
//! - [`Network`]: the links between nodes;
//! - [`Cluster`]: one node's part in one Raft group, started from a [`ClusterConfig`] for the
//!   node's first group, or from a [`GroupConfig`] for each further group the node hosts
//!   ([`Cluster::host_group`], over the same peer port); [`Cluster::propose`] answers once a
//!   majority has the change and it is applied here; [`Cluster::add_node`],
//!   [`Cluster::remove_node`] and [`Cluster::transfer_leadership`] change who belongs and who
//!   leads.
//!
//! The broker's core stays as it is: deterministic, no clock, no I/O. Time enters the log as
//! the leader's clock, in the entries it proposes.

mod codec;
mod contact;
mod forward;
mod group;
mod leadership;
mod log_store;
mod membership;
mod network;
mod peer_listeners;
mod removal;
mod snapshot_stream;
mod state_machine;
pub mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use broker_core::{Command, NameRules};
use broker_storage::Repairs;
use group::GroupCore;
use openraft::error::{InitializeError, RaftError};
use openraft::{Raft, RaftMetrics, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use log_store::{LogStore, LogSync, CACHED_ENTRY_BYTES};
pub use network::{Listeners, Network, PeerLink, PeerTls, MAX_PEER_FRAME};
pub use openraft::error::Fatal;
pub use openraft::ServerState;
pub use snapshot_stream::SnapshotStream;
pub use state_machine::{Replica, SnapshotBuilder, StateMachine};
pub use types::{
    members_list, parse_members, Applied, BrokerChange, ClusterChange, ClusterNode, ClusterState,
    Departure, GroupId, NodeId, Proposal, TypeConfig, FIRST_GROUP,
};

/// How one node of a cluster runs.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id.
    pub node_id: NodeId,
    /// Every voting member of a new cluster, this node included. Used only the first time a
    /// node starts (with an empty directory); after that the membership is in the log.
    pub members: BTreeMap<NodeId, ClusterNode>,
    /// Where the log, the vote and the snapshots live.
    pub dir: PathBuf,
    /// When appends to the log reach the disk.
    pub sync: LogSync,
    /// The secret peers present to each other, if any.
    pub token: Option<String>,
    /// TLS on the peer port, if any (every node of a cluster must agree).
    pub tls: Option<PeerTls>,
    /// How often the leader tells followers it is alive.
    pub heartbeat: Duration,
    /// A follower that hears nothing from a leader for a random time between this and twice
    /// this starts an election.
    pub election_timeout: Duration,
    /// A snapshot is taken after this many entries since the last one, and the log before it
    /// removed.
    pub snapshot_every: u64,
    /// This node joins a cluster that already runs: it proposes no membership of its own and
    /// waits until the leader adds it ([`Cluster::add_node`]).
    pub join: bool,
    /// A record segment file is closed and a new one started after this many bytes.
    pub segment_bytes: u64,
    /// The most bytes of the newest log entries each group keeps in memory besides on disk
    /// (see [`log_store::CACHED_ENTRY_BYTES`], the default); older ones are read back.
    pub cached_log_bytes: u64,
    /// Where this node serves clients besides the broker port, as its peers are told (see
    /// [`Cluster::kafka_addresses`]).
    pub listeners: Listeners,
    /// The rules the names of the commands this node proposes are checked by, in every group
    /// it hosts (see [`Proposal::commands`]).
    pub names: NameRules,
    /// Settings every node of the cluster must be given alike, as `name=value`: told to the
    /// peers that ask what this node's release can do, so that a node given another value can
    /// be found ([`Cluster::settings_apart`]).
    pub shared_settings: Vec<String>,
    /// Settings of this node that may differ from the others', as `name=value`: told with
    /// [`ClusterConfig::shared_settings`], never compared ([`Cluster::told_by_members`]).
    pub told_settings: Vec<String>,
}

impl ClusterConfig {
    /// The default timing (heartbeats every 150 ms, elections after 500 to 1,000 ms of
    /// silence, a snapshot every 20,000 entries) for `node_id` of a cluster of `members`,
    /// keeping its files in `dir`.
    pub fn new(node_id: NodeId, members: BTreeMap<NodeId, ClusterNode>, dir: PathBuf) -> Self {
        ClusterConfig {
            node_id,
            members,
            dir,
            sync: LogSync::EveryAppend,
            token: None,
            tls: None,
            heartbeat: Duration::from_millis(150),
            election_timeout: Duration::from_millis(500),
            snapshot_every: 20_000,
            join: false,
            segment_bytes: 64 * 1024 * 1024,
            cached_log_bytes: log_store::CACHED_ENTRY_BYTES,
            listeners: Listeners::default(),
            names: NameRules::Broker,
            shared_settings: Vec::new(),
            told_settings: Vec::new(),
        }
    }
}

/// How a node hosts a group besides its first ([`Cluster::host_group`]); the timing of
/// heartbeats and elections is the node's.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    /// Where the group's log, vote and snapshots live: a directory of its own.
    pub dir: PathBuf,
    /// When appends to the group's log reach the disk.
    pub sync: LogSync,
    /// A snapshot is taken after this many entries since the last one.
    pub snapshot_every: u64,
    /// A record segment file is closed and a new one started after this many bytes.
    pub segment_bytes: u64,
    /// As [`ClusterConfig::cached_log_bytes`].
    pub cached_log_bytes: u64,
    /// The group's voters when it is new. Every node that hosts a new group must be given the
    /// same (the voters of a group that has a log are in its log).
    pub voters: BTreeMap<NodeId, ClusterNode>,
}

impl GroupConfig {
    /// A group of `voters` keeping its files in `dir`, with the defaults of [`ClusterConfig`].
    pub fn new(dir: PathBuf, voters: BTreeMap<NodeId, ClusterNode>) -> Self {
        GroupConfig {
            dir,
            sync: LogSync::EveryAppend,
            snapshot_every: 20_000,
            segment_bytes: 64 * 1024 * 1024,
            cached_log_bytes: log_store::CACHED_ENTRY_BYTES,
            voters,
        }
    }
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The settings are inconsistent.
    #[error("invalid cluster settings: {0}")]
    Config(String),
    /// The node's files cannot be read or written, or are damaged. (Not a source as well: it
    /// is said in the message, once.)
    #[error("the cluster's files: {0}")]
    Storage(io::Error),
    /// The consensus engine refused to start.
    #[error("the consensus engine: {0}")]
    Raft(String),
    /// The node's directory is empty, but the leader knows it held entries: its log and
    /// votes were lost, and a voter that forgot them could help elect a leader missing
    /// committed changes.
    #[error(
        "node {node}'s directory is empty, but the leader (node {leader}) knows it held the log up \
         to entry {matched}: its log and votes were lost. A node must not come back under its \
         id without them (it could help elect a leader missing committed changes). Remove it \
         (`broker cluster remove {node}`), then start it with a new id, an empty directory and \
         --cluster-join (its own addresses and the running nodes in --cluster-members), and add \
         it (`broker cluster add ID=PEER_ADDR/CLIENT_ADDR`)"
    )]
    LogLost {
        /// This node.
        node: NodeId,
        /// The leader that knows.
        leader: NodeId,
        /// The last entry the leader knows this node held.
        matched: u64,
    },
    /// A node of a new cluster was started with another members list than this one: nodes
    /// that each propose their own membership would disagree on who votes.
    #[error(
        "node {peer} was started with --cluster-members {theirs}, this node with {ours}: every \
         node of a new cluster must be given the same list. Start this node with the list the \
         other nodes have (or, if theirs is the wrong one, stop them, empty their directories \
         and start every node with the right list)"
    )]
    MembersDiffer {
        /// The member that answered with another list.
        peer: NodeId,
        /// Its list, as `ID=PEER_ADDR/CLIENT_ADDR,...`.
        theirs: String,
        /// This node's list, the same way.
        ours: String,
    },
}

/// How long a node that starts with an empty directory waits for each member's answer to its
/// questions (whether it held a log before, which members list they were given).
const START_QUESTION: Duration = Duration::from_secs(2);

/// How often a group's leader asks its members again whether they apply a change of the
/// memory budget (or entries under this release's rules), while one answers that it does not
/// ([`Cluster::change_budget`], [`Cluster::adopt_revision`]).
pub const BUDGET_ASKED_EVERY: Duration = Duration::from_secs(60);

/// How soon a group's leader asks its members again whether they apply a feature when one
/// could not be reached (it may be restarting).
pub const FEATURE_ASKED_AGAIN: Duration = Duration::from_secs(5);

/// Asks every member of `members` but `node_id` at once, through `ask`; each answer with the
/// member that gave it.
async fn ask_members<T, Asked>(
    network: &Network,
    node_id: NodeId,
    members: &BTreeMap<NodeId, ClusterNode>,
    ask: impl Fn(PeerLink) -> Asked,
) -> Vec<(NodeId, io::Result<T>)>
where
    Asked: std::future::Future<Output = io::Result<T>>,
{
    use openraft::network::RaftNetworkFactory;
    let ask = &ask;
    let questions = members
        .iter()
        .filter(|(id, _)| **id != node_id)
        .map(|(&id, node)| {
            let mut network = network.clone();
            async move { (id, ask(network.new_client(id, node).await).await) }
        });
    futures::future::join_all(questions).await
}

/// Refuses to start node `node_id`, whose directory is empty, if a member that leads knows
/// it held entries ([`ClusterError::LogLost`]). Members that do not answer in
/// [`START_QUESTION`] (not started yet, as when a new cluster forms) are not waited for.
async fn refuse_if_log_lost(
    network: &Network,
    node_id: NodeId,
    members: &BTreeMap<NodeId, ClusterNode>,
) -> Result<(), ClusterError> {
    let answers = ask_members(network, node_id, members, |mut link| async move {
        link.matched(START_QUESTION).await
    });
    for (leader, answer) in answers.await {
        if let Ok(Some(matched)) = answer {
            return Err(ClusterError::LogLost {
                node: node_id,
                leader,
                matched,
            });
        }
    }
    Ok(())
}

/// Refuses to start node `node_id` of a new cluster if a member that answers within
/// [`START_QUESTION`] was started with another members list than `members`
/// ([`ClusterError::MembersDiffer`]): nodes that each propose their own membership would form
/// a cluster whose nodes disagree on who votes. Members that do not answer (not started yet, or
/// of an earlier release) are not waited for.
async fn refuse_if_members_differ(
    network: &Network,
    node_id: NodeId,
    members: &BTreeMap<NodeId, ClusterNode>,
) -> Result<(), ClusterError> {
    let answers = ask_members(network, node_id, members, |mut link| async move {
        link.members(START_QUESTION).await
    });
    for (peer, answer) in answers.await {
        match answer {
            Ok(theirs) if theirs != *members => {
                return Err(ClusterError::MembersDiffer {
                    peer,
                    theirs: members_list(&theirs),
                    ours: members_list(members),
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// Makes the repairs the node's files need, listed while they were read (a torn last record
/// of the log, what an unfinished snapshot left: see [`LogStore::check`] and
/// [`StateMachine::check`]), and readies the log for writes: once nothing can refuse the
/// start any more.
async fn repair(log: &LogStore, repairs: Repairs) -> Result<(), ClusterError> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || {
        repairs.apply().map_err(io::Error::other)?;
        log.start()
    })
    .await
    .map_err(|error| ClusterError::Raft(error.to_string()))?
    .map_err(ClusterError::Storage)
}

/// Where one group of a node keeps its files, and how it writes them.
struct GroupFiles {
    dir: PathBuf,
    sync: LogSync,
    segment_bytes: u64,
    cached_log_bytes: u64,
}

impl GroupFiles {
    /// Reads the group's log and state machine (restoring `replica` from the last snapshot),
    /// listing the repairs they need without making them. A node whose directory holds
    /// nothing is first refused if a leader among `members` knows it held entries
    /// ([`ClusterError::LogLost`]), asked through `network`. Nothing is written: a refused
    /// start leaves the directory as it was.
    async fn open<R: Replica>(
        &self,
        network: &Network,
        node_id: NodeId,
        members: &BTreeMap<NodeId, ClusterNode>,
        replica: Arc<R>,
    ) -> Result<(LogStore, StateMachine<R>, Repairs), ClusterError> {
        let dir = self.dir.clone();
        let empty = tokio::task::spawn_blocking(move || {
            LogStore::holds_no_entries(&dir)
                .map(|none| none && !state_machine::snapshot_exists(&dir))
        })
        .await
        .map_err(|error| ClusterError::Raft(error.to_string()))??;
        if empty {
            refuse_if_log_lost(network, node_id, members).await?;
        }
        let (dir, sync, segment_bytes) = (self.dir.clone(), self.sync, self.segment_bytes);
        let cached_log_bytes = self.cached_log_bytes;
        let opened = tokio::task::spawn_blocking(move || {
            let mut repairs = Repairs::default();
            let log = LogStore::check(
                &dir,
                node_id,
                sync,
                log_store::SEGMENT_BYTES,
                cached_log_bytes,
                &mut repairs,
            )?;
            let machine = StateMachine::check(&dir, replica, segment_bytes, &mut repairs)?;
            Ok::<_, io::Error>((log, machine, repairs))
        })
        .await
        .map_err(|error| ClusterError::Raft(error.to_string()))??;
        Ok(opened)
    }
}

/// Why a proposal was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProposeError {
    /// This node is not the leader; the leader is given when this node knows it.
    #[error("this node is not the leader{}", leader_hint(.leader))]
    NotLeader {
        /// The leader's id and addresses, if known.
        leader: Option<(NodeId, ClusterNode)>,
    },
    /// The node cannot serve the call now: it is shutting down (or its part in the group
    /// stopped), its storage failed, it holds no copy of the group to read, or the node it asked
    /// did not answer in time. A proposal answered so may or may not have been applied.
    #[error("the cluster cannot take changes: {0}")]
    Unavailable(String),
    /// The change asked for cannot be made (a membership change that would leave no voter, or
    /// names an unknown node).
    #[error("{0}")]
    Refused(String),
    /// A membership change was made in part, or not committed yet, when its wait ran out: a
    /// node added that has not caught up with the log (it stays a learner), or a change a
    /// majority has not taken yet (it may still be). Asked again, the change goes on. (Never
    /// sent to another node: it answers a call on the node that made the change.)
    #[error("{0}")]
    Pending(String),
}

impl From<io::Error> for ClusterError {
    fn from(error: io::Error) -> Self {
        ClusterError::Storage(error)
    }
}

/// Each member of `membership`: its id, addresses, and whether it votes.
/// The members of a group as `metrics` say, once its last membership entry is applied.
pub(crate) fn committed_members(
    metrics: &RaftMetrics<NodeId, ClusterNode>,
) -> Option<Vec<(NodeId, ClusterNode, bool)>> {
    let index = metrics.membership_config.log_id().map_or(0, |id| id.index);
    let applied = metrics.last_applied.map_or(0, |id| id.index);
    if index > applied {
        return None;
    }
    Some(members(metrics.membership_config.membership()))
}

fn members(
    membership: &openraft::Membership<NodeId, ClusterNode>,
) -> Vec<(NodeId, ClusterNode, bool)> {
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| (*id, node.clone(), voters.contains(id)))
        .collect()
}

/// The wall clock in milliseconds since the Unix epoch (0 before it, which no clock shows): the
/// time a leader gives the commands it proposes.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
}

fn leader_hint(leader: &Option<(NodeId, ClusterNode)>) -> String {
    match leader {
        Some((id, node)) => format!("; node {id} is, at {}", node.client_addr),
        None => String::new(),
    }
}

/// What a node knows of the cluster now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// This node's id.
    pub node_id: NodeId,
    /// Leader, follower, candidate or learner; a leader that does not lead by
    /// [`Cluster::is_leader`] is a follower here.
    pub role: ServerState,
    /// The current term.
    pub term: u64,
    /// The leader this node knows of.
    pub leader: Option<NodeId>,
    /// The index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// The index of the last entry applied here.
    pub applied_index: Option<u64>,
    /// Every member, with its addresses and whether it votes.
    pub members: Vec<(NodeId, ClusterNode, bool)>,
    /// On the leader: the index each follower is known to have.
    pub replication: BTreeMap<NodeId, Option<u64>>,
    /// The other members whose last exchange with this node failed.
    pub unreachable: BTreeSet<NodeId>,
}

/// What the groups a node hosts share: its peer port's registry of groups and the timing of
/// its Raft instances.
struct NodeParts {
    /// The links of the node's first group, from which each group's are made.
    network: Network,
    /// The groups the peer port serves.
    groups: Arc<network::Groups>,
    heartbeat: Duration,
    election_timeout: Duration,
    /// See [`ClusterConfig::names`].
    names: NameRules,
    /// See [`ClusterConfig::shared_settings`].
    shared_settings: Arc<Vec<String>>,
}

impl NodeParts {
    /// openraft's settings for a group of this node that takes a snapshot every
    /// `snapshot_every` entries.
    fn raft_config(&self, snapshot_every: u64) -> Result<Arc<openraft::Config>, ClusterError> {
        let election = millis(self.election_timeout);
        let config = openraft::Config {
            cluster_name: "broker".to_owned(),
            heartbeat_interval: millis(self.heartbeat),
            election_timeout_min: election,
            election_timeout_max: election * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(snapshot_every),
            // Followers that fall behind by less than this catch up from the log, not a
            // snapshot.
            max_in_snapshot_log_to_keep: snapshot_every / 2,
            ..openraft::Config::default()
        };
        config
            .validate()
            .map(Arc::new)
            .map_err(|error| ClusterError::Config(error.to_string()))
    }
}

/// One node's part in one Raft group: its first group ([`Cluster::start`]), or another it
/// hosts ([`Cluster::host_group`]).
pub struct Cluster {
    /// The group.
    group: GroupId,
    /// What the node's groups share.
    node: Arc<NodeParts>,
    /// The group's links, and whether each peer answers.
    network: Network,
    node_id: NodeId,
    /// The consensus engine and what decides whether this node takes changes now.
    core: Arc<GroupCore>,
    /// Whether the node had neither log nor snapshot when it started.
    started_empty: bool,
    /// The cluster's state as the group's entries applied here left it (empty but in the
    /// first group).
    cluster_state: watch::Receiver<ClusterState>,
    /// Held by a membership change or a hand-over: one at a time.
    changing: tokio::sync::Mutex<()>,
    /// Links to the group's leader kept for forwarded requests, with the address each dialled.
    leader_links: std::sync::Mutex<BTreeMap<NodeId, (String, PeerLink)>>,
    /// On a node that is not a member of the group: the leader its members named when last
    /// asked, and when (see [`Cluster::find_leader`]); one lookup at a time.
    named_leader: tokio::sync::Mutex<Option<forward::NamedLeader>>,
    /// Whether every other member of the group answered that its release applies the commands
    /// of protocol version 14 (see [`Cluster::check_commands`]): once so, always so.
    commands_14: std::sync::atomic::AtomicBool,
    /// When a member could not be asked about the commands of protocol version 14, for
    /// [`FEATURE_ASKED_AGAIN`] (see [`Cluster::check_commands`]).
    commands_14_unreachable: std::sync::Mutex<Option<std::time::Instant>>,
    kafka_addresses: Arc<peer_listeners::KafkaAddresses>,
    /// Every member answered that it applies [`Proposal::NamedCommands`] (asked before the
    /// first one this handle proposes).
    named_commands_known: AtomicBool,
    /// Every member answered that it applies [`Proposal::Budget`] (see
    /// [`Cluster::change_budget`]).
    budget_changes_known: AtomicBool,
    /// When the members were last asked whether they apply [`Proposal::Budget`], while one
    /// did not answer so, and how long until they are asked again.
    budget_changes_asked: std::sync::Mutex<Option<(std::time::Instant, Duration)>>,
    /// When the members were last asked whether they apply [`Proposal::Revised`] entries of
    /// [`broker_core::Revision::NEWEST`], while one did not answer so, and how long until
    /// they are asked again.
    revision_asked: std::sync::Mutex<Option<(std::time::Instant, Duration)>>,
    /// The replica the group's state machine applies to, weakly: see [`Cluster::released`].
    released: Weak<dyn std::any::Any + Send + Sync>,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("node_id", &self.node_id)
            .field("group", &self.group)
            .finish()
    }
}

impl Cluster {
    /// Starts this node: opens its files (restoring `replica` from the last snapshot), serves
    /// peers on `listener`, and on the very first start of a new cluster proposes its initial
    /// membership (every node may do so with the same members), unless it joins a running
    /// cluster ([`ClusterConfig::join`]). What the files need repaired after a crash is
    /// repaired once nothing can refuse the start any more: a refused start leaves every file
    /// as it was.
    ///
    /// # Errors
    /// The settings are inconsistent, or the files cannot be used.
    pub async fn start<R: Replica>(
        config: ClusterConfig,
        listener: TcpListener,
        replica: Arc<R>,
    ) -> Result<Cluster, ClusterError> {
        if !config.members.contains_key(&config.node_id) {
            return Err(ClusterError::Config(format!(
                "node {} is not among the members {:?}",
                config.node_id,
                config.members.keys().collect::<Vec<_>>()
            )));
        }
        let node = Arc::new(NodeParts {
            network: Network::new(config.node_id, config.token.clone(), config.tls.clone()),
            groups: Arc::default(),
            heartbeat: config.heartbeat,
            election_timeout: config.election_timeout,
            names: config.names,
            shared_settings: Arc::new(config.shared_settings.clone()),
        });
        let raft_config = node.raft_config(config.snapshot_every)?;
        let network = node.network.clone();
        let files = GroupFiles {
            dir: config.dir.clone(),
            sync: config.sync,
            segment_bytes: config.segment_bytes,
            cached_log_bytes: config.cached_log_bytes,
        };
        let released = released_when_dropped(&replica);
        let (log, machine, repairs) = files
            .open(&network, config.node_id, &config.members, replica)
            .await?;
        // A node with nothing yet proposes the initial membership; one with a log or a
        // snapshot already belongs to a cluster.
        let fresh = log.last_index().is_none() && !machine.has_snapshot();
        // A node of a new cluster takes no Raft message until it has checked that the members
        // were given the same list: a refused start leaves its directory without entries, so
        // that the next start checks again. Its files are repaired after the check, other
        // nodes' now: the consensus engine may write as soon as it starts.
        let checks_members = fresh && !config.join;
        let unrepaired = match checks_members {
            true => Some((log.clone(), repairs)),
            false => {
                repair(&log, repairs).await?;
                None
            }
        };
        let cluster_state = machine.cluster_state();
        let revision_known = machine.revision_applied();
        let raft = Raft::new(config.node_id, raft_config, network.clone(), log, machine)
            .await
            .map_err(|error| ClusterError::Raft(error.to_string()))?;
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let kafka_addresses = Arc::new(peer_listeners::KafkaAddresses::default());
        tracker.spawn(peer_listeners::learn(
            Arc::clone(&kafka_addresses),
            network.clone(),
            raft.metrics(),
            (config.node_id, config.listeners.clone()),
            stop.clone(),
        ));
        let core = Arc::new(GroupCore::new(
            config.node_id,
            raft.clone(),
            config.election_timeout * 2,
            revision_known,
        ));
        let contact = Arc::new(contact::LeaderContact::new());
        tracker.spawn(removal::watch(
            FIRST_GROUP,
            raft.clone(),
            network.clone(),
            Arc::clone(&contact),
            Arc::clone(&core.known_removed),
            stop.clone(),
        ));
        let takes_raft = Arc::new(AtomicBool::new(!checks_members));
        node.groups.host(
            FIRST_GROUP,
            network::HostedGroup {
                core: Arc::clone(&core),
                contact,
            },
        );
        let service = network::PeerService {
            groups: Arc::clone(&node.groups),
            listeners: config.listeners,
            shared_settings: Arc::new(config.shared_settings.clone()),
            told_settings: Arc::new(config.told_settings.clone()),
            members: Arc::new(config.members.clone()),
            takes_raft: Arc::clone(&takes_raft),
        };
        tracker.spawn(network::serve_peers(
            listener,
            service,
            config.token,
            config.tls,
            stop.clone(),
            tracker.clone(),
        ));
        let cluster = Cluster {
            group: FIRST_GROUP,
            node,
            network,
            node_id: config.node_id,
            core,
            started_empty: fresh,
            cluster_state,
            changing: tokio::sync::Mutex::new(()),
            leader_links: std::sync::Mutex::default(),
            named_leader: tokio::sync::Mutex::default(),
            commands_14: std::sync::atomic::AtomicBool::new(false),
            commands_14_unreachable: std::sync::Mutex::new(None),
            kafka_addresses,
            named_commands_known: AtomicBool::new(false),
            budget_changes_known: AtomicBool::new(false),
            budget_changes_asked: std::sync::Mutex::new(None),
            revision_asked: std::sync::Mutex::new(None),
            released,
            stop,
            tracker,
        };
        if let Some((log, repairs)) = unrepaired {
            // Its own peer service answers the same question meanwhile, so that of two nodes
            // started together, at least the later one finds the other.
            let mut checked =
                refuse_if_members_differ(&cluster.network, config.node_id, &config.members).await;
            if checked.is_ok() {
                checked = repair(&log, repairs).await;
            }
            takes_raft.store(checked.is_ok(), Ordering::Release);
            let initialized = match checked {
                Ok(()) => match cluster.core.raft.initialize(config.members).await {
                    // Another node's proposal of the same membership got here first.
                    Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
                    Err(error) => Err(ClusterError::Raft(error.to_string())),
                },
                Err(refusal) => Err(refusal),
            };
            if let Err(refusal) = initialized {
                cluster.shutdown().await;
                return Err(refusal);
            }
        }
        Ok(cluster)
    }

    /// Hosts Raft group `group` on this node as well, over the same peer port: opens its files
    /// in `config.dir` (restoring `replica` from its last snapshot) and, when the directory
    /// holds nothing, starts it as a new group of `config.voters` (every node given the same
    /// voters may do so) or, if this node is not among them, waits to be added to it. The
    /// returned handle is the node's part in that group: proposals, reads, membership and
    /// leadership of that group only. A node whose directory holds nothing but which a leader
    /// of the group knows held entries is refused, as at [`Cluster::start`].
    ///
    /// # Errors
    /// The group is the first group or hosted already; the settings are inconsistent; the
    /// files cannot be used.
    pub async fn host_group<R: Replica>(
        &self,
        group: GroupId,
        config: GroupConfig,
        replica: Arc<R>,
    ) -> Result<Cluster, ClusterError> {
        if group == FIRST_GROUP || self.node.groups.get(group).is_some() {
            return Err(ClusterError::Config(format!(
                "group {group} is hosted by this node already"
            )));
        }
        let raft_config = self.node.raft_config(config.snapshot_every)?;
        let network = self.node.network.for_group(group);
        let files = GroupFiles {
            dir: config.dir,
            sync: config.sync,
            segment_bytes: config.segment_bytes,
            cached_log_bytes: config.cached_log_bytes,
        };
        let released = released_when_dropped(&replica);
        let (log, machine, repairs) = files
            .open(&network, self.node_id, &config.voters, replica)
            .await?;
        let fresh = log.last_index().is_none() && !machine.has_snapshot();
        repair(&log, repairs).await?;
        let cluster_state = machine.cluster_state();
        let revision_known = machine.revision_applied();
        let raft = Raft::new(self.node_id, raft_config, network.clone(), log, machine)
            .await
            .map_err(|error| ClusterError::Raft(error.to_string()))?;
        let core = Arc::new(GroupCore::new(
            self.node_id,
            raft,
            self.core.lease,
            revision_known,
        ));
        let contact = Arc::new(contact::LeaderContact::new());
        self.node.groups.host(
            group,
            network::HostedGroup {
                core: Arc::clone(&core),
                contact: Arc::clone(&contact),
            },
        );
        let hosted = Cluster {
            group,
            node: Arc::clone(&self.node),
            network,
            node_id: self.node_id,
            core,
            started_empty: fresh,
            cluster_state,
            changing: tokio::sync::Mutex::new(()),
            leader_links: std::sync::Mutex::default(),
            named_leader: tokio::sync::Mutex::default(),
            commands_14: std::sync::atomic::AtomicBool::new(false),
            commands_14_unreachable: std::sync::Mutex::new(None),
            kafka_addresses: Arc::clone(&self.kafka_addresses),
            named_commands_known: AtomicBool::new(false),
            budget_changes_known: AtomicBool::new(false),
            budget_changes_asked: std::sync::Mutex::new(None),
            revision_asked: std::sync::Mutex::new(None),
            released,
            stop: CancellationToken::new(),
            tracker: TaskTracker::new(),
        };
        // A node that a group gave up (its copies follow the cluster's nodes) learns so as a
        // node removed from the cluster does, and takes part again when added back.
        hosted.tracker.spawn(removal::watch(
            group,
            hosted.core.raft.clone(),
            hosted.network.clone(),
            contact,
            Arc::clone(&hosted.core.known_removed),
            hosted.stop.clone(),
        ));
        if fresh && config.voters.contains_key(&self.node_id) {
            match hosted.core.raft.initialize(config.voters).await {
                // Another voter's proposal of the same membership got here first.
                Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(error) => {
                    hosted.shutdown().await;
                    return Err(ClusterError::Raft(error.to_string()));
                }
            }
        }
        Ok(hosted)
    }

    /// The group this handle is the node's part in.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// The groups this node hosts now, by id (the first group among them).
    pub fn hosted_groups(&self) -> Vec<GroupId> {
        self.node.groups.ids()
    }

    /// Commits `change` to the cluster's state (in the first group: see [`ClusterState`]) and
    /// answers the group it is about, once a majority has it and it is applied here. Before the
    /// first change (while the state is empty), every other member of the group must answer
    /// that its release applies such changes: a node of an earlier release would stop at the
    /// entry. (After it, every member was found able, and one of an earlier release could no
    /// longer read the group's snapshots anyway.)
    ///
    /// # Errors
    /// As [`Cluster::propose`]; [`ProposeError::Refused`] (nothing proposed) when, before the
    /// first change, a member does not answer so within a second, naming it.
    pub async fn change_cluster(&self, change: ClusterChange) -> Result<GroupId, ProposeError> {
        self.ensure_leader()?;
        if self.cluster_state.borrow().is_empty() {
            self.check_abilities().await?;
        }
        let applied = self.propose(Proposal::Cluster(change)).await?;
        applied.group.ok_or_else(|| {
            ProposeError::Unavailable("a change to the cluster's state went unanswered".to_owned())
        })
    }

    /// The group's members, and the answer of each other member to `ask` (asked at once).
    async fn ask_other_members<T, Asked>(
        &self,
        ask: impl Fn(PeerLink) -> Asked,
    ) -> (BTreeMap<NodeId, ClusterNode>, Vec<(NodeId, io::Result<T>)>)
    where
        Asked: std::future::Future<Output = io::Result<T>>,
    {
        let (_, members) = self.membership();
        let members: BTreeMap<NodeId, ClusterNode> = members.into_iter().collect();
        let answers = ask_members(&self.network, self.node_id, &members, ask).await;
        (members, answers)
    }

    /// What each other member of the group tells of its release and settings (its features,
    /// [`ClusterConfig::shared_settings`] and [`ClusterConfig::told_settings`], as
    /// `name=value`), or why it did not answer.
    pub async fn told_by_members(&self) -> Vec<(NodeId, io::Result<Vec<String>>)> {
        self.ask_other_members(|mut link| async move {
            link.features(network::PEER_ANSWER_WITHIN).await
        })
        .await
        .1
    }

    /// The settings of [`ClusterConfig::shared_settings`] that another member of the group
    /// was given another value of, as it answers now: each with the node, its value and this
    /// node's (`name=value` both). A member that does not answer, or that does not tell the
    /// setting (of an earlier release), is not named.
    pub async fn settings_apart(&self) -> Vec<(NodeId, String, String)> {
        let (_, answers) = self
            .ask_other_members(|mut link| async move {
                link.features(network::PEER_ANSWER_WITHIN).await
            })
            .await;
        let ours = &self.node.shared_settings;
        let mut apart = Vec::new();
        for (node, answer) in answers {
            let Ok(told) = answer else { continue };
            for setting in ours.iter() {
                let name = setting
                    .split_once('=')
                    .map_or(setting.as_str(), |(name, _)| name);
                let theirs = told.iter().find(|their| {
                    their
                        .split_once('=')
                        .is_some_and(|(their_name, _)| their_name == name)
                });
                if let Some(theirs) = theirs.filter(|theirs| *theirs != setting) {
                    apart.push((node, theirs.clone(), setting.clone()));
                }
            }
        }
        apart
    }

    /// `Ok` once every other member of the group answered that its release applies changes to
    /// the cluster's state; the refusal naming the first that did not otherwise.
    async fn check_abilities(&self) -> Result<(), ProposeError> {
        let (members, answers) = self
            .ask_other_members(|mut link| async move {
                link.abilities(network::PEER_ANSWER_WITHIN).await
            })
            .await;
        for (node, answer) in answers {
            let why = match answer {
                Ok(abilities) if abilities.groups => continue,
                Ok(_) => "its release does not".to_owned(),
                Err(cause) => format!("no answer: {cause}"),
            };
            return Err(ProposeError::Refused(format!(
                "node {node} (at {}) does not say that it can apply changes to the cluster's \
                 groups ({why}): every node must run this release or a later one, and answer, \
                 before groups are used; upgrade or start it, then try again",
                members[&node].raft_addr
            )));
        }
        Ok(())
    }

    /// The cluster's state as the entries applied on this node left it, changing as more are:
    /// which data groups exist and which holds each topic. Only the first group's is kept.
    pub fn cluster_state(&self) -> watch::Receiver<ClusterState> {
        self.cluster_state.clone()
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Why the consensus engine stopped, when it failed (a storage error, a broken invariant);
    /// `None` while it runs or after an orderly shutdown. A failed node applies nothing more
    /// until it is restarted.
    pub fn failure(&self) -> Option<String> {
        match &self.core.raft.metrics().borrow().running_state {
            Ok(()) | Err(Fatal::Stopped) => None,
            Err(failure) => Some(failure.to_string()),
        }
    }

    /// Every member's Kafka address as last heard: this node's own (from
    /// [`ClusterConfig::listeners`]) and each peer's answer to the question this node asks
    /// every 2 seconds (more often just after it starts). A member without a Kafka listener, or not heard from yet, is absent.
    pub fn kafka_addresses(&self) -> BTreeMap<NodeId, String> {
        self.kafka_addresses.snapshot()
    }

    /// Whether the node had neither log nor snapshot when it started: a new node (one that
    /// joins waits to be added).
    pub fn started_empty(&self) -> bool {
        self.started_empty
    }

    /// Appends `proposal` to the log and answers what applying it gave, once a majority has it
    /// and it is applied on this node (the leader).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader (nothing was proposed);
    /// [`ProposeError::Unavailable`] when the node is shutting down or failed.
    pub async fn propose(&self, proposal: Proposal) -> Result<Applied, ProposeError> {
        if matches!(proposal, Proposal::NamedCommands { .. })
            && !self.named_commands_known.load(Ordering::Acquire)
        {
            self.ensure_leader()?;
            self.check_feature(
                network::NAMED_COMMANDS,
                "apply commands under Kafka's names",
            )
            .await?;
            self.named_commands_known.store(true, Ordering::Release);
        }
        match self.core.propose(proposal).await {
            // A node holding no copy of the group names the leader its members name.
            Err(ProposeError::NotLeader { leader: None }) if !self.is_member() => {
                Err(ProposeError::NotLeader {
                    leader: self.find_leader().await,
                })
            }
            answer => answer,
        }
    }

    /// Proposes that the group's memory budget become `bytes` ([`Proposal::Budget`]), once
    /// every other member of the group answered that its release applies such a change (asked
    /// before the first, and then again as [`Cluster::check_feature_now_and_then`] says while
    /// a member does not answer so). Answers once the change is applied here.
    ///
    /// # Errors
    /// As [`Cluster::propose`]; nothing is proposed on [`ProposeError::Refused`] (naming a
    /// member whose release does not apply it) or [`ProposeError::Pending`] (a member could
    /// not be asked, or was asked too recently).
    pub async fn change_budget(&self, bytes: Option<u64>) -> Result<(), ProposeError> {
        self.ensure_leader()?;
        if !self.budget_changes_known.load(Ordering::Acquire) {
            let every_member_answered = self
                .check_feature_now_and_then(
                    &self.budget_changes_asked,
                    network::BUDGET_CHANGES,
                    "apply a change of a group's memory budget",
                )
                .await?;
            match every_member_answered {
                Some(true) => self.budget_changes_known.store(true, Ordering::Release),
                Some(false) => {
                    return Err(ProposeError::Pending(
                        "a member of the group could not be asked whether it applies a change \
                         of the memory budget"
                            .to_owned(),
                    ))
                }
                None => {
                    return Err(ProposeError::Pending(
                        "the members were asked lately whether they apply a change of the \
                         memory budget, and one did not answer so"
                            .to_owned(),
                    ))
                }
            }
        }
        self.propose(Proposal::Budget { bytes }).await.map(drop)
    }

    /// [`Cluster::check_feature`] of `feature`, unless the members were asked lately (`asked`
    /// says when, and when to ask again): `None` then. After an answer that a member's release
    /// does not apply it, they are asked again [`BUDGET_ASKED_EVERY`] later; after one that
    /// could not be reached (it may be restarting), [`FEATURE_ASKED_AGAIN`] later.
    ///
    /// # Errors
    /// As [`Cluster::check_feature`].
    async fn check_feature_now_and_then(
        &self,
        asked: &std::sync::Mutex<Option<(std::time::Instant, Duration)>>,
        feature: &str,
        what: &str,
    ) -> Result<Option<bool>, ProposeError> {
        let lock = || {
            asked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if lock().is_some_and(|(at, wait)| at.elapsed() < wait) {
            return Ok(None);
        }
        // Others calling meanwhile wait for this answer, as if it had come.
        *lock() = Some((std::time::Instant::now(), BUDGET_ASKED_EVERY));
        let answer = self.check_feature(feature, what).await;
        let wait = match &answer {
            Ok(false) => FEATURE_ASKED_AGAIN,
            Ok(true) | Err(_) => BUDGET_ASKED_EVERY,
        };
        *lock() = Some((std::time::Instant::now(), wait));
        answer.map(Some)
    }

    /// On the leader, makes the commands and ticks it proposes apply under
    /// [`broker_core::Revision::NEWEST`] once every other member of the group answers that its
    /// release applies such entries ([`Proposal::Revised`]); before, they apply under
    /// [`broker_core::Revision::Original`], as every earlier release applies them. The members
    /// are asked at the first call, then again [`FEATURE_ASKED_AGAIN`] later while one cannot
    /// be reached, [`BUDGET_ASKED_EVERY`] later while one answers that it does not; once they
    /// all did, the answer is kept (nodes are not expected to go
    /// back to an earlier release, and [`Cluster::add_node`] refuses one that does not apply
    /// it). A node that applied an entry of the group's log under that revision knows it
    /// without asking. Whether its entries carry the newest revision now.
    pub async fn adopt_revision(&self) -> bool {
        if self.core.revision_known.load(Ordering::Acquire) {
            return true;
        }
        if self.ensure_leader().is_err() {
            return false;
        }
        let adopted = matches!(
            self.check_feature_now_and_then(
                &self.revision_asked,
                network::REVISION_1,
                "apply entries under the rules of this release",
            )
            .await,
            Ok(Some(true))
        );
        if adopted {
            self.core.revision_known.store(true, Ordering::Release);
            tracing::info!(
                group = self.group,
                revision = broker_core::Revision::NEWEST.number(),
                "every member of group {} applies the rules of this release: its new entries \
                 carry them",
                self.group
            );
        }
        adopted
    }

    /// `Ok` unless another member of the group that answers cannot apply the changes that move
    /// a topic between groups (see [`Cluster::check_feature`]): asked of the first group, of
    /// which every node is a member, before a move.
    ///
    /// # Errors
    /// [`ProposeError::Refused`], naming the first member that cannot.
    pub async fn check_moves(&self) -> Result<(), ProposeError> {
        self.check_feature(network::MOVES_IMAGE_5, "move topics between groups")
            .await
            .map(drop)
    }

    /// `Ok` unless another member of the group cannot apply the commands of protocol version
    /// `version` (it answers that its release does not, see [`Cluster::check_feature`]): asked
    /// of the first group, of which every node is a member, before a command of version 14 or
    /// later goes into any group's log. Once every member answered that it can, the answer is
    /// kept (nodes are not expected to go back to an earlier release); while a member cannot
    /// be reached, the members are asked again [`FEATURE_ASKED_AGAIN`] later (calls meanwhile
    /// go on, as while it cannot be reached, rather than each waiting for it to answer).
    ///
    /// # Errors
    /// [`ProposeError::Refused`], naming the first member that cannot.
    pub async fn check_commands(&self, version: u16) -> Result<(), ProposeError> {
        use std::sync::atomic::Ordering;
        // Version 14 is the first whose commands are asked about; a later version that adds
        // commands adds its own feature here.
        if version < 14 || self.commands_14.load(Ordering::Acquire) {
            return Ok(());
        }
        let unreachable = || {
            self.commands_14_unreachable
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        if unreachable().is_some_and(|at| at.elapsed() < FEATURE_ASKED_AGAIN) {
            return Ok(());
        }
        let every_member_answered = self
            .check_feature(
                network::COMMANDS_14,
                "apply the commands of protocol version 14",
            )
            .await?;
        *unreachable() = (!every_member_answered).then(std::time::Instant::now);
        if every_member_answered && self.is_member() {
            self.commands_14.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// `Ok` unless another member of the group that answers does not have `feature` (it
    /// answers without it, or closes the connection at the question, as a node of an earlier
    /// release does): the refusal naming it then, saying it cannot `what`. A member that cannot
    /// be reached now is not waited for, so that a group with a member down keeps serving: it is
    /// not asked again by this handle.
    /// Answers whether every other member answered (`false` when one could not be reached).
    async fn check_feature(&self, feature: &str, what: &str) -> Result<bool, ProposeError> {
        let mut every_member_answered = true;
        let (members, answers) = self
            .ask_other_members(|mut link| async move {
                link.features(network::PEER_ANSWER_WITHIN).await
            })
            .await;
        for (node, answer) in answers {
            let why = match answer {
                Ok(features) if features.iter().any(|known| known == feature) => continue,
                Ok(_) => "its release does not".to_owned(),
                Err(cause)
                    if matches!(
                        cause.kind(),
                        io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::InvalidData
                    ) =>
                {
                    format!("it closed the connection at the question, as an earlier release does: {cause}")
                }
                Err(cause) => {
                    // (The peer links say that it cannot be reached.)
                    tracing::debug!(node, feature, %cause, "a member that cannot be reached was not asked whether its release has a feature");
                    every_member_answered = false;
                    continue;
                }
            };
            return Err(ProposeError::Refused(format!(
                "node {node} (at {}) does not say that it can {what} ({why}): every node must \
                 run this release or a later one first; upgrade it, then try again",
                members[&node].raft_addr
            )));
        }
        Ok(every_member_answered)
    }

    /// The proposal of `commands` applied at `now_ms` under this node's name rules
    /// ([`ClusterConfig::names`]).
    pub fn commands(&self, now_ms: i64, commands: Vec<Command>) -> Proposal {
        Proposal::commands(now_ms, self.node.names, commands)
    }

    /// Answers once this node has confirmed with a majority that it still leads and has
    /// applied everything committed before the call: a read of the state after it is
    /// linearizable.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader, or that no longer leads
    /// or cannot reach a majority; [`ProposeError::Unavailable`] when the node is shutting
    /// down or failed.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        self.core.read_barrier().await
    }

    /// `Ok` on the leader; otherwise the refusal that names the leader when this node knows
    /// it (none when this node leads but is cut off from a majority).
    fn ensure_leader(&self) -> Result<(), ProposeError> {
        self.core.ensure_leader()
    }

    /// Whether a leader told this node, which had missed it, that it was removed from the
    /// cluster: it campaigns no more, names no leader (its clients look for the cluster
    /// elsewhere), and should be stopped.
    pub fn knows_removed(&self) -> bool {
        self.core.knows_removed()
    }

    /// The leader this node knows of, with its addresses: the group's leader as this node's
    /// part in the group knows it or, on a node that is not a member of the group, the one its
    /// members named when [`Cluster::find_leader`] last asked them.
    pub fn leader(&self) -> Option<(NodeId, ClusterNode)> {
        self.core.leader().or_else(|| self.leader_named())
    }

    /// Whether this node is a member of the group (a voter or a learner), as its copy of the
    /// group's membership says: a node hosting a group it holds no replica of (the group's
    /// voters are other nodes, or it waits to be added) is not, nor is one that a leader told
    /// it was removed.
    pub fn is_member(&self) -> bool {
        !self.knows_removed()
            && self
                .core
                .raft
                .metrics()
                .borrow()
                .membership_config
                .membership()
                .get_node(&self.node_id)
                .is_some()
    }

    /// Whether this node is the leader now, and has heard from a majority of the nodes within
    /// its lease (twice the election timeout): a leader cut off from the others cannot commit
    /// anything, and they elect another one meanwhile, so it answers as a follower that knows
    /// no leader, and its clients look for the new one. A leader handing its leadership over
    /// answers so too.
    pub fn is_leader(&self) -> bool {
        self.core.is_leader()
    }

    /// [`Cluster::is_leader`] as `metrics` tell.
    pub fn leads(&self, metrics: &RaftMetrics<NodeId, ClusterNode>) -> bool {
        self.core.leads(metrics)
    }

    /// A watch that changes whenever this node's view of the cluster does (role, term, leader,
    /// indexes).
    pub fn watch(&self) -> watch::Receiver<RaftMetrics<NodeId, ClusterNode>> {
        self.core.raft.metrics()
    }

    /// The other members this node has failed to reach for `at_least`: every exchange with
    /// each has failed since then (a member that stopped, or that this node is cut off from).
    pub fn unreachable_for(&self, at_least: Duration) -> BTreeSet<NodeId> {
        self.network.unreachable_for(at_least).into_iter().collect()
    }

    /// What this node knows of the cluster now. A leader that does not lead by
    /// [`Cluster::is_leader`] (cut off from the majority, or handing its leadership over) is
    /// reported as it answers clients: a follower that knows no leader, and of no follower how
    /// far it is.
    pub fn status(&self) -> ClusterStatus {
        // (Before the metrics are borrowed: it reads them too.)
        let named = self.leader_named().map(|(id, _)| id);
        let metrics = self.core.raft.metrics();
        let metrics = metrics.borrow();
        let deposed = metrics.state == ServerState::Leader && !self.leads(&metrics);
        ClusterStatus {
            node_id: self.node_id,
            role: match deposed {
                true => ServerState::Follower,
                false => metrics.state,
            },
            term: metrics.current_term,
            // A node that no longer leads may still name itself (it was removed while leading);
            // one that knows it was removed names the leader it last followed no more.
            leader: metrics
                .current_leader
                .filter(|leader| {
                    !deposed
                        && !self.knows_removed()
                        && (*leader != self.node_id || metrics.state == ServerState::Leader)
                })
                .or(named),
            last_log_index: metrics.last_log_index,
            applied_index: metrics.last_applied.map(|id| id.index),
            members: members(metrics.membership_config.membership()),
            replication: metrics
                .replication
                .as_ref()
                .filter(|_| !deposed)
                .map(|replication| {
                    replication
                        .iter()
                        .map(|(id, matched)| (*id, matched.map(|log_id| log_id.index)))
                        .collect()
                })
                .unwrap_or_default(),
            unreachable: self.network.unreachable().into_iter().collect(),
        }
    }

    /// The members of the group (id, addresses, whether it votes) as its last membership
    /// entry says, once this node has applied that entry: a change only proposed (which may
    /// yet be dropped) is not shown; `None` until the entry is applied.
    pub fn committed_members(&self) -> Option<Vec<(NodeId, ClusterNode, bool)>> {
        committed_members(&self.core.raft.metrics().borrow())
    }

    /// Whether the tasks of the group's engine let go of the replica it was given: after
    /// [`Cluster::shutdown`], the last of them (an entry being applied, a snapshot being built)
    /// may still run for a moment, and use the replica and the group's files.
    pub fn released(&self) -> bool {
        self.released.strong_count() == 0
    }

    /// Stops this group on this node: its Raft core, and for the first group also the node's
    /// peer port and tasks, so that the other groups it hosts (stop them first) reach their
    /// peers no more. Once a group stopped, its peers are answered that the node hosts no such
    /// group.
    pub async fn shutdown(&self) {
        if self.group != FIRST_GROUP {
            self.node.groups.drop_group(self.group);
        }
        if let Err(error) = self.core.raft.shutdown().await {
            tracing::warn!(%error, "stopping the consensus engine");
        }
        self.stop.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

/// A weak handle on `replica`, which tells when every task using it ended.
fn released_when_dropped<R: Replica>(replica: &Arc<R>) -> Weak<dyn std::any::Any + Send + Sync> {
    let weak: Weak<R> = Arc::downgrade(replica);
    weak
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

#[cfg(test)]
mod tests;
