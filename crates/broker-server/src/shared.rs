//! What every task of the server shares: the broker's shards, the limits in force, the
//! waiters' signals, and the shutdown token and task tracker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use broker_cluster::Cluster;
use broker_net::RequestMemory;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::arrivals::Arrivals;
use crate::metrics::Metrics;
use crate::shards::Shards;
use crate::signals::Signals;
use crate::Config;

/// The server's shared context, one per server, behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The states, sessions and journals, one per shard (in a cluster, one shard, shared with
    /// the cluster's state machine).
    pub(crate) shards: Shards,
    /// The limits in force.
    pub(crate) config: Config,
    /// Per-topic signals for waiting requests.
    pub(crate) signals: Arc<Signals>,
    /// Cancelled when the server shuts down.
    pub(crate) shutdown: CancellationToken,
    /// Every task of the server, so shutdown can wait for them.
    pub(crate) tracker: TaskTracker,
    /// The counters of the metrics endpoint, when it is on.
    pub(crate) metrics: Option<Arc<Metrics>>,
    /// In a cluster, this node's part in the first group (set once it has started): the
    /// cluster's membership and state, and the topics of that group.
    pub(crate) cluster: OnceLock<Arc<Cluster>>,
    /// In a cluster of several groups (`--cluster-data-groups`), this node's part in each
    /// further group, by shard less one (shard `n` holds group `n + 1`), set once the node
    /// hosts it, and set again when it drops a copy the group gave up (see `data_groups`).
    pub(crate) groups: Vec<RwLock<Option<Arc<Cluster>>>>,
    /// Whether this node leads the first group and has applied every entry committed before
    /// its term: only then is its copy of where each topic lives current (see `data_groups`).
    pub(crate) first_group_current: AtomicBool,
    /// The id the next connection gets (on either listener).
    next_connection: AtomicU64,
    /// What the connections of Kafka's clients (with `--kafka-listen`) share: their consumer
    /// groups' members and generations, and their idempotent producers' positions.
    pub(crate) kafka: broker_kafka::KafkaState,
    /// The bytes of requests read and not yet answered, on both listeners
    /// (`--max-request-memory`).
    pub(crate) request_memory: RequestMemory,
    /// The connections of both listeners that have not said who they are yet.
    pub(crate) arrivals: Arrivals,
}

impl Shared {
    /// The context of a server serving `shards` with `config`; no session yet; counting in
    /// `metrics` if given.
    pub(crate) fn new(shards: Shards, config: Config, metrics: Option<Arc<Metrics>>) -> Shared {
        let kafka = broker_kafka::KafkaState::new(broker_kafka::Coordinator::new(
            config.limits.max_groups_per_topic,
            config.limits.max_members_per_group,
        ));
        let further_groups = match config.cluster {
            Some(_) => shards.all().len().saturating_sub(1),
            None => 0,
        };
        let request_memory = RequestMemory::new(config.max_request_memory);
        Shared {
            request_memory,
            groups: (0..further_groups).map(|_| RwLock::new(None)).collect(),
            first_group_current: AtomicBool::new(false),
            shards,
            config,
            signals: Arc::new(Signals::default()),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            metrics,
            cluster: OnceLock::new(),
            next_connection: AtomicU64::new(1),
            kafka,
            arrivals: Arrivals::default(),
        }
    }

    /// A new connection's id, never given before.
    pub(crate) fn new_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// This node of the cluster (its part in the first group), when the server runs in one.
    pub(crate) fn cluster(&self) -> Option<&Cluster> {
        self.cluster.get().map(Arc::as_ref)
    }

    /// In a cluster, this node's part in the group that holds the topics of `shard`, while it
    /// hosts it.
    pub(crate) fn group(&self, shard: usize) -> Option<Arc<Cluster>> {
        match shard.checked_sub(1) {
            None => self.cluster.get().cloned(),
            Some(further) => self
                .groups
                .get(further)?
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// Makes `hosted` this node's part in the group of `shard` (not the first), in place of the
    /// one it had; the one it had.
    pub(crate) fn set_group(
        &self,
        shard: usize,
        hosted: Option<Arc<Cluster>>,
    ) -> Option<Arc<Cluster>> {
        let slot = self.groups.get(shard.checked_sub(1)?)?;
        std::mem::replace(
            &mut *slot.write().unwrap_or_else(PoisonError::into_inner),
            hosted,
        )
    }

    /// This node's part in each further group it hosts now.
    pub(crate) fn further_groups(&self) -> Vec<Arc<Cluster>> {
        (1..=self.groups.len())
            .filter_map(|shard| self.group(shard))
            .collect()
    }
}
