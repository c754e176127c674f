//! A node that was removed from the cluster while it was down, or cut off, never receives the
//! entry that removed it. A voter still believes it votes, and campaigns alone, ignored by the
//! others; a learner (a voter is made one first, so a node removed while it runs ends as one)
//! still names the leader it last followed, and sends its clients there, though that node may
//! have stopped leading long ago. Such a node asks its peers whether it still belongs: a voter
//! once it has known no leader for a while, a learner once it has heard from no leader for as
//! long. Only a leader answers, with the membership it has committed: one that does not hold
//! the node and is newer than the membership the node holds proves it was removed (a node
//! being added holds a newer membership than the committed one, so it is never told). The
//! node then stops campaigning, names no leader to its clients, and says so.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use openraft::network::RaftNetworkFactory;
use openraft::{Raft, ServerState};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::contact::LeaderContact;
use crate::network::{Network, PEER_ANSWER_WITHIN};
use crate::types::{ClusterNode, GroupId, NodeId, TypeConfig, FIRST_GROUP};
use crate::Cluster;

/// How long a voter knows no leader, or a learner hears from none, before it asks whether it
/// still belongs.
const LEADERLESS: Duration = Duration::from_secs(5);

/// How often it looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Until `stop` is cancelled: whenever this node (`raft`'s, in group `group`) has been out of
/// touch for [`LEADERLESS`] (a voter that knows no leader, a learner that heard from no
/// leader, as told by `contact`), asks the members it knows whether it still belongs; once a
/// leader proves it was removed, stops its elections, says so, and sets `removed`. From the
/// first group that is for good (a node removed from the cluster is never added again under
/// its id); a further group may take the node again (its copies follow the cluster's nodes),
/// so there the node takes part again once a newer membership holds it.
pub(crate) async fn watch(
    group: GroupId,
    raft: Raft<TypeConfig>,
    mut network: Network,
    contact: Arc<LeaderContact>,
    removed: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let metrics = raft.metrics();
    let mut leaderless_since: Option<Instant> = None;
    let mut asked_at: Option<Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        // The membership this node holds, when it has been out of touch for long enough.
        let asking = {
            let now = metrics.borrow();
            let membership = now.membership_config.membership();
            let leaderless_voter =
                now.current_leader.is_none() && membership.voter_ids().any(|id| id == now.id);
            if !leaderless_voter {
                leaderless_since = None;
            }
            let out_of_touch_since = if leaderless_voter {
                Some(*leaderless_since.get_or_insert_with(Instant::now))
            } else if now.state == ServerState::Learner {
                Some(contact.last())
            } else {
                None
            };
            // Asked again only after another while out of touch.
            let out_of_touch_since =
                out_of_touch_since.map(|since| asked_at.map_or(since, |asked| since.max(asked)));
            if out_of_touch_since.is_none_or(|since| since.elapsed() < LEADERLESS) {
                None
            } else {
                let held = now
                    .membership_config
                    .log_id()
                    .as_ref()
                    .map_or(0, |id| id.index);
                let peers: BTreeMap<NodeId, ClusterNode> = membership
                    .nodes()
                    .filter(|(id, _)| **id != now.id)
                    .map(|(id, node)| (*id, node.clone()))
                    .collect();
                Some((held, peers))
            }
        };
        let Some((held, peers)) = asking else {
            continue;
        };
        for (peer, node) in peers {
            let mut link = network.new_client(peer, &node).await;
            let Ok(Some(told)) = link.belonging(PEER_ANSWER_WITHIN).await else {
                continue;
            };
            if !told.member && told.index > held {
                raft.runtime_config().elect(false);
                removed.store(true, Ordering::SeqCst);
                if group == FIRST_GROUP {
                    tracing::warn!(
                        leader = peer,
                        "this node was removed from the cluster (node {peer}, which leads, \
                         committed a membership without it at entry {}, which a removed node \
                         is not sent): it no longer campaigns and names no leader to its \
                         clients; stop it",
                        told.index
                    );
                    return;
                }
                tracing::info!(
                    group,
                    leader = peer,
                    "this node no longer holds a copy of group {group} (node {peer}, which \
                     leads it, committed a membership without it at entry {})",
                    told.index
                );
                if !taken_again(&raft, told.index, &stop).await {
                    return;
                }
                raft.runtime_config().elect(true);
                removed.store(false, Ordering::SeqCst);
                tracing::info!(group, "this node holds a copy of group {group} again");
                break;
            }
        }
        asked_at = Some(Instant::now());
    }
}

/// Waits until a membership later than entry `left_out_at` holds this node (`raft`'s): true
/// then, false once `stop` is cancelled.
async fn taken_again(raft: &Raft<TypeConfig>, left_out_at: u64, stop: &CancellationToken) -> bool {
    let metrics = raft.metrics();
    loop {
        tokio::select! {
            () = stop.cancelled() => return false,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        let now = metrics.borrow();
        let index = now
            .membership_config
            .log_id()
            .as_ref()
            .map_or(0, |id| id.index);
        if index > left_out_at
            && now
                .membership_config
                .membership()
                .get_node(&now.id)
                .is_some()
        {
            return true;
        }
    }
}

impl Cluster {
    /// Whether this node holds a copy of the group (entries or a snapshot) that the group gave
    /// up: it is no member of the latest membership the node holds (or a leader told it it was
    /// removed), and a node of the cluster that leads the group answers that a membership it
    /// committed, no older than that one, holds no such member. Such a copy is no part of the
    /// group any more: no leader counts it, none sends it entries, and a group that takes the
    /// node again sends it everything anew; it can be dropped (see [`Cluster::shutdown`]).
    /// Always false for the first group (a node removed from the cluster is stopped, never
    /// emptied) and when no leader answers.
    pub async fn holds_given_up_copy(&self) -> bool {
        if self.group == FIRST_GROUP || self.is_member() {
            return false;
        }
        let held = {
            let metrics = self.core.raft.metrics();
            let metrics = metrics.borrow();
            if metrics.last_log_index.is_none() && metrics.snapshot.is_none() {
                return false;
            }
            metrics
                .membership_config
                .log_id()
                .as_ref()
                .map_or(0, |id| id.index)
        };
        let Some(nodes) = self.other_nodes() else {
            return false;
        };
        let told = join_all(nodes.into_iter().map(|(id, node)| async move {
            let mut link = self.network.clone().new_client(id, &node).await;
            link.belonging(PEER_ANSWER_WITHIN).await.ok().flatten()
        }))
        .await;
        // A leader deposed without knowing it tells an older membership: one that took this
        // node again since is newer than the one it holds.
        told.into_iter()
            .flatten()
            .any(|told| !told.member && told.index >= held)
    }
}
