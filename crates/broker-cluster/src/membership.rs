//! Changing who belongs to the cluster: adding a node (it catches up with the log as a learner,
//! then votes) and removing one. Only the leader changes the membership, one change at a time.

use openraft::network::RaftNetworkFactory;
use std::collections::BTreeSet;
use std::time::Duration;

use openraft::ChangeMembers;
use tokio::time::Instant;

use crate::network::matched;
use crate::types::{shared_address, FIRST_GROUP};
use crate::{Cluster, ClusterNode, NodeId, ProposeError};

/// How long the removal of a voter waits for it to hear that it is a learner now, before it is
/// removed (see [`Cluster::remove_node`]).
const LEARNER_HANDOVER: Duration = Duration::from_secs(5);

impl Cluster {
    /// Adds node `id`, reached at `node`: the leader replicates the log to it as a learner (a
    /// snapshot first when the log it needs is gone), and once it has caught up, makes it a
    /// voter. Answers once it votes; adding a voter again with the same addresses changes
    /// nothing. The new node must have been started to join (`ClusterConfig::join`).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader;
    /// [`ProposeError::Refused`] when `id` is a member at other addresses;
    /// [`ProposeError::Pending`] when the node has not caught up within `wait` (it stays a
    /// learner and keeps catching up: adding it again later makes it a voter), or the change
    /// was not committed within `wait`;
    /// [`ProposeError::Unavailable`] when the node is shutting down or failed.
    pub async fn add_node(
        &self,
        id: NodeId,
        node: ClusterNode,
        wait: Duration,
    ) -> Result<(), ProposeError> {
        self.ensure_leader()?;
        if id == 0 {
            return Err(ProposeError::Refused(
                "node ids start at 1 (0 stands for no node)".to_owned(),
            ));
        }
        if self.votes_already(id, &node)? {
            return Ok(());
        }
        // One deadline for the whole change, so that the answer comes within `wait`.
        let deadline = Instant::now() + wait;
        let _change = self.one_change_at_a_time(deadline, wait).await?;
        self.ensure_leader()?;
        // A change that ran while this one waited may have added it, or given its addresses
        // to another node.
        if self.votes_already(id, &node)? {
            return Ok(());
        }
        // A node that does not answer would stay a learner that never catches up: found out
        // before anything changes.
        let mut link = self.network.clone().new_client(id, &node).await;
        if let Err(cause) = link.listeners(crate::network::PEER_ANSWER_WITHIN).await {
            return Err(ProposeError::Refused(format!(
                "node {id} does not answer at its peer address {} ({cause}): start it first \
                 (with --cluster-join and its own addresses), then add it",
                node.raft_addr
            )));
        }
        // Entries of kinds this node proposed since it started are in the group's log: a
        // node whose release cannot read them would stop at the first. Entries under this
        // release's rules may be there whatever this node proposed (written before a restart,
        // now in a snapshot), and will be once every member applies them: a node must apply
        // them to be added.
        let used: Vec<&str> = [
            (&self.named_commands_known, crate::network::NAMED_COMMANDS),
            (&self.budget_changes_known, crate::network::BUDGET_CHANGES),
        ]
        .into_iter()
        .filter(|(known, _)| known.load(std::sync::atomic::Ordering::Acquire))
        .map(|(_, feature)| feature)
        .chain([crate::network::REVISION_1])
        .collect();
        if !used.is_empty() {
            let told = link
                .features(crate::network::PEER_ANSWER_WITHIN)
                .await
                .unwrap_or_default();
            if let Some(missing) = used
                .iter()
                .find(|used| !told.iter().any(|told| told == *used))
            {
                return Err(ProposeError::Refused(format!(
                    "node {id} does not say that it applies the entries of this group's log \
                     ({missing}): upgrade it to this release or a later one, then add it"
                )));
            }
        }
        let added = within(deadline, wait, self.core.raft.add_learner(id, node, false))
            .await?
            .map_err(|error| self.core.write_error(error))?;
        // Caught up: it holds the entry that made it a learner. (Or this node stopped leading,
        // checked below.)
        if !self
            .wait_until_holds(id, added.log_id.index, deadline)
            .await
        {
            // From the engine's own view: `status` hides how far followers are once this node
            // lost its lease.
            let (matched, last_log_index) = {
                let metrics = self.core.raft.metrics();
                let metrics = metrics.borrow();
                (matched(&metrics, id), metrics.last_log_index)
            };
            return Err(ProposeError::Pending(format!(
                "node {id} has not caught up with the log within {} s (it holds {} of {} \
                 entries): it stays a learner and keeps catching up; is it running, started \
                 to join, and reachable at its peer address? Add it again to make it a voter \
                 once it has caught up, or remove it",
                wait.as_secs(),
                matched.map_or_else(|| "none".to_owned(), |index| (index + 1).to_string()),
                last_log_index.map_or(0, |index| index + 1),
            )));
        }
        self.ensure_leader()?;
        within(
            deadline,
            wait,
            self.core
                .raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false),
        )
        .await?
        .map_err(|error| self.core.write_error(error))?;
        match self.group {
            FIRST_GROUP => tracing::info!(node = id, "node added to the cluster"),
            group => tracing::info!(node = id, group, "node {id} added to group {group}"),
        }
        Ok(())
    }

    /// Removes node `id` from the cluster: it no longer votes, nor receives the log. Answers
    /// once the cluster without it is committed. (A leader that removes itself stops leading
    /// then.)
    ///
    /// Another voter is first made a learner, and given the entry that says so before it is
    /// removed: a voter removed outright may miss the last entry (the leader stops sending to
    /// it once the others have it) and, still a voter as far as it knows, would campaign on
    /// its own for ever. A learner never campaigns. A voter that does not answer (it is
    /// stopped, say) is waited for at most 5 seconds.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] on a node that is not the leader;
    /// [`ProposeError::Refused`] when `id` is not a member or is the last voter;
    /// [`ProposeError::Pending`] when the change was not committed within `wait` (a majority
    /// is missing: it may still be);
    /// [`ProposeError::Unavailable`] when the node is shutting down or failed.
    pub async fn remove_node(&self, id: NodeId, wait: Duration) -> Result<(), ProposeError> {
        self.ensure_leader()?;
        self.leaves_a_reachable_majority(&self.removable(id)?, id)?;
        let deadline = Instant::now() + wait;
        let _change = self.one_change_at_a_time(deadline, wait).await?;
        self.ensure_leader()?;
        // Read again: a change that ran while this one waited may have changed the voters.
        let voters = self.removable(id)?;
        self.leaves_a_reachable_majority(&voters, id)?;
        let removed = BTreeSet::from([id]);
        if voters.contains(&id) {
            if id == self.node_id {
                // The leader holds every entry it writes, and stops leading once the cluster
                // without it is committed: removed outright, it knows.
                let change = ChangeMembers::RemoveVoters(removed);
                within(
                    deadline,
                    wait,
                    self.core.raft.change_membership(change, false),
                )
                .await?
                .map_err(|error| self.core.write_error(error))?;
                self.log_removed(id);
                return Ok(());
            }
            let change = ChangeMembers::RemoveVoters(removed.clone());
            let demoted = within(
                deadline,
                wait,
                self.core.raft.change_membership(change, true),
            )
            .await?
            .map_err(|error| self.core.write_error(error))?;
            let handover = deadline.min(Instant::now() + LEARNER_HANDOVER);
            // One that does not hear of it in time is removed all the same: it is stopped, or cut
            // off.
            if !self
                .wait_until_holds(id, demoted.log_id.index, handover)
                .await
            {
                tracing::warn!(
                    node = id,
                    group = self.group,
                    "node {id} did not hear in time that it no longer votes in group {}; it is \
                     removed all the same (if it runs, it learns so when it asks the group)",
                    self.group
                );
            }
            self.ensure_leader()?;
        }
        let change = ChangeMembers::RemoveNodes(removed);
        within(
            deadline,
            wait,
            self.core.raft.change_membership(change, false),
        )
        .await?
        .map_err(|error| self.core.write_error(error))?;
        self.log_removed(id);
        Ok(())
    }

    /// Says that node `id` left the group (from the first group: the cluster).
    fn log_removed(&self, id: NodeId) {
        match self.group {
            FIRST_GROUP => tracing::info!(node = id, "node removed from the cluster"),
            group => tracing::info!(node = id, group, "node {id} removed from group {group}"),
        }
    }

    /// Whether node `id` votes already at the addresses `node` (adding it again changes
    /// nothing).
    ///
    /// # Errors
    /// [`ProposeError::Refused`] when another node has one of its addresses, or `id` is a
    /// member at other addresses.
    fn votes_already(&self, id: NodeId, node: &ClusterNode) -> Result<bool, ProposeError> {
        let (voters, nodes) = self.membership();
        let others = nodes.iter().filter(|(member, _)| *member != id);
        if let Some((other, addresses)) = shared_address(others.map(|(id, node)| (id, node)), node)
        {
            return Err(ProposeError::Refused(format!(
                "node {other} has one of these addresses already ({addresses}): each node \
                 needs addresses of its own"
            )));
        }
        match nodes.iter().find(|(member, _)| *member == id) {
            Some((_, existing)) if existing != node => Err(ProposeError::Refused(format!(
                "node {id} is already a member, at {existing}: remove it first to give it \
                 other addresses"
            ))),
            Some(_) => Ok(voters.contains(&id)),
            None => Ok(false),
        }
    }

    /// The voters, when node `id` can be removed.
    ///
    /// # Errors
    /// [`ProposeError::Refused`] when `id` is not a member, or is the last voter.
    fn removable(&self, id: NodeId) -> Result<BTreeSet<NodeId>, ProposeError> {
        let (voters, nodes) = self.membership();
        if !nodes.iter().any(|(member, _)| *member == id) {
            return Err(ProposeError::Refused(format!(
                "node {id} is not a member of the cluster (members: {:?})",
                nodes.iter().map(|(member, _)| member).collect::<Vec<_>>()
            )));
        }
        if voters.len() == 1 && voters.contains(&id) {
            return Err(ProposeError::Refused(format!(
                "node {id} is the cluster's last voter: a cluster cannot be left without one"
            )));
        }
        Ok(voters)
    }

    /// Refuses to remove `id` from `voters` when the voters left would not have a majority that
    /// answers this node: the change needs one in the new membership as in the old to be
    /// committed, and until it is, the cluster commits nothing else (it would stop until the
    /// missing voters answer again).
    ///
    /// # Errors
    /// [`ProposeError::Refused`], naming the voters that do not answer.
    fn leaves_a_reachable_majority(
        &self,
        voters: &BTreeSet<NodeId>,
        id: NodeId,
    ) -> Result<(), ProposeError> {
        let unreachable = self.network.unreachable();
        let left: BTreeSet<NodeId> = voters.iter().copied().filter(|&v| v != id).collect();
        let silent: Vec<NodeId> = left
            .iter()
            .copied()
            .filter(|voter| *voter != self.node_id && unreachable.contains(voter))
            .collect();
        let answering = left.len() - silent.len();
        if answering > left.len() / 2 {
            return Ok(());
        }
        Err(ProposeError::Refused(format!(
            "removing node {id} would leave the voters {left:?}, of which node{} {silent:?} \
             do{} not answer: the change needs a majority of them to be committed, and the \
             cluster would commit nothing else until they answer again. Bring {} back first, \
             or remove {} first",
            if silent.len() == 1 { "" } else { "s" },
            if silent.len() == 1 { "es" } else { "" },
            if silent.len() == 1 { "it" } else { "them" },
            if silent.len() == 1 { "it" } else { "them" },
        )))
    }

    /// Waits until node `id` holds the entry at `index`, or this node stops leading (`true`),
    /// or `deadline` comes (`false`).
    async fn wait_until_holds(&self, id: NodeId, index: u64, deadline: Instant) -> bool {
        let node_id = self.node_id;
        self.core
            .raft
            .wait(Some(deadline.saturating_duration_since(Instant::now())))
            .metrics(
                |metrics| {
                    metrics.current_leader != Some(node_id) || matched(metrics, id) >= Some(index)
                },
                "the node holds the entry",
            )
            .await
            .is_ok()
    }

    /// The voters and every member (voters and learners) with its addresses.
    pub(crate) fn membership(&self) -> (BTreeSet<NodeId>, Vec<(NodeId, ClusterNode)>) {
        let metrics = self.core.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let nodes = membership
            .nodes()
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        (membership.voter_ids().collect(), nodes)
    }
}

impl Cluster {
    /// Waits until no other membership change or hand-over runs (until `deadline`), and keeps
    /// others out while the guard lives.
    async fn one_change_at_a_time(
        &self,
        deadline: Instant,
        wait: Duration,
    ) -> Result<tokio::sync::MutexGuard<'_, ()>, ProposeError> {
        tokio::time::timeout_at(deadline, self.changing.lock())
            .await
            .map_err(|_| {
                ProposeError::Refused(format!(
                    "another membership change or a hand-over of the leadership was still under \
                     way after {} s: try again once it is done",
                    wait.as_secs()
                ))
            })
    }
}

/// `change` if it completes by `deadline`, the end of a change given `wait` in all.
async fn within<T>(
    deadline: Instant,
    wait: Duration,
    change: impl std::future::Future<Output = T>,
) -> Result<T, ProposeError> {
    tokio::time::timeout_at(deadline, change)
        .await
        .map_err(|_| {
            ProposeError::Pending(format!(
                "the membership change was not committed within {} s: a majority of the cluster \
             may be unreachable (the change may still be committed later; `broker cluster \
             status` shows the members)",
                wait.as_secs()
            ))
        })
}
