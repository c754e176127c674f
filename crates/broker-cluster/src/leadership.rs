//! Handing leadership over to another voter: the leader stops taking changes, waits until the
//! chosen node holds its whole log, then stops its heartbeats until the others' promise to
//! follow it (the leader lease each voter keeps) has run out, and asks the chosen node to
//! campaign. The chosen node wins the election before any other voter's election timer runs
//! out (those wait a lease plus an election timeout). Nothing committed is at risk: the chosen
//! node holds every entry, and the election is an ordinary Raft election.

use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use openraft::{RaftMetrics, ServerState};
use tokio::time::Instant;

use crate::network::{matched, PEER_ANSWER_WITHIN};
use crate::{Cluster, ClusterNode, NodeId, ProposeError};

/// How long past the end of the voters' leases the leader waits before asking the chosen node
/// to campaign: the last message may have reached them a moment after it was sent (later on a
/// loaded host).
const LEASE_MARGIN: Duration = Duration::from_millis(200);

impl Cluster {
    /// Makes voter `to` the leader: answers once this node follows it. Transferring to the
    /// leader itself changes nothing. Takes about the leader lease (twice the election
    /// timeout) once `to` holds the log; meanwhile this node takes no change and answers as a
    /// node that knows no leader, so that clients wait and find the new one.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader;
    /// [`ProposeError::Refused`] when `to` is not a voter or does not answer (nothing changed),
    /// a membership change or another hand-over is under way, `to` has not caught up with the
    /// log within `wait` (this node leads on), or `to` did not win (the message says whether
    /// this node leads on or an election is under way).
    pub async fn transfer_leadership(
        &self,
        to: NodeId,
        wait: Duration,
    ) -> Result<(), ProposeError> {
        if self.core.handing_over.load(Ordering::SeqCst) {
            return Err(under_way());
        }
        self.ensure_leader()?;
        if to == self.node_id {
            return Ok(());
        }
        let target = self.chosen_voter(to)?;
        let _change = self.changing.try_lock().map_err(|_| under_way())?;
        // A node that does not answer cannot take over: found out before anything stops.
        let mut link = self.network.clone().new_client(to, &target).await;
        if let Err(cause) = link.listeners(PEER_ANSWER_WITHIN).await {
            return Err(ProposeError::Refused(format!(
                "node {to} does not answer at its peer address {} ({cause}): this node leads on",
                target.raft_addr
            )));
        }
        let deadline = Instant::now() + wait;
        let term = self.core.raft.metrics().borrow().current_term;
        let handing_over = HandingOver::start(self);
        self.quiesce(to, term, &handing_over, (deadline, wait))
            .await?;
        let won = link.campaign().await;
        let Ok(true) = won else {
            let why = match won {
                Ok(_) => "it did not win the election".to_owned(),
                Err(cause) => format!("asking it to campaign failed ({cause})"),
            };
            drop(handing_over);
            return Err(ProposeError::Refused(format!(
                "node {to} did not take over: {why}; {}",
                self.who_leads(term)
            )));
        };
        // Answered once this node follows, so that its status names the new leader; or as soon
        // as it is clear that another node leads, this one included (elected again). At least
        // a lease, even when catching up took the whole wait.
        let hear_by = deadline.max(Instant::now() + self.core.lease);
        let settled = self
            .core
            .raft
            .wait(Some(hear_by.saturating_duration_since(Instant::now())))
            .metrics(
                |metrics| metrics.current_leader.is_some() && metrics.current_term > term,
                "this node hears from the new leader",
            )
            .await;
        drop(handing_over);
        match settled.map(|metrics| metrics.current_leader) {
            Ok(Some(leader)) if leader == to => {
                match self.group {
                    crate::FIRST_GROUP => {
                        tracing::info!(node = to, "leadership handed over to node {to}")
                    }
                    group => tracing::info!(
                        node = to,
                        group,
                        "leadership of group {group} handed over to node {to}"
                    ),
                }
                Ok(())
            }
            Ok(_) => Err(ProposeError::Refused(format!(
                "node {to} won an election, but {}",
                self.who_leads(term)
            ))),
            Err(_) => Err(ProposeError::Refused(format!(
                "node {to} won an election, but this node has not heard from it since: `broker \
                 cluster status` shows the leader"
            ))),
        }
    }

