//! The table of requests awaiting their responses, keyed by correlation id, and the rules for
//! matching a response to its caller.

use std::sync::{Mutex, MutexGuard, PoisonError};

use broker_core::Outcome;
use broker_proto::ResponseFrame;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Error;

/// What a waiting caller receives: the outcome, or why there is none.
pub(crate) type Reply = Result<Outcome, Error>;

/// The requests of one connection that are waiting for a response.
///
/// Once closed (the connection died), the table is empty for good: every waiting caller has been
/// told why, and new registrations are refused, so nothing can wait on a dead connection.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    // A std `Mutex`, not tokio's: each critical section is one hash-map insert or remove (or one
    // drain when the connection dies), never spans an `.await`, and must be callable from `Drop`
    // (a cancelled call removes itself). An async mutex would only add overhead.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Hashed with foldhash: the ids are the client's own counter, not chosen by a peer.
    waiting: hashbrown::HashMap<u64, Waiter>,
    /// How many responses the reader handed over from its last read that completed any.
    answered_together: usize,
    closed: Option<String>,
}

/// A call in the table.
#[derive(Debug)]
pub(crate) struct Registered {
    /// Where its outcome comes.
    pub(crate) reply: oneshot::Receiver<Reply>,
    /// No other call waits, and the reader's last read answered at most one: nothing suggests
    /// that other callers, woken by the same read, are about to send with this one.
    pub(crate) alone: bool,
}

/// A caller waiting for a response, and when it stops waiting.
#[derive(Debug)]
struct Waiter {
    sender: oneshot::Sender<Reply>,
    deadline: Instant,
}

impl Pending {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section can panic halfway through changing the map (inserts, removes and
        // a drain), so the state behind a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a caller waiting for the response to `id` until `deadline`, after which
    /// [`Pending::expire`] answers it [`Error::Timeout`].
    ///
    /// Returns the reason the connection closed if it has.
    pub(crate) fn register(&self, id: u64, deadline: Instant) -> Result<Registered, String> {
        let mut state = self.lock();
        if let Some(reason) = &state.closed {
            return Err(reason.clone());
        }
        let (sender, reply) = oneshot::channel();
        state.waiting.insert(id, Waiter { sender, deadline });
        let alone = state.waiting.len() == 1 && state.answered_together <= 1;
        Ok(Registered { reply, alone })
    }

    /// The reader handed over `count` responses (at least one) from its last read.
    pub(crate) fn answered_together(&self, count: usize) {
        self.lock().answered_together = count;
    }

    /// Answers [`Error::Timeout`] to every caller whose deadline is at or before `now`: one
    /// sweep per connection, instead of a timer per call.
    pub(crate) fn expire(&self, now: Instant) {
        let expired: Vec<Waiter> = self
            .lock()
            .waiting
            .extract_if(|_, waiter| waiter.deadline <= now)
            .map(|(_, waiter)| waiter)
            .collect();
        for waiter in expired {
            let _ = waiter.sender.send(Err(Error::Timeout));
        }
    }

    /// Hands `reply` to the caller waiting for `id`; `false` if none is (it gave up).
    pub(crate) fn complete(&self, id: u64, reply: Reply) -> bool {
        let waiter = self.lock().waiting.remove(&id);
        match waiter {
            // A caller that gave up after this removal simply drops the reply.
            Some(waiter) => {
                let _ = waiter.sender.send(reply);
                true
            }
            None => false,
        }
    }

    /// Forgets `id`: its caller stopped waiting (timeout or cancellation).
    pub(crate) fn forget(&self, id: u64) {
        self.lock().waiting.remove(&id);
    }

    /// Matches one response to its caller.
    ///
    /// A response to a caller that gave up is dropped. A response with correlation id 0 is the
    /// server saying it could not read one of this connection's requests (the client never uses
    /// id 0); no caller can be told which, so the connection cannot go on: that is `Err` with the
    /// reason.
    pub(crate) fn dispatch(&self, response: ResponseFrame) -> Result<(), String> {
        if response.correlation_id == 0 {
            return Err(match response.result {
                Err(reply) => format!("the server could not read a request: {reply}"),
                Ok(_) => "the server answered a request the client never sent".to_owned(),
            });
        }
        let reply = response.result.map_err(Error::from_reply);
        if !self.complete(response.correlation_id, reply) {
            tracing::debug!(
                correlation_id = response.correlation_id,
                "response to a call that gave up"
            );
        }
        Ok(())
    }

    /// Closes the table: every waiting caller fails with [`Error::ConnectionLost`] and later
    /// registrations are refused. Only the first reason is kept.
    pub(crate) fn close(&self, reason: &str) {
        let waiting = {
            let mut state = self.lock();
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(reason.to_owned());
            std::mem::take(&mut state.waiting)
        };
        for (_, waiter) in waiting {
            let _ = waiter
                .sender
                .send(Err(Error::ConnectionLost(reason.to_owned())));
        }
    }

    /// Whether the connection closed.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed.is_some()
    }

    /// Why the connection closed, if it has.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.lock().closed.clone()
    }

    /// How many callers are waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().waiting.len()
    }
}

/// Removes a registered call from the table when its caller stops waiting early, so a timed-out
/// or cancelled call leaves nothing behind.
pub(crate) struct Registration<'a> {
    pending: &'a Pending,
    id: u64,
    armed: bool,
}

