//! The links between nodes: each node listens on its cluster port for its peers' Raft messages
//! (append entries, votes, snapshot chunks), and opens one connection to each peer it sends to.
//!
//! # The peer protocol
//!
//! Frames are a length (`u32`, big-endian, at most [`MAX_PEER_FRAME`]) then a body in the
//! encoding of [`crate::codec`]. The connecting node sends a [`PeerHello`] first (its node id,
//! the protocol's name and the cluster's token, when the broker has one) and gets `Ok` with the
//! other node's token (which it checks in turn: the two must hold the same) or the reason it is
//! refused; then it sends [`PeerRequest`]s, one at a time, each answered by one
//! [`PeerResponse`]. With [`PeerTls`], all of it travels inside TLS: the connecting node checks
//! the other's certificate against its authorities and the host of the address it dialled.
//!
//! # Groups
//!
//! A node may host several Raft groups ([`GroupId`]), each with its own log, vote and state.
//! A request about one group travels as [`PeerRequest::Group`] naming it, except for the
//! node's first group ([`FIRST_GROUP`], the one every release has), whose requests travel
//! untagged as they always did, so that nodes of earlier releases keep replicating it with
//! nodes of this one. Each group has its own connection to each peer, so that one group's
//! large append or snapshot never holds back another's heartbeats. A node that does not host
//! the group asked answers [`PeerResponse::NoSuchGroup`] (it may not have created it yet), and
//! the sender retries as it does after any failed exchange.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{FutureExt, SinkExt, StreamExt};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::Raft;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::codec::{decode_at_most, encode};
use crate::contact::LeaderContact;
use crate::group::GroupCore;
use crate::types::{
    Applied, ClusterNode, Entry, GroupId, NodeId, Proposal, TypeConfig, FIRST_GROUP,
};
use crate::{committed_members, ProposeError};

/// The largest frame between peers: a batch of entries, or a snapshot chunk.
pub const MAX_PEER_FRAME: usize = 512 * 1024 * 1024;

/// What a hello names, so that a node never takes another program's bytes for Raft messages.
const PROTOCOL: &str = "broker-raft/1";

/// How long a new peer connection may take to say hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a node asked to take the leadership over campaigns before it answers that it did
/// not win.
pub(crate) const CAMPAIGN_WITHIN: Duration = Duration::from_secs(3);

/// The first frame on a peer connection.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct PeerHello {
    /// The id of the node that connects (first, so that a tool in the middle can tell links
    /// apart by their first 12 bytes: the frame's length, then this `u64`).
    from: NodeId,
    /// [`PROTOCOL`].
    protocol: String,
    /// The cluster's shared secret (the broker's auth token), if it has one.
    token: Option<String>,
}

/// A Raft message from a peer.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum PeerRequest {
    /// Entries to append (or a heartbeat).
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// A candidate asks for a vote.
    Vote(VoteRequest<NodeId>),
    /// A chunk of a snapshot.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// How far the asking node's log reaches, as far as this node knows (a node starting with
    /// an empty directory asks, to find out whether it lost its log). Added after the first
    /// release: a node of that release closes the connection instead of answering.
    Matched,
    /// Where the node serves clients besides the broker port (its Kafka listener). Added with
    /// the Kafka listener: a node of an earlier release closes the connection instead of
    /// answering.
    Listeners,
    /// The leader hands its leadership over to the node asked: it campaigns until it leads, for
    /// at most [`CAMPAIGN_WITHIN`]. Added with leadership transfer: a node of an earlier release
    /// closes the connection instead of answering.
    Campaign,
    /// Whether the asking node still belongs to the cluster, asked by a voter that has known
    /// no leader for a while (see `removal`). Added with that check: a node of an earlier
    /// release closes the connection instead of answering.
    Belonging,
    /// The members list the node was started with, asked by a node of a new cluster before it
    /// proposes its own: every node must be given the same. Added with that check: a node of
    /// an earlier release closes the connection instead of answering.
    Members,
    /// `request`, about Raft group `group` of the node asked rather than its first group: a
    /// [`GroupRequest`] (so never a request about the node, nor another `Group`: nothing
    /// nests). Added
    /// with several groups per node: a node of an earlier release closes the connection
    /// instead of answering.
    Group {
        /// The group the request is about (never [`FIRST_GROUP`], whose requests travel
        /// untagged).
        group: GroupId,
        /// The request.
        request: GroupRequest,
    },
    /// What the node's release can do ([`Abilities`]), asked before a change that every node
    /// must be able to apply. Added with groups: a node of an earlier release closes the
    /// connection instead of answering.
    Abilities,
    /// A proposal forwarded to the node as the group's leader, answered once applied there
    /// (or refused, as a proposal to it would be). Added with groups, always inside a `Group`.
    Propose(Proposal),
    /// Asked of the group's leader by a node that is about to read its own copy of the group's
    /// state: the index of the last entry the leader had committed when asked, confirmed with a
    /// majority (a read index); the asking node reads once it has applied that entry. Added with
    /// groups, always inside a `Group`.
    ReadIndex,
    /// What the node's release can do beyond [`Abilities`], by name ([`FEATURES`]): asked
    /// before the first entry that a node of an earlier release could not apply. Added with
    /// name rules: a node of an earlier release closes the connection instead of answering.
    Features,
}

/// The features of this release a peer may ask about ([`PeerRequest::Features`]).
pub(crate) const FEATURES: &[&str] = &[
    NAMED_COMMANDS,
    MOVES,
    MOVES_IMAGE_5,
    COMMANDS_14,
    BUDGET_CHANGES,
    REVISION_1,
];

/// The feature of applying [`crate::Proposal::NamedCommands`].
pub(crate) const NAMED_COMMANDS: &str = "named-commands";

/// The feature of applying the changes that move a topic between groups
/// ([`crate::ClusterChange::Depart`] and those after it).
pub(crate) const MOVES: &str = "moves";

