//! Applying requests to the broker: a batch of pipelined requests goes in under one lock of the
//! broker (one per run of requests to the same shard; a delivery whose records are on disk
//! lets it go while they are read), responses come out (held back until their log entries are
//! durable), and requests that found no record and asked to wait come out as parked requests
//! for the waiter.

use std::sync::Arc;

use crate::reply::RequestPermit;
use broker_core::{BrokerError, ColdReads, Command, CommandKind, Outcome, PendingRead, ReadAhead};
use broker_proto::{Decoded, ErrorReply, RequestFrame, ResponseFrame};
use tokio::time::{Duration, Instant};
use tracing::{debug, error};

use crate::answers::fit_answer;
use crate::broker::{storage_reply, BrokerGuard, Executed};
use crate::cluster_admin::{is_about_the_cluster, ClusterRequest};
use crate::data_groups::{self, GroupRoute};
use crate::metrics::Metrics;
use crate::replicated;
use crate::reply::{Answers, Deferred, Parked};
use crate::shards::{self, Route, Shards};
use crate::shared::Shared;
use crate::Config;

/// What applying one batch produced.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// Responses to write, in request order.
    pub(crate) responses: Vec<ResponseFrame>,
    /// The permits of the requests answered in `responses`.
    pub(crate) permits: Vec<RequestPermit>,
    /// Requests to hand to the waiter.
    pub(crate) parked: Vec<Parked>,
    /// Topics whose waiters should retry: something there may have become eligible.
    pub(crate) wake: Vec<String>,
    /// Requests the server answers about its cluster, once done.
    pub(crate) cluster_requests: Vec<ClusterRequest>,
    /// Reads of records on disk, begun under their shard's lock and finished once it is let
    /// go ([`finish_reads`]): their answers in `responses` wait for them.
    reads: Vec<LaterRead>,
    /// Indexes into `responses` of the requests whose changes were logged, with their shard.
    logged: Vec<(usize, usize)>,
    /// The last log entry of the batch in each shard it changed: its responses wait until they
    /// are durable.
    last_entries: LastEntries,
    /// With metrics on, the kind of each request answered in `responses`, in the same order
    /// (`None` for one that did not decode); empty otherwise, so that a server without metrics
    /// spends nothing on them.
    kinds: Vec<Option<CommandKind>>,
    /// With metrics on, when the batch arrived.
    received: Option<Instant>,
}

impl Applied {
    /// Nothing applied yet of a batch that arrived `now` (noted for the metrics, when on).
    pub(crate) fn arrived(shared: &Shared, now: Instant) -> Applied {
        Applied {
            received: shared.metrics.is_some().then_some(now),
            ..Applied::default()
        }
    }

    fn answer(
        &mut self,
        kind: Option<CommandKind>,
        correlation_id: u64,
        result: Result<Outcome, ErrorReply>,
        mut permit: RequestPermit,
    ) {
        permit.answer_built(&result);
        self.responses.push(ResponseFrame {
            correlation_id,
            result,
        });
        self.permits.push(permit);
        if self.received.is_some() {
            self.kinds.push(kind);
        }
    }

    /// Answers `request` once `read` is finished, after the batch ([`finish_reads`]); `read`
    /// is `command` begun in `shard`.
    fn read_later(
        &mut self,
        request: Answerable,
        shard: usize,
        command: Command,
        read: PendingRead,
    ) {
        self.reads.push(LaterRead {
            response: self.responses.len(),
            shard,
            command,
            read,
        });
        // Its answer's room stays whole until the read is finished.
        self.responses.push(ResponseFrame {
            correlation_id: request.correlation_id,
            result: Err(ErrorReply::Storage("the read was not finished".to_owned())),
        });
        self.permits.push(request.permit);
        if self.received.is_some() {
            self.kinds.push(Some(request.kind));
        }
    }

    /// Notes that the batch's responses wait for `entry` of `shard`'s log.
    fn logged_to(&mut self, shard: usize, entry: u64) {
        self.last_entries.note(shard, entry);
    }

