//! A voter that was removed from the cluster while it was down, or cut off, never receives the
//! entry that removed it: it still believes it votes, and campaigns alone, ignored by the
//! others. Such a node asks its peers, once it has known no leader for a while, whether it
//! still belongs. Only a leader answers, with the membership it has committed: one that does
//! not hold the node and is newer than the membership the node holds proves it was removed
//! (a node being added holds a newer membership than the committed one, so it is never told).
//! The node then stops campaigning and says so.

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use openraft::Raft;
use tokio_util::sync::CancellationToken;

use crate::network::Network;
use crate::types::{ClusterNode, NodeId, TypeConfig};

/// How long a voter knows no leader before it asks whether it still belongs.
const LEADERLESS: Duration = Duration::from_secs(5);

/// How often it looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How long it waits for each peer's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(1);

/// Until `stop` is cancelled: whenever this voter (`raft`'s node) has known no leader for
/// [`LEADERLESS`], asks the members it knows whether it still belongs; once a leader proves it
/// was removed, stops its elections for good and says so.
pub(crate) async fn watch(raft: Raft<TypeConfig>, mut network: Network, stop: CancellationToken) {
    let metrics = raft.metrics();
    let mut leaderless_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        let now = metrics.borrow().clone();
        let voter = now
            .membership_config
            .membership()
            .voter_ids()
            .any(|voter| voter == now.id);
        if now.current_leader.is_some() || !voter {
            leaderless_since = None;
            continue;
        }
        let since = *leaderless_since.get_or_insert_with(tokio::time::Instant::now);
        if since.elapsed() < LEADERLESS {
            continue;
        }
        let held = now
            .membership_config
            .log_id()
            .as_ref()
            .map_or(0, |id| id.index);
        let peers: BTreeMap<NodeId, ClusterNode> = now
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != now.id)
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        for (peer, node) in peers {
            let mut link = network.new_client(peer, &node).await;
            let Ok(Some(told)) = link.belonging(ANSWER_WITHIN).await else {
                continue;
            };
            if !told.member && told.index > held {
                raft.runtime_config().elect(false);
                tracing::warn!(
                    leader = peer,
                    "this node was removed from the cluster while it could not hear of it \
                     (node {peer}, which leads, committed a membership without it at entry {}): \
                     it no longer campaigns; stop it",
                    told.index
                );
                return;
            }
        }
        // Asked again after another while without a leader.
        leaderless_since = None;
    }
}