/// The feature of applying the commands protocol version 14 added (`Producers`,
/// `StoredOffsets`, `DeleteOffsets`): in a cluster every command is an entry of the log, and a
/// node of an earlier release stops at one it cannot read.
pub(crate) const COMMANDS_14: &str = "commands-14";

/// The feature of applying a topic's arrival with its state image of version 5
/// ([`crate::ClusterChange::Arrive`]), which the releases before it cannot read: a move is
/// made only once every node has it.
pub(crate) const MOVES_IMAGE_5: &str = "moves-image-5";

/// The feature of applying a change of a group's memory budget ([`crate::Proposal::Budget`]).
pub(crate) const BUDGET_CHANGES: &str = "budget-changes";

/// The feature of applying entries under revision 1 of the core's rules
/// ([`broker_core::Revision::Bounded`], in a [`crate::Proposal::Revised`]).
pub(crate) const REVISION_1: &str = "revision-1";

/// What a node's release can do, as it tells its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Abilities {
    /// It applies changes to the cluster's state (`Proposal::Cluster`) and hosts further
    /// groups.
    pub(crate) groups: bool,
}

/// What this release can do.
pub(crate) const ABILITIES: Abilities = Abilities { groups: true };

/// A request about one group, as [`PeerRequest::Group`] carries it: the same requests as
/// [`PeerRequest`]'s variants of these names (the first group's travel as those).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum GroupRequest {
    /// See [`PeerRequest::AppendEntries`].
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// See [`PeerRequest::Vote`].
    Vote(VoteRequest<NodeId>),
    /// See [`PeerRequest::InstallSnapshot`].
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// See [`PeerRequest::Matched`].
    Matched,
    /// See [`PeerRequest::Campaign`].
    Campaign,
    /// See [`PeerRequest::Belonging`].
    Belonging,
    /// See [`PeerRequest::Propose`].
    Propose(Proposal),
    /// See [`PeerRequest::ReadIndex`].
    ReadIndex,
    /// Asked of the group's leader by a node that holds no copy of the group: the group's
    /// members as the leader has committed them. Added with `--cluster-replicas`, only ever
    /// inside a `Group`: a node of an earlier release closes the connection instead of
    /// answering.
    CommittedMembers,
}

impl GroupRequest {
    /// Whether answering it may write this node's log or vote: Raft's own messages, a request
    /// to campaign, and a proposal.
    fn writes_raft_state(&self) -> bool {
        match self {
            GroupRequest::AppendEntries(_)
            | GroupRequest::Vote(_)
            | GroupRequest::InstallSnapshot(_)
            | GroupRequest::Campaign
            | GroupRequest::Propose(_) => true,
            GroupRequest::ReadIndex
            | GroupRequest::Matched
            | GroupRequest::Belonging
            | GroupRequest::CommittedMembers => false,
        }
    }
}

/// A [`PeerRequest`] about the node itself rather than one of its groups.
#[derive(Debug, Clone, Copy)]
enum NodeQuestion {
    Listeners,
    Members,
    Abilities,
    Features,
}

impl PeerRequest {
    /// The request about one group it is, with that group (untagged: the first group's); or
    /// itself, a request about the node.
    fn into_group_request(self) -> Result<(GroupId, GroupRequest), NodeQuestion> {
        let request = match self {
            PeerRequest::Group { group, request } => return Ok((group, request)),
            PeerRequest::AppendEntries(rpc) => GroupRequest::AppendEntries(rpc),
            PeerRequest::Vote(rpc) => GroupRequest::Vote(rpc),
            PeerRequest::InstallSnapshot(rpc) => GroupRequest::InstallSnapshot(rpc),
            PeerRequest::Matched => GroupRequest::Matched,
            PeerRequest::Campaign => GroupRequest::Campaign,
            PeerRequest::Belonging => GroupRequest::Belonging,
            PeerRequest::Propose(proposal) => GroupRequest::Propose(proposal),
            PeerRequest::ReadIndex => GroupRequest::ReadIndex,
            PeerRequest::Listeners => return Err(NodeQuestion::Listeners),
            PeerRequest::Members => return Err(NodeQuestion::Members),
            PeerRequest::Abilities => return Err(NodeQuestion::Abilities),
            PeerRequest::Features => return Err(NodeQuestion::Features),
        };
        Ok((FIRST_GROUP, request))
    }

    /// The request as it travels to group `group`: untagged for the first group and for a
    /// request about the node, in a [`PeerRequest::Group`] otherwise.
    fn addressed_to(self, group: GroupId) -> PeerRequest {
        if group == FIRST_GROUP {
            return self;
        }
        match self.into_group_request() {
            Ok((_, request)) => PeerRequest::Group { group, request },
            Err(NodeQuestion::Listeners) => PeerRequest::Listeners,
            Err(NodeQuestion::Members) => PeerRequest::Members,
            Err(NodeQuestion::Abilities) => PeerRequest::Abilities,
            Err(NodeQuestion::Features) => PeerRequest::Features,
        }
    }
}

/// The answer to a [`PeerRequest`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum PeerResponse {
    /// Answers [`PeerRequest::AppendEntries`].
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// Answers [`PeerRequest::Vote`].
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// Answers [`PeerRequest::InstallSnapshot`].
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// Answers [`PeerRequest::Matched`]: if this node leads, the index of the last entry it
    /// knows the asking node holds (`None` when it knows of none, or does not lead).
    Matched(Option<u64>),
    /// Answers [`PeerRequest::Listeners`].
    Listeners(Listeners),
    /// Answers [`PeerRequest::Campaign`]: whether the node asked leads now.
    Campaign(bool),
    /// Answers [`PeerRequest::Belonging`]: from a leader, its committed membership.
    Belonging(Option<Belonging>),
    /// Answers [`PeerRequest::Members`].
    Members(BTreeMap<NodeId, ClusterNode>),
    /// Answers a [`PeerRequest::Group`] about a group the node does not host (it may not have
    /// created it yet, or no longer holds a replica of it).
    NoSuchGroup(GroupId),
    /// Answers [`PeerRequest::Abilities`].
    Abilities(Abilities),
    /// Answers [`PeerRequest::Propose`].
    Proposed(Result<Applied, ProposeError>),
    /// Answers [`PeerRequest::ReadIndex`]: the index to have applied before reading.
    ReadIndex(Result<u64, ProposeError>),
    /// Answers [`PeerRequest::Features`]: the names of the features of the node's release.
    Features(Vec<String>),
    /// Answers [`GroupRequest::CommittedMembers`]: from a leader, the group's committed members
    /// (id, addresses, whether it votes); `None` from a node that does not lead, or whose
    /// latest membership is not committed yet.
    CommittedMembers(Option<Vec<(NodeId, ClusterNode, bool)>>),
}