    /// Member `to`'s addresses, if it may lead: a voter, and no membership change under way.
    fn chosen_voter(&self, to: NodeId) -> Result<ClusterNode, ProposeError> {
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
        let joint = self
            .core
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_joint_config()
            .len()
            > 1;
        if joint {
            return Err(under_way());
        }
        Ok(target.clone())
    }

    /// Waits until `to` holds this node's whole log, then lets the voters' leases run out with
    /// no message sent, until neither the term (`term`) nor the log moved meanwhile: then every
    /// voter grants a vote to a candidate holding the log.
    async fn quiesce(
        &self,
        to: NodeId,
        term: u64,
        handing_over: &HandingOver<'_>,
        (deadline, wait): (Instant, Duration),
    ) -> Result<(), ProposeError> {
        loop {
            let node_id = self.node_id;
            // With heartbeats on, so that no other voter campaigns meanwhile.
            let caught_up = self
                .core
                .raft
                .wait(Some(deadline.saturating_duration_since(Instant::now())))
                .metrics(
                    |metrics| {
                        metrics.current_leader != Some(node_id)
                            || matched(metrics, to) >= metrics.last_log_index
                    },
                    "the chosen node holds the whole log",
                )
                .await;
            let Ok(before) = caught_up else {
                return Err(ProposeError::Refused(format!(
                    "node {to} has not caught up with the log within {} s: is it running and \
                     reachable at its peer address? This node leads on",
                    wait.as_secs()
                )));
            };
            self.still_leading(term)?;
            handing_over.silence();
            tokio::time::sleep(self.core.lease + LEASE_MARGIN).await;
            let after = self.core.raft.metrics().borrow().clone();
            self.still_leading(term)?;
            if (after.last_log_index, after.last_applied)
                == (before.last_log_index, before.last_applied)
            {
                return Ok(());
            }
            // Entries went out meanwhile (changes proposed just before the hand-over started):
            // they renewed the leases. Again.
            handing_over.resume_heartbeats();
            if Instant::now() >= deadline {
                return Err(ProposeError::Refused(format!(
                    "the log kept moving: node {to} could not be handed the leadership within \
                     {} s; this node leads on",
                    wait.as_secs()
                )));
            }
        }
    }

    /// `Ok` while this node still leads in `term` in the engine's eyes (the hand-over keeps
    /// [`Cluster::is_leader`] false meanwhile).
    fn still_leading(&self, term: u64) -> Result<(), ProposeError> {
        let metrics = self.core.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.state == ServerState::Leader && metrics.current_term == term {
            return Ok(());
        }
        Err(ProposeError::Refused(format!(
            "this node stopped leading during the hand-over (another node campaigned); {}",
            describe_leader(&metrics, self.node_id, term)
        )))
    }

    /// Who leads now, as a hand-over that failed tells it.
    fn who_leads(&self, term: u64) -> String {
        describe_leader(&self.core.raft.metrics().borrow(), self.node_id, term)
    }
}

fn describe_leader(metrics: &RaftMetrics<NodeId, ClusterNode>, this: NodeId, term: u64) -> String {
    match metrics.current_leader {
        Some(leader) if leader == this && metrics.current_term == term => {
            "this node leads on".to_owned()
        }
        Some(leader) if leader == this => "this node was elected again".to_owned(),
        Some(leader) => format!("node {leader} leads now"),
        None => "an election is under way: `broker cluster status` shows its outcome".to_owned(),
    }
}

fn under_way() -> ProposeError {
    ProposeError::Refused(
        "a membership change or another hand-over is under way: try again once it is done"
            .to_owned(),
    )
}

/// While it lives, the leader takes no change; [`HandingOver::silence`] stops its heartbeats
/// too. Dropped (the hand-over done, failed or abandoned), both resume.
struct HandingOver<'a> {
    cluster: &'a Cluster,
}

impl<'a> HandingOver<'a> {
    /// Starts a hand-over; the caller holds `Cluster::changing`, so it is the only one.
    fn start(cluster: &'a Cluster) -> HandingOver<'a> {
        cluster.core.handing_over.store(true, Ordering::SeqCst);
        HandingOver { cluster }
    }

    fn silence(&self) {
        self.cluster.core.raft.runtime_config().heartbeat(false);
    }

    fn resume_heartbeats(&self) {
        self.cluster.core.raft.runtime_config().heartbeat(true);
    }
}

impl Drop for HandingOver<'_> {
    fn drop(&mut self) {
        self.resume_heartbeats();
        self.cluster
            .core
            .handing_over
            .store(false, Ordering::SeqCst);
    }
}
