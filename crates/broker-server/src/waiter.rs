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
use crate::session::ParkedIn;

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
///
/// Once its connection is closing (the peer went away, a write failed, or the server is
/// shutting down) it answers at once with nothing, without trying again: records reserved then
/// could be for a peer that is gone, and would stay in flight to a member that never saw them.
pub(crate) async fn wait(shared: Arc<Shared>, reply_to: ReplyTo, parked: Parked) {
    let Parked {
        correlation_id,
        command,
        mut session,
        acked,
        logged: acks_logged,
        wait,
        permit,
    } = parked;
    let signal = shared.signals.topic(command.topic().unwrap_or_default());
    let deadline = time::sleep_until(Instant::now() + wait);
    tokio::pin!(deadline);
    let nothing = || (Ok(Outcome::Records(Vec::new())), None);
    let (result, logged) = loop {
        // Register interest before retrying, so a signal between the retry and the wait is
        // not lost.
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if reply_to.outgoing.is_closed() {
            // Nobody to answer.
            release(&shared, session);
            return;
        }
        if reply_to.closing.is_cancelled() {
            break nothing();
        }
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
            if !is_empty_records(&result) {
                if let Some(parked) = session.take() {
                    sessions.unpark(parked, now);
                }
            }
            (result, logged)
        });
        if !is_empty_records(&result) {
            break (result, logged);
        }
        tokio::select! {
            _ = reply_to.closing.cancelled() => break nothing(),
            _ = &mut deadline => break nothing(),
            _ = &mut notified => {}
        }
    };
    release(&shared, session);
    // The answer waits until what it reports is durable: the poll that ended the wait and the
    // acknowledgements of an ack-and-poll (applied before it parked). Entries become durable in
    // order, so the later of the two covers both.
    let result = match (logged.max(acks_logged), &shared.journal) {
        (Some(entry), Some(journal)) => match journal.durable(entry).await {
            Ok(()) => result,
            Err(refusal) => Err(refusal),
        },
        _ => result,
    };
    let result = match (result, acked) {
        (Ok(Outcome::Records(records)), Some(acked)) => {
            Ok(Outcome::AckedAndPolled { acked, records })
        }
        (result, _) => result,
    };
    let answer = Outgoing::ready(
        vec![ResponseFrame {
            correlation_id,
            result,
        }],
        vec![permit],
    );
    // A closed writer means the peer is gone; its answer has nowhere to go.
    let _ = reply_to.outgoing.send(answer).await;
}

/// Ends a parked request's claim on its member's session, if it still holds one.
fn release(shared: &Shared, session: Option<ParkedIn>) {
    if let Some(parked) = session {
        shared.broker.with_state(|_| {
            shared.lock_sessions().unpark(parked, Instant::now());
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::{Command, EventBroker};
    use tokio::sync::Semaphore;

    use super::*;
    use crate::dispatch::Parked;
    use crate::Config;

    fn poll() -> Command {
        Command::Poll {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 8,
            max_bytes: None,
        }
    }

    /// A request parked on a connection that is closing answers at once with nothing and
    /// reserves nothing, even with a record waiting: its peer may be gone, and a record
    /// reserved for it would stay in flight to a member that never saw it.
    #[tokio::test]
    async fn a_closing_connection_reserves_nothing() {
        let broker = EventBroker::new(10).unwrap();
        broker.create("t", 1).unwrap();
        broker.join("t", "g", "m").unwrap();
        let shared = Arc::new(Shared::new(broker, None, Config::default()));
        let (outgoing, mut answers) = mpsc::channel(4);
        let closing = CancellationToken::new();
        let reply_to = ReplyTo {
            connection: 1,
            outgoing,
            closing: closing.clone(),
        };
        // The record arrives as the connection closes: the waiter sees both at once.
        shared.broker.publish("t", 0, "late").unwrap();
        closing.cancel();
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let parked = Parked {
            correlation_id: 9,
            command: poll(),
            session: None,
            acked: None,
            logged: None,
            wait: std::time::Duration::from_secs(30),
            permit,
        };
        wait(Arc::clone(&shared), reply_to, parked).await;
        match answers.recv().await.unwrap() {
            Outgoing::Ready(answers) => {
                assert_eq!(answers.responses[0].correlation_id, 9);
                assert_eq!(
                    answers.responses[0].result,
                    Ok(Outcome::Records(Vec::new()))
                );
            }
            Outgoing::Deferred(_) => panic!("a waiting answer is never deferred"),
        }
        let group = &shared.broker.describe().topics[0].groups[0];
        assert_eq!(
            group.partitions[0].in_flight, None,
            "reserved for a closed peer"
        );
    }
}