/// Where a node serves clients besides the broker port, as its peers are told.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listeners {
    /// The `HOST:PORT` Kafka's clients are told to reach the node on, if it has a Kafka
    /// listener.
    pub kafka: Option<String>,
}

/// A peer connection's bytes: plain TCP, or TLS over it.
trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send + Sync {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> PeerIo for T {}

type PeerFramed = Framed<Box<dyn PeerIo>, LengthDelimitedCodec>;

/// TLS on the peer port: the certificate a node presents to the peers that connect to it, and
/// the authorities it checks the certificates of the peers it connects to against (each must
/// carry the host of the peer's address). Cheap to clone.
#[derive(Clone)]
pub struct PeerTls {
    acceptor: TlsAcceptor,
    connector: TlsConnector,
}

impl PeerTls {
    /// TLS with `server` for the connections peers open to this node, and `client` for those
    /// it opens to them.
    pub fn new(server: Arc<ServerConfig>, client: Arc<ClientConfig>) -> PeerTls {
        PeerTls {
            acceptor: TlsAcceptor::from(server),
            connector: TlsConnector::from(client),
        }
    }

    /// Runs the client side of the handshake with the peer at `addr` (`HOST:PORT`).
    async fn connect(&self, addr: &str, stream: TcpStream) -> io::Result<Box<dyn PeerIo>> {
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned()).map_err(|error| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} cannot be checked against a certificate: {error}"),
            )
        })?;
        let stream = self.connector.connect(name, stream).await?;
        Ok(Box::new(stream))
    }
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerTls").finish_non_exhaustive()
    }
}

/// The largest hello or welcome frame: until a peer is welcomed, nothing larger is read.
const MAX_HELLO_FRAME: usize = 64 * 1024;

/// A peer connection, reading frames of at most [`MAX_HELLO_FRAME`] until [`welcomed`] lifts
/// that to [`MAX_PEER_FRAME`].
fn framed(stream: Box<dyn PeerIo>) -> PeerFramed {
    Framed::new(
        stream,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_HELLO_FRAME)
            .new_codec(),
    )
}

/// Lets `framed` read frames as large as Raft messages: its hellos were exchanged.
fn welcomed(framed: &mut PeerFramed) {
    framed.codec_mut().set_max_frame_length(MAX_PEER_FRAME);
}

async fn send<T: Serialize>(framed: &mut PeerFramed, message: &T) -> io::Result<()> {
    let bytes = encode(message).map_err(io::Error::other)?;
    framed.send(bytes::Bytes::from(bytes)).await
}

/// The next message, whose lengths may claim at most `LIMIT` bytes in all (a peer's lengths are
/// not trusted: a forged one is refused, not allocated).
async fn receive<T: serde::de::DeserializeOwned, const LIMIT: usize>(
    framed: &mut PeerFramed,
) -> io::Result<T> {
    let frame = framed.next().await.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the connection",
        )
    })??;
    decode_at_most::<T, LIMIT>(&frame)
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))
}

/// Opens links to peers: openraft asks it for one per peer it replicates to or asks for votes.
#[derive(Debug, Clone)]
pub struct Network {
    from: NodeId,
    /// The group whose requests the links carry.
    group: GroupId,
    token: Option<String>,
    tls: Option<PeerTls>,
    reachability: Arc<Reachability>,
}

impl Network {
    /// Links of node `from` that present `token` to their peers, inside `tls` when given, for
    /// the node's first group.
    pub fn new(from: NodeId, token: Option<String>, tls: Option<PeerTls>) -> Network {
        Network {
            from,
            group: FIRST_GROUP,
            token,
            tls,
            reachability: Arc::default(),
        }
    }

    /// The same node's links for group `group`: their own connections, the same peers' state
    /// of reachability.
    pub fn for_group(&self, group: GroupId) -> Network {
        Network {
            group,
            ..self.clone()
        }
    }

    /// The group whose requests the links carry.
    pub fn group(&self) -> GroupId {
        self.group
    }

    /// The peers whose last exchange with this node failed.
    pub fn unreachable(&self) -> HashSet<NodeId> {
        self.reachability.lock().unreachable.clone()
    }

    /// The peers every exchange with has failed for `at_least` (none answered since).
    pub fn unreachable_for(&self, at_least: Duration) -> HashSet<NodeId> {
        self.reachability
            .lock()
            .down_since
            .iter()
            .filter(|(_, since)| since.elapsed() >= at_least)
            .map(|(node, _)| *node)
            .collect()
    }
}

/// Which peers the last exchange with failed, shared by every link of a node: a peer that goes
/// down is logged once (and once more when it answers again), not at every retry. A peer that
/// never answered since this node started (the nodes of a new cluster start one after the
/// other) is no news: said at info, not as a warning.
#[derive(Debug, Default)]
struct Reachability {
    peers: Mutex<Peers>,
}

/// The peers the last exchange with failed, and those that ever answered.
#[derive(Debug, Default)]
struct Peers {
    unreachable: HashSet<NodeId>,
    answered: HashSet<NodeId>,
    /// Since when each unreachable peer's exchanges have failed.
    down_since: HashMap<NodeId, std::time::Instant>,
}