    /// Parks `request` when it found no record and may wait (protecting its member's session
    /// in `shard`, whose broker is `broker`, while it waits), or answers it with `result`.
    /// `entry` is the log entry of its change, if it was logged.
    fn park_or_answer(
        &mut self,
        (shard, broker): (usize, &mut BrokerGuard<'_>),
        request: Answerable,
        result: Result<Outcome, ErrorReply>,
        entry: Option<u64>,
    ) {
        let Answerable {
            correlation_id,
            kind,
            wait,
            retry,
            mut permit,
        } = request;
        match (retry, result) {
            (Some(retry), Ok(found)) if found.found_no_records() => {
                // Its retries take room for their answers as they come.
                permit.hold_answer_room(None);
                let session = retry
                    .member()
                    .and_then(|member| broker.sessions().park(member));
                self.parked.push(Parked {
                    correlation_id,
                    retry,
                    found,
                    session,
                    shard,
                    logged: entry,
                    wait,
                    permit,
                    kind,
                });
            }
            (_, result) => {
                if entry.is_some() {
                    self.logged.push((self.responses.len(), shard));
                }
                self.answer(Some(kind), correlation_id, result, permit);
            }
        }
    }

    /// Counts the answers in `responses` in `metrics`, as answered now.
    pub(crate) fn count(&self, metrics: &Metrics) {
        let elapsed = self.received.map(|at| at.elapsed());
        let answered = self
            .kinds
            .iter()
            .zip(&self.responses)
            .map(|(kind, response)| (*kind, &response.result));
        metrics.answered(answered, elapsed);
    }
}

/// Applies a batch of decoded frames, each with its in-flight permit, for `connection`: under
/// one lock of the broker, or with several shards, of each shard in turn (one lock for each run
/// of requests to the same shard). With `may_wait` false (the connection is closing) nothing
/// is parked.
///
/// A delivery to a group member whose records are on disk stops the batch there, before it is
/// applied: it is returned, for the caller to read those records with every lock let go
/// ([`ReadAheadWanted::read`]) and call again with them and the rest of the batch, so that the
/// requests still apply in their order and no lock is held while the disk is read.
pub(crate) fn apply_batch(
    shared: &Shared,
    connection: u64,
    frames: &mut std::vec::IntoIter<(Decoded<RequestFrame>, RequestPermit)>,
    may_wait: bool,
    applied: &mut Applied,
    resumed: Option<ReadAheadDone>,
) -> Option<ReadAheadWanted> {
    let now = Instant::now();
    let mut locked = Locked::default();
    if let Some(ReadAheadDone {
        request,
        command,
        shard,
        ahead,
    }) = resumed
    {
        let broker = locked.shard(&shared.shards, shard);
        let Executed { result, entry } =
            broker.execute_with(ahead, command, connection, now, &mut applied.wake);
        if let Some(entry) = entry {
            applied.logged_to(shard, entry);
        }
        applied.park_or_answer((shard, broker), request, result, entry);
    }
    for (frame, permit) in frames.by_ref() {
        let Admitted {
            correlation_id,
            kind,
            wait,
            retry,
            command,
        } = match admit(shared, connection, frame, may_wait, permit.answer_room()) {
            Ok(admitted) if is_about_the_cluster(&admitted.command) => {
                applied
                    .cluster_requests
                    .push(admitted.into_cluster_request(permit));
                continue;
            }
            Ok(admitted) => admitted,
            Err(refused) => {
                applied.answer(
                    refused.kind,
                    refused.correlation_id,
                    Err(refused.refusal),
                    permit,
                );
                continue;
            }
        };
        let request = Answerable {
            correlation_id,
            kind,
            wait,
            retry,
            permit,
        };
        let shards = &shared.shards;
        match shards.route(&command) {
            Route::One(shard) => {
                let broker = locked.shard(shards, shard);
                // A read of records on disk reads them once the lock is let go.
                if let Some(begun) = broker.begin_read(&command) {
                    let result = match begun {
                        Ok(read) if read.reads_cold_store() => {
                            applied.read_later(request, shard, command, read);
                            continue;
                        }
                        Ok(read) => read.finish().map(Outcome::Read).map_err(ErrorReply::from),
                        Err(refusal) => Err(refusal),
                    };
                    applied.park_or_answer((shard, broker), request, result, None);
                    continue;
                }
                if let Some(planned) = broker.cold_reads_of(&command) {
                    locked.release();
                    return Some(ReadAheadWanted {
                        request,
                        command,
                        shard,
                        planned,
                    });
                }
                let Executed { result, entry } = match kafka_refusal(shared, &command) {
                    Some(refusal) => Executed {
                        result: Err(refusal),
                        entry: None,
                    },
                    None => broker.execute(command, connection, now, &mut applied.wake),
                };
                if let Some(entry) = entry {
                    applied.logged_to(shard, entry);
                }
                applied.park_or_answer((shard, broker), request, result, entry);
            }
            Route::Every => {
                locked.release();
                let results = shards.all().iter().map(|broker| {
                    let mut broker = broker.lock();
                    let executed =
                        broker.execute(command.clone(), connection, now, &mut applied.wake);
                    broker.maybe_checkpoint();
                    executed.result
                });
                let result = shards::merge(results.collect::<Vec<_>>());
                applied.answer(
                    Some(request.kind),
                    request.correlation_id,
                    result,
                    request.permit,
                );
            }
            Route::Placing => {
                locked.release();
                let wake = &mut applied.wake;
                let placed = shards.place(command, |broker, command| {
                    let mut broker = broker.lock();
                    let executed = broker.execute(command, connection, now, wake);
                    broker.maybe_checkpoint();
                    (executed.result, executed.entry)
                });
                match placed {
                    Ok((shard, result, entry)) => {
                        if let Some(entry) = entry {
                            applied.logged_to(shard, entry);
                            applied.logged.push((applied.responses.len(), shard));
                        }
                        applied.answer(
                            Some(request.kind),
                            request.correlation_id,
                            result,
                            request.permit,
                        );
                    }
                    Err(refusal) => {
                        applied.answer(
                            Some(request.kind),
                            request.correlation_id,
                            Err(refusal),
                            request.permit,
                        );
                    }
                }
            }
        }
    }
    locked.release();
    None
}

/// A delivery whose records are on disk, stopped before it was applied ([`apply_batch`]).
pub(crate) struct ReadAheadWanted {
    request: Answerable,
    command: Command,
    shard: usize,
    planned: ColdReads,
}

/// A delivery with its records on disk read, to apply ([`apply_batch`]).
pub(crate) struct ReadAheadDone {
    request: Answerable,
    command: Command,
    shard: usize,
    ahead: ReadAhead,
}

impl ReadAheadWanted {
    /// Reads the records on a blocking thread (what cannot be read is read again, under the
    /// lock, when the delivery is applied: it then answers as it would have).
    pub(crate) async fn read(self, metrics: Option<&Metrics>) -> ReadAheadDone {
        let ReadAheadWanted {
            request,
            command,
            shard,
            planned,
        } = self;
        let ahead = crate::broker::read_ahead(vec![planned], metrics)
            .await
            .pop()
            .unwrap_or_default();
        ReadAheadDone {
            request,
            command,
            shard,
            ahead,
        }
    }
}

/// The last log entry of a batch in each shard it changed, by shard: that of the first shard
/// without an allocation (a broker of one shard never needs more).
#[derive(Debug, Default)]
struct LastEntries {
    first: Option<(usize, u64)>,
    others: Vec<(usize, u64)>,
}

impl LastEntries {
    /// Notes `entry` as the last of `shard`.
    fn note(&mut self, shard: usize, entry: u64) {
        match &mut self.first {
            None => self.first = Some((shard, entry)),
            Some((of, last)) if *of == shard => *last = entry,
            Some(_) => match self.others.iter_mut().find(|(of, _)| *of == shard) {
                Some((_, last)) => *last = entry,
                None => self.others.push((shard, entry)),
            },
        }
    }

