//! Waiting polls and fetches (real-time consumption): a request that found nothing is parked as
//! a task waiting on its topic's signal (`signals`), which every batch that may have made a
//! record eligible there signals. On a signal it looks at the state under the broker's lock,
//! and tries again only when the state says it may now find records (so that a change of a
//! partition it cannot take from, or a record another member holds, costs it one look; in a
//! cluster, no entry); it answers as soon as it gets records, when its wait expires, or at once
//! when its connection closes or the server shuts down. No thread, no busy loop.

use std::sync::Arc;

use broker_core::Outcome;
use broker_proto::ErrorReply;
use tokio::time::{self, Instant};

use crate::answers;
use crate::broker::{read_ahead, storage_reply, BrokerGuard, Executed};
use crate::replicated;
use crate::reply::{Parked, ReplyTo};
use crate::sessions::ParkedIn;
use crate::shared::Shared;

/// Waits for `parked` to get records (or time out, or be told to answer) and sends its answer.
///
/// Once its connection is closing (the peer went away, a write failed, or the server is
/// shutting down) it answers at once with nothing, without trying again: records reserved then
/// could be for a peer that is gone, and would stay in flight to a member that never saw them.
pub(crate) async fn wait(shared: Arc<Shared>, reply_to: ReplyTo, parked: Parked) {
    let Parked {
        correlation_id,
        retry,
        found,
        mut session,
        shard,
        logged: before_logged,
        wait,
        mut permit,
        kind,
    } = parked;
    let signal = shared.signals.topic(retry.topic().unwrap_or_default());
    let deadline = time::sleep_until(Instant::now() + wait);
    tokio::pin!(deadline);
    let (result, logged) = loop {
        // Register interest before retrying, so a signal between the retry and the wait is
        // not lost.
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if reply_to.outgoing.is_closed() {
            // Nobody to answer.
            release(&shared, shard, session);
            return;
        }
        if reply_to.closing.is_cancelled() {
            break (Ok(found), None);
        }
        // Tried again only when the state says it may find records now: one that would find
        // nothing waits for the next change instead (in a cluster, nothing is proposed). On a
        // node that no longer leads the group, tried again: the client is told where to go.
        let leads = shared
            .cluster()
            .is_none_or(|_| shared.group(shard).is_some_and(|group| group.is_leader()));
        let may_deliver = !leads || shared.shards.get(shard).lock().may_deliver(&retry);
        if may_deliver {
            // Room for what this retry may answer (from a native connection): its byte budget is
            // lowered to what it gets.
            let mut attempt = retry.clone();
            if permit.counts_answers() {
                let room = answers::room_for_retry(
                    &shared.config,
                    &reply_to.memory,
                    permit.frame_bytes(),
                    &mut attempt,
                );
                let room = tokio::select! {
                    room = room => room,
                    () = reply_to.closing.cancelled() => break (Ok(found), None),
                    () = &mut deadline => break (Ok(found), None),
                };
                permit.hold_answer_room(room);
                // The connection may have closed while the retry waited for room: a poll applied
                // now would reserve records whose answer nobody reads.
                if reply_to.closing.is_cancelled() || reply_to.outgoing.is_closed() {
                    break (Ok(found), None);
                }
            }
            let cluster = shared.cluster().map(|_| shared.group(shard));
            let Executed { result, entry } = match cluster {
                None => {
                    // Records on disk the retry would take are read first, with the lock let go.
                    let planned = shared.shards.get(shard).lock().cold_reads_of(&attempt);
                    let ahead = match planned {
                        Some(planned) => {
                            let read = read_ahead(vec![planned], shared.metrics.as_deref());
                            let ahead = tokio::select! {
                                mut ahead = read => ahead.pop(),
                                () = reply_to.closing.cancelled() => break (Ok(found), None),
                                () = &mut deadline => break (Ok(found), None),
                            };
                            // As after a wait for room: nobody would read what it reserves.
                            if reply_to.outgoing.is_closed() {
                                break (Ok(found), None);
                            }
                            ahead
                        }
                        None => None,
                    };
                    // A retry that moved a record to its dead-letter topic wakes that topic's
                    // waiters, and its own topic's: this one among them, when the record it
                    // released is gone and the partition's next is eligible.
                    let mut wake = Vec::new();
                    let mut broker = shared.shards.get(shard).lock();
                    let now = Instant::now();
                    let connection = reply_to.connection;
                    let executed = match ahead {
                        Some(ahead) => {
                            broker.execute_with(ahead, attempt, connection, now, &mut wake)
                        }
                        None => broker.execute(attempt, connection, now, &mut wake),
                    };
                    stop_protecting(&mut broker, &executed.result, &mut session, now);
                    drop(broker);
                    shared.signals.wake(&wake);
                    executed
                }
                // A group this node no longer hosts: another node may.
                Some(None) => Executed {
                    result: Err(ErrorReply::NotLeader { leader: None }),
                    entry: None,
                },
                Some(Some(cluster)) => {
                    let retried =
                        replicated::execute_reading_ahead(&shared, shard, &cluster, vec![attempt]);
                    let result = match retried.await {
                        Ok(results) => results.into_iter().next().unwrap_or_else(|| {
                            Err(ErrorReply::Storage("the retry was not answered".to_owned()))
                        }),
                        Err(refusal) => Err(refusal),
                    };
                    let mut broker = shared.shards.get(shard).lock();
                    let now = Instant::now();
                    broker.track_session(&retry, result.is_ok(), reply_to.connection, now);
                    stop_protecting(&mut broker, &result, &mut session, now);
                    Executed {
                        result,
                        entry: None,
                    }
                }
            };
            permit.answer_built(&result);
            match result {
                Ok(outcome) if outcome.found_no_records() => permit.hold_answer_room(None),
                Ok(outcome) => break (Ok(found.after_wait(outcome)), entry),
                Err(refusal) => break (Err(refusal), entry),
            }
        }
        tokio::select! {
            _ = reply_to.closing.cancelled() => break (Ok(found), None),
            _ = &mut deadline => break (Ok(found), None),
            _ = &mut notified => {}
        }
    };
    release(&shared, shard, session);
    // The answer waits until what it reports is durable: the poll that ended the wait and what
    // the request changed before it parked (an ack-and-poll's acknowledgements). Entries become
    // durable in order, so the later of the two covers both.
    let result = match (
        logged.max(before_logged),
        shared.shards.get(shard).journal(),
    ) {
        (Some(entry), Some(journal)) => match journal.durable(entry).await {
            Ok(()) => result,
            Err(error) => Err(storage_reply(error)),
        },
        _ => result,
    };
    reply_to
        .answer_one(
            shared.metrics.as_deref(),
            kind,
            correlation_id,
            result,
            permit,
        )
        .await;
}