impl Reachability {
    fn failed(&self, target: NodeId, addr: &str, cause: &io::Error) {
        let mut peers = self.lock();
        if !peers.unreachable.insert(target) {
            return;
        }
        peers.down_since.insert(target, std::time::Instant::now());
        match peers.answered.contains(&target) {
            true => tracing::warn!(node = target, %addr, %cause, "a peer is unreachable; retrying"),
            false => {
                tracing::info!(node = target, %addr, %cause, "a peer does not answer yet; retrying");
            }
        }
    }

    fn answered(&self, target: NodeId, addr: &str) {
        let mut peers = self.lock();
        let was_down = peers.unreachable.remove(&target);
        peers.down_since.remove(&target);
        let answered_before = !peers.answered.insert(target);
        match (was_down, answered_before) {
            (true, true) => tracing::info!(node = target, %addr, "a peer answers again"),
            (true, false) => tracing::info!(node = target, %addr, "a peer answers"),
            (false, _) => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Peers> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerLink;

    async fn new_client(&mut self, target: NodeId, node: &ClusterNode) -> PeerLink {
        PeerLink {
            from: self.from,
            group: self.group,
            reachability: Arc::clone(&self.reachability),
            target,
            addr: node.raft_addr.clone(),
            token: self.token.clone(),
            tls: self.tls.clone(),
            connection: None,
        }
    }
}

/// One node's link to one peer: a connection opened on first use and again after any failure.
pub struct PeerLink {
    from: NodeId,
    group: GroupId,
    reachability: Arc<Reachability>,
    target: NodeId,
    addr: String,
    token: Option<String>,
    tls: Option<PeerTls>,
    connection: Option<PeerFramed>,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("from", &self.from)
            .field("group", &self.group)
            .field("target", &self.target)
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .field("connected", &self.connection.is_some())
            .finish_non_exhaustive()
    }
}

impl PeerLink {
    /// Sends `request` and waits for its answer, within `timeout`; on any failure the
    /// connection is dropped, so the next call opens a new one.
    async fn call(&mut self, request: PeerRequest, timeout: Duration) -> io::Result<PeerResponse> {
        let called = tokio::time::timeout(timeout, self.exchange(request)).await;
        let result = called.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "node {} at {} did not answer in {timeout:?}",
                    self.target, self.addr
                ),
            ))
        });
        match &result {
            // A peer that answered that it hosts no such group (yet) is reachable.
            Ok(_) => self.reachability.answered(self.target, &self.addr),
            Err(cause) if cause.kind() == io::ErrorKind::NotFound => {
                self.reachability.answered(self.target, &self.addr);
            }
            Err(cause) => {
                self.reachability.failed(self.target, &self.addr, cause);
                self.connection = None;
            }
        }
        result
    }

    async fn exchange(&mut self, request: PeerRequest) -> io::Result<PeerResponse> {
        let connection = match &mut self.connection {
            Some(connection) => connection,
            None => self.connection.insert(self.connect().await?),
        };
        send(connection, &request.addressed_to(self.group)).await?;
        match receive::<_, MAX_PEER_FRAME>(connection).await? {
            PeerResponse::NoSuchGroup(group) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "node {} at {} hosts no group {group} (yet)",
                    self.target, self.addr
                ),
            )),
            response => Ok(response),
        }
    }

    async fn connect(&self) -> io::Result<PeerFramed> {
        let stream = broker_net::connect(&self.addr).await?;
        stream.set_nodelay(true)?;
        let stream: Box<dyn PeerIo> = match &self.tls {
            None => Box::new(stream),
            Some(tls) => tls.connect(&self.addr, stream).await?,
        };
        let mut connection = framed(stream);
        let hello = PeerHello {
            from: self.from,
            protocol: PROTOCOL.to_owned(),
            token: self.token.clone(),
        };
        send(&mut connection, &hello).await?;
        let welcome: Result<Option<String>, String> =
            receive::<_, MAX_HELLO_FRAME>(&mut connection).await?;
        let refused = |why: String| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("node {} at {}: {why}", self.target, self.addr),
            )
        };
        let their_token = welcome.map_err(|why| refused(format!("refused this node: {why}")))?;
        // Both ways: a node without the cluster's token gets nothing from this one either.
        if !same_token(self.token.as_deref(), their_token.as_deref()) {
            return Err(refused(
                "does not hold this cluster's token (the nodes' auth token)".to_owned(),
            ));
        }
        welcomed(&mut connection);
        Ok(connection)
    }
}

type RpcError<E = openraft::error::Infallible> =
    RPCError<NodeId, ClusterNode, RaftError<NodeId, E>>;

fn unreachable<E: std::error::Error>(error: &io::Error) -> RPCError<NodeId, ClusterNode, E> {
    match error.kind() {
        io::ErrorKind::InvalidData | io::ErrorKind::PermissionDenied => {
            RPCError::Network(NetworkError::new(error))
        }
        _ => RPCError::Unreachable(Unreachable::new(error)),
    }
}

fn mismatched<E: std::error::Error>() -> RPCError<NodeId, ClusterNode, E> {
    RPCError::Network(NetworkError::new(&another_answer()))
}

impl PeerLink {
    /// Sends `request` and takes the answer `pick` finds in the response: a remote refusal, a
    /// response of another kind (a protocol error) or a failed exchange become openraft's
    /// errors.
    async fn ask<T, E: std::error::Error>(
        &mut self,
        request: PeerRequest,
        option: RPCOption,
        pick: impl FnOnce(PeerResponse) -> Option<Result<T, RaftError<NodeId, E>>>,
    ) -> Result<T, RpcError<E>> {
        match self.call(request, option.hard_ttl()).await.map(pick) {
            Ok(Some(answer)) => {
                answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
            }
            Ok(None) => Err(mismatched()),
            Err(error) => Err(unreachable(&error)),
        }
    }
}

