//! Applying requests to the core: a batch of pipelined requests goes in under one lock of the
//! broker, responses come out, and poll, fetch or ack-and-poll requests that found nothing and
//! asked to wait come out as parked requests for the waiter.

use broker_core::{BrokerState, Command, Outcome, PublishRecord};
use broker_proto::{Decoded, ErrorReply, RequestFrame, ResponseFrame};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Duration, Instant};
use tracing::debug;

use crate::durability::{apply_logged, Journal};
use crate::server::Shared;
use crate::session::{MemberRef, ParkedIn, Sessions};
use crate::Config;

/// Wire bytes a record may take in a response beyond its payload, key and topic name.
const RECORD_OVERHEAD: usize = 120;

/// Wire bytes a records response may take besides its records.
const RESPONSE_OVERHEAD: usize = 1024;

/// A poll or fetch (or the poll of an ack-and-poll) that found nothing and will wait for a
/// record.
#[derive(Debug)]
pub(crate) struct Parked {
    /// The request's correlation id.
    pub(crate) correlation_id: u64,
    /// The poll or fetch, retried on every signal of its topic.
    pub(crate) command: Command,
    /// The session of the member it names, which it keeps from expiring while it waits.
    pub(crate) session: Option<ParkedIn>,
    /// For an ack-and-poll, the outcome of its acknowledgements (applied before it parked):
    /// the answer carries them with the records.
    pub(crate) acked: Option<Vec<bool>>,
    /// The log entry of those acknowledgements: the answer waits until it is durable.
    pub(crate) logged: Option<u64>,
    /// How long it may wait at most (already bounded by the server's maximum).
    pub(crate) wait: Duration,
    /// The in-flight permit of the request, released once it is answered.
    pub(crate) permit: OwnedSemaphorePermit,
}

/// What applying one batch produced.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// Responses to write now, in request order.
    pub(crate) responses: Vec<ResponseFrame>,
    /// The permits of the requests answered in `responses`.
    pub(crate) permits: Vec<OwnedSemaphorePermit>,
    /// Requests to hand to the waiter.
    pub(crate) parked: Vec<Parked>,
    /// Topics whose waiters should retry: something there may have become eligible.
    pub(crate) wake: Vec<String>,
    /// Indexes into `responses` of the requests whose changes were logged.
    pub(crate) logged: Vec<usize>,
    /// The last log entry of the batch: its responses wait until it is durable.
    pub(crate) last_entry: Option<u64>,
}

/// Applies a batch of decoded frames, each with its in-flight permit, under one lock of the
/// broker. With `may_wait` false (the connection is closing) nothing is parked.
pub(crate) fn apply_batch(
    shared: &Shared,
    connection: u64,
    frames: Vec<(Decoded<RequestFrame>, OwnedSemaphorePermit)>,
    may_wait: bool,
) -> Applied {
    let now = Instant::now();
    let mut applied = Applied::default();
    shared.broker.with_state(|state| {
        let mut sessions = shared.lock_sessions();
        for (frame, permit) in frames {
            let request = match frame {
                Decoded::Message(request) => request,
                Decoded::Malformed {
                    leading_u64,
                    reason,
                } => {
                    debug!(connection, cause = %reason, "malformed request");
                    applied.responses.push(ResponseFrame {
                        correlation_id: leading_u64.unwrap_or(0),
                        result: Err(ErrorReply::MalformedRequest(reason)),
                    });
                    applied.permits.push(permit);
                    continue;
                }
            };
            let RequestFrame {
                correlation_id,
                max_wait_ms,
                command,
            } = request;
            let command = match prepare(&shared.config, command) {
                Ok(command) => command,
                Err(refusal) => {
                    applied.responses.push(ResponseFrame {
                        correlation_id,
                        result: Err(refusal),
                    });
                    applied.permits.push(permit);
                    continue;
                }
            };
            let wait = Duration::from_millis(max_wait_ms.into()).min(shared.config.max_wait);
            let retry = (may_wait && !wait.is_zero())
                .then(|| retry_of(&command))
                .flatten();
            let (result, logged) = execute(
                state,
                &mut sessions,
                shared.journal.as_ref(),
                connection,
                command,
                now,
                &mut applied.wake,
            );
            if logged.is_some() {
                applied.last_entry = logged;
            }
            match retry {
                Some(command) if is_empty_records(&result) => {
                    let session = MemberRef::of(&command).and_then(|key| sessions.park(key));
                    let acked = match result {
                        Ok(Outcome::AckedAndPolled { acked, .. }) => Some(acked),
                        _ => None,
                    };
                    applied.parked.push(Parked {
                        correlation_id,
                        command,
                        session,
                        acked,
                        logged,
                        wait,
                        permit,
                    });
                }
                _ => {
                    if logged.is_some() {
                        applied.logged.push(applied.responses.len());
                    }
                    applied.responses.push(ResponseFrame {
                        correlation_id,
                        result,
                    });
                    applied.permits.push(permit);
                }
            }
        }
        if let Some(journal) = &shared.journal {
            journal.maybe_snapshot(state);
        }
    });
    applied
}

