//! One signal per topic for waiting requests: every batch that may have made a record
//! eligible on a topic signals it, and every request waiting on the topic tries again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// One [`Notify`] per topic that has ever had a waiter (topics are never deleted, so this grows
/// no larger than the set of topics).
#[derive(Debug, Default)]
pub(crate) struct Signals {
    topics: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Signals {
    /// The signal of `topic`.
    pub(crate) fn topic(&self, topic: &str) -> Arc<Notify> {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = topics.get(topic) {
            return Arc::clone(signal);
        }
        let signal = Arc::new(Notify::new());
        topics.insert(topic.to_owned(), Arc::clone(&signal));
        signal
    }

    /// Wakes every waiting request, whatever its topic.
    pub(crate) fn wake_all(&self) {
        let signals = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in signals.values() {
            signal.notify_waiters();
        }
    }

    /// Wakes every request waiting on one of `topics`.
    pub(crate) fn wake(&self, topics: &[String]) {
        if topics.is_empty() {
            return;
        }
        let signals = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for topic in topics {
            if let Some(signal) = signals.get(topic) {
                signal.notify_waiters();
            }
        }
    }
}