/// How long a node waits for a peer's answer to a question of its own (where the peer serves
/// clients, whether this node still belongs, whether it runs before a hand-over).
pub(crate) const PEER_ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// On the leader, the index of the last entry it knows `node` holds; `None` elsewhere, or for
/// a node it has not heard from.
pub(crate) fn matched(
    metrics: &openraft::RaftMetrics<NodeId, ClusterNode>,
    node: NodeId,
) -> Option<u64> {
    metrics
        .replication
        .as_ref()
        .and_then(|replication| replication.get(&node))
        .copied()
        .flatten()
        .map(|matched| matched.index)
}

impl PeerLink {
    /// Asks the peer how far it knows this node's log reaches ([`PeerRequest::Matched`]),
    /// waiting at most `timeout`.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question.
    pub(crate) async fn matched(&mut self, timeout: Duration) -> io::Result<Option<u64>> {
        match self.question(PeerRequest::Matched, timeout).await? {
            PeerResponse::Matched(matched) => Ok(matched),
            _ => Err(another_answer()),
        }
    }

    /// Asks the peer what its release can do ([`PeerRequest::Abilities`]), waiting at most
    /// `timeout`.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question (a node
    /// of an earlier release).
    pub(crate) async fn abilities(&mut self, timeout: Duration) -> io::Result<Abilities> {
        match self.question(PeerRequest::Abilities, timeout).await? {
            PeerResponse::Abilities(abilities) => Ok(abilities),
            _ => Err(another_answer()),
        }
    }

    /// Asks the peer which features its release has ([`PeerRequest::Features`]), waiting at
    /// most `timeout`.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question (a node
    /// of an earlier release).
    pub(crate) async fn features(&mut self, timeout: Duration) -> io::Result<Vec<String>> {
        match self.question(PeerRequest::Features, timeout).await? {
            PeerResponse::Features(features) => Ok(features),
            _ => Err(another_answer()),
        }
    }

    /// Asks the peer where it serves clients besides the broker port
    /// ([`PeerRequest::Listeners`]), waiting at most `timeout`.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question (a node
    /// of an earlier release).
    pub(crate) async fn listeners(&mut self, timeout: Duration) -> io::Result<Listeners> {
        match self.question(PeerRequest::Listeners, timeout).await? {
            PeerResponse::Listeners(listeners) => Ok(listeners),
            _ => Err(another_answer()),
        }
    }

    /// Asks the peer to campaign until it leads ([`PeerRequest::Campaign`]); answers whether
    /// it leads, waiting at most [`CAMPAIGN_WITHIN`] and a second more.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question (a node
    /// of an earlier release).
    pub(crate) async fn campaign(&mut self) -> io::Result<bool> {
        let timeout = CAMPAIGN_WITHIN + Duration::from_secs(1);
        match self.question(PeerRequest::Campaign, timeout).await? {
            PeerResponse::Campaign(leads) => Ok(leads),
            _ => Err(another_answer()),
        }
    }

    /// Asks the peer whether this node belongs to the cluster ([`PeerRequest::Belonging`]),
    /// waiting at most `timeout`: a leader answers with its committed membership.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question (a node
    /// of an earlier release).
    pub(crate) async fn belonging(&mut self, timeout: Duration) -> io::Result<Option<Belonging>> {
        match self.question(PeerRequest::Belonging, timeout).await? {
            PeerResponse::Belonging(told) => Ok(told),
            _ => Err(another_answer()),
        }
    }

    /// Asks the peer which members list it was started with ([`PeerRequest::Members`]),
    /// waiting at most `timeout`.
    ///
    /// # Errors
    /// The peer cannot be reached, refuses this node, or does not know the question (a node
    /// of an earlier release).
    pub(crate) async fn members(
        &mut self,
        timeout: Duration,
    ) -> io::Result<BTreeMap<NodeId, ClusterNode>> {
        match self.question(PeerRequest::Members, timeout).await? {
            PeerResponse::Members(members) => Ok(members),
            _ => Err(another_answer()),
        }
    }

    /// Opens the connection now, unless one is open that the peer has not closed, waiting at
    /// most `timeout`: a request sent
    /// after it succeeded may have reached the peer, one whose connection failed here did not.
    ///
    /// # Errors
    /// The peer cannot be reached in time, or refuses this node.
    pub(crate) async fn open_within(&mut self, timeout: Duration) -> io::Result<()> {
        if let Some(connection) = &mut self.connection {
            // Between questions a kept connection has nothing to read: one that does was closed
            // by the peer (it restarted) or broken, and a question sent on it would fail as if
            // it may have been taken. It is dropped here, where nothing was sent yet.
            if connection.next().now_or_never().is_none() {
                return Ok(());
            }
            self.connection = None;
        }
        let opened = tokio::time::timeout(timeout, self.connect())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no connection in time"))??;
        self.connection = Some(opened);
        Ok(())
    }

    /// Sends a question that is not one of Raft's and waits at most `timeout` for its answer.
    /// Not through `call`: a peer of an earlier release closes the connection on a question it
    /// does not know, which is no sign that it is down. A peer is marked unreachable only when
    /// it cannot be connected to or does not answer in time, and reachable when it answers.
    pub(crate) async fn question(
        &mut self,
        request: PeerRequest,
        timeout: Duration,
    ) -> io::Result<PeerResponse> {
        let asked = tokio::time::timeout(timeout, self.exchange(request)).await;
        let answer = asked
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no answer"))
            .and_then(|answer| answer);
        // A follower hears of the peers it exchanges no entries with through these questions
        // alone (Kafka's metadata leaves out the nodes it cannot reach).
        match &answer {
            // Answered, even that it hosts no such group or with an unexpected answer.
            Ok(_) => self.reachability.answered(self.target, &self.addr),
            Err(cause) => match cause.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::InvalidData => {
                    self.reachability.answered(self.target, &self.addr);
                }
                io::ErrorKind::TimedOut
                | io::ErrorKind::ConnectionRefused
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::AddrNotAvailable => {
                    self.reachability.failed(self.target, &self.addr, cause);
                }
                // A connection closed under the question: a peer that went down is marked at
                // the next question, which cannot connect.
                _ => {}
            },
        }
        if answer.is_err() {
            // Whatever was half sent or half read, the next question starts afresh.
            self.connection = None;
        }
        answer
    }
}

