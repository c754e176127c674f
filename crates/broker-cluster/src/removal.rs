//! A voter that was removed from the cluster while it was down, or cut off, never receives the
//! entry that removed it: it still believes it votes, and campaigns alone, ignored by the
//! others. Such a node asks its peers, once it has known no leader for a while, whether it
//! still belongs. Only a leader answers, with the membership it has committed: one that does
//! not hold the node and is newer than the membership the node holds proves it was removed
//! (a node being added holds a newer membership than the committed one, so it is never told).
//! The node then stops campaigning and says so.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use openraft::Raft;
use tokio_util::sync::CancellationToken;

use crate::network::{Network, PEER_ANSWER_WITHIN};
use crate::types::{ClusterNode, NodeId, TypeConfig};

/// How long a voter knows no leader before it asks whether it still belongs.
const LEADERLESS: Duration = Duration::from_secs(5);

/// How often it looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Until `stop` is cancelled: whenever this voter (`raft`'s node) has known no leader for
/// [`LEADERLESS`], asks the members it knows whether it still belongs; once a leader proves it
/// was removed, stops its elections for good, says so, and sets `removed`.
pub(crate) async fn watch(
    raft: Raft<TypeConfig>,
    mut network: Network,
    removed: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let metrics = raft.metrics();
    let mut leaderless_since: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LOOK_EVERY) => {}
        }
        // The membership this voter holds, when it has known no leader for long enough.
        let asking = {
            let now = metrics.borrow();
            let membership = now.membership_config.membership();
            let leaderless_voter =
                now.current_leader.is_none() && membership.voter_ids().any(|id| id == now.id);
            if !leaderless_voter {
                leaderless_since = None;
                None
            } else if leaderless_since
                .get_or_insert_with(tokio::time::Instant::now)
                .elapsed()
                < LEADERLESS
            {
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
