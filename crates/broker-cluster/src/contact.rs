//! When this node last heard from a leader: noted by the peer connections (a leader's entries,
//! heartbeats included, or snapshot taken), read by the watch for a removal this node missed.

use std::sync::{Mutex, PoisonError};

use tokio::time::Instant;

/// When this node last heard from a leader: the last time it took a leader's entries (a
/// heartbeat included) or snapshot.
#[derive(Debug)]
pub(crate) struct LeaderContact(Mutex<Instant>);

impl LeaderContact {
    /// Counts from now: a node that starts has not been out of touch for long yet.
    pub(crate) fn new() -> Self {
        LeaderContact(Mutex::new(Instant::now()))
    }

    /// Notes that a leader was heard from now.
    pub(crate) fn heard(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// When a leader was last heard from (when the node started, before any).
    pub(crate) fn last(&self) -> Instant {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
