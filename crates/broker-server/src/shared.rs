//! What every task of the server shares: the broker, the limits in force, the waiters' signals,
//! and the shutdown token and task tracker.

use std::sync::Arc;

use broker_core::BrokerState;
use broker_storage::Journal;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::broker::Broker;
use crate::metrics::Metrics;
use crate::signals::Signals;
use crate::Config;

/// The server's shared context, one per server, behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The state, sessions and journal.
    pub(crate) broker: Broker,
    /// The limits in force.
    pub(crate) config: Config,
    /// Per-topic signals for waiting requests.
    pub(crate) signals: Signals,
    /// Cancelled when the server shuts down.
    pub(crate) shutdown: CancellationToken,
    /// Every task of the server, so shutdown can wait for them.
    pub(crate) tracker: TaskTracker,
    /// The counters of the metrics endpoint, when it is on.
    pub(crate) metrics: Option<Arc<Metrics>>,
}

impl Shared {
    /// The context of a server serving `state` with `config`, logging to `journal` if there is
    /// one; no session yet; counting in `metrics` if given.
    pub(crate) fn new(
        state: BrokerState,
        journal: Option<Journal>,
        config: Config,
        metrics: Option<Arc<Metrics>>,
    ) -> Shared {
        Shared {
            broker: Broker::new(state, journal),
            config,
            signals: Signals::default(),
            shutdown: CancellationToken::new(),
            tracker: TaskTracker::new(),
            metrics,
        }
    }
}
