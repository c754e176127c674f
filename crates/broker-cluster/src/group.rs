//! One node's part in one group, as everything that answers for it sees it: the consensus
//! engine, and what decides whether this node takes changes now (its lease, a hand-over under
//! way, a removal it was told of). Shared by the group's [`Cluster`](crate::Cluster) handle and
//! the peer port, which takes the changes other nodes forward to this group's leader.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use broker_core::Revision;
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{Raft, RaftMetrics, ServerState};

use crate::types::{Applied, ClusterNode, NodeId, Proposal, TypeConfig};
use crate::ProposeError;

/// See the module's documentation.
pub(crate) struct GroupCore {
    pub(crate) node_id: NodeId,
    pub(crate) raft: Raft<TypeConfig>,
    /// A leader that has heard from no majority for this long acts as a follower that knows no
    /// leader (see [`GroupCore::is_leader`]).
    pub(crate) lease: Duration,
    /// Whether this leader is handing its leadership over
    /// ([`Cluster::transfer_leadership`](crate::Cluster::transfer_leadership)): meanwhile it
    /// takes no change.
    pub(crate) handing_over: AtomicBool,
    /// Whether a leader told this node, which had missed it, that it was removed (it
    /// campaigns no more and names no leader).
    pub(crate) known_removed: Arc<AtomicBool>,
    /// Whether every other member of the group answered that its release applies entries of
    /// [`Revision::NEWEST`] (see [`Cluster::adopt_revision`](crate::Cluster::adopt_revision)),
    /// or this node applied an entry of the group's log written under it (shared with the
    /// state machine, which sets it): the commands and ticks this node proposes as leader
    /// carry that revision from then on.
    pub(crate) revision_known: Arc<AtomicBool>,
}

impl GroupCore {
    /// This node's part (`node_id`) in the group `raft` runs, with a leader lease of `lease`;
    /// `revision_known` is its state machine's [`revision_applied`](
    /// crate::state_machine::StateMachine::revision_applied).
    pub(crate) fn new(
        node_id: NodeId,
        raft: Raft<TypeConfig>,
        lease: Duration,
        revision_known: Arc<AtomicBool>,
    ) -> GroupCore {
        GroupCore {
            node_id,
            raft,
            lease,
            handing_over: AtomicBool::new(false),
            known_removed: Arc::new(AtomicBool::new(false)),
            revision_known,
        }
    }

    /// The revision of the core's rules the commands and ticks this node proposes apply under:
    /// [`Revision::NEWEST`] once every member applies it, [`Revision::Original`] before.
    pub(crate) fn revision(&self) -> Revision {
        match self.revision_known.load(Ordering::Acquire) {
            true => Revision::NEWEST,
            false => Revision::Original,
        }
    }

    /// Appends `proposal` to the log and answers what applying it gave, once a majority has it
    /// and it is applied on this node (the leader).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader (nothing was proposed);
    /// [`ProposeError::Unavailable`] when the node is shutting down or failed.
    pub(crate) async fn propose(&self, proposal: Proposal) -> Result<Applied, ProposeError> {
        if self.is_cut_off() || self.knows_removed() {
            return Err(ProposeError::NotLeader { leader: None });
        }
        // Under the revision every member applies, whatever a forwarding node asked.
        let proposal = proposal.revised(self.revision());
        match self.raft.client_write(proposal).await {
            Ok(written) => Ok(written.data),
            Err(error) => Err(self.write_error(error)),
        }
    }