/// Applies one command with the broker locked (`state`) and the sessions locked: refreshes the
/// member it names, records joins and leaves, logs the change to `journal`, and adds its topic
/// to `wake` (once) when it succeeded and may have made a record eligible for a waiter. Returns
/// the result and the sequence number of its log entry when it was logged.
pub(crate) fn execute(
    state: &mut BrokerState,
    sessions: &mut Sessions,
    journal: Option<&Journal>,
    connection: u64,
    command: Command,
    now: Instant,
    wake: &mut Vec<String>,
) -> (Result<Outcome, ErrorReply>, Option<u64>) {
    // The session is refreshed before the command is moved into the core, so its names are
    // borrowed, not copied; only a join or a leave (rare) needs a key of its own.
    let named = MemberRef::of(&command);
    if let Some(member) = named {
        sessions.touch(member, now);
    }
    let is_join = matches!(command, Command::Join { .. });
    let is_leave = matches!(command, Command::Leave { .. });
    let membership = named.filter(|_| is_join || is_leave).map(MemberRef::to_key);
    let wakes = matches!(
        command,
        Command::Publish { .. }
            | Command::PublishKeyed { .. }
            | Command::PublishBatch { .. }
            | Command::Ack { .. }
            | Command::AckAndPoll { .. }
            | Command::Redeliver { .. }
            | Command::Retry { .. }
            | Command::Join { .. }
            | Command::Leave { .. }
            | Command::Commit { .. }
    );
    // The topic is copied only the first time a batch wakes it (before the command is moved
    // into the core), and taken back if the command fails.
    let added_wake = match command.topic().filter(|_| wakes) {
        Some(topic) if !wake.iter().any(|woken| woken == topic) => {
            wake.push(topic.to_owned());
            true
        }
        _ => false,
    };
    let (result, logged) = apply_logged(state, journal, command);
    if let (Some(key), Ok(_)) = (membership, &result) {
        if is_join {
            sessions.joined(key, connection, now);
        } else {
            sessions.left(key.as_ref());
        }
    }
    if added_wake && result.is_err() {
        wake.pop();
    }
    (result, logged)
}

