//! Cluster mode: the broker as the state machine of the cluster's replicated log, and what only
//! the leader does. Every change a client asks for is proposed to the cluster and answered once
//! a majority has it and it is applied; the server's own changes (time passing, the removal of
//! members whose session expired) are proposed by the leader alone, so every node applies the
//! same entries with the same times.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use broker_cluster::{
    Applied, BrokerChange, Cluster, ClusterConfig, ClusterNode, Fatal, Listeners, LogSync, NodeId,
    PeerTls, Proposal, ProposeError, Replica,
};
use broker_core::cold::{ColdStore, LogId};
use broker_core::image::{StateImage, TopicImage};
use broker_core::{BrokerError, BrokerState, ColdReads, Command, Outcome, ReadAheadAt};
use broker_proto::ErrorReply;
use broker_storage::DataDir;
use tokio::net::TcpListener;
use tracing::{debug, error, info, warn};

use crate::broker::{wall_clock_ms, Broker};
use crate::config::ClusterSettings;
use crate::security::peer_client_config;
use crate::shared::Shared;
use crate::signals::Signals;
use crate::ServerError;

/// Where a node keeps its replicated log and snapshots, inside its data directory.
pub(crate) const CLUSTER_DIR: &str = "raft";

/// The broker as the cluster's state machine sees it: the same state and signals the server
/// serves from.
pub(crate) struct BrokerReplica {
    broker: Arc<Broker>,
    signals: Arc<Signals>,
}

impl BrokerReplica {
    /// The replica of `broker`, whose waiting requests `signals` wakes.
    pub(crate) fn new(broker: Arc<Broker>, signals: Arc<Signals>) -> BrokerReplica {
        BrokerReplica { broker, signals }
    }
}

/// When appends to a node's logs reach the disk, by `--fsync`.
pub(crate) fn log_sync(config: &crate::Config) -> LogSync {
    match config.fsync {
        crate::Fsync::Always => LogSync::EveryAppend,
        crate::Fsync::Batch => LogSync::Every(config.fsync_interval),
        crate::Fsync::Never => LogSync::Never,
    }
}

impl Replica for BrokerReplica {
    fn apply(&self, change: BrokerChange) -> Applied {
        let mut changed = Vec::new();
        let results = {
            let mut broker = self.broker.lock();
            match change {
                BrokerChange::Commands {
                    now_ms,
                    names,
                    revision,
                    commands,
                } => {
                    // The entry's rules while it applies, this node's own for its reads.
                    let own = broker.set_names(names);
                    let own_revision = broker.set_revision(revision);
                    let results = commands
                        .into_iter()
                        .map(|command| broker.apply_committed(now_ms, command, &mut changed))
                        .collect();
                    broker.set_revision(own_revision);
                    broker.set_names(own);
                    results
                }
                BrokerChange::Tick { now_ms, revision } => {
                    let own_revision = broker.set_revision(revision);
                    changed = broker.tick_committed(now_ms);
                    broker.set_revision(own_revision);
                    Vec::new()
                }
                BrokerChange::Budget { bytes } => {
                    broker.set_memory_budget(bytes);
                    Vec::new()
                }
            }
        };
        // Waiting requests live on the leader, but a follower wakes its own too (none wait
        // there): every node applies alike.
        self.signals.wake(&changed);
        Applied {
            results,
            changed,
            group: None,
        }
    }

    fn holds_topic(&self, topic: &str) -> bool {
        self.broker.lock().holds_topic(topic)
    }

    fn image(&self) -> StateImage {
        self.broker.lock().image()
    }

    fn restore(&self, image: StateImage, records: Arc<dyn ColdStore>) -> Result<(), String> {
        let state = BrokerState::from_image(image, Some(records))?;
        self.broker.lock().replace_state(state);
        self.signals.wake_all();
        Ok(())
    }

    fn evict(&self, written: &[(LogId, i64)]) {
        self.broker.lock().evict(written);
    }

