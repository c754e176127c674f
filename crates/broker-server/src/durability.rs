//! Durability with `--data-dir`: the journal between the broker's lock and the disk.
//!
//! Requests are applied under the broker's lock, and the log entry of every state change is
//! appended, in that same critical section, to an in-memory buffer, so entries are in apply
//! order. A dedicated thread (the flusher) takes the whole buffer, writes it with one `write`,
//! fsyncs according to the [`Fsync`] policy, and publishes how far the log is written and synced.
//! Connections send the responses of state-changing requests only once their entries are
//! written (every policy: a `kill -9` loses nothing acknowledged) or synced (`always`). Group
//! commit comes for free: one write and one fsync cover everything that arrived while the
//! previous ones ran.
//!
//! Failures: a failed write (a full disk, an I/O error) is retried every
//! [`WRITE_RETRY`]; meanwhile every new state-changing request is refused with
//! `ErrorReply::Storage` before it is applied, and the requests already applied wait for the
//! retry. A failed fsync is not retried (the kernel may have dropped the pages): the journal
//! stops for good (fail-stop), waiting requests get `ErrorReply::Storage`, and every later
//! state-changing request is refused until the server is restarted and recovers from the log.
//!
//! Snapshots: once [`Config::snapshot_log_bytes`] of entries were logged since the last
//! snapshot, the state is cloned under the lock (records are reference-counted `Bytes`, so this
//! copies no payload) and written by a background thread, after which the log segments it
//! covers are removed.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use broker_core::{BrokerDescription, BrokerState, Command, Outcome};
use broker_proto::{ErrorReply, ResponseFrame};
use broker_storage::{
    encode_entry, is_logged, remove_covered, DataDir, LogWriter, Recovery, StorageError,
};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::connection::{Answers, Deferred};
use crate::dispatch::Applied;
use crate::server::Shared;
use crate::{Config, ServerError};

/// How often a failed log write is retried.
const WRITE_RETRY: Duration = Duration::from_millis(200);

/// How often a log write that keeps failing is reported again.
const FAILURE_REPORT: Duration = Duration::from_secs(10);

/// When the log's entries count as durable, and so when a state-changing request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Fsync {
    /// A response is sent only after its log entry is fsynced (one fsync covers every request
    /// that arrived while the previous one ran): nothing acknowledged is lost, even on power
    /// loss.
    #[default]
    Always,
    /// Entries are written before the response and fsynced at least every
    /// `--fsync-interval-ms`: a `kill -9` loses nothing acknowledged, a power loss at most that
    /// interval.
    Batch,
    /// Entries are written before the response and the operating system decides when they
    /// reach the disk: a `kill -9` loses nothing acknowledged, a power loss may lose anything
    /// not yet flushed.
    Never,
}

/// A data directory opened and recovered, ready to serve: what [`crate::run_with_storage`]
/// takes. Opening it before binding lets a refusal (a locked or damaged directory) stop the
/// start-up before the server announces its address.
#[derive(Debug)]
pub struct Storage {
    dir: Arc<DataDir>,
    recovery: Recovery,
}

impl Storage {
    /// Locks `config.data_dir` and rebuilds the broker from it (the latest snapshot, then the
    /// log through the core's `apply`). `None` without a data directory.
    ///
    /// # Errors
    /// [`ServerError::Storage`] if the directory is locked by another server, damaged, written by
    /// an incompatible version or with another capacity, or cannot be read.
    pub fn open(config: &Config) -> Result<Option<Storage>, ServerError> {
        let Some(path) = &config.data_dir else {
            return Ok(None);
        };
        let started = Instant::now();
        let dir = DataDir::open(path)?;
        let recovery = dir.recover(config.capacity)?;
        // Every retained record must fit an answer, or a poll could reserve one that can never
        // be delivered; so a smaller limit than the data needs is refused here.
        let largest = recovery.state.largest_retained_record();
        if largest > config.max_payload_bytes as u64 {
            return Err(ServerError::InvalidConfig(format!(
                "{} holds a record of {largest} bytes (payload and key), more than the \
                 configured max payload bytes ({}); records are delivered whole, so start with \
                 --max-payload-bytes {largest} or more",
                path.display(),
                config.max_payload_bytes
            )));
        }
        info!(
            data_dir = %path.display(),
            snapshot = ?recovery.snapshot_seq,
            replayed = recovery.replayed,
            next_entry = recovery.next_seq,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recovered the broker from its data directory"
        );
        Ok(Some(Storage {
            dir: Arc::new(dir),
            recovery,
        }))
    }

