//! Time passing: a few times a second the broker's clock advances, so that records past their
//! topic's maximum age leave and deliveries past their group's acknowledgement timeout are
//! released for redelivery even when no request touches them. The core reads no clock; this is
//! where the wall clock enters it (logged, so a replay does the same), and only when it changes
//! something: an idle broker writes nothing.

use std::sync::Arc;

use tokio::time::{self, Duration, MissedTickBehavior};
use tracing::{debug, warn};

use crate::shared::Shared;

/// How often time is let pass: the precision of age retention and acknowledgement timeouts.
pub(crate) const TICK: Duration = Duration::from_millis(250);

/// Advances the broker's clock every [`TICK`] until shutdown, waking the waiters of the topics
/// where something changed.
pub(crate) async fn run(shared: Arc<Shared>) {
    let mut ticks = time::interval(TICK);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if shared.cluster().is_some() {
            // The groups at once: one that cannot commit does not hold back the others' time.
            let ticks = (0..shared.shards.all().len()).filter_map(|shard| {
                let (shared, group) = (&shared, shared.group(shard)?);
                Some(async move { crate::replicated::tick(shared, &group, shard).await })
            });
            futures::future::join_all(ticks).await;
            continue;
        }
        for broker in shared.shards.all() {
            let changed = broker.lock().tick();
            match changed {
                Ok(topics) => {
                    if !topics.is_empty() {
                        debug!(topics = ?topics, "records aged out or deliveries timed out");
                        shared.signals.wake(&topics);
                    }
                }
                Err(cause) => warn!(cause = %cause, "letting time pass failed; trying again"),
            }
        }
    }
}