    fn import_topic(&self, topic: &str, image: TopicImage) -> Result<(), BrokerError> {
        self.broker.lock().import_topic(topic, image)
    }

    fn drop_topic(&self, topic: &str) -> bool {
        let dropped = self.broker.lock().drop_topic(topic);
        // Requests waiting on it ask again, and learn where it went.
        self.signals.wake(&[topic.to_owned()]);
        dropped
    }

    fn dead_letter_ties(&self, topic: &str) -> Vec<String> {
        self.broker.lock().dead_letter_ties(topic)
    }

    fn failure(&self) -> Option<String> {
        self.broker.lock().failure()
    }
}

/// The setting each node tells the others (`serves-groups=N`): how many groups it serves
/// (the first group's leader adds a group only once every node serves it).
pub(crate) const SERVES_GROUPS: &str = "serves-groups";

/// Starts this server's node of the cluster in `data_dir` (locked for the life of the server,
/// and refused if it holds a single broker's data): binds the peer port, starts the node and
/// the task that follows its role. `listening` is the broker port's address, checked against
/// the client address the members list gives this node; `kafka` the Kafka listener's, if the
/// node has one (its peers are told where it is: see [`crate::Config::kafka_advertised`]).
///
/// # Errors
/// The directory is locked, holds a single broker's data or damaged files, or the peer port
/// cannot be bound.
pub(crate) async fn start(
    shared: &Arc<Shared>,
    settings: &ClusterSettings,
    data_dir: &Path,
    listening: Option<SocketAddr>,
    kafka: Option<SocketAddr>,
) -> Result<DataDir, ServerError> {
    let locked = DataDir::open(data_dir)?;
    let this_node = this_node(settings)?;
    let (listener, listen) = bind_peer_port(settings).await?;
    let mut config = ClusterConfig::new(
        settings.node_id,
        settings.members.clone(),
        data_dir.join(CLUSTER_DIR),
    );
    config.sync = log_sync(&shared.config);
    config.token = shared
        .config
        .auth_token
        .as_ref()
        .map(|token| token.secret().to_owned());
    config.join = settings.join;
    config.names = shared.config.names;
    config.shared_settings = vec![format!("cluster-replicas={}", settings.replicas)];
    // How many groups this node serves (its --cluster-data-groups, or what its directory
    // holds): the first group's leader adds a group only once every node serves it.
    config.told_settings = vec![format!("{}={}", SERVES_GROUPS, shared.shards.all().len())];
    config.segment_bytes = shared.config.segment_bytes;
    config.snapshot_every = settings.snapshot_entries;
    config.cached_log_bytes = settings.log_cache_bytes;
    config.listeners = Listeners {
        kafka: kafka.and_then(|kafka| shared.config.kafka_advertised(kafka)),
    };
    config.tls = match (&settings.tls_ca, &shared.config.tls) {
        (Some(ca), Some(tls)) => Some(PeerTls::new(tls.config(), peer_client_config(ca)?)),
        (Some(_), None) => {
            return Err(ServerError::InvalidConfig(
                "--cluster-tls-ca needs --tls-cert and --tls-key (the certificate the node \
                 presents to its peers)"
                    .to_owned(),
            ))
        }
        (None, Some(_)) => {
            warn!(
                "clients speak TLS but the peer port does not: the replicated log crosses the \
                 network in clear text (give every node --cluster-tls-ca)"
            );
            None
        }
        (None, None) => None,
    };
    // Until it leads, the node logs none of the changes it applies (the leader does).
    shared.shards.first().set_audited(false);
    let replica = Arc::new(BrokerReplica::new(
        Arc::clone(shared.shards.first()),
        Arc::clone(&shared.signals),
    ));
    let cluster = Cluster::start(config, listener, replica).await?;
    warn_about_settings(settings, listening);
    info!(
        node_id = settings.node_id,
        peer_listen = %listen,
        members = settings.members.len(),
        "cluster node started"
    );
    if settings.join && cluster.started_empty() {
        info!(
            node = %format!("{}={}/{}", settings.node_id, this_node.raft_addr, this_node.client_addr),
            "waiting to be added to the running cluster: run `broker cluster add` with this \
             node (ID=PEER_ADDR/CLIENT_ADDR) against any of its nodes"
        );
    }
    // Set once, before any connection is accepted.
    let _ = shared.cluster.set(Arc::new(cluster));
    shared
        .tracker
        .spawn(follow_leadership(Arc::clone(shared), 0));
    Ok(locked)
}

