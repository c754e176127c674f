//! Handing leadership over to another voter: the leader stops taking changes and stops its
//! heartbeats, waits until the chosen node holds its whole log and the others' promise to
//! follow it (the leader lease each voter keeps) has run out, then asks that node to campaign.
//! The chosen node wins the election before any other voter's election timer runs out (those
//! wait a lease plus an election timeout). Nothing committed is at risk: the chosen node holds
//! every entry, and the election is an ordinary Raft election.

use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use tokio::time::Instant;

use crate::{Cluster, NodeId, ProposeError};

/// How long past the end of the voters' leases the leader waits before asking the chosen node
/// to campaign: the last heartbeat may have reached them a moment after it was sent.
const LEASE_MARGIN: Duration = Duration::from_millis(50);

impl Cluster {
    /// Makes voter `to` the leader: answers once this node knows `to` leads. Transferring to
    /// the leader itself changes nothing. Takes about the leader lease (twice the election
    /// timeout); meanwhile this node takes no change and answers as a node that knows no
    /// leader, so that clients wait and find the new one.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader;
    /// [`ProposeError::Refused`] when `to` is not a voter, has not caught up with the log or
    /// did not win within `wait` (this node then leads on as before);
    /// [`ProposeError::Unavailable`] when the node is shutting down or failed.
    pub async fn transfer_leadership(
        &self,
        to: NodeId,
        wait: Duration,
    ) -> Result<(), ProposeError> {
        self.ensure_leader()?;
        if to == self.node_id {
            return Ok(());
        }
        let (voters, nodes) = self.membership();
        let Some((_, target)) = nodes.iter().find(|(id, _)| *id == to) else {
            return Err(ProposeError::Refused(format!(
                "node {to} is not a member of the cluster (members: {:?})",
                nodes.iter().map(|(id, _)| id).collect::<Vec<_>>()
            )));
        };
        if !voters.contains(&to) {
            return Err(ProposeError::Refused(format!(
                "node {to} is a learner: only a voter can lead (add it again once it has caught \
                 up to make it a voter)"
            )));
        }
        let deadline = Instant::now() + wait;
        // (Another hand-over under way: this one waits for the new leader, as clients do.)
        let _handing_over =
            HandingOver::start(self).ok_or(ProposeError::NotLeader { leader: None })?;
        let node_id = self.node_id;
        // It holds everything this node appended (what was proposed before the hand-over
        // started included).
        let caught_up = self
            .raft
            .wait(Some(wait))
            .metrics(
                |metrics| {
                    metrics.current_leader != Some(node_id)
                        || metrics
                            .replication
                            .as_ref()
                            .and_then(|replication| replication.get(&to))
                            .copied()
                            .flatten()
                            .map(|matched| matched.index)
                            >= metrics.last_log_index
                },
                "the chosen node holds the whole log",
            )
            .await;
        if caught_up.is_err() {
            return Err(ProposeError::Refused(format!(
                "node {to} has not caught up with the log within {} s: is it running and \
                 reachable at its peer address? This node leads on",
                wait.as_secs()
            )));
        }
        self.still_leading()?;
        // No heartbeat went out since the hand-over started, and no entry since `to` caught
        // up: once a lease has passed, every voter grants a vote.
        tokio::time::sleep(self.lease + LEASE_MARGIN).await;
        self.still_leading()?;
        let mut link = self.network.clone().new_client(to, target).await;
        let won = link.campaign().await;
        if !matches!(won, Ok(true)) {
            let why = match won {
                Ok(_) => "it did not win the election in time".to_owned(),
                Err(cause) => format!("asking it to campaign failed: {cause}"),
            };
            return Err(ProposeError::Refused(format!(
                "node {to} did not take over: {why}; this node leads on unless another was \
                 elected (`broker cluster status` shows the leader)"
            )));
        }
        // Answered once this node knows it follows, so that its status names the new leader.
        // (The chosen node won either way: one that is slow to say so is no failure.)
        let heard = self
            .raft
            .wait(Some(deadline.saturating_duration_since(Instant::now())))
            .metrics(
                |metrics| metrics.current_leader == Some(to),
                "this node hears from the new leader",
            )
            .await;
        if heard.is_err() {
            tracing::debug!(
                node = to,
                "the new leader won but has not been heard from yet"
            );
        }
        tracing::info!(node = to, "leadership handed over to node {to}");
        Ok(())
    }

    /// `Ok` while this node still leads in the engine's eyes (the hand-over keeps
    /// [`Cluster::is_leader`] false meanwhile).
    fn still_leading(&self) -> Result<(), ProposeError> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.current_leader == Some(self.node_id) {
            return Ok(());
        }
        Err(ProposeError::Refused(
            "this node stopped leading during the hand-over (another node campaigned): `broker \
             cluster status` shows the leader"
                .to_owned(),
        ))
    }
}

/// While it lives, the leader takes no change and sends no heartbeat; dropped (the hand-over
/// done, failed or abandoned), both resume.
struct HandingOver<'a> {
    cluster: &'a Cluster,
}

impl<'a> HandingOver<'a> {
    /// `None` when a hand-over is under way already.
    fn start(cluster: &'a Cluster) -> Option<HandingOver<'a>> {
        cluster
            .handing_over
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        cluster.raft.runtime_config().heartbeat(false);
        Some(HandingOver { cluster })
    }
}

impl Drop for HandingOver<'_> {
    fn drop(&mut self) {
        self.cluster.raft.runtime_config().heartbeat(true);
        self.cluster.handing_over.store(false, Ordering::SeqCst);
    }
}
