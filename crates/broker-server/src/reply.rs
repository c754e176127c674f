//! What a request turns into on its way back to the peer: answers to write now, answers to
//! write once their log entries are durable, or a request parked to wait for records; and the
//! parts of a connection an answer goes back through. The reader (`server`), the writer
//! (`connection`), `dispatch` and `waiter` all speak these types, and none of them depends on
//! another for it.

use std::future::Future;
use std::pin::Pin;

use broker_core::{Command, CommandKind, Outcome};
use broker_net::{FrameRoom, RequestMemory};
use broker_proto::{ErrorReply, ResponseFrame};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::sessions::ParkedIn;

/// What a request holds until it is answered: its place among its connection's requests in
/// flight and, for a request read from a native connection, its frame's room in the process's
/// request memory, when its answer carries records the room for that answer, and when its
/// answer grows with the state its connection's one turn for such answers. Dropping it (once
/// the answer is written) gives all of them back.
#[derive(Debug)]
pub(crate) struct RequestPermit {
    _in_flight: OwnedSemaphorePermit,
    room: Option<FrameRoom>,
    /// The connection's turn for an answer that grows with the state
    /// ([`broker_core::CommandKind::answer_grows_with_state`]): one at a time per connection.
    _large_answer: Option<OwnedSemaphorePermit>,
    answer: Option<FrameRoom>,
    /// Whether its answers take room in the request memory: those of native connections,
    /// which pipeline requests; a Kafka connection reads its next request once the last one
    /// is answered.
    counts_answers: bool,
}

impl RequestPermit {
    /// The permit of a request holding `in_flight` and `room`.
    pub(crate) fn new(in_flight: OwnedSemaphorePermit, room: Option<FrameRoom>) -> Self {
        RequestPermit {
            _in_flight: in_flight,
            room,
            _large_answer: None,
            answer: None,
            counts_answers: false,
        }
    }

    /// The bytes of request memory the request's frame holds (none for a frame of at most a
    /// read chunk).
    pub(crate) fn frame_bytes(&self) -> u64 {
        self.room.as_ref().map_or(0, FrameRoom::bytes)
    }

    /// The permit of a request read from a native connection, whose answers take room in the
    /// request memory.
    pub(crate) fn counting_answers(mut self) -> Self {
        self.counts_answers = true;
        self
    }

    /// The permit holding its connection's turn for an answer that grows with the state.
    pub(crate) fn with_large_answer(mut self, turn: OwnedSemaphorePermit) -> Self {
        self._large_answer = Some(turn);
        self
    }

    /// Whether its answers take room in the request memory.
    pub(crate) fn counts_answers(&self) -> bool {
        self.counts_answers
    }

    /// The bytes of room held for the request's answer, if any.
    pub(crate) fn answer_room(&self) -> Option<u64> {
        self.answer.as_ref().map(FrameRoom::bytes)
    }

    /// Holds `room` for the request's answer (replacing any held before).
    pub(crate) fn hold_answer_room(&mut self, room: Option<FrameRoom>) {
        self.answer = room;
    }

    /// Keeps of the answer's room what the answer `result` takes, now that it is built (its
    /// size is worked out only when room is held).
    pub(crate) fn answer_built(&mut self, result: &Result<Outcome, ErrorReply>) {
        if let Some(room) = &mut self.answer {
            room.shrink_to(crate::answers::answer_bytes(result));
        }
    }
}

/// Responses on their way to the peer, with the in-flight permits of the requests they answer:
/// the permits are released once the responses are written, so a peer that does not read
/// stops being read from.
#[derive(Debug)]
pub(crate) struct Answers {
    /// The responses, in the order they are to be written.
    pub(crate) responses: Vec<ResponseFrame>,
    /// One permit per request answered here.
    pub(crate) permits: Vec<RequestPermit>,
}

/// Answers that can be written only once something else has happened (their log entries are
/// durable).
pub(crate) type Deferred = Pin<Box<dyn Future<Output = Answers> + Send>>;

/// What the writer is handed, in the order the connection's answers must go out.
pub(crate) enum Outgoing {
    /// Answers to write now.
    Ready(Answers),
    /// Answers to write once the future resolves; everything queued after them waits too, so
    /// answers to non-waiting requests keep their request order.
    Deferred(Deferred),
}

impl Outgoing {
    /// Answers to write now.
    pub(crate) fn ready(responses: Vec<ResponseFrame>, permits: Vec<RequestPermit>) -> Self {
        Outgoing::Ready(Answers { responses, permits })
    }
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outgoing::Ready(answers) => f.debug_tuple("Ready").field(answers).finish(),
            Outgoing::Deferred(_) => f.write_str("Deferred"),
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
    /// The request memory as the connection takes from it (its share, on the broker's port).
    pub(crate) memory: RequestMemory,
}

impl ReplyTo {
    /// Answers one request apart from its batch (a wait that ended, a command about the
    /// cluster): counts it in `metrics`, when they are on, and hands it to the connection's
    /// writer.
    pub(crate) async fn answer_one(
        &self,
        metrics: Option<&Metrics>,
        kind: CommandKind,
        correlation_id: u64,
        result: Result<Outcome, ErrorReply>,
        permit: RequestPermit,
    ) {
        if let Some(metrics) = metrics {
            metrics.answered([(Some(kind), &result)], None);
        }
        let answer = Outgoing::ready(
            vec![ResponseFrame {
                correlation_id,
                result,
            }],
            vec![permit],
        );
        // A closed writer means the peer is gone; its answer has nowhere to go.
        let _ = self.outgoing.send(answer).await;
    }
}

/// A request that found no record and waits for one.
#[derive(Debug)]
pub(crate) struct Parked {
    /// The request's correlation id.
    pub(crate) correlation_id: u64,
    /// The poll or fetch retried on every signal of its topic.
    pub(crate) retry: Command,
    /// What the request answered before it waited (records empty): the answer is this with
    /// the records the wait found (an ack-and-poll keeps its acknowledgements' results).
    pub(crate) found: Outcome,
    /// The session of the member it names, which it keeps from expiring while it waits.
    pub(crate) session: Option<ParkedIn>,
    /// The shard of its topic: where it retries, and whose log `logged` is of.
    pub(crate) shard: usize,
    /// The log entry of what it changed before it parked: the answer waits until it is
    /// durable.
    pub(crate) logged: Option<u64>,
    /// How long it may wait at most (already bounded by the server's maximum).
    pub(crate) wait: Duration,
    /// The in-flight permit of the request, released once it is answered.
    pub(crate) permit: RequestPermit,
    /// The kind of the request as it came (an ack-and-poll retries as a poll): for the
    /// metrics.
    pub(crate) kind: CommandKind,
}