impl<'a> Registration<'a> {
    /// Guards the registration of `id` in `pending`.
    pub(crate) fn new(pending: &'a Pending, id: u64) -> Self {
        Registration {
            pending,
            id,
            armed: true,
        }
    }

    /// The reply arrived, so the table no longer holds the call.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.pending.forget(self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use broker_core::BrokerError;
    use broker_proto::ErrorReply;

    fn response(id: u64, result: Result<Outcome, ErrorReply>) -> ResponseFrame {
        ResponseFrame {
            correlation_id: id,
            result,
        }
    }

    /// A deadline no test reaches.
    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    #[test]
    fn expire_times_out_exactly_the_calls_past_their_deadline() {
        let pending = Pending::default();
        let now = Instant::now();
        let mut due = pending.register(1, now).unwrap().reply;
        let mut not_due = pending
            .register(2, now + std::time::Duration::from_millis(1))
            .unwrap()
            .reply;
        pending.expire(now);
        assert!(matches!(due.try_recv(), Ok(Err(Error::Timeout))));
        assert!(not_due.try_recv().is_err(), "still waiting");
        assert_eq!(pending.len(), 1);
        assert!(pending.complete(2, Ok(Outcome::Committed)));
        assert!(matches!(not_due.try_recv(), Ok(Ok(Outcome::Committed))));
    }

    #[tokio::test]
    async fn responses_reach_their_callers_in_any_order() {
        let pending = Pending::default();
        let one = pending.register(1, later()).unwrap().reply;
        let two = pending.register(2, later()).unwrap().reply;
        let three = pending.register(3, later()).unwrap().reply;
        pending
            .dispatch(response(3, Ok(Outcome::Offset(30))))
            .unwrap();
        pending
            .dispatch(response(1, Ok(Outcome::Offset(10))))
            .unwrap();
        pending
            .dispatch(response(2, Ok(Outcome::Offset(20))))
            .unwrap();
        assert_eq!(one.await.unwrap().unwrap(), Outcome::Offset(10));
        assert_eq!(two.await.unwrap().unwrap(), Outcome::Offset(20));
        assert_eq!(three.await.unwrap().unwrap(), Outcome::Offset(30));
        assert_eq!(pending.len(), 0);
    }

    #[tokio::test]
    async fn an_error_reply_reaches_its_caller_as_a_typed_error() {
        let pending = Pending::default();
        let call = pending.register(5, later()).unwrap().reply;
        pending
            .dispatch(response(5, Err(ErrorReply::NotAssigned { partition: 2 })))
            .unwrap();
        assert!(matches!(
            call.await.unwrap(),
            Err(Error::Broker(BrokerError::NotAssigned { partition: 2 }))
        ));
    }

    #[test]
    fn a_response_to_a_forgotten_call_is_dropped() {
        let pending = Pending::default();
        let call = pending.register(9, later()).unwrap().reply;
        drop(call);
        pending.forget(9);
        assert_eq!(pending.len(), 0);
        pending
            .dispatch(response(9, Ok(Outcome::Committed)))
            .unwrap();
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn a_response_to_an_unknown_id_changes_nothing() {
        let pending = Pending::default();
        let _call = pending.register(1, later()).unwrap().reply;
        pending
            .dispatch(response(77, Ok(Outcome::Committed)))
            .unwrap();
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn correlation_id_zero_ends_the_connection() {
        let pending = Pending::default();
        let reason = pending
            .dispatch(response(
                0,
                Err(ErrorReply::MalformedRequest("bad tag".into())),
            ))
            .unwrap_err();
        assert!(reason.contains("bad tag"), "{reason}");
    }

    #[tokio::test]
    async fn closing_fails_every_waiting_call_and_refuses_new_ones() {
        let pending = Pending::default();
        let calls: Vec<_> = (1..=3)
            .map(|id| pending.register(id, later()).unwrap().reply)
            .collect();
        pending.close("end of stream");
        pending.close("a later reason is ignored");
        for call in calls {
            assert!(matches!(
                call.await.unwrap(),
                Err(Error::ConnectionLost(reason)) if reason == "end of stream"
            ));
        }
        assert_eq!(pending.register(4, later()).unwrap_err(), "end of stream");
        assert_eq!(pending.closed_reason().as_deref(), Some("end of stream"));
        assert_eq!(pending.len(), 0);
    }

    #[test]
    fn a_dropped_registration_forgets_its_call_and_a_disarmed_one_does_not_need_to() {
        let pending = Pending::default();
        let _receiver = pending.register(1, later()).unwrap().reply;
        drop(Registration::new(&pending, 1));
        assert_eq!(pending.len(), 0);

        let _receiver = pending.register(2, later()).unwrap().reply;
        Registration::new(&pending, 2).disarm();
        assert_eq!(pending.len(), 1);
    }

    #[test]
    fn a_call_is_alone_when_no_other_waits_and_the_last_read_answered_at_most_one() {
        let pending = Pending::default();
        let first = pending.register(1, later()).unwrap();
        assert!(first.alone);
        assert!(
            !pending.register(2, later()).unwrap().alone,
            "another call waits"
        );
        assert!(pending.complete(1, Ok(Outcome::Committed)));
        assert!(pending.complete(2, Ok(Outcome::Committed)));
        // Woken with others by one read: they are likely to send together.
        pending.answered_together(2);
        assert!(!pending.register(3, later()).unwrap().alone);
        assert!(pending.complete(3, Ok(Outcome::Committed)));
        pending.answered_together(1);
        assert!(pending.register(4, later()).unwrap().alone);
    }
}