    /// The entries noted, emptying this.
    fn take(&mut self) -> impl Iterator<Item = (usize, u64)> {
        self.first
            .take()
            .into_iter()
            .chain(std::mem::take(&mut self.others))
    }
}

/// The shard a batch holds the lock of, if any: a batch whose requests all go to one shard
/// takes its lock once.
#[derive(Default)]
struct Locked<'a> {
    held: Option<(usize, BrokerGuard<'a>)>,
}

impl<'a> Locked<'a> {
    /// The lock of `shard`, taken now unless held already (another shard's is released first).
    fn shard(&mut self, shards: &'a Shards, shard: usize) -> &mut BrokerGuard<'a> {
        if self.held.as_ref().is_some_and(|(held, _)| *held != shard) {
            self.release();
        }
        let (_, broker) = self
            .held
            .get_or_insert_with(|| (shard, shards.get(shard).lock()));
        broker
    }

    /// Releases the lock held, if any, once its shard's log had its chance to checkpoint.
    fn release(&mut self) {
        if let Some((_, mut broker)) = self.held.take() {
            broker.maybe_checkpoint();
        }
    }
}

/// Applies a batch as [`apply_batch`] does, through the cluster: the batch's commands are
/// proposed together, one entry of the replicated log per group they go to (with one group,
/// one entry), and answered once a majority has each and it is applied here. Commands for a
/// group this node does not lead are answered `NotLeader`, naming that group's leader. With
/// several groups, a create and a description of every topic are applied alone, in their
/// place in the batch (see `data_groups`). Nothing is logged by this server's journal (the
/// cluster's log is the journal), so nothing waits to be durable after this.
pub(crate) async fn apply_batch_replicated(
    shared: &Shared,
    connection: u64,
    frames: Vec<(Decoded<RequestFrame>, RequestPermit)>,
    may_wait: bool,
) -> Applied {
    let now = Instant::now();
    let mut applied = Applied::arrived(shared, now);
    let spread = data_groups::spread(shared);
    // Each request in order: refused before the proposal, or proposed (with a copy of its
    // command when it names a member, for the session books), its result in `results`.
    let mut requests = Vec::with_capacity(frames.len());
    let mut results: Vec<Option<Result<Outcome, ErrorReply>>> = Vec::with_capacity(frames.len());
    let mut run = Run::default();
    for (frame, permit) in frames {
        let admitted = match admit(shared, connection, frame, may_wait, permit.answer_room()) {
            Ok(admitted) if is_about_the_cluster(&admitted.command) => {
                applied
                    .cluster_requests
                    .push(admitted.into_cluster_request(permit));
                continue;
            }
            Ok(admitted) => admitted,
            Err(refused) => {
                requests.push(Err((refused, permit)));
                continue;
            }
        };
        let tracked = admitted
            .command
            .member()
            .is_some()
            .then(|| admitted.command.clone());
        let slot = results.len();
        let route = match spread {
            true => data_groups::route(shared, &admitted.command),
            false => GroupRoute::One(0),
        };
        let shard = match route {
            GroupRoute::One(shard) => {
                run.add(shard, slot, admitted.command);
                results.push(None);
                shard
            }
            GroupRoute::Refused(refusal) => {
                results.push(Some(Err(refusal)));
                0
            }
            GroupRoute::Alone => {
                // In its place: after what came before it.
                run.propose(shared, spread, &mut results).await;
                let (shard, result) = data_groups::apply_alone(shared, admitted.command).await;
                results.push(Some(result));
                shard
            }
        };
        let request = Answerable {
            correlation_id: admitted.correlation_id,
            kind: admitted.kind,
            wait: admitted.wait,
            retry: admitted.retry,
            permit,
        };
        requests.push(Ok((request, tracked, shard, slot)));
    }
    run.propose(shared, spread, &mut results).await;
    let mut locked = Locked::default();
    for request in requests {
        match request {
            Ok((request, tracked, shard, slot)) => {
                let result = results
                    .get_mut(slot)
                    .and_then(Option::take)
                    .unwrap_or_else(|| {
                        Err(ErrorReply::Storage(
                            "the change was not answered".to_owned(),
                        ))
                    });
                let broker = locked.shard(&shared.shards, shard);
                if let Some(command) = &tracked {
                    broker.track_session(command, result.is_ok(), connection, now);
                }
                applied.park_or_answer((shard, broker), request, result, None);
            }
            Err((refused, permit)) => {
                applied.answer(
                    refused.kind,
                    refused.correlation_id,
                    Err(refused.refusal),
                    permit,
                );
            }
        }
    }
    locked.release();
    applied
}

/// The first protocol version whose commands a cluster asks every node about before they go
/// into a log.
const FIRST_ASKED_VERSION: u16 = 14;

/// Whether `commands` are a command that every node must be asked about, which [`Run::add`]
/// puts alone (so its first command says, in constant time however long a batch grows).
fn asked_about(commands: &[Command]) -> bool {
    commands
        .first()
        .is_some_and(|command| command.since_version() >= FIRST_ASKED_VERSION)
}

/// Commands of a batch not proposed yet, by shard, each with its request's place in the
/// batch's results.
#[derive(Default)]
struct Run {
    by_shard: Vec<(usize, Vec<usize>, Vec<Command>)>,
}

impl Run {
    /// Adds `command` to the proposal of `shard`; a command that every node must be asked
    /// about first (see `replicated::every_node_applies`) goes alone, so that its refusal is
    /// its own.
    fn add(&mut self, shard: usize, slot: usize, command: Command) {
        if command.since_version() >= FIRST_ASKED_VERSION {
            self.by_shard.push((shard, vec![slot], vec![command]));
            return;
        }
        match self
            .by_shard
            .iter_mut()
            .find(|(of, _, commands)| *of == shard && !asked_about(commands))
        {
            Some((_, slots, commands)) => {
                slots.push(slot);
                commands.push(command);
            }
            None => self.by_shard.push((shard, vec![slot], vec![command])),
        }
    }