/// `settings`' own entry in its members list.
fn this_node(settings: &ClusterSettings) -> Result<&ClusterNode, ServerError> {
    settings.this_node().ok_or_else(|| {
        ServerError::InvalidConfig(format!("node {} is not a member", settings.node_id))
    })
}

/// Binds the peer port of `settings`' node (`--cluster-listen`, else the node's peer address
/// in its members list); returns it with the address as given.
///
/// # Errors
/// The node is not in its members list, the address does not resolve, or it cannot be bound
/// (another process listens there, it is not an address of this host).
pub async fn bind_peer_port(
    settings: &ClusterSettings,
) -> Result<(TcpListener, String), ServerError> {
    let listen = match &settings.listen {
        Some(listen) => listen.clone(),
        None => this_node(settings)?.raft_addr.clone(),
    };
    let addresses = crate::resolve_listen_addr(&listen).await?;
    let listener = TcpListener::bind(addresses.as_slice())
        .await
        .map_err(|error| {
            ServerError::Io(std::io::Error::new(
                error.kind(),
                format!("cannot listen for peers on {listen}: {error}"),
            ))
        })?;
    Ok((listener, listen))
}

/// Warns when the client address the members list gives this node is on another port than the
/// one it listens on: clients sent to it would go elsewhere, unless a port mapping forwards
/// them.
fn warn_about_settings(settings: &ClusterSettings, listening: Option<SocketAddr>) {
    let advertised = settings.this_node().map(|node| node.client_addr.as_str());
    let advertised_port = advertised
        .and_then(|address| address.rsplit_once(':'))
        .and_then(|(_, port)| port.parse::<u16>().ok());
    if let (Some(advertised), Some(port), Some(listening)) =
        (advertised, advertised_port, listening)
    {
        if port != listening.port() {
            warn!(
                %listening,
                %advertised,
                "this node listens for clients on another port than the client address \
                 --cluster-members gives for it: clients sent to it go to that address, so it \
                 must reach this node (a port mapping, say)"
            );
        }
    }
}

/// Warns when the members list given differs from the membership in force (the one in the
/// node's log): the list counts only when a cluster first forms.
fn check_membership(
    given: &BTreeMap<NodeId, ClusterNode>,
    in_force: &BTreeMap<NodeId, ClusterNode>,
) {
    if !in_force.is_empty() && in_force != given {
        warn!(
            in_force = %broker_cluster::members_list(in_force),
            given = %broker_cluster::members_list(given),
            "--cluster-members differs from the membership in this node's log, which is the one \
             in force (the list counts only when a cluster first forms)"
        );
    }
}

/// How long a voter goes without knowing a leader before it says so.
const LEADERLESS_WARNING: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether a voter has known no leader for long, to warn once each time it happens: it cannot
/// reach a majority, or it was removed from the cluster without hearing of it (a follower
/// removed while the leader could not tell it, which then campaigns on its own).
#[derive(Debug, Default)]
struct Leaderless {
    since: Option<std::time::Instant>,
    warned: bool,
}