    /// Answers once this node has confirmed with a majority that it still leads and has
    /// applied everything committed before the call: a read of the state after it is
    /// linearizable.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader, or that no longer leads
    /// or cannot reach a majority; [`ProposeError::Unavailable`] when the node is shutting
    /// down or failed.
    pub(crate) async fn read_barrier(&self) -> Result<(), ProposeError> {
        self.ensure_leader()?;
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(()),
            Err(error) => Err(self.read_error(error)),
        }
    }

    /// On the leader, the index of the last entry committed when asked, once a majority
    /// confirmed that this node still leads: a node that has applied it reads a state at
    /// least as new as any write answered before the call (a read index).
    ///
    /// # Errors
    /// As [`GroupCore::read_barrier`].
    pub(crate) async fn read_index(&self) -> Result<u64, ProposeError> {
        self.ensure_leader()?;
        match self.raft.get_read_log_id().await {
            Ok((read, _)) => Ok(read.map_or(0, |id| id.index)),
            Err(error) => Err(self.read_error(error)),
        }
    }

    /// What a reader is told when the leader could not confirm that it leads.
    fn read_error(
        &self,
        error: RaftError<NodeId, CheckIsLeaderError<NodeId, ClusterNode>>,
    ) -> ProposeError {
        match error {
            RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)) => {
                ProposeError::NotLeader {
                    leader: forward
                        .leader_id
                        .zip(forward.leader_node)
                        .or_else(|| self.leader()),
                }
            }
            // Cut off from a majority: the others may elect another leader meanwhile.
            RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)) => {
                ProposeError::NotLeader { leader: None }
            }
            RaftError::Fatal(fatal) => ProposeError::Unavailable(fatal.to_string()),
        }
    }

    /// `Ok` on the leader; otherwise the refusal that names the leader when this node knows
    /// it (none when this node leads but is cut off from a majority).
    pub(crate) fn ensure_leader(&self) -> Result<(), ProposeError> {
        if self.is_leader() {
            return Ok(());
        }
        let leader = match self.is_cut_off() {
            true => None,
            false => self.leader().filter(|(id, _)| *id != self.node_id),
        };
        Err(ProposeError::NotLeader { leader })
    }

    /// Whether a leader told this node, which had missed it, that it was removed from the
    /// cluster: it campaigns no more, names no leader (its clients look for the cluster
    /// elsewhere), and should be stopped.
    pub(crate) fn knows_removed(&self) -> bool {
        self.known_removed.load(Ordering::SeqCst)
    }

    /// The leader this node knows of, with its addresses.
    pub(crate) fn leader(&self) -> Option<(NodeId, ClusterNode)> {
        if self.knows_removed() {
            return None;
        }
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader?;
        let node = metrics
            .membership_config
            .membership()
            .get_node(&leader)?
            .clone();
        Some((leader, node))
    }

    /// Whether this node is the leader now, and has heard from a majority of the nodes within
    /// its lease (twice the election timeout): a leader cut off from the others cannot commit
    /// anything, and they elect another one meanwhile, so it answers as a follower that knows
    /// no leader, and its clients look for the new one. A leader handing its leadership over
    /// answers so too.
    pub(crate) fn is_leader(&self) -> bool {
        self.leads(&self.raft.metrics().borrow())
    }

    /// [`GroupCore::is_leader`] as `metrics` tell.
    pub(crate) fn leads(&self, metrics: &RaftMetrics<NodeId, ClusterNode>) -> bool {
        metrics.state == ServerState::Leader
            && !self.lease_expired(metrics)
            && !self.handing_over.load(Ordering::SeqCst)
    }

    fn lease_expired(&self, metrics: &RaftMetrics<NodeId, ClusterNode>) -> bool {
        metrics
            .millis_since_quorum_ack
            .is_some_and(|since| u128::from(since) > self.lease.as_millis())
    }

    /// Whether this node leads but has heard from no majority within its lease, or is handing
    /// its leadership over.
    pub(crate) fn is_cut_off(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.state == ServerState::Leader
            && (self.lease_expired(&metrics) || self.handing_over.load(Ordering::SeqCst))
    }

    /// What a client is told when a write through the consensus engine failed.
    pub(crate) fn write_error(
        &self,
        error: RaftError<NodeId, ClientWriteError<NodeId, ClusterNode>>,
    ) -> ProposeError {
        match error {
            RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => {
                let leader = forward.leader_id.zip(forward.leader_node);
                ProposeError::NotLeader {
                    // The vote may not name the leader yet where the metrics already do. A
                    // node that knows it was removed names none.
                    leader: leader
                        .filter(|_| !self.knows_removed())
                        .or_else(|| self.leader()),
                }
            }
            RaftError::APIError(ClientWriteError::ChangeMembershipError(error)) => {
                ProposeError::Refused(error.to_string())
            }
            RaftError::Fatal(fatal) => ProposeError::Unavailable(fatal.to_string()),
        }
    }
}