/// Refuses payloads over the limit and gives polls and fetches a byte budget whose response
/// fits in a frame.
fn prepare(config: &Config, mut command: Command) -> Result<Command, ErrorReply> {
    // The largest record of the request: every record must fit the payload limit.
    let payload_size = match &command {
        Command::Publish { payload, .. } => Some(payload.len()),
        Command::PublishKeyed { key, payload, .. } => {
            Some(payload.len() + key.as_ref().map_or(0, |key| key.len()))
        }
        Command::PublishBatch { records, .. } => records.iter().map(PublishRecord::size).max(),
        _ => None,
    };
    if let Some(size) = payload_size.filter(|&size| size > config.max_payload_bytes) {
        return Err(ErrorReply::TooLarge {
            what: "payload".into(),
            size: size as u64,
            limit: config.max_payload_bytes as u64,
        });
    }
    if let Command::Poll {
        topic,
        max_records,
        max_bytes,
        ..
    }
    | Command::Fetch {
        topic,
        max_records,
        max_bytes,
        ..
    }
    | Command::AckAndPoll {
        topic,
        max_records,
        max_bytes,
        ..
    }
    | Command::Redeliver {
        topic,
        max_records,
        max_bytes,
        ..
    } = &mut command
    {
        let records = usize::try_from(*max_records).unwrap_or(0);
        let per_record = RECORD_OVERHEAD + topic.len();
        let budget = config
            .max_frame_bytes
            .saturating_sub(RESPONSE_OVERHEAD)
            .saturating_sub(records.saturating_mul(per_record)) as u64;
        *max_bytes = Some(max_bytes.map_or(budget, |asked| asked.min(budget)));
    }
    Ok(command)
}

/// The command a request retries while it waits, if it is a kind that waits: a poll or fetch
/// itself, and for an ack-and-poll or a redelivery its poll alone (its acknowledgements or
/// releases were applied once).
fn retry_of(command: &Command) -> Option<Command> {
    match command {
        Command::Poll { .. } | Command::Fetch { .. } => Some(command.clone()),
        Command::AckAndPoll {
            topic,
            group,
            member,
            max_records,
            max_bytes,
            ..
        }
        | Command::Redeliver {
            topic,
            group,
            member,
            max_records,
            max_bytes,
        } => Some(Command::Poll {
            topic: topic.clone(),
            group: group.clone(),
            member: member.clone(),
            max_records: *max_records,
            max_bytes: *max_bytes,
        }),
        _ => None,
    }
}

/// Whether a result is a successful poll, fetch or ack-and-poll that took no record: the kind
/// that waits.
pub(crate) fn is_empty_records(result: &Result<Outcome, ErrorReply>) -> bool {
    matches!(
        result,
        Ok(Outcome::Records(records) | Outcome::AckedAndPolled { records, .. })
            if records.is_empty()
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::Bytes;

    use super::*;

    #[test]
    fn payload_over_the_limit_is_too_large() {
        let config = Config {
            max_payload_bytes: 4,
            ..Config::default()
        };
        let publish = Command::PublishKeyed {
            topic: "t".into(),
            key: Some(Bytes::from_static(b"ab")),
            payload: Bytes::from_static(b"abc"),
        };
        assert_eq!(
            prepare(&config, publish),
            Err(ErrorReply::TooLarge {
                what: "payload".into(),
                size: 5,
                limit: 4
            })
        );
        let publish = Command::Publish {
            topic: "t".into(),
            partition: 0,
            payload: Bytes::from_static(b"abcd"),
        };
        assert!(prepare(&config, publish).is_ok());
    }

    #[test]
    fn poll_budget_fits_a_frame_and_respects_the_client() {
        let config = Config::default();
        let poll = |max_bytes| Command::Poll {
            topic: "topic".into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 10,
            max_bytes,
        };
        let expected =
            (config.max_frame_bytes - RESPONSE_OVERHEAD - 10 * (RECORD_OVERHEAD + 5)) as u64;
        match prepare(&config, poll(None)).unwrap() {
            Command::Poll { max_bytes, .. } => assert_eq!(max_bytes, Some(expected)),
            other => panic!("unexpected {other:?}"),
        }
        match prepare(&config, poll(Some(7))).unwrap() {
            Command::Poll { max_bytes, .. } => assert_eq!(max_bytes, Some(7)),
            other => panic!("unexpected {other:?}"),
        }
    }
}