/// The error of a question answered with the answer to another question.
fn another_answer() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "an answer to another request")
}

/// The most bytes of entries one `AppendEntries` carries (unless one entry alone is larger):
/// openraft waits for its answer only a heartbeat interval (150 ms by default), so a larger
/// batch, of large records or of the pieces of a moving topic, might never arrive in time,
/// each try of it outlasting the wait. openraft is told to send fewer entries instead.
const MOST_APPEND_BYTES: usize = 4 * 1024 * 1024;

/// `Some(n)` when `entries` take more than `most` bytes encoded: how many of the first ones to
/// send instead (those within `most`, and at least one).
fn entries_within(entries: &[Entry], most: usize) -> Option<u64> {
    if entries.len() < 2 {
        return None;
    }
    let mut total = 0;
    for (index, entry) in entries.iter().enumerate() {
        total += crate::codec::encoded_len(entry);
        if total > most {
            return Some(index.max(1) as u64);
        }
    }
    None
}

impl RaftNetwork<TypeConfig> for PeerLink {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        if let Some(fitting) = entries_within(&rpc.entries, MOST_APPEND_BYTES) {
            return Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(fitting),
            ));
        }
        self.ask(
            PeerRequest::AppendEntries(rpc),
            option,
            |response| match response {
                PeerResponse::AppendEntries(answer) => Some(answer),
                _ => None,
            },
        )
        .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        self.ask(
            PeerRequest::InstallSnapshot(rpc),
            option,
            |response| match response {
                PeerResponse::InstallSnapshot(answer) => Some(answer),
                _ => None,
            },
        )
        .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        self.ask(PeerRequest::Vote(rpc), option, |response| match response {
            PeerResponse::Vote(answer) => Some(answer),
            _ => None,
        })
        .await
    }
}

/// One group as a node's peers reach it.
#[derive(Clone)]
pub(crate) struct HostedGroup {
    /// Takes the peers' Raft requests, and the changes they forward to this node as the
    /// group's leader.
    pub(crate) core: Arc<GroupCore>,
    /// Notes each leader's entries or snapshot taken.
    pub(crate) contact: Arc<LeaderContact>,
}

/// The Raft groups a node hosts, by id, as its peers reach them.
#[derive(Default)]
pub(crate) struct Groups {
    hosted: std::sync::RwLock<BTreeMap<GroupId, HostedGroup>>,
}