impl Leaderless {
    /// Takes the node's state at a change of its consensus engine: `settled` when it knows a
    /// leader or is no voter (a node waiting to be added knows none and says so elsewhere).
    fn observe(&mut self, settled: bool, term: u64) {
        if settled {
            *self = Leaderless::default();
            return;
        }
        let since = *self.since.get_or_insert_with(std::time::Instant::now);
        if !self.warned && since.elapsed() >= LEADERLESS_WARNING {
            self.warned = true;
            warn!(
                term,
                "this node has known no leader for {} s: it reaches no majority of the voters \
                 (are they running, and can it reach their peer ports?), or it was removed \
                 from the cluster while it could not hear of it (then stop it)",
                LEADERLESS_WARNING.as_secs()
            );
        }
    }
}

/// Where a node stands in the membership in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// Not a member: waiting to be added, or removed.
    Outside,
    /// A member that receives the log but does not vote yet.
    Learner,
    /// A member that votes.
    Voter,
}

/// Logs a change of this node's standing in the cluster.
fn announce_standing(before: Standing, now: Standing) {
    match (before, now) {
        (Standing::Outside, Standing::Learner) => {
            info!("this node was added to the cluster as a learner; it catches up with the log");
        }
        (Standing::Outside | Standing::Learner, Standing::Voter) => {
            info!("this node votes in the cluster now");
        }
        (Standing::Learner | Standing::Voter, Standing::Outside) => warn!(
            "this node was removed from the cluster: it takes no part in it any more and can \
             be stopped"
        ),
        (Standing::Voter, Standing::Learner) => info!(
            "this node no longer votes in the cluster; if it is being removed, stop it once \
             `broker cluster remove` has answered"
        ),
        (Standing::Outside, Standing::Outside)
        | (Standing::Learner, Standing::Learner)
        | (Standing::Voter, Standing::Voter) => {}
    }
}

/// Checks that `dir` (if it exists) may serve node `node_id` of a cluster: it holds no single
/// broker's data, and no other node's log. Runs before the server announces its address.
///
/// # Errors
/// [`ServerError::InvalidConfig`] saying which, or an I/O error reading the directory.
pub(crate) fn check_directory(dir: &Path, node_id: NodeId) -> Result<(), ServerError> {
    if !dir.exists() {
        return Ok(());
    }
    if holds_single_broker_data(dir)? {
        return Err(ServerError::InvalidConfig(format!(
            "{} holds the data of a single broker (wal-*.log, snap-*.snap): a cluster node \
             needs a directory of its own",
            dir.display()
        )));
    }
    broker_cluster::LogStore::check_owner(&dir.join(CLUSTER_DIR), node_id)
        .map_err(|error| ServerError::InvalidConfig(error.to_string()))
}

