//! Waiting polls and fetches (seed 002, real-time consumption): a request that found nothing is
//! parked as a task waiting on its topic's [`Notify`], which every batch that may have made a
//! record eligible there signals. On a signal it retries under the broker's lock; it answers as
//! soon as it gets records, when its wait expires, or at once when its connection closes or the
//! server shuts down. No thread, no busy loop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use broker_core::Outcome;
use broker_proto::ResponseFrame;
use tokio::sync::{mpsc, Notify};
use tokio::time::{self, Instant};
use tokio_util::sync::CancellationToken;

use crate::connection::Outgoing;
use crate::dispatch::{execute, is_empty_records, Parked};
use crate::server::Shared;
use crate::session::MemberKey;

/// One [`Notify`] per topic that has ever had a waiter (topics are never deleted, so this grows
/// no larger than the set of topics).
#[derive(Debug, Default)]
pub(crate) struct Signals {
    topics: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Signals {
    /// The signal of `topic`.
    fn topic(&self, topic: &str) -> Arc<Notify> {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(signal) = topics.get(topic) {
            return Arc::clone(signal);
        }
        let signal = Arc::new(Notify::new());
        topics.insert(topic.to_owned(), Arc::clone(&signal));
        signal
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

/// The parts of a connection a parked request answers through.
#[derive(Debug, Clone)]
pub(crate) struct ReplyTo {
    /// The connection's id, for sessions.
    pub(crate) connection: u64,
    /// The connection's writer.
    pub(crate) outgoing: mpsc::Sender<Outgoing>,
    /// Cancelled when the connection closes or the server shuts down: answer at once.
    pub(crate) closing: CancellationToken,
}

/// Waits for `parked` to get records (or time out, or be told to answer) and sends its answer.
pub(crate) async fn wait(shared: Arc<Shared>, reply_to: ReplyTo, parked: Parked) {
    let Parked {
        correlation_id,
        command,
        acked,
        logged: acks_logged,
        wait,
        permit,
    } = parked;
    let member = MemberKey::of(&command);
    let signal = shared.signals.topic(command.topic().unwrap_or_default());
    let deadline = time::sleep_until(Instant::now() + wait);
    tokio::pin!(deadline);
    let mut answer_now = false;
    let result = loop {
        // Register interest before retrying, so a signal between the retry and the wait is
        // not lost.
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if reply_to.outgoing.is_closed() {
            // Nobody to answer: do not reserve records for a connection that is gone.
            finish(&shared, member.as_ref());
            return;
        }
        let last_try = answer_now;
        let (result, logged) = shared.broker.with_state(|state| {
            let mut sessions = shared.lock_sessions();
            let now = Instant::now();
            // A retried poll wakes nobody.
            let (result, logged) = execute(
                state,
                &mut sessions,
                shared.journal.as_ref(),
                reply_to.connection,
                command.clone(),
                now,
                &mut Vec::new(),
            );
            if last_try || !is_empty_records(&result) {
                if let Some(key) = &member {
                    sessions.unpark(key.as_ref(), now);
                }
            }
            (result, logged)
        });
        if last_try || !is_empty_records(&result) {
            // Entries become durable in order: the later of the two covers both.
            break match (logged.max(acks_logged), &shared.journal) {
                (Some(entry), Some(journal)) => match journal.durable(entry).await {
                    Ok(()) => result,
                    Err(refusal) => Err(refusal),
                },
                _ => result,
            };
        }
        answer_now = tokio::select! {
            _ = reply_to.closing.cancelled() => true,
            _ = &mut deadline => true,
            _ = &mut notified => false,
        };
    };
    let result = match (result, acked) {
        (Ok(Outcome::Records(records)), Some(acked)) => {
            Ok(Outcome::AckedAndPolled { acked, records })
        }
        (result, _) => result,
    };
    let answer = Outgoing {
        responses: vec![ResponseFrame {
            correlation_id,
            result,
        }],
        permits: vec![permit],
    };
    // A closed writer means the peer is gone; its answer has nowhere to go.
    let _ = reply_to.outgoing.send(answer).await;
}

/// Marks a parked request of `member` as no longer waiting.
fn finish(shared: &Shared, member: Option<&MemberKey>) {
    if let Some(key) = member {
        shared.broker.with_state(|_| {
            shared.lock_sessions().unpark(key.as_ref(), Instant::now());
        });
    }
}