impl Groups {
    /// Hosts `group` from now on (in place of any group of that id).
    pub(crate) fn host(&self, id: GroupId, group: HostedGroup) {
        self.hosted
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, group);
    }

    /// Hosts group `id` no more: its requests are answered [`PeerResponse::NoSuchGroup`].
    pub(crate) fn drop_group(&self, id: GroupId) {
        self.hosted
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Group `id`, if hosted.
    pub(crate) fn get(&self, id: GroupId) -> Option<HostedGroup> {
        self.hosted
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    /// The ids of the groups hosted now.
    pub(crate) fn ids(&self) -> Vec<GroupId> {
        self.hosted
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }
}

/// What a node answers its peers from.
#[derive(Clone)]
pub(crate) struct PeerService {
    /// The groups it hosts.
    pub(crate) groups: Arc<Groups>,
    /// The answer to a question about this node's listeners.
    pub(crate) listeners: Listeners,
    /// The members list this node was started with.
    pub(crate) members: Arc<BTreeMap<NodeId, ClusterNode>>,
    /// See [`crate::ClusterConfig::shared_settings`].
    pub(crate) shared_settings: Arc<Vec<String>>,
    /// See [`crate::ClusterConfig::told_settings`].
    pub(crate) told_settings: Arc<Vec<String>>,
    /// Whether requests that write this node's log or vote are taken yet (a node of a new
    /// cluster first checks the members list); until then a connection that sends one is
    /// closed, and the sender tries again.
    pub(crate) takes_raft: Arc<AtomicBool>,
}

/// Serves peers on `listener` (inside `tls` when given) from `service` until `stop` is
/// cancelled. Connections whose hello does not carry `token` (when there is one) are refused.
pub(crate) async fn serve_peers(
    listener: TcpListener,
    service: PeerService,
    token: Option<String>,
    tls: Option<PeerTls>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let (service, token, stop) = (service.clone(), token.clone(), stop.clone());
                let tls = tls.clone();
                tracker.spawn(async move {
                    let served = serve_peer(stream, &service, token.as_deref(), tls.as_ref());
                    tokio::select! {
                        () = stop.cancelled() => {}
                        ended = served => {
                            if let Err(cause) = ended {
                                tracing::debug!(%peer, %cause, "peer connection closed");
                            }
                        }
                    }
                });
            }
            Err(cause) => {
                tracing::warn!(%cause, "accepting a peer connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_peer(
    stream: TcpStream,
    service: &PeerService,
    token: Option<&str>,
    tls: Option<&PeerTls>,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr()?;
    let no_hello = || io::Error::new(io::ErrorKind::TimedOut, "no hello in time");
    let stream: Box<dyn PeerIo> = match tls {
        None => Box::new(stream),
        Some(tls) => {
            let accepted = tokio::time::timeout(HELLO_TIMEOUT, tls.acceptor.accept(stream))
                .await
                .map_err(|_| no_hello())?;
            match accepted {
                Ok(stream) => Box::new(stream),
                Err(cause) => {
                    tracing::warn!(%peer, %cause, "refusing a peer connection: TLS handshake failed");
                    return Ok(());
                }
            }
        }
    };
    let mut connection = framed(stream);
    let hello: PeerHello = tokio::time::timeout(
        HELLO_TIMEOUT,
        receive::<_, MAX_HELLO_FRAME>(&mut connection),
    )
    .await
    .map_err(|_| no_hello())??;
    // Welcomed with this node's token, so that the peer checks this node too.
    let verdict = check_hello(&hello, token).map(|()| token.map(str::to_owned));
    send(&mut connection, &verdict).await?;
    if let Err(why) = verdict {
        tracing::warn!(%peer, cause = %why, "refusing a peer connection");
        return Ok(());
    }
    welcomed(&mut connection);
    loop {
        let request: PeerRequest = match receive::<_, MAX_PEER_FRAME>(&mut connection).await {
            Ok(request) => request,
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error),
        };
        let response = match request.into_group_request() {
            Err(question) => answer_about_the_node(service, question),
            Ok((_, request))
                if request.writes_raft_state() && !service.takes_raft.load(Ordering::Acquire) =>
            {
                return Ok(());
            }
            Ok((group, request)) => answer(service, hello.from, group, request).await,
        };
        send(&mut connection, &response).await?;
    }
}

/// The answer to `question`, about the node itself.
fn answer_about_the_node(service: &PeerService, question: NodeQuestion) -> PeerResponse {
    match question {
        NodeQuestion::Listeners => PeerResponse::Listeners(service.listeners.clone()),
        NodeQuestion::Abilities => PeerResponse::Abilities(ABILITIES),
        // (The node's shared settings are told with them: `name=value` entries, which no
        // feature's name holds.)
        NodeQuestion::Features => PeerResponse::Features(
            FEATURES
                .iter()
                .map(ToString::to_string)
                .chain(service.shared_settings.iter().cloned())
                .chain(service.told_settings.iter().cloned())
                .collect(),
        ),
        NodeQuestion::Members => PeerResponse::Members(BTreeMap::clone(&service.members)),
    }
}

/// The answer to `request` about group `group` from peer `from`.
async fn answer(
    service: &PeerService,
    from: NodeId,
    group: GroupId,
    request: GroupRequest,
) -> PeerResponse {
    let Some(HostedGroup { core, contact }) = service.groups.get(group) else {
        return PeerResponse::NoSuchGroup(group);
    };
    let raft = &core.raft;
    match request {
        GroupRequest::AppendEntries(rpc) => {
            let answer = raft.append_entries(rpc).await;
            // Refused for its term, it came from a node that no longer leads.
            if matches!(&answer, Ok(taken) if !matches!(taken, AppendEntriesResponse::HigherVote(_)))
            {
                contact.heard();
            }
            PeerResponse::AppendEntries(answer)
        }
        GroupRequest::Vote(rpc) => {
            let refusal = refuses_votes(&raft.metrics().borrow());
            PeerResponse::Vote(match refusal {
                Some(refusal) => Ok(refusal),
                None => raft.vote(rpc).await,
            })
        }
        GroupRequest::InstallSnapshot(rpc) => {
            let sent_by = rpc.vote;
            let answer = raft.install_snapshot(rpc).await;
            // Answered with a higher vote than the sender's, it came from a node that no
            // longer leads.
            if matches!(&answer, Ok(taken) if taken.vote <= sent_by) {
                contact.heard();
            }
            PeerResponse::InstallSnapshot(answer)
        }
        GroupRequest::Matched => PeerResponse::Matched(matched(&raft.metrics().borrow(), from)),
        GroupRequest::Campaign => PeerResponse::Campaign(campaign(raft, group, from).await),
        GroupRequest::Belonging => {
            PeerResponse::Belonging(belonging(&raft.metrics().borrow(), from))
        }
        GroupRequest::Propose(proposal) => {
            let proposal = proposal.at(crate::wall_clock_ms());
            PeerResponse::Proposed(core.propose(proposal).await)
        }
        GroupRequest::ReadIndex => PeerResponse::ReadIndex(core.read_index().await),
        GroupRequest::CommittedMembers => {
            let members = match core.is_leader() {
                true => committed_members(&raft.metrics().borrow()),
                false => None,
            };
            PeerResponse::CommittedMembers(members)
        }
    }
}

/// The refusal of a vote by a node that holds nothing of the group: neither entries nor a
/// snapshot; `None` from any other node, which answers as Raft says. Raft grants a vote to a
/// candidate whose log is at least as complete as the voter's, which an empty log always is,
/// whatever the candidate and whatever the voter's membership: a node that dropped the copy a
/// group gave up (see `data_groups` in the server) would otherwise let a voter that missed
/// the changes since then (a node that was down) win an election with the votes of the nodes
/// it still believes in, and cut committed entries from the others' logs. No election needs
/// such a node: a voter holds at least the membership that made it one (a new group's first
/// voters hold theirs from its start, and a node added is a learner until it caught up).
fn refuses_votes(
    metrics: &openraft::RaftMetrics<NodeId, ClusterNode>,
) -> Option<VoteResponse<NodeId>> {
    let empty = metrics.last_log_index.is_none() && metrics.snapshot.is_none();
    empty.then_some(VoteResponse {
        vote: metrics.vote,
        vote_granted: false,
        last_log_id: None,
    })
}

/// A leader's committed membership, as it tells a node that asks whether it belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Belonging {
    /// The index of the log entry that set the membership.
    pub(crate) index: u64,
    /// Whether the node that asked is a member in it (a voter or a learner).
    pub(crate) member: bool,
}