/// Whether `dir` holds a single broker's log or snapshots.
fn holds_single_broker_data(dir: &Path) -> Result<bool, ServerError> {
    let unreadable = |error: std::io::Error| {
        ServerError::InvalidConfig(format!("cannot read {}: {error}", dir.display()))
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let name = entry.map_err(unreadable)?.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with("wal-") && name.ends_with(".log"))
            || (name.starts_with("snap-") && name.ends_with(".snap"))
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Proposes `commands` (applied in order at the leader's clock) and answers each one's result
/// once a majority has them and they are applied here.
///
/// # Errors
/// The refusal every command gets when nothing was applied: this node is not the leader, or
/// the cluster cannot take changes.
pub(crate) async fn execute(
    cluster: &Cluster,
    commands: Vec<Command>,
) -> Result<Vec<Result<Outcome, ErrorReply>>, ErrorReply> {
    let count = commands.len();
    let proposal = cluster.commands(wall_clock_ms(), commands);
    let applied = cluster.propose(proposal).await.map_err(refusal)?;
    let mut results: Vec<_> = applied
        .results
        .into_iter()
        .map(|result| result.map_err(ErrorReply::from))
        .collect();
    // Every node applies every command of an entry; an answer short of them is a fault of the
    // node, reported as such rather than as another command's answer.
    results.resize_with(count, || {
        Err(ErrorReply::Storage(
            "the cluster applied the change but gave no answer for it".to_owned(),
        ))
    });
    Ok(results)
}

/// `Ok` unless `commands` hold one of a protocol version that a node of the cluster cannot
/// apply (a node of an earlier release would stop at its entry): asked of the first group,
/// whose members are every node (see [`Cluster::check_commands`]). A server alone takes them
/// all.
///
/// # Errors
/// `InvalidArgument`, naming the node to upgrade.
pub(crate) async fn every_node_applies(
    shared: &Shared,
    commands: &[Command],
) -> Result<(), ErrorReply> {
    let version = commands
        .iter()
        .map(Command::since_version)
        .max()
        .unwrap_or(0);
    match shared.cluster() {
        Some(first) => first.check_commands(version).await.map_err(refusal),
        None => Ok(()),
    }
}

/// [`execute`] on `cluster`, the group of `shard`, reading ahead when this node leads it: the
/// records on disk that its deliveries would take (see `BrokerState::cold_reads_of`) are read
/// on a blocking thread before they are proposed, and handed to the state until the proposal
/// is answered, so that applying them (under the shard's lock, which every call about its
/// topics waits for) need not read them. What was read is only a guess: a delivery that needs
/// other records by the time it applies reads them as before, and answers exactly as it would
/// have (followers, which answer nobody, read under the lock still).
///
/// # Errors
/// As [`execute`].
pub(crate) async fn execute_reading_ahead(
    shared: &Shared,
    shard: usize,
    cluster: &Cluster,
    commands: Vec<Command>,
) -> Result<Vec<Result<Outcome, ErrorReply>>, ErrorReply> {
    let planned: Vec<ColdReads> = match cluster.is_leader() {
        true => {
            let broker = shared.shards.get(shard).lock();
            commands
                .iter()
                .filter_map(|command| broker.replicated_cold_reads_of(command))
                .collect()
        }
        false => Vec::new(),
    };
    if planned.is_empty() {
        return execute(cluster, commands).await;
    }
    let read = crate::broker::read_ahead(planned, shared.metrics.as_deref()).await;
    let handed = {
        let mut broker = shared.shards.get(shard).lock();
        Handed {
            broker: shared.shards.get(shard),
            at: read
                .into_iter()
                .map(|ahead| broker.read_ahead(ahead))
                .collect(),
        }
    };
    let results = execute(cluster, commands).await;
    drop(handed);
    results
}

/// Records read ahead and handed to a shard's state, taken back when dropped: once the
/// proposal is answered, or when the call is given up before (its connection closed).
struct Handed<'a> {
    broker: &'a Broker,
    at: Vec<ReadAheadAt>,
}

impl Drop for Handed<'_> {
    fn drop(&mut self) {
        let mut broker = self.broker.lock();
        for at in self.at.drain(..) {
            broker.forget_read_ahead(at);
        }
    }
}

/// What a client is told when its change was not applied.
pub(crate) fn refusal(error: ProposeError) -> ErrorReply {
    match error {
        ProposeError::NotLeader { leader } => ErrorReply::NotLeader {
            leader: leader.map(|(_, node)| node.client_addr),
        },
        ProposeError::Unavailable(why) => ErrorReply::Storage(why),
        ProposeError::Refused(why) => ErrorReply::InvalidArgument(why),
        ProposeError::Pending(why) => ErrorReply::Pending(why),
    }
}

/// On the leader of the group of `shard`, lets time pass when that changes something (see
/// `clock`), keeps the group's memory budget its share of `--max-memory`, and makes its
/// entries carry this release's rules once every member applies them.
pub(crate) async fn tick(shared: &Shared, cluster: &Cluster, shard: usize) {
    if !cluster.is_leader() {
        return;
    }
    cluster.adopt_revision().await;
    keep_budget(shared, cluster, shard).await;
    let now_ms = wall_clock_ms();
    if !shared.shards.get(shard).lock().is_due(now_ms) {
        return;
    }
    if let Err(error) = cluster.propose(Proposal::Tick { now_ms }).await {
        debug!(%error, "letting time pass was not replicated; trying again at the next tick");
    }
}