/// Ends the parked request's claim on its member's session once `result` ends the wait.
fn stop_protecting(
    broker: &mut BrokerGuard<'_>,
    result: &Result<Outcome, ErrorReply>,
    session: &mut Option<ParkedIn>,
    now: Instant,
) {
    let still_waiting = matches!(result, Ok(outcome) if outcome.found_no_records());
    if !still_waiting {
        if let Some(parked) = session.take() {
            broker.sessions().unpark(parked, now);
        }
    }
}

/// Ends a parked request's claim on its member's session in `shard`, if it still holds one.
fn release(shared: &Shared, shard: usize, session: Option<ParkedIn>) {
    if let Some(parked) = session {
        shared
            .shards
            .get(shard)
            .lock()
            .sessions()
            .unpark(parked, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::{BrokerState, Command, CommandKind, KeyHash, Outcome};
    use tokio::sync::{mpsc, Semaphore};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::broker::Broker;
    use crate::reply::Outgoing;
    use crate::shards::Shards;
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
        let mut state = BrokerState::new(10).unwrap();
        state.create("t", 1, KeyHash::default(), &[]).unwrap();
        state.join("t", "g", "m", None, &[]).unwrap();
        // The record arrives as the connection closes: the waiter sees both at once.
        state.publish("t", 0, "late".into()).unwrap();
        let shards = Shards::single(Broker::new(state, None));
        let shared = Arc::new(Shared::new(shards, Config::default(), None));
        let (outgoing, mut answers) = mpsc::channel(4);
        let closing = CancellationToken::new();
        let reply_to = ReplyTo {
            connection: 1,
            outgoing,
            closing: closing.clone(),
            memory: shared.request_memory.clone(),
        };
        closing.cancel();
        let permit = crate::reply::RequestPermit::new(
            Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
            None,
        );
        let parked = Parked {
            correlation_id: 9,
            retry: poll(),
            found: Outcome::Records(Vec::new()),
            session: None,
            shard: 0,
            logged: None,
            wait: std::time::Duration::from_secs(30),
            permit,
            kind: CommandKind::Poll,
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
        let group = &shared.shards.first().lock().describe().topics[0].groups[0].clone();
        assert_eq!(
            group.partitions[0].in_flight, None,
            "reserved for a closed peer"
        );
    }
}