    /// The recovered state's description (for restoring member sessions).
    pub(crate) fn describe(&self) -> BrokerDescription {
        self.recovery.state.describe_all()
    }

    /// Starts the journal's flusher on a fresh log segment; returns the recovered state and the
    /// journal.
    pub(crate) fn start(self, config: &Config) -> Result<(BrokerState, Journal), ServerError> {
        let Storage { dir, recovery } = self;
        // The memory budget and the topic, group and member limits decide which calls are
        // refused, so log entries must be replayed under the settings they were decided under.
        // The settings are part of the snapshotted state: unless nothing changed since the
        // last snapshot, every start writes one with the configured settings before it logs
        // anything, so the entries that follow are always replayed on top of the settings they
        // were written with.
        let budget = Some(config.max_memory);
        let unchanged = recovery.replayed == 0
            && recovery.snapshot_seq.is_some()
            && recovery.state.memory_budget() == budget
            && recovery.state.limits() == config.limits;
        let state = recovery
            .state
            .with_memory_budget(budget)
            .with_limits(config.limits);
        let mut since_snapshot = recovery.replayed_bytes;
        if !unchanged {
            dir.write_snapshot(recovery.next_seq, &state)?;
            remove_covered(dir.path(), recovery.next_seq)?;
            since_snapshot = 0;
        }
        let segment_bytes = (config.snapshot_log_bytes / 4).clamp(64 * 1024, 64 * 1024 * 1024);
        let writer = dir.log_writer(config.capacity, recovery.next_seq, segment_bytes)?;
        // A replayed tail (none after the start-up snapshot) counts towards the next snapshot,
        // so frequent restarts cannot let the log (and recovery time) grow without bound.
        let journal = Journal::start(config, dir, writer, recovery.next_seq, since_snapshot)?;
        Ok((state, journal))
    }
}

/// How far the log is on disk. Entries below `written` were handed to the operating system,
/// entries below `synced` were fsynced.
#[derive(Debug, Clone, Default)]
struct Progress {
    written: u64,
    synced: u64,
    /// Set when the journal stopped for good (a failed fsync).
    failed: Option<Arc<str>>,
    /// Whether log writes are failing now (and being retried).
    stalled: bool,
}

/// Entries appended under the broker's lock and not yet taken by the flusher.
#[derive(Debug, Default)]
struct Pending {
    buffer: Vec<u8>,
    entries: u64,
    /// The sequence number the next appended entry gets.
    next_seq: u64,
    /// Why state-changing requests are refused now (a failing write or a failed fsync).
    refusing: Option<String>,
    /// Entry bytes appended since the last snapshot started.
    since_snapshot: u64,
    snapshot_running: bool,
    stopping: bool,
}