/// What a node that leads tells `asking` of its committed membership; `None` from a node that
/// does not lead, or whose latest membership is not committed yet.
fn belonging(
    metrics: &openraft::RaftMetrics<NodeId, ClusterNode>,
    asking: NodeId,
) -> Option<Belonging> {
    if metrics.state != openraft::ServerState::Leader {
        return None;
    }
    let index = metrics.membership_config.log_id().as_ref()?.index;
    let applied = metrics.last_applied.as_ref()?.index;
    (index <= applied).then(|| Belonging {
        index,
        member: metrics
            .membership_config
            .membership()
            .get_node(&asking)
            .is_some(),
    })
}

/// Campaigns until this node leads, for at most [`CAMPAIGN_WITHIN`], at the request of the
/// leader `asked_by` handing its leadership over; answers whether it leads. A node that is no
/// voter, or follows another leader, does not campaign (one that knows no leader, its election
/// timer having just run out, does). Each election is given a quarter of
/// the shortest election timeout before the next starts: a voter whose lease had not quite run
/// out refuses the first, and the others' election timers must not run out first.
async fn campaign(raft: &Raft<TypeConfig>, group: GroupId, asked_by: NodeId) -> bool {
    let id = raft.metrics().borrow().id;
    let follows = raft.metrics().borrow().current_leader;
    if follows.is_some_and(|leader| leader != asked_by) {
        tracing::warn!(
            node = asked_by,
            "node {asked_by} asked this node to take the leadership over, but does not lead"
        );
        return false;
    }
    match group {
        FIRST_GROUP => tracing::info!(
            leader = asked_by,
            "node {asked_by} hands its leadership over to this node"
        ),
        group => tracing::info!(
            leader = asked_by,
            group,
            "node {asked_by} hands its leadership of group {group} over to this node"
        ),
    }
    let round_length = Duration::from_millis(raft.config().election_timeout_min / 4);
    let until = tokio::time::Instant::now() + CAMPAIGN_WITHIN;
    let mut metrics = raft.metrics();
    loop {
        {
            let now = metrics.borrow_and_update();
            if now.state == openraft::ServerState::Leader {
                return true;
            }
            // Another node won, or this one is no voter.
            if now
                .current_leader
                .is_some_and(|leader| leader != id && leader != asked_by)
                || !now
                    .membership_config
                    .membership()
                    .voter_ids()
                    .any(|voter| voter == id)
            {
                return false;
            }
        }
        if tokio::time::Instant::now() >= until || raft.trigger().elect().await.is_err() {
            return false;
        }
        // The outcome, or the next round.
        let round = until.min(tokio::time::Instant::now() + round_length);
        while tokio::time::timeout_at(round, metrics.changed())
            .await
            .is_ok_and(|changed| changed.is_ok())
        {
            let now = metrics.borrow_and_update();
            if now.state == openraft::ServerState::Leader {
                return true;
            }
        }
    }
}

fn check_hello(hello: &PeerHello, token: Option<&str>) -> Result<(), String> {
    if hello.protocol != PROTOCOL {
        return Err(format!(
            "this node speaks {PROTOCOL}, not {:?}",
            hello.protocol
        ));
    }
    match token {
        None => Ok(()),
        Some(_) if same_token(token, hello.token.as_deref()) => Ok(()),
        Some(_) => Err(
            "wrong or missing cluster token (the nodes' auth token: --auth-token-file or \
             BROKER_AUTH_TOKEN)"
                .to_owned(),
        ),
    }
}

/// Whether two nodes hold the same token (or both none), compared in constant time.
fn same_token(ours: Option<&str>, theirs: Option<&str>) -> bool {
    match (ours, theirs) {
        (None, None) => true,
        (Some(ours), Some(theirs)) => bool::from(ours.as_bytes().ct_eq(theirs.as_bytes())),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The first group's requests travel as they did before groups, so that nodes of earlier
    /// releases keep replicating with this one; another group's are tagged, with a variant
    /// those releases do not know (they close the connection).
    #[test]
    fn only_requests_of_other_groups_than_the_first_are_tagged() {
        let untagged = encode(&PeerRequest::Campaign.addressed_to(FIRST_GROUP)).unwrap();
        // The variant index (u32, little-endian) of `Campaign`, as earlier releases send it.
        assert_eq!(untagged, 5u32.to_le_bytes());
        let tagged = encode(&PeerRequest::Campaign.addressed_to(7)).unwrap();
        let mut expected = 8u32.to_le_bytes().to_vec();
        expected.extend(7u32.to_le_bytes());
        // `GroupRequest::Campaign`, in that enum's own numbering.
        expected.extend(4u32.to_le_bytes());
        assert_eq!(tagged, expected);
        // Questions about the node itself are never tagged.
        let members = encode(&PeerRequest::Members.addressed_to(7)).unwrap();
        assert_eq!(members, 7u32.to_le_bytes());
        let decoded: PeerRequest = decode_at_most::<_, 1024>(&tagged).unwrap();
        assert!(matches!(
            decoded,
            PeerRequest::Group {
                group: 7,
                request: GroupRequest::Campaign
            }
        ));
    }

    #[test]
    fn a_batch_of_entries_past_its_bytes_is_cut_to_those_within_them() {
        let piece = |piece: u64| Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), piece + 1),
            payload: openraft::EntryPayload::Normal(Proposal::Cluster(
                crate::ClusterChange::Stage {
                    topic: "t".to_owned(),
                    attempt: 1,
                    piece,
                    partition: 0,
                    records: vec![broker_core::image::RecordImage {
                        key: None,
                        payload: vec![7; 1_000].into(),
                        headers: Vec::new(),
                        timestamp_ms: 0,
                    }],
                },
            )),
        };
        let entries: Vec<Entry> = (0..10).map(piece).collect();
        let one = crate::codec::encoded_len(&entries[0]);
        assert!(one > 1_000, "{one}");
        assert_eq!(entries_within(&entries, one * 10), None);
        assert_eq!(entries_within(&entries, one * 3), Some(3));
        // One entry goes alone, however large.
        assert_eq!(entries_within(&entries, 10), Some(1));
        assert_eq!(entries_within(&entries[..1], 10), None);
    }
}