    /// Proposes the commands of each shard to its group, the groups at once, and puts each
    /// command's result in its place of `results`; empties the run.
    async fn propose(
        &mut self,
        shared: &Shared,
        spread: bool,
        results: &mut [Option<Result<Outcome, ErrorReply>>],
    ) {
        let proposals = std::mem::take(&mut self.by_shard).into_iter().map(
            |(shard, slots, commands)| async move {
                // Only a group that a topic left answers a call `NotLeader` for it (see
                // `data_groups::moved_to`): no copy of the topics otherwise.
                let left_from = spread
                    && shared
                        .group(shard)
                        .is_some_and(|group| !group.cluster_state().borrow().departures.is_empty());
                let topics: Vec<Option<String>> = match left_from {
                    true => commands
                        .iter()
                        .map(|command| command.topic().map(str::to_owned))
                        .collect(),
                    false => Vec::new(),
                };
                let answers = match shared.group(shard) {
                    // Routed by where this node's copy of the first group says each topic lives,
                    // which a leader that has not yet applied its predecessor's entries may not
                    // know yet: the client asks again in a moment.
                    Some(_) if spread && shard == 0 && !data_groups::routes_current(shared) => {
                        Err(ErrorReply::NotLeader { leader: None })
                    }
                    Some(group) => match replicated::every_node_applies(shared, &commands).await {
                        Ok(()) => {
                            replicated::execute_reading_ahead(shared, shard, &group, commands).await
                        }
                        Err(refusal) => Err(refusal),
                    },
                    // A group this node does not host yet: another node may.
                    None => Err(ErrorReply::NotLeader { leader: None }),
                };
                let answers = answers.map(|mut answers| {
                    for (answer, topic) in answers.iter_mut().zip(&topics) {
                        if let (Err(ErrorReply::NotLeader { leader }), Some(topic)) =
                            (answer, topic)
                        {
                            *leader = leader
                                .take()
                                .or_else(|| data_groups::moved_to(shared, shard, topic));
                        }
                    }
                    answers
                });
                (slots, answers)
            },
        );
        for (slots, answers) in futures::future::join_all(proposals).await {
            match answers {
                Ok(answers) => {
                    for (slot, answer) in slots.into_iter().zip(answers) {
                        if let Some(result) = results.get_mut(slot) {
                            *result = Some(answer);
                        }
                    }
                }
                Err(refusal) => {
                    for slot in slots {
                        if let Some(result) = results.get_mut(slot) {
                            *result = Some(Err(refusal.clone()));
                        }
                    }
                }
            }
        }
    }
}

/// A request that decoded and may be applied.
struct Admitted {
    correlation_id: u64,
    kind: CommandKind,
    /// How long it may wait for records (bounded by the server's maximum).
    wait: Duration,
    /// What to retry while it waits, when it may wait.
    retry: Option<Command>,
    /// The command, prepared (see [`prepare`]).
    command: Command,
}

impl Admitted {
    fn into_cluster_request(self, permit: RequestPermit) -> ClusterRequest {
        ClusterRequest {
            correlation_id: self.correlation_id,
            command: self.command,
            permit,
        }
    }
}

/// A read begun under its shard's lock whose records on disk are read after the batch.
#[derive(Debug)]
struct LaterRead {
    /// Its answer's place in the batch's responses.
    response: usize,
    shard: usize,
    /// The read, to apply again under the lock if its records left the disk meanwhile.
    command: Command,
    read: PendingRead,
}

/// Finishes the reads `applied` began (see [`Applied::read_later`]) for `connection`, reading
/// their records from disk on a blocking thread, and puts their answers in their places. A
/// read that cannot read its records (retention removed them after the read began, or a file
/// is damaged) is applied again under its shard's lock, after the rest of its batch: it
/// answers with what is retained then, or with the error as it did before reads left the
/// lock.
pub(crate) async fn finish_reads(shared: &Shared, applied: &mut Applied, connection: u64) {
    if applied.reads.is_empty() {
        return;
    }
    let (places, reads): (Vec<(usize, usize, Command)>, Vec<PendingRead>) =
        std::mem::take(&mut applied.reads)
            .into_iter()
            .map(|later| ((later.response, later.shard, later.command), later.read))
            .unzip();
    let finished = tokio::task::spawn_blocking(move || {
        reads
            .into_iter()
            .map(PendingRead::finish)
            .collect::<Vec<_>>()
    })
    .await;
    let finished = finished.unwrap_or_else(|failed| {
        error!(cause = %failed, "reading records from disk failed; reading them again");
        places
            .iter()
            .map(|_| Err(BrokerError::Storage("the read failed".to_owned())))
            .collect()
    });
    for ((response, shard, command), result) in places.into_iter().zip(finished) {
        let result = match result {
            Ok(read) => Ok(Outcome::Read(read)),
            Err(BrokerError::Storage(_)) => {
                let mut broker = shared.shards.get(shard).lock();
                let now = Instant::now();
                broker
                    .execute(command, connection, now, &mut Vec::new())
                    .result
            }
            Err(refusal) => Err(ErrorReply::from(refusal)),
        };
        applied.permits[response].answer_built(&result);
        applied.responses[response].result = result;
    }
}

/// A request refused before it was applied.
struct Refused {
    /// Its kind, when it decoded.
    kind: Option<CommandKind>,
    /// Its id (0 when it could not be read).
    correlation_id: u64,
    refusal: ErrorReply,
}

/// A request applied and to be answered (or parked).
struct Answerable {
    correlation_id: u64,
    kind: CommandKind,
    wait: Duration,
    retry: Option<Command>,
    permit: RequestPermit,
}

/// Decodes and prepares one request for `connection`; its refusal when it did not decode or is
/// refused before it is applied (a payload over the limit). With `may_wait` false nothing
/// waits. A request holding `answer_room` bytes for its answer has its byte budget lowered to
/// them; its retries, while it waits, keep the budget it came with.
fn admit(
    shared: &Shared,
    connection: u64,
    frame: Decoded<RequestFrame>,
    may_wait: bool,
    answer_room: Option<u64>,
) -> Result<Admitted, Refused> {
    let request = match frame {
        Decoded::Message(request) => request,
        Decoded::Malformed {
            leading_u64,
            reason,
        } => {
            debug!(connection, cause = %reason, "malformed request");
            return Err(Refused {
                kind: None,
                correlation_id: leading_u64.unwrap_or(0),
                refusal: ErrorReply::MalformedRequest(reason),
            });
        }
    };
    let RequestFrame {
        correlation_id,
        max_wait_ms,
        command,
    } = request;
    let kind = command.kind();
    let config = &shared.config;
    let mut command = checked(shared, command).map_err(|refusal| Refused {
        kind: Some(kind),
        correlation_id,
        refusal,
    })?;
    let wait = Duration::from_millis(max_wait_ms.into()).min(config.max_wait);
    let retry = (may_wait && !wait.is_zero())
        .then(|| command.waiting_retry())
        .flatten();
    if let Some(room) = answer_room {
        fit_answer(&mut command, room);
    }
    Ok(Admitted {
        correlation_id,
        kind,
        wait,
        retry,
        command,
    })
}

/// The checks of a command before it is applied, here or at another node's: [`prepare`], then
/// [`kafka_owns_group`].
pub(crate) fn checked(shared: &Shared, command: Command) -> Result<Command, ErrorReply> {
    prepare(&shared.config, command).and_then(|command| kafka_owns_group(shared, command))
}

/// Refuses a native join to a group whose members joined through the Kafka listener (a group
/// name is used by one protocol at a time), the deletion of such a group (a group with
/// members is never deleted), and its reset (its consumers would commit their own positions
/// over it, as Kafka refuses to reset a group whose consumers run).
fn kafka_owns_group(shared: &Shared, command: Command) -> Result<Command, ErrorReply> {
    match kafka_refusal(shared, &command) {
        Some(refusal) => Err(refusal),
        None => Ok(command),
    }
}

/// Why [`kafka_owns_group`] refuses `command`, if it does. Asked again under the lock the
/// command is applied under: a Kafka member may have begun to join since the command was
/// admitted (see `Coordinator::claim`).
fn kafka_refusal(shared: &Shared, command: &Command) -> Option<ErrorReply> {
    let why = match command {
        Command::Join { group, .. } if shared.kafka.groups.has_members(group) => format!(
            "group {group:?} has members that joined through the Kafka listener (or one is \
             joining it now): a group is used by one protocol at a time"
        ),
        Command::DeleteGroup { group, .. } if shared.kafka.groups.has_members(group) => format!(
            "group {group:?} has members that joined through the Kafka listener: a group with \
             members cannot be deleted (stop its consumers first)"
        ),
        Command::ResetGroup { group, .. } | Command::DeleteOffsets { group, .. }
            if shared.kafka.groups.has_members(group) =>
        {
            format!(
                "group {group:?} has members that joined through the Kafka listener, which \
                 would commit their own positions over the change (stop its consumers first)"
            )
        }
        _ => return None,
    };
    Some(ErrorReply::InvalidArgument(why))
}

/// Refuses payloads over the limit and gives commands whose answer carries records a byte
/// budget with which the answer fits in a frame.
fn prepare(config: &Config, mut command: Command) -> Result<Command, ErrorReply> {
    if let Some(size) = command
        .largest_record()
        .filter(|&size| size > config.max_payload_bytes)
    {
        return Err(ErrorReply::TooLarge {
            what: "payload".into(),
            size: size as u64,
            limit: config.max_payload_bytes as u64,
        });
    }
    fit_answer(&mut command, config.max_frame_bytes as u64);
    Ok(command)
}

/// Holds a batch's responses until its last log entry is durable; if the journal stopped
/// first, the responses of the logged requests become `ErrorReply::Storage`. Waits inline (the
/// read loop's fast path), but once log writes are failing, takes the responses and permits out
/// of `applied` and returns them as a deferred answer for the connection's writer, which writes
/// them in their place once the entry is durable: the read loop goes on reading, so later
/// requests of the connection are read and answered (refused, while the log refuses changes)
/// at once, and their answers queue behind the deferred ones, in request order. (The permits
/// the deferred answer holds still bound what a connection can have outstanding.)
///
/// With several shards, each shard's last entry is waited for in turn, and a shard whose log
/// failed refuses only the responses of the requests it logged.
pub(crate) async fn settle(shared: &Arc<Shared>, applied: &mut Applied) -> Option<Deferred> {
    let mut entries = applied.last_entries.take();
    for (shard, entry) in entries.by_ref() {
        let Some(journal) = shared.shards.get(shard).journal() else {
            continue;
        };
        match journal.durable_unless_stalled(entry).await {
            Some(Ok(())) => {}
            Some(Err(error)) => refuse_logged(
                &mut applied.responses,
                &applied.logged,
                shard,
                &storage_reply(error),
            ),
            None => {
                let stalled = std::iter::once((shard, entry)).chain(entries).collect();
                return Some(defer(shared, applied, stalled));
            }
        }
    }
    None
}

/// The answers of `applied`, taken out of it, written once `entries` (shard and log entry)
/// are durable: see [`settle`].
fn defer(shared: &Arc<Shared>, applied: &mut Applied, entries: Vec<(usize, u64)>) -> Deferred {
    let shared = Arc::clone(shared);
    let mut responses = std::mem::take(&mut applied.responses);
    let permits = std::mem::take(&mut applied.permits);
    let logged = std::mem::take(&mut applied.logged);
    Box::pin(async move {
        for (shard, entry) in entries {
            if let Some(journal) = shared.shards.get(shard).journal() {
                if let Err(error) = journal.durable(entry).await {
                    refuse_logged(&mut responses, &logged, shard, &storage_reply(error));
                }
            }
        }
        Answers { responses, permits }
    })
}

/// Replaces the responses of the requests `shard` logged with `refusal`.
fn refuse_logged(
    responses: &mut [ResponseFrame],
    logged: &[(usize, usize)],
    shard: usize,
    refusal: &ErrorReply,
) {
    for &(index, logged_in) in logged {
        if logged_in != shard {
            continue;
        }
        if let Some(response) = responses.get_mut(index) {
            response.result = Err(refusal.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use bytes::Bytes;

    use super::*;
    use crate::answers::{RECORD_OVERHEAD, RESPONSE_OVERHEAD};

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
