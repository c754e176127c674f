//! Reaching a group's leader from any node: a proposal forwarded to the leader, and a read
//! index, so that a member which does not lead a group can still change it, or answer about it
//! linearizably from its own copy of the state; and, on a node that holds no replica of a
//! group, the leader its members name.

use std::time::Duration;

use futures::future::join_all;
use openraft::network::RaftNetworkFactory;
use tokio::time::Instant;

use crate::network::{GroupRequest, PeerLink, PeerRequest, PeerResponse};
use crate::types::{Applied, ClusterNode, NodeId, Proposal, FIRST_GROUP};
use crate::{Cluster, ProposeError};

/// How long a node waits for the leader to answer a forwarded proposal: as long as a client
/// would wait for the leader itself.
const FORWARD_WITHIN: Duration = Duration::from_secs(30);

/// How long a node tries to open a connection to the group's leader before it answers as a
/// node that knows no leader.
const LEADER_CONNECT_WITHIN: Duration = Duration::from_secs(1);

/// How long a node waits for the leader's read index, and then to apply up to it.
const READ_INDEX_WITHIN: Duration = Duration::from_secs(10);

/// How long a node that is not a member of a group waits for the nodes it asks to name the
/// group's leader.
const NAME_LEADER_WITHIN: Duration = Duration::from_secs(1);

/// How long the leader a group's members named stays the one a node that is not a member
/// names in turn, before it asks again: a leader elected meanwhile is found by the client that
/// the old one turns away, or at the next lookup.
const NAMED_LEADER_FOR: Duration = Duration::from_secs(2);

/// How long a lookup that found no leader (the group elects) stands before the next asks
/// again: shorter, so that the group's clients learn the new leader soon after its election.
const NO_LEADER_FOR: Duration = Duration::from_millis(250);

/// The leader of a group as its members named it to a node that is not one of them.
#[derive(Debug, Clone)]
pub(crate) struct NamedLeader {
    leader: Option<(NodeId, ClusterNode)>,
    at: Instant,
}

impl NamedLeader {
    /// Whether it still stands (see [`NAMED_LEADER_FOR`] and [`NO_LEADER_FOR`]).
    fn fresh(&self) -> bool {
        let lasts = match self.leader {
            Some(_) => NAMED_LEADER_FOR,
            None => NO_LEADER_FOR,
        };
        self.at.elapsed() < lasts
    }
}

impl Cluster {
    /// The group's leader, found if need be: on a member of the group, the one it knows (see
    /// [`Cluster::leader`]); on a node that hosts the group but holds no replica of it, which
    /// knows none by itself, the one the group's members name when asked (every member of the
    /// node's first group is asked at once; a node leading the group says so, another names
    /// the leader it knows), kept for a moment so that a burst of calls asks once. `None` when
    /// no node asked knows one (an election goes on, or the members cannot be reached).
    pub async fn find_leader(&self) -> Option<(NodeId, ClusterNode)> {
        if self.group == FIRST_GROUP || self.is_member() {
            return self.leader();
        }
        let mut named = self.named_leader.lock().await;
        if let Some(fresh) = named.as_ref().filter(|named| named.fresh()) {
            return fresh.leader.clone();
        }
        let leader = self.ask_members_for_leader().await;
        *named = Some(NamedLeader {
            leader: leader.clone(),
            at: Instant::now(),
        });
        leader
    }

    /// The group's members (id, addresses, whether it votes) as its leader has committed them:
    /// here when this node leads ([`Cluster::committed_members`]), else asked of the leader
    /// through the peer links (the one this node knows, or the one the others name: see
    /// [`Cluster::find_leader`]), so that a node whose copy lags, or that holds none, tells
    /// them as they are. `None` when they cannot be told now (no leader known or answering, or
    /// a membership change not committed yet).
    pub async fn members_at_leader(&self) -> Option<Vec<(NodeId, ClusterNode, bool)>> {
        if self.is_leader() {
            return self.committed_members();
        }
        let request = PeerRequest::Group {
            group: self.group,
            request: GroupRequest::CommittedMembers,
        };
        match self
            .ask_leader(request, NAME_LEADER_WITHIN, "try again")
            .await
        {
            Ok(PeerResponse::CommittedMembers(members)) => members,
            _ => None,
        }
    }

