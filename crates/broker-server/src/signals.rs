//! One signal per topic for waiting requests: every batch that may have made a record
//! eligible on a topic signals it, and every request waiting on the topic looks again (see
//! `waiter`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// Signals kept before those of topics nobody waits on are forgotten.
const KEPT: usize = 1024;

/// One [`Notify`] per topic that has had a waiter. A signal nobody holds (no request waits on
/// its topic) keeps nothing a later waiter needs: such signals are forgotten once there are
/// more than [`KEPT`], so that topics created, waited on and deleted again and again do not
/// grow the map.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    topics: Mutex<Kept>,
}

/// The signals, and how many there may be before the next sweep.
#[derive(Debug, Default)]
struct Kept {
    signals: HashMap<String, Arc<Notify>>,
    sweep_at: usize,
}

impl Signals {
    /// The signal of `topic`.
    pub(crate) fn topic(&self, topic: &str) -> Arc<Notify> {
        let mut kept = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = kept.signals.get(topic) {
            return Arc::clone(signal);
        }
        if kept.signals.len() >= kept.sweep_at.max(KEPT) {
            kept.signals
                .retain(|_, signal| Arc::strong_count(signal) > 1);
            // As many new signals again before the next sweep: a sweep costs each insert
            // little, however many topics have waiters.
            kept.sweep_at = 2 * kept.signals.len();
        }
        let signal = Arc::new(Notify::new());
        kept.signals.insert(topic.to_owned(), Arc::clone(&signal));
        signal
    }

    /// Wakes every waiting request, whatever its topic.
    pub(crate) fn wake_all(&self) {
        let kept = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for signal in kept.signals.values() {
            signal.notify_waiters();
        }
    }

    /// Wakes every request waiting on one of `topics`.
    pub(crate) fn wake(&self, topics: &[String]) {
        if topics.is_empty() {
            return;
        }
        let kept = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        for topic in topics {
            if let Some(signal) = kept.signals.get(topic) {
                signal.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_nobody_holds_are_forgotten_and_held_ones_kept() {
        let signals = Signals::default();
        let held = signals.topic("held");
        for i in 0..3 * KEPT {
            drop(signals.topic(&format!("t{i}")));
        }
        let kept = signals
            .topics
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        assert!(kept.signals.len() <= KEPT + 1, "{}", kept.signals.len());
        assert!(Arc::ptr_eq(&kept.signals["held"], &held));
    }
}
