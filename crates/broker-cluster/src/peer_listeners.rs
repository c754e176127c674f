//! Where each member serves Kafka's clients: every node knows its own Kafka address (from its
//! settings) and asks its peers for theirs, again and again, so that any node can tell a
//! client every node's address and which one leads. Nothing of it is in the replicated log:
//! a node's addresses are its own settings, and a node that restarts with others is asked again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::network::RaftNetworkFactory;
use openraft::RaftMetrics;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::network::{Listeners, Network, PeerLink, PEER_ANSWER_WITHIN};
use crate::types::{ClusterNode, NodeId};

/// How often a node asks its peers where they serve Kafka's clients.
const ASK_EVERY: Duration = Duration::from_secs(2);

/// How often it asks in its first seconds while some peer has not answered yet (they may be
/// starting too), so that a node that starts lists every node within a moment.
const ASK_SOON: Duration = Duration::from_millis(200);

/// How long after the start a node asks every [`ASK_SOON`] rather than every [`ASK_EVERY`].
const STARTING: Duration = Duration::from_secs(10);

/// The Kafka addresses of the members, as last heard from each.
#[derive(Debug, Default)]
pub(crate) struct KafkaAddresses {
    known: Mutex<BTreeMap<NodeId, String>>,
}

impl KafkaAddresses {
    /// Every member's Kafka address known now: this node's own, and each peer's last answer.
    pub(crate) fn snapshot(&self) -> BTreeMap<NodeId, String> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, known: BTreeMap<NodeId, String>) {
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = known;
    }
}

/// Asks every member of the membership `metrics` shows for its Kafka address every
/// [`ASK_EVERY`] until `stop` is cancelled, recording the answers in `addresses` with `own`
/// (this node's id and listeners). A member that does not answer keeps the address it gave
/// last (it may be restarting); one that left the membership, or answers that it has no Kafka
/// listener, is forgotten.
pub(crate) async fn learn(
    addresses: Arc<KafkaAddresses>,
    mut network: Network,
    metrics: watch::Receiver<RaftMetrics<NodeId, ClusterNode>>,
    own: (NodeId, Listeners),
    stop: CancellationToken,
) {
    let (own_id, own_listeners) = own;
    let started = tokio::time::Instant::now();
    let mut links: BTreeMap<NodeId, (String, PeerLink)> = BTreeMap::new();
    loop {
        let members: BTreeMap<NodeId, ClusterNode> = metrics
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .filter(|(id, _)| **id != own_id)
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        links.retain(|id, (addr, _)| members.get(id).is_some_and(|node| node.raft_addr == *addr));
        for (id, node) in &members {
            if !links.contains_key(id) {
                let link = network.new_client(*id, node).await;
                links.insert(*id, (node.raft_addr.clone(), link));
            }
        }
        let answers = futures::future::join_all(
            links
                .iter_mut()
                .map(|(id, (_, link))| async { (*id, link.listeners(PEER_ANSWER_WITHIN).await) }),
        )
        .await;
        // (No peers yet may be a membership not loaded yet.)
        let everyone_answered =
            !answers.is_empty() && answers.iter().all(|(_, answer)| answer.is_ok());
        let mut known = addresses.snapshot();
        known.retain(|id, _| members.contains_key(id));
        for (id, answer) in answers {
            match answer {
                Ok(Listeners { kafka: Some(kafka) }) => {
                    known.insert(id, kafka);
                }
                Ok(Listeners { kafka: None }) => {
                    known.remove(&id);
                }
                Err(cause) => tracing::trace!(node = id, %cause, "no answer about listeners"),
            }
        }
        match &own_listeners.kafka {
            Some(kafka) => known.insert(own_id, kafka.clone()),
            None => known.remove(&own_id),
        };
        addresses.replace(known);
        let again = match everyone_answered || started.elapsed() > STARTING {
            true => ASK_EVERY,
            false => ASK_SOON,
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(again) => {}
        }
    }
}
