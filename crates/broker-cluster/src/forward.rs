//! Reaching a group's leader from any of its members: a proposal forwarded to the leader, and a
//! read index, so that a node which does not lead a group can still change it, or answer about
//! it linearizably from its own copy of the state.

use std::time::Duration;

use openraft::network::RaftNetworkFactory;

use crate::network::{PeerLink, PeerRequest, PeerResponse};
use crate::types::{Applied, NodeId, Proposal};
use crate::{Cluster, ProposeError};

/// How long a node waits for the leader to answer a forwarded proposal: as long as a client
/// would wait for the leader itself.
const FORWARD_WITHIN: Duration = Duration::from_secs(30);

/// How long a node tries to open a connection to the group's leader before it answers as a
/// node that knows no leader.
const LEADER_CONNECT_WITHIN: Duration = Duration::from_secs(1);

/// How long a node waits for the leader's read index, and then to apply up to it.
const READ_INDEX_WITHIN: Duration = Duration::from_secs(10);

impl Cluster {
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
        let Some((leader, node)) = self.leader().filter(|(id, _)| *id != self.node_id) else {
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