    /// The other nodes of the cluster (the members of this node's first group), with their
    /// addresses; `None` once the first group stopped.
    pub(crate) fn other_nodes(&self) -> Option<Vec<(NodeId, ClusterNode)>> {
        let first = self.node.groups.get(FIRST_GROUP)?;
        let metrics = first.core.raft.metrics();
        let metrics = metrics.borrow();
        let nodes = metrics
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != self.node_id)
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        Some(nodes)
    }

    /// The leader the group's members named when last asked, while it is current and this
    /// node is not a member (see [`Cluster::find_leader`]).
    pub(crate) fn leader_named(&self) -> Option<(NodeId, ClusterNode)> {
        if self.group == FIRST_GROUP || self.is_member() {
            return None;
        }
        let named = self.named_leader.try_lock().ok()?;
        named.as_ref().filter(|named| named.fresh())?.leader.clone()
    }

    /// Asks every other member of the node's first group (every node of the cluster) which
    /// node leads this group: a read index asked of each, which the leader answers and another
    /// member refuses naming the leader it knows. The first node that answers for itself wins,
    /// else the leader named first.
    async fn ask_members_for_leader(&self) -> Option<(NodeId, ClusterNode)> {
        let nodes = self.other_nodes()?;
        let answers = join_all(nodes.into_iter().map(|(id, node)| async move {
            let mut link = self.network.clone().new_client(id, &node).await;
            link.open_within(NAME_LEADER_WITHIN).await.ok()?;
            match link
                .question(PeerRequest::ReadIndex, NAME_LEADER_WITHIN)
                .await
            {
                Ok(PeerResponse::ReadIndex(Ok(_))) => Some((true, (id, node))),
                Ok(PeerResponse::ReadIndex(Err(ProposeError::NotLeader { leader }))) => {
                    leader.map(|leader| (false, leader))
                }
                _ => None,
            }
        }))
        .await;
        let mut named: Vec<(bool, (NodeId, ClusterNode))> = answers.into_iter().flatten().collect();
        // The node that leads, before those that name one.
        named.sort_by_key(|(leads, _)| !*leads);
        named.into_iter().next().map(|(_, leader)| leader)
    }

    /// Proposes `proposal` at the group's leader, wherever it is: here when this node leads,
    /// through the peer port of the leader this node knows otherwise. Answers what applying it
    /// gave there (this node applies it too, later, as every member does).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when this node knows no leader, the one it asked no longer
    /// leads, or it cannot be reached (nothing was proposed; try again once a leader is
    /// known); [`ProposeError::Unavailable`] when the leader did not answer once the proposal
    /// was sent, in which case it may or may not have been applied; otherwise as
    /// [`Cluster::propose`].
    pub async fn propose_via_leader(&self, proposal: Proposal) -> Result<Applied, ProposeError> {
        if self.is_leader() {
            return self.propose(proposal).await;
        }
        match self
            .ask_leader(
                PeerRequest::Propose(proposal),
                FORWARD_WITHIN,
                "the proposal may or may not have been applied",
            )
            .await?
        {
            PeerResponse::Proposed(answer) => answer,
            _ => Err(another_answer()),
        }
    }

    /// Answers once this node has applied every entry the group had committed when the call
    /// began: a read of this node's copy of the group's state after it is linearizable. On the
    /// leader, as [`Cluster::read_barrier`]; elsewhere, the leader is asked for its read index.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when no leader confirmed its leadership (this node knows
    /// none, or the one asked no longer leads); [`ProposeError::Unavailable`] when the leader
    /// did not answer, or this node did not apply up to the read index in time.
    pub async fn read_barrier_anywhere(&self) -> Result<(), ProposeError> {
        if self.is_leader() {
            return self.read_barrier().await;
        }
        if self.group != FIRST_GROUP && !self.is_member() {
            return Err(ProposeError::Unavailable(format!(
                "node {} holds no replica of group {}, so it cannot read the group's state",
                self.node_id, self.group
            )));
        }
        // A read index asked for changes nothing: a leader that did not answer it is as none.
        let asked = self
            .ask_leader(PeerRequest::ReadIndex, READ_INDEX_WITHIN, "try again")
            .await;
        let answer = asked.map_err(|refusal| match refusal {
            ProposeError::Unavailable(_) => ProposeError::NotLeader { leader: None },
            refusal => refusal,
        })?;
        let index = match answer {
            PeerResponse::ReadIndex(answer) => answer?,
            _ => return Err(another_answer()),
        };
        self.core
            .raft
            .wait(Some(READ_INDEX_WITHIN))
            .applied_index_at_least(Some(index), "read index")
            .await
            .map(|_| ())
            .map_err(|error| {
                ProposeError::Unavailable(format!(
                    "this node did not apply the group's log up to entry {index} in time: {error}"
                ))
            })
    }

    /// Sends `request` about this group to the leader this node knows, waiting at most
    /// `within`; `after_timeout` says what a client can make of a request left unanswered.
    async fn ask_leader(
        &self,
        request: PeerRequest,
        within: Duration,
        after_timeout: &str,
    ) -> Result<PeerResponse, ProposeError> {
        let known = self.find_leader().await;
        let Some((leader, node)) = known.filter(|(id, _)| *id != self.node_id) else {
            return Err(ProposeError::NotLeader { leader: None });
        };
        // One link per leader, taken out while in use (a second request at the same time opens
        // another).
        let cached = self.leader_link(leader, &node.raft_addr);
        let mut link = match cached {
            Some(link) => link,
            None => self.network.clone().new_client(leader, &node).await,
        };
        // Not reached, the leader applied nothing: as a node that knows no leader answers.
        if let Err(cause) = link.open_within(LEADER_CONNECT_WITHIN).await {
            tracing::debug!(leader, %cause, "the group's leader cannot be reached");
            return Err(ProposeError::NotLeader { leader: None });
        }
        let answer = link.question(request, within).await;
        if answer.is_ok() {
            self.keep_leader_link(leader, node.raft_addr.clone(), link);
        }
        answer.map_err(|cause| {
            ProposeError::Unavailable(format!(
                "node {leader}, which leads group {}, did not answer at {} ({cause}): \
                 {after_timeout}",
                self.group, node.raft_addr
            ))
        })
    }

    /// The link to `leader` at `addr` kept from an earlier request, if any.
    fn leader_link(&self, leader: NodeId, addr: &str) -> Option<PeerLink> {
        let mut links = self
            .leader_links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match links.remove(&leader) {
            Some((kept_addr, link)) if kept_addr == addr => Some(link),
            _ => None,
        }
    }

    fn keep_leader_link(&self, leader: NodeId, addr: String, link: PeerLink) {
        self.leader_links
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(leader, (addr, link));
    }
}

/// A request answered with the answer to another: a fault of the peer.
fn another_answer() -> ProposeError {
    ProposeError::Unavailable("the leader answered another request".to_owned())
}