/// The shared side of the journal: appending, durability waits, snapshots, shutdown.
#[derive(Debug)]
pub(crate) struct Journal {
    inner: Arc<Inner>,
    progress: watch::Receiver<Progress>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Inner {
    pending: Mutex<Pending>,
    wake: Condvar,
    fsync: Fsync,
    fsync_interval: Duration,
    snapshot_log_bytes: u64,
    dir: Arc<DataDir>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing panics while holding it; a poisoned lock still guards a consistent buffer.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Journal {
    fn start(
        config: &Config,
        dir: Arc<DataDir>,
        writer: LogWriter,
        next_seq: u64,
        since_snapshot: u64,
    ) -> Result<Journal, ServerError> {
        let inner = Arc::new(Inner {
            pending: Mutex::new(Pending {
                next_seq,
                since_snapshot,
                ..Pending::default()
            }),
            wake: Condvar::new(),
            fsync: config.fsync,
            fsync_interval: config.fsync_interval,
            snapshot_log_bytes: config.snapshot_log_bytes,
            dir,
        });
        let (progress_tx, progress) = watch::channel(Progress {
            written: next_seq,
            synced: next_seq,
            failed: None,
            stalled: false,
        });
        let flusher_inner = Arc::clone(&inner);
        let flusher = std::thread::Builder::new()
            .name("broker-log".into())
            .spawn(move || flush(&flusher_inner, writer, &progress_tx))?;
        Ok(Journal {
            inner,
            progress,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// Refuses a state-changing request while the log cannot take entries. Call with the
    /// broker locked, before applying.
    pub(crate) fn check_writable(&self) -> Result<(), ErrorReply> {
        match &self.inner.lock().refusing {
            None => Ok(()),
            Some(reason) => Err(ErrorReply::Storage(reason.clone())),
        }
    }

    /// Applies `command` to `state` and logs it if it changed anything: its entry is encoded
    /// straight into the buffer the flusher takes (one copy of its payloads), before the
    /// command is moved into the core, and taken back if the outcome needs no entry. Returns
    /// the result and the entry's sequence number. Call with the broker locked, in apply order;
    /// the flusher waits for the buffer meanwhile.
    fn apply_and_log(
        &self,
        state: &mut BrokerState,
        command: Command,
    ) -> (Result<Outcome, ErrorReply>, Option<u64>) {
        let mut pending = self.inner.lock();
        if let Some(reason) = &pending.refusing {
            return (Err(ErrorReply::Storage(reason.clone())), None);
        }
        let start = pending.buffer.len();
        if let Err(cause) = encode_entry(&command, &mut pending.buffer) {
            return (Err(ErrorReply::Storage(cause.to_string())), None);
        }
        let result = state.apply(command).map_err(ErrorReply::from);
        if !matches!(&result, Ok(outcome) if is_logged(false, outcome)) {
            pending.buffer.truncate(start);
            return (result, None);
        }
        pending.entries += 1;
        pending.since_snapshot += (pending.buffer.len() - start) as u64;
        let seq = pending.next_seq;
        pending.next_seq += 1;
        drop(pending);
        self.inner.wake.notify_one();
        (result, Some(seq))
    }

    /// Waits until the entry `seq` is durable in the sense of the fsync policy.
    ///
    /// # Errors
    /// The `ErrorReply::Storage` to answer with when the journal stopped before that.
    pub(crate) async fn durable(&self, seq: u64) -> Result<(), ErrorReply> {
        self.wait(seq, false).await.unwrap_or(Ok(()))
    }

    /// [`Journal::durable`], or `None` as soon as log writes are failing (stalled) with `seq`
    /// not yet durable.
    async fn durable_unless_stalled(&self, seq: u64) -> Option<Result<(), ErrorReply>> {
        self.wait(seq, true).await
    }

    async fn wait(&self, seq: u64, until_stalled: bool) -> Option<Result<(), ErrorReply>> {
        let fsync = self.inner.fsync;
        let done = |progress: &Progress| match fsync {
            Fsync::Always => progress.synced > seq,
            Fsync::Batch | Fsync::Never => progress.written > seq,
        };
        let mut progress = self.progress.clone();
        let outcome = progress
            .wait_for(|progress| {
                done(progress) || progress.failed.is_some() || (until_stalled && progress.stalled)
            })
            .await;
        match outcome {
            Ok(progress) if done(&progress) => Some(Ok(())),
            Ok(progress) => progress.failed.as_deref().map(|failed| {
                Err(ErrorReply::Storage(format!(
                    "the change was applied but may not be on disk: {failed}"
                )))
            }),
            Err(_) => Some(Err(ErrorReply::Storage(
                "the log writer stopped before the change reached the disk".into(),
            ))),
        }
    }

    /// Starts a background snapshot of `state` if enough was logged since the last one. Call
    /// with the broker locked (`state` is the locked state), after a batch.
    pub(crate) fn maybe_snapshot(&self, state: &BrokerState) {
        let mut pending = self.inner.lock();
        if pending.snapshot_running
            || pending.refusing.is_some()
            || pending.since_snapshot < self.inner.snapshot_log_bytes
        {
            return;
        }
        pending.snapshot_running = true;
        pending.since_snapshot = 0;
        let seq = pending.next_seq;
        drop(pending);
        let state = state.clone();
        let inner = Arc::clone(&self.inner);
        let spawned = std::thread::Builder::new()
            .name("broker-snapshot".into())
            .spawn(move || {
                snapshot(&inner, seq, &state);
                inner.lock().snapshot_running = false;
            });
        if let Err(cause) = spawned {
            warn!(cause = %cause, "cannot start the snapshot thread");
            self.inner.lock().snapshot_running = false;
        }
    }

    /// Writes and syncs everything appended, then stops the flusher. For shutdown: call once
    /// no request is being applied any more; blocks until the flusher is done.
    pub(crate) fn finish(&self) {
        self.inner.lock().stopping = true;
        self.inner.wake.notify_one();
        let flusher = self
            .flusher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(flusher) = flusher {
            if flusher.join().is_err() {
                error!("the log flusher panicked");
            }
        }
    }
}

/// Writes a snapshot covering the entries below `seq` and removes what it covers.
fn snapshot(inner: &Inner, seq: u64, state: &BrokerState) {
    let started = Instant::now();
    match inner.dir.write_snapshot(seq, state) {
        Ok(path) => {
            let removed = remove_covered(inner.dir.path(), seq);
            info!(
                file = %path.display(),
                covers_entries = seq,
                elapsed_ms = started.elapsed().as_millis() as u64,
                removed_files = ?removed.as_ref().ok(),
                "snapshot written"
            );
            if let Err(cause) = removed {
                warn!(cause = %cause, "cannot remove the files the snapshot covers");
            }
        }
        Err(cause) => {
            warn!(cause = %cause, "writing a snapshot failed; the log keeps growing until one succeeds");
        }
    }
}

/// The flusher thread: takes what was appended, writes it, fsyncs it as the policy says, and
/// publishes the progress, until shutdown or a failed fsync.
fn flush(inner: &Inner, mut writer: LogWriter, progress: &watch::Sender<Progress>) {
    let mut last_sync = Instant::now();
    let mut unsynced = false;
    let mut failed_write: Option<(Vec<u8>, u64)> = None;
    let mut failing_since: Option<Instant> = None;
    let mut last_report = Instant::now();
    loop {
        let (mut buffer, mut entries, stopping) = {
            let mut pending = inner.lock();
            while pending.buffer.is_empty() && failed_write.is_none() && !pending.stopping {
                let timeout = match (unsynced, inner.fsync) {
                    (true, Fsync::Batch) => {
                        inner.fsync_interval.saturating_sub(last_sync.elapsed())
                    }
                    _ => Duration::from_secs(3600),
                };
                if unsynced && timeout.is_zero() {
                    break;
                }
                pending = inner
                    .wake
                    .wait_timeout(pending, timeout)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            let buffer = std::mem::take(&mut pending.buffer);
            let entries = std::mem::take(&mut pending.entries);
            (buffer, entries, pending.stopping)
        };
        if let Some((mut failed, failed_entries)) = failed_write.take() {
            // Entries that failed to write come first: they were applied first.
            failed.extend_from_slice(&buffer);
            buffer = failed;
            entries += failed_entries;
        }
        if !buffer.is_empty() {
            if let Err(cause) = writer.append(&buffer, entries) {
                if cause.is_failed_sync() {
                    // Rolling to a new segment syncs the old one: that failure is final.
                    fail_stop(inner, progress, &cause);
                    return;
                }
                let reason = format!("cannot write the log: {cause}");
                match failing_since {
                    None => {
                        error!(cause = %cause, "log write failed; refusing changes until it succeeds");
                        failing_since = Some(Instant::now());
                        last_report = Instant::now();
                    }
                    Some(since) if last_report.elapsed() >= FAILURE_REPORT => {
                        warn!(
                            cause = %cause,
                            failing_for_s = since.elapsed().as_secs(),
                            "the log still cannot be written; still refusing changes"
                        );
                        last_report = Instant::now();
                    }
                    Some(_) => {}
                }
                inner.lock().refusing = Some(reason);
                progress
                    .send_if_modified(|progress| !std::mem::replace(&mut progress.stalled, true));
                if stopping {
                    error!(
                        lost_entries = entries,
                        "shutting down with log entries not written"
                    );
                    return;
                }
                failed_write = Some((buffer, entries));
                std::thread::sleep(WRITE_RETRY);
                continue;
            }
            unsynced = true;
            {
                let mut pending = inner.lock();
                if pending.refusing.take().is_some() {
                    info!(
                        failed_for_ms =
                            failing_since.map_or(0, |since| since.elapsed().as_millis() as u64),
                        "the log is writable again; accepting changes"
                    );
                }
                failing_since = None;
            }
            // Waiters of `always` wait for the fsync: waking them now would only put them back
            // to sleep.
            let wake = inner.fsync != Fsync::Always;
            progress.send_if_modified(|progress| {
                progress.written = writer.next_seq();
                let was_stalled = std::mem::replace(&mut progress.stalled, false);
                wake || was_stalled
            });
        }
        let sync_now = unsynced
            && (stopping
                || match inner.fsync {
                    Fsync::Always => true,
                    Fsync::Batch => last_sync.elapsed() >= inner.fsync_interval,
                    Fsync::Never => false,
                });
        if sync_now {
            if let Err(cause) = writer.sync() {
                fail_stop(inner, progress, &cause);
                return;
            }
            last_sync = Instant::now();
            unsynced = false;
            // Only waiters of `always` wait for the fsync.
            let wake = inner.fsync == Fsync::Always;
            progress.send_if_modified(|progress| {
                progress.synced = writer.next_seq();
                wake
            });
        }
        if stopping && inner.lock().buffer.is_empty() {
            return;
        }
    }
}

/// A failed fsync: stop writing for good and say so loudly.
fn fail_stop(inner: &Inner, progress: &watch::Sender<Progress>, cause: &StorageError) {
    let reason = format!("the log is stopped after a failed fsync ({cause}); restart the server");
    error!(
        cause = %cause,
        "FSYNC FAILED: the log may have lost entries; refusing every change until the server is \
         restarted and recovers from its data directory"
    );
    inner.lock().refusing = Some(reason.clone());
    progress.send_modify(|progress| progress.failed = Some(reason.into()));
}

/// Applies `command` to `state` and, with a journal, logs it when it changed the state: a
/// state-changing command is refused before it is applied while the log cannot take entries.
/// Returns the result and the log entry's sequence number. Call with the broker locked.
pub(crate) fn apply_logged(
    state: &mut BrokerState,
    journal: Option<&Journal>,
    command: Command,
) -> (Result<Outcome, ErrorReply>, Option<u64>) {
    match journal {
        Some(journal) if !command.is_read_only() => journal.apply_and_log(state, command),
        _ => (state.apply(command).map_err(ErrorReply::from), None),
    }
}

/// Holds a batch's responses until its last log entry is durable; if the journal stopped
/// first, the responses of the logged requests become `ErrorReply::Storage`. Waits inline (the
/// read loop's fast path), but once log writes are failing, takes the responses and permits out
/// of `applied` and returns them as a deferred answer for the connection's writer, which writes
/// them in their place once the entry is durable: the read loop goes on reading, so later
/// requests of the connection are read and answered (refused, while the log refuses changes)
/// at once, and their answers queue behind the deferred ones, in request order. (The permits
/// the deferred answer holds still bound what a connection can have outstanding.)
pub(crate) async fn settle(shared: &Arc<Shared>, applied: &mut Applied) -> Option<Deferred> {
    let journal = shared.journal.as_ref()?;
    let entry = applied.last_entry.take()?;
    match journal.durable_unless_stalled(entry).await {
        Some(Ok(())) => return None,
        Some(Err(refusal)) => {
            refuse_logged(&mut applied.responses, &applied.logged, &refusal);
            return None;
        }
        None => {}
    }
    let shared = Arc::clone(shared);
    let mut responses = std::mem::take(&mut applied.responses);
    let permits = std::mem::take(&mut applied.permits);
    let logged = std::mem::take(&mut applied.logged);
    Some(Box::pin(async move {
        if let Some(journal) = &shared.journal {
            if let Err(refusal) = journal.durable(entry).await {
                refuse_logged(&mut responses, &logged, &refusal);
            }
        }
        Answers { responses, permits }
    }))
}

/// Replaces the responses of the logged requests with `refusal`.
fn refuse_logged(responses: &mut [ResponseFrame], logged: &[usize], refusal: &ErrorReply) {
    for &index in logged {
        if let Some(response) = responses.get_mut(index) {
            response.result = Err(refusal.clone());
        }
    }
}