/// On the leader of the group of `shard`, makes the group's memory budget this node's share of
/// `--max-memory` when the budget in force differs: one that a snapshot written under other
/// settings brought back (`--max-memory` changed, or `--cluster-data-groups` raised), or that
/// a leader started with other settings proposed. The change goes through the group's log, so
/// every replica refuses the same publishes as full.
async fn keep_budget(shared: &Shared, cluster: &Cluster, shard: usize) {
    let share = shared.config.memory_share(shared.shards.all().len());
    let (budget, _) = shared.shards.get(shard).lock().memory();
    if budget == Some(share) {
        return;
    }
    let group = cluster.group();
    match cluster.change_budget(Some(share)).await {
        Ok(()) => info!(
            group,
            bytes = share,
            was = ?budget,
            "the memory budget of group {group} is now its share of --max-memory"
        ),
        Err(ProposeError::Pending(why)) => debug!(group, why, "the memory budget is unchanged"),
        Err(ProposeError::NotLeader { .. }) => {}
        Err(error) => warn!(
            group,
            %error,
            "the memory budget of group {group} is not its share of --max-memory; trying again"
        ),
    }
}

/// Follows this node's role in the group of `shard` (0: the first group, which also tells
/// where the node stands in the cluster). When it becomes the group's leader it takes over the
/// sessions of every member the group's state holds (as a restarted server does: each gets a
/// full session timeout to show up), once everything the old leader committed is applied here.
/// When it stops being the leader, every waiting request is woken: its retry is refused with
/// `NotLeader`, so its client moves to the new leader at once.
pub(crate) async fn follow_leadership(shared: Arc<Shared>, shard: usize) {
    let Some(cluster) = shared.group(shard) else {
        return;
    };
    let first = shard == 0;
    let broker = shared.shards.get(shard);
    let mut watch = cluster.watch();
    // The term in which this node last took up (or tried to take up) the leadership, while it
    // leads. By term, not by a flag: the metrics' watch keeps only the latest state, so a node
    // that lost the leadership and won it again in a later term may never be seen not leading
    // in between, and must take it up again all the same.
    let mut leading: Option<u64> = None;
    // The members list given, until it is compared with the membership in force.
    // (A node that joins a running cluster is given the members only for its own addresses.)
    let mut given = shared
        .config
        .cluster
        .as_ref()
        .filter(|settings| first && !settings.join)
        .map(|settings| settings.members.clone());
    // Whether this node said it leads (and so says when it no longer does).
    let mut announced = false;
    // Where this node stands in the membership in force, to say when that changes.
    let mut standing = None;
    // The other node this one last knew to lead, to say when another one does.
    let mut known_leader = None;
    // Since when this voter knows no leader, and whether it said so.
    let mut leaderless = Leaderless::default();
    // The term in which this node (of the first group) coordinated Kafka's groups, while what
    // it knows of them may still hold: no other node led in that term.
    let mut kafka_groups_term: Option<u64> = None;
    loop {
        tokio::select! {
            biased;
            () = shared.shutdown.cancelled() => return,
            changed = watch.changed() => if changed.is_err() { return },
        }
        // One borrow at a time: a second one of the same channel while this is held could wait
        // behind the engine's next update, which waits for this one.
        let (now_leading, term, leader, stopped) = {
            let metrics = watch.borrow_and_update();
            // Once, when the membership is known (the metrics change at every step of the
            // engine: nothing is copied after that).
            if given.is_some() {
                let in_force: BTreeMap<NodeId, ClusterNode> = metrics
                    .membership_config
                    .membership()
                    .nodes()
                    .map(|(node, addresses)| (*node, addresses.clone()))
                    .collect();
                if !in_force.is_empty() {
                    if let Some(given) = given.take() {
                        check_membership(&given, &in_force);
                    }
                }
            }
            let membership = metrics.membership_config.membership();
            let now = match membership.get_node(&cluster.node_id()) {
                None => Standing::Outside,
                Some(_) if membership.voter_ids().any(|id| id == cluster.node_id()) => {
                    Standing::Voter
                }
                Some(_) => Standing::Learner,
            };
            if let Some(before) = standing.replace(now).filter(|_| first) {
                announce_standing(before, now);
            }
            let stopped = match &metrics.running_state {
                Ok(()) => None,
                // Shut down with the server: nothing to report.
                Err(Fatal::Stopped) => return,
                Err(failure) => Some(failure.to_string()),
            };
            (
                cluster.leads(&metrics),
                metrics.current_term,
                metrics.current_leader,
                stopped,
            )
        };
        if let Some(cause) = stopped {
            match first {
                true => error!(
                    %cause,
                    "the consensus engine failed; this node applies nothing more until it is \
                     restarted"
                ),
                false => {
                    let group = cluster.group();
                    error!(
                        %cause,
                        group,
                        "the consensus engine of data group {group} failed; this node applies \
                         nothing more of it until it is restarted (the other groups serve on)"
                    );
                }
            }
            shared.signals.wake_all();
            return;
        }
        // (A voter told it was removed said so already; the first group says it for all.)
        leaderless.observe(
            !first
                || leader.is_some()
                || standing != Some(Standing::Voter)
                || cluster.knows_removed(),
            term,
        );
        let group = cluster.group();
        // Another node leads: it coordinates Kafka's groups now (their members join again
        // there), and what this node knew of them no longer holds.
        if first
            && leader.is_some_and(|leader| leader != cluster.node_id())
            && kafka_groups_term.take().is_some()
        {
            shared.kafka.groups.forget_all();
        }
        match leader {
            Some(leader) if leader == cluster.node_id() => known_leader = None,
            Some(leader) if known_leader.replace(leader) != Some(leader) => match first {
                true => info!(leader, term, "node {leader} leads the cluster"),
                false => debug!(
                    leader,
                    term, group, "node {leader} leads data group {group}"
                ),
            },
            Some(_) | None => {}
        }
        let now_leading = now_leading.then_some(term);
        if now_leading == leading {
            continue;
        }
        if leading.take().is_some() {
            if first {
                shared.first_group_current.store(false, Ordering::SeqCst);
            }
            broker.set_audited(false);
            if std::mem::take(&mut announced) {
                match first {
                    true => info!(term, "this node no longer leads the cluster"),
                    false => info!(term, group, "this node no longer leads data group {group}"),
                }
            }
            shared.signals.wake_all();
        }
        if let Some(term) = now_leading {
            leading = Some(term);
            // Kafka's groups as this node knew them hold only if no other node led since: a
            // lease lost and won back within one term (no majority heard for a moment) keeps
            // them; a later term may have seen another coordinator.
            if first && kafka_groups_term.replace(term) != Some(term) {
                shared.kafka.groups.forget_all();
            }
            // An entry of this term, applied, means every entry before it is applied too.
            match cluster
                .propose(Proposal::Tick {
                    now_ms: wall_clock_ms(),
                })
                .await
            {
                Ok(_) => {
                    broker.lock().restore_sessions();
                    broker.set_audited(true);
                    announced = true;
                    let term = cluster.status().term;
                    match first {
                        true => {
                            shared.first_group_current.store(true, Ordering::SeqCst);
                            info!(term, "this node leads the cluster");
                        }
                        false => info!(term, group, "this node leads data group {group}"),
                    }
                }
                // A node restarting from its files may believe for a moment that it still
                // leads: routine, not news.
                Err(error) => debug!(%error, term, "leadership ended before it was taken up"),
            }
        }
    }
}
