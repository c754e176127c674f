//! The journal: between the broker's lock and the disk.
//!
//! Commands are applied under the caller's lock on the state, and the log entry of every state
//! change is appended, in that same critical section, to an in-memory buffer, so entries are in
//! apply order. A dedicated thread (the flusher) takes the whole buffer, writes it with one
//! `write`, fsyncs according to the [`Fsync`] policy, and publishes how far the log is written
//! and synced. Callers answer a state-changing request only once its entry is durable
//! ([`Journal::durable`]): written (every policy: a `kill -9` loses nothing acknowledged) or
//! synced (`always`). Group commit comes for free: one write and one fsync cover everything
//! that arrived while the previous ones ran.
//!
//! Failures: a failed write (a full disk, an I/O error) is retried every [`WRITE_RETRY`];
//! meanwhile every new state-changing command is refused before it is applied, and the ones
//! already applied (or being applied when the write failed) wait for the retry. A failed fsync is not retried (the kernel may have
//! dropped the pages): the journal stops for good (fail-stop), waiting callers get an error,
//! and every later state-changing command is refused until the process restarts and recovers
//! from the log.
//!
//! Records, with `batch` and `never`: the state notes every record a command appends
//! ([`BrokerState::record_appends`]), and the flusher writes them to their partitions' record
//! segments just before the entries of the same batch go to the log. A command that publishes
//! is logged once applied, with the records it stored taken out: its entry says where they
//! went ([`EntryRef::Placed`]), so each record is written once, and the `.rec` files are
//! synced before the log (see the crate's documentation); recovery reads them back from the
//! segments. With `always`, entries keep their records, so that a group commit syncs one file,
//! and checkpoints write the records to their segments.
//!
//! Checkpoints: once [`JournalSettings::snapshot_log_bytes`] of entries were logged since the
//! last one, the state's image is taken under the lock, and the flusher is asked for the record
//! segments' catalog as it stands once it wrote the records of every entry the image covers (it
//! syncs them first, and writes later ones only after). The image then holds no record, only
//! where each partition's are ([`BrokerState::to_image_with_records_stored`]). With `always`,
//! the image holds the records kept in memory (reference-counted `Bytes`: no payload is
//! copied), and the checkpoint appends them to their segments itself. A background thread then
//! writes a snapshot of the state with those records counted as in their segments, with that
//! catalog, and removes
//! the log segments, the older snapshots and the record segments it makes unnecessary.
//! At the next call between commands the state evicts the records the checkpoint covers from
//! memory: memory holds the records logged since the last checkpoint, not every retained one,
//! and recovery replays only the log since it. Under a bound on the records held in memory
//! ([`JournalSettings::held_log_bytes`]) with `batch` and `never`, the records the flusher
//! wrote also leave memory between checkpoints, as it fills.
//!
//! Locks: the journal's own mutex (the pending buffer) is taken inside the caller's lock on the
//! state by [`Journal::apply`], and alone by the flusher and the snapshot thread, never the
//! other way round.
//!
//! The journal needs no async runtime: waits for durability are futures over a
//! `tokio::sync::watch` channel, which any executor can poll.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::path::PathBuf;

use broker_core::cold::{Appended, LogId};
use broker_core::image::StateImage;
use broker_core::{BrokerError, BrokerState, Command, Outcome};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::format::{config, EntryRef, PlacedRun, MAX_ENTRY_BYTES};
use crate::records::{
    without_retired, written_out, OpenSegments, RecordStore, RecordsToSync, SegmentImage,
    WrittenOut, RECORD_OVERHEAD_BYTES,
};
use crate::repair::Repairs;
use crate::segment::LogToSync;
use crate::snapshot::Checkpoint;
use crate::{encode_entry, remove_covered, DataDir, LogWriter, Recovery, StorageError};

/// The most room [`Journal::apply`] keeps between calls for encoding an entry.
const KEPT_ENCODING_BYTES: usize = 1 << 20;

/// How often a failed log write is retried.
pub const WRITE_RETRY: Duration = Duration::from_millis(200);

/// How often a log write that keeps failing is reported again.
const FAILURE_REPORT: Duration = Duration::from_secs(10);

/// When the log's entries count as durable, and so when a state-changing request may be
/// answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fsync {
    /// An entry is durable once fsynced (one fsync covers every entry appended while the
    /// previous one ran): nothing acknowledged is lost, even on power loss.
    #[default]
    Always,
    /// An entry is durable once written to the operating system, and entries are fsynced at
    /// least every [`JournalSettings::fsync_interval`]: a `kill -9` loses nothing acknowledged,
    /// a power loss at most that interval.
    Batch,
    /// An entry is durable once written to the operating system, which decides when it reaches
    /// the disk: a `kill -9` loses nothing acknowledged, a power loss may lose anything not yet
    /// flushed.
    Never,
}

/// How the journal writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalSettings {
    /// When an entry counts as durable.
    pub fsync: Fsync,
    /// With [`Fsync::Batch`], the longest a written entry waits for its fsync.
    pub fsync_interval: Duration,
    /// Log bytes written since the last checkpoint that trigger the next one; bounds recovery
    /// time and the records held in memory.
    pub snapshot_log_bytes: u64,
    /// A partition's record segment is closed (and a new one started) once it holds this many
    /// bytes; the oldest records leave the disk a whole segment at a time.
    pub segment_bytes: u64,
    /// The most log bytes of records the state may hold in memory. With `batch` and `never`,
    /// where the flusher writes each record to its segment: once half of it was appended since
    /// the last eviction, [`Journal::maybe_checkpoint`] evicts every record written (they are
    /// read from their segments from then on), and past half of it not yet written,
    /// [`Journal::over_memory`] says to hold new records back until the flusher writes more.
    /// With `always`, where checkpoints write them: records logged since the last checkpoint
    /// whose records left memory, past which new records wait for the running checkpoint, and
    /// checkpoints start every half of it (or every `snapshot_log_bytes`, when that is less).
    /// `None` bounds nothing.
    pub held_log_bytes: Option<u64>,
}

/// A data directory opened and recovered, ready to be journaled to.
#[derive(Debug)]
pub struct Storage {
    dir: Arc<DataDir>,
    recovery: Recovery,
    /// What recovery cuts and removes, made by [`Storage::start`].
    repairs: Repairs,
}

impl Storage {
    /// Locks the directory at `path` (creating it if needed) and rebuilds the state from it:
    /// the latest snapshot, then the log through the core's `apply`. Only reads (but for the
    /// lock file): what [`DataDir::recover`] cuts and removes waits for [`Storage::start`], so
    /// a start refused before it, here or by the caller's own checks of the state, leaves the
    /// directory as it was.
    ///
    /// # Errors
    /// As [`DataDir::open`] and [`DataDir::recover`]: the directory is locked by another
    /// process, damaged, written by an incompatible version or with another capacity, or cannot
    /// be read.
    pub fn open(path: &std::path::Path, capacity: i32) -> Result<Storage, StorageError> {
        let dir = DataDir::open(path)?;
        let (recovery, repairs) = dir.check(capacity)?;
        Ok(Storage {
            dir: Arc::new(dir),
            recovery,
            repairs,
        })
    }

    /// What recovery found.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// Starts the journal on a fresh log segment, after making the repairs recovery found
    /// necessary (see [`DataDir::recover`]): `configure` receives the recovered state and
    /// returns it with the settings this process runs with (capacity, memory budget, limits),
    /// which is the state returned. Settings decide which commands are refused, so log entries
    /// must be replayed under the settings they were decided under: they are part of the
    /// checkpointed state, and unless nothing changed since the last checkpoint, a checkpoint
    /// with the new settings is written before anything is logged. A directory of an older
    /// format is migrated the same way: the checkpoint is written in the current format and
    /// the older files it covers are removed.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a repair, the checkpoint or the segment cannot be written or
    /// the flusher thread cannot start.
    pub fn start(
        self,
        settings: JournalSettings,
        configure: impl FnOnce(BrokerState) -> BrokerState,
    ) -> Result<(BrokerState, Journal), StorageError> {
        let Storage {
            dir,
            recovery,
            repairs,
        } = self;
        repairs.apply()?;
        let recovered_image = (recovery.replayed == 0
            && recovery.snapshot_seq.is_some()
            && recovery.migrated_from.is_none())
        .then(|| recovery.state.to_image());
        let records = recovery.records;
        let mut state = configure(recovery.state);
        let mut since_snapshot = recovery.replayed_bytes;
        if recovered_image.as_ref() != Some(&state.to_image()) {
            let started = Instant::now();
            let written = checkpoint(
                &dir,
                &records,
                recovery.next_seq,
                state.to_image(),
                settings.segment_bytes,
            )?;
            state.evict(&written.evicted);
            info!(
                file = %written.path.display(),
                covers_entries = recovery.next_seq,
                migrated_from_format = recovery.migrated_from,
                segments_removed = written.removed,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "checkpoint written at start"
            );
            since_snapshot = 0;
        }
        // Every record the state holds in memory is in a segment now (none was replayed, or
        // the checkpoint above wrote them): unless checkpoints write them (`always`), the
        // flusher writes each new one as it comes.
        state.record_appends(settings.fsync != Fsync::Always);
        let capacity = state.capacity_per_partition();
        let segment_log_bytes =
            (settings.snapshot_log_bytes / 4).clamp(64 * 1024, 64 * 1024 * 1024);
        let writer = dir.log_writer(capacity, recovery.next_seq, segment_log_bytes)?;
        // A replayed tail (none after a start-up checkpoint) counts towards the next one, so
        // frequent restarts cannot let the log (and recovery time) grow without bound.
        let journal = Journal::start(
            settings,
            dir,
            records,
            writer,
            recovery.next_seq,
            since_snapshot,
        )?;
        Ok((state, journal))
    }
}

/// Whether a command of `kind` that gave `result` changed `state` and must be logged: by its
/// outcome, or because a record went past its last delivery meanwhile (`dead_letters` is
/// [`BrokerState::dead_letter_events`] before it was applied).
fn changed(
    state: &BrokerState,
    dead_letters: u64,
    kind: broker_core::CommandKind,
    result: &Result<Outcome, JournalError>,
) -> bool {
    match result {
        Ok(outcome) => kind.changed_state(outcome) || state.dead_letter_events() != dead_letters,
        Err(_) => false,
    }
}

/// Why a command was not applied, or a change is not known to be on disk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// The broker refused the command; nothing changed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The log cannot take entries now (a full disk, an I/O error, or it stopped after a failed
    /// fsync); the command was not applied.
    #[error("{0}")]
    Refused(String),
    /// The change was applied, but the log stopped before it was durable.
    #[error("{0}")]
    NotDurable(String),
}

/// A command (or the passing of time) applied through the journal: its result and, when it
/// changed the state, the sequence number of its log entry (see [`Journal::durable`]).
#[derive(Debug)]
pub struct Applied<T = Outcome> {
    /// What the command returned.
    pub result: Result<T, JournalError>,
    /// Its log entry, if it was logged.
    pub entry: Option<u64>,
}

/// An entry encoded into the flusher's buffer, with the buffer held, until the change it
/// describes says whether it is kept. Dropped without [`Slot::finish`] (a panic while the
/// change was applied), it takes the entry back.
struct Slot<'a> {
    pending: MutexGuard<'a, Pending>,
    start: usize,
    inner: &'a Inner,
    finished: bool,
}

impl Slot<'_> {
    /// Encodes `entry` at the end of the buffer (in place of what was encoded before).
    fn encode(&mut self, entry: &EntryRef<'_>) -> Result<(), StorageError> {
        let start = self.start;
        self.pending.batch.buffer.truncate(start);
        encode_entry(entry, &mut self.pending.batch.buffer)
    }

    /// Keeps the entry with the records its change appended (returning its sequence number),
    /// or takes it back.
    fn finish(mut self, keep: bool, appended: Vec<Appended>) -> Option<u64> {
        self.finished = true;
        if !keep {
            let start = self.start;
            self.pending.batch.buffer.truncate(start);
            // None are expected; any there are the state holds, so they are written (with no
            // entry, a restart drops them) for a checkpoint to find them in their segments.
            self.pending.note_records(appended);
            return None;
        }
        let pending = &mut *self.pending;
        pending.batch.entries += 1;
        // Records written to their segments count as written with their entry, as when the
        // entry held them: the records held in memory and the time between checkpoints stay
        // what they were. (With `always`, none is noted: entries hold them.)
        let records = pending.note_records(appended);
        pending.since_snapshot += (pending.batch.buffer.len() - self.start) as u64 + records;
        let seq = pending.next_seq;
        pending.next_seq += 1;
        // A notification is a system call: made only when the flusher sleeps (it looks for
        // new entries before it does).
        if pending.flusher_waits {
            self.inner.wake.notify_one();
        }
        Some(seq)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let start = self.start;
            self.pending.batch.buffer.truncate(start);
        }
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

/// Log entries and the records they appended, written by the flusher together: the records
/// to their segments, then the entries to the log.
#[derive(Debug, Default)]
struct Batch {
    /// The entries, encoded.
    buffer: Vec<u8>,
    entries: u64,
    /// The records the entries' changes appended, in apply order, as each change's list.
    records: Vec<Vec<Appended>>,
    /// A checkpoint of the state after these entries waits for the record segments' catalog
    /// once these records (and every earlier one) are written and synced.
    catalog: Option<mpsc::SyncSender<Vec<SegmentImage>>>,
    /// The bytes `records` take in their segments.
    record_bytes: u64,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.buffer.is_empty() && self.catalog.is_none() && self.records.is_empty()
    }
}

/// Entries appended under the caller's lock and not yet taken by the flusher.
#[derive(Debug, Default)]
struct Pending {
    /// What was appended since the flusher last took it.
    batch: Batch,
    /// Batches closed by checkpoints, oldest first: written before `batch`.
    sealed: VecDeque<Batch>,
    /// The sequence number the next appended entry gets.
    next_seq: u64,
    /// Why state-changing commands are refused now (a failing write or a failed fsync).
    refusing: Option<String>,
    /// Why state-changing commands are refused for good: a change applied that could not be
    /// logged, or the flusher gone. Unlike `refusing`, no successful write clears it.
    broken: Option<String>,
    /// Entry bytes appended since the last checkpoint started, with the bytes the records they
    /// appended take in their segments.
    since_snapshot: u64,
    /// Entry bytes the running checkpoint covers, whose records are in memory until its
    /// evictions are taken (0 when none is running or waiting to be taken).
    checkpointing: u64,
    snapshot_running: bool,
    /// What the last finished checkpoint wrote to record segments, for the state to evict.
    evicted: Option<Vec<(LogId, i64)>>,
    stopping: bool,
    /// Whether the flusher sleeps on [`Inner::wake`], waiting for entries.
    flusher_waits: bool,
    /// Bytes (in their segments) of the records appended since the journal started, of those
    /// the flusher wrote, and of those written when the state last evicted what was written.
    appended_record_bytes: u64,
    written_record_bytes: u64,
    evicted_record_bytes: u64,
    /// How many syncs the flusher handed the syncer thread that it has not finished (`batch`).
    syncing: usize,
    /// Whether an fsync failed (on either thread) or the syncer stopped during one: the
    /// journal is stopped, and the flusher stops too.
    sync_failed: bool,
}

impl Pending {
    /// Adds records a change appended to the batch, for the flusher to write; returns the bytes
    /// they take in their segments.
    fn note_records(&mut self, appended: Vec<Appended>) -> u64 {
        if appended.is_empty() {
            return 0;
        }
        let bytes: u64 = appended
            .iter()
            .map(|appended| appended.record.size() + RECORD_OVERHEAD_BYTES)
            .sum();
        self.batch.records.push(appended);
        self.batch.record_bytes += bytes;
        self.appended_record_bytes += bytes;
        bytes
    }
}

/// The write-ahead log of a running broker: appending, durability waits, snapshots, shutdown.
#[derive(Debug)]
pub struct Journal {
    inner: Arc<Inner>,
    /// Where [`Journal::apply`] encodes an entry before the journal's lock is taken (never
    /// contended: the caller's lock on the state serializes calls).
    encoded: Mutex<Vec<u8>>,
    progress: watch::Receiver<Progress>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    /// The thread of the last checkpoint started, which [`Journal::finish`] waits for.
    checkpointer: Mutex<Option<JoinHandle<()>>>,
}

impl Journal {
    /// Whether new records should wait ([`Journal::room_made`]) under
    /// [`JournalSettings::held_log_bytes`]: with `batch` and `never`, while more than half of
    /// it is not yet written by the flusher; with `always`, while the records held in memory
    /// (as log bytes) pass it and a checkpoint that will take some of them out runs. Always
    /// `false` without that bound, and while the log takes no change (publishes are refused
    /// instead).
    pub fn over_memory(&self) -> bool {
        let Some(bound) = self.inner.settings.held_log_bytes else {
            return false;
        };
        let pending = self.inner.lock();
        if pending.broken.is_some() || pending.refusing.is_some() {
            // The log takes no change now: publishes are refused, with why, rather than wait.
            return false;
        }
        if self.inner.writes_records() {
            pending.appended_record_bytes - pending.written_record_bytes > bound / 2
        } else {
            pending.snapshot_running && pending.since_snapshot + pending.checkpointing > bound
        }
    }

    /// Completes once the journal may have made room for records held back by
    /// [`Journal::over_memory`]: the flusher wrote more (`batch`, `never`: the state's next
    /// [`Journal::maybe_checkpoint`] evicts them), or the running checkpoint is done
    /// (`always`; at once when none runs), or the log stopped or its writes fail (publishes
    /// are then refused, with why).
    pub async fn room_made(&self) {
        if self.inner.writes_records() {
            let mut progress = self.progress.clone();
            let _ = progress
                .wait_for(|progress| {
                    progress.failed.is_some() || progress.stalled || !self.over_memory()
                })
                .await;
            return;
        }
        // Subscribed before the check: a checkpoint that finishes after it is seen.
        let mut done = self.inner.checkpoints.subscribe();
        if !self.inner.lock().snapshot_running {
            return;
        }
        let _ = done.changed().await;
    }
}

#[derive(Debug)]
struct Inner {
    pending: Mutex<Pending>,
    wake: Condvar,
    settings: JournalSettings,
    dir: Arc<DataDir>,
    records: Arc<RecordStore>,
    /// Told how long each fsync of the log took (see [`Journal::observe_fsyncs`]).
    fsync_observer: OnceLock<FsyncObserver>,
    /// How many checkpoints finished: [`Journal::room_made`] waits for it to change.
    checkpoints: watch::Sender<u64>,
}

/// A function told how long each fsync of the log took.
struct FsyncObserver(Box<dyn Fn(Duration) + Send + Sync>);

impl std::fmt::Debug for FsyncObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FsyncObserver")
    }
}

impl Inner {
    /// Whether the flusher writes each record to its segment as it comes, and publishes' entries
    /// leave their records out (`batch`, `never`); otherwise (`always`) entries hold them and
    /// checkpoints write them to their segments.
    fn writes_records(&self) -> bool {
        self.settings.fsync != Fsync::Always
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing panics while holding it; a poisoned lock still guards a consistent buffer.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Journal {
    fn start(
        settings: JournalSettings,
        dir: Arc<DataDir>,
        records: Arc<RecordStore>,
        writer: LogWriter,
        next_seq: u64,
        since_snapshot: u64,
    ) -> Result<Journal, StorageError> {
        let inner = Arc::new(Inner {
            pending: Mutex::new(Pending {
                next_seq,
                since_snapshot,
                ..Pending::default()
            }),
            wake: Condvar::new(),
            settings,
            dir,
            records,
            fsync_observer: OnceLock::new(),
            checkpoints: watch::Sender::new(0),
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
            .spawn(move || flush(&flusher_inner, writer, &progress_tx))
            .map_err(StorageError::io(
                "start the log writer thread",
                inner.dir.path(),
            ))?;
        Ok(Journal {
            inner,
            encoded: Mutex::new(Vec::new()),
            progress,
            flusher: Mutex::new(Some(flusher)),
            checkpointer: Mutex::new(None),
        })
    }

    /// The record segments the journal writes to.
    #[cfg(test)]
    pub(crate) fn records(&self) -> &RecordStore {
        &self.inner.records
    }

    /// Why state-changing commands are refused now, if they are (the log cannot take entries).
    pub fn refusing(&self) -> Option<String> {
        let pending = self.inner.lock();
        pending.broken.clone().or_else(|| pending.refusing.clone())
    }

    /// Applies `command` to `state` at `now_ms` (see [`BrokerState::apply_at`]) and logs it,
    /// with the time, if it changed anything (see [`broker_core::CommandKind::changed_state`]);
    /// a state-changing command is refused before it is applied while the log cannot take
    /// entries (one being applied when the log stops taking them is logged, and waits with
    /// those before it), and read-only commands are applied without the log. The entry is encoded
    /// before the command is moved into the core, and appended to the buffer the flusher takes
    /// if the outcome needs one; but with `batch` and `never`, that of a command that publishes
    /// is encoded once it was applied, without the records it stored ([`EntryRef::Placed`]),
    /// which the flusher writes to their segments. Either way the command is applied without
    /// the journal's lock. Call with `state` locked, in apply order.
    pub fn apply(&self, state: &mut BrokerState, now_ms: i64, command: Command) -> Applied {
        let kind = command.kind();
        if kind.is_read_only() {
            return Applied {
                result: state.apply_at(now_ms, command).map_err(JournalError::from),
                entry: None,
            };
        }
        // The clock the command is applied at (it never goes back), so that a replay gives
        // records the same times even if the wall clock stepped back.
        let now_ms = state.clock_ms().max(now_ms);
        if self.inner.writes_records() && command.largest_record().is_some() {
            return self.apply_publish(state, now_ms, command);
        }
        // Encoded before the command moves into the core, outside the journal's lock (which
        // the flusher takes meanwhile), into a buffer kept from call to call; copied into the
        // flusher's buffer once the outcome says to keep it.
        let mut encoded = self.encoded.lock().unwrap_or_else(PoisonError::into_inner);
        encoded.clear();
        let checked = self.accepting().and_then(|()| {
            let entry = EntryRef::Apply {
                at_ms: now_ms,
                command: &command,
            };
            encode_entry(&entry, &mut encoded)
                .map_err(|cause| JournalError::Refused(cause.to_string()))
        });
        if let Err(refused) = checked {
            return Applied {
                result: Err(refused),
                entry: None,
            };
        }
        let dead_letters = state.dead_letter_events();
        let result = state.apply_at(now_ms, command).map_err(JournalError::from);
        let keep = changed(state, dead_letters, kind, &result);
        let appended = state.take_appended();
        let mut slot = self.slot();
        if keep {
            slot.pending.batch.buffer.extend_from_slice(&encoded);
        }
        let entry = slot.finish(keep, appended);
        // A large entry's room is not kept for ever.
        if encoded.capacity() > KEPT_ENCODING_BYTES {
            *encoded = Vec::new();
        }
        Applied { result, entry }
    }

    /// [`Journal::apply`] of a command that publishes records, with `batch` and `never`: it is
    /// only checked to fit before it is applied, and logged once applied without the records
    /// it stored, which the flusher writes to their segments. (The caller's lock on the state
    /// keeps entries in apply order.)
    fn apply_publish(&self, state: &mut BrokerState, now_ms: i64, command: Command) -> Applied {
        let kind = command.kind();
        let mut logged = command.clone();
        // Room for where each record went: the entry may grow by that much.
        let records = logged.published_records_mut().len();
        let checked = self.accepting().and_then(|()| {
            let entry = EntryRef::Apply {
                at_ms: now_ms,
                command: &command,
            };
            check_entry(&entry, 8 + PLACED_RUN_BYTES * records)
                .map_err(|cause| JournalError::Refused(cause.to_string()))
        });
        if let Err(refused) = checked {
            return Applied {
                result: Err(refused),
                entry: None,
            };
        }
        let dead_letters = state.dead_letter_events();
        let mut result = state.apply_at(now_ms, command).map_err(JournalError::from);
        let keep = changed(state, dead_letters, kind, &result);
        let appended = state.take_appended();
        let placed = match &result {
            Ok(outcome) if keep => {
                let topic = logged.topic().and_then(|topic| state.topic_id(topic));
                placed_runs(&mut logged, outcome, topic, &appended)
            }
            _ => Vec::new(),
        };
        let mut slot = self.slot();
        if keep {
            let entry = if placed.is_empty() {
                EntryRef::Apply {
                    at_ms: now_ms,
                    command: &logged,
                }
            } else {
                EntryRef::Placed {
                    at_ms: now_ms,
                    command: &logged,
                    placed: &placed,
                }
            };
            if let Err(cause) = slot.encode(&entry) {
                // Checked before the command was applied, and smaller than then: this cannot
                // happen. Were it to, the state would hold a change the log lacks.
                let reason = format!(
                    "a change was applied but could not be logged ({cause}); restart the server"
                );
                error!(%reason, "refusing every change");
                slot.pending.broken = Some(reason.clone());
                result = Err(JournalError::NotDurable(reason));
                drop(slot);
                return Applied {
                    result,
                    entry: None,
                };
            }
        }
        let entry = slot.finish(keep, appended);
        Applied { result, entry }
    }

    /// Moves `state`'s clock to `now_ms` and logs it, when that changes anything besides the
    /// clock (see [`BrokerState::is_due`]): records past their topic's age leave, overdue
    /// deliveries are released. The result lists the topics where something changed. Call with
    /// `state` locked, between commands.
    pub fn tick(&self, state: &mut BrokerState, now_ms: i64) -> Applied<Vec<String>> {
        if !state.is_due(now_ms) {
            return Applied {
                result: Ok(Vec::new()),
                entry: None,
            };
        }
        let now_ms = state.clock_ms().max(now_ms);
        let slot = self.begin().and_then(|mut slot| {
            slot.encode(&EntryRef::Tick { at_ms: now_ms })
                .map(|()| slot)
                .map_err(|cause| JournalError::Refused(cause.to_string()))
        });
        let slot = match slot {
            Ok(slot) => slot,
            Err(refused) => {
                return Applied {
                    result: Err(refused),
                    entry: None,
                }
            }
        };
        let result = state.advance_clock(now_ms);
        let entry = slot.finish(result.is_ok(), state.take_appended());
        Applied {
            result: result.map_err(JournalError::from),
            entry,
        }
    }

    /// Holds the buffer the flusher takes for an entry ([`Slot::encode`]) until
    /// [`Slot::finish`] says whether to keep it; refused while the log cannot take entries.
    fn begin(&self) -> Result<Slot<'_>, JournalError> {
        let slot = self.slot();
        match refused(&slot.pending) {
            Some(refused) => Err(refused),
            None => Ok(slot),
        }
    }

    /// Whether the log takes entries now; refused otherwise.
    fn accepting(&self) -> Result<(), JournalError> {
        refused(&self.inner.lock()).map_or(Ok(()), Err)
    }

    /// Holds the buffer the flusher takes for an entry, as [`Journal::begin`] but whether or
    /// not the log takes entries.
    fn slot(&self) -> Slot<'_> {
        let pending = self.inner.lock();
        let start = pending.batch.buffer.len();
        Slot {
            pending,
            start,
            inner: &self.inner,
            finished: false,
        }
    }

    /// Waits until the entry `seq` is durable in the sense of the fsync policy.
    ///
    /// # Errors
    /// [`JournalError::NotDurable`] when the journal stopped before that.
    pub async fn durable(&self, seq: u64) -> Result<(), JournalError> {
        self.wait(seq, false).await.unwrap_or(Ok(()))
    }

    /// Has `observer` told how long each fsync of the log takes from now on (for metrics). Only
    /// the first observer set is kept; a later one is ignored.
    pub fn observe_fsyncs(&self, observer: impl Fn(Duration) + Send + Sync + 'static) {
        let _ = self
            .inner
            .fsync_observer
            .set(FsyncObserver(Box::new(observer)));
    }

    /// [`Journal::durable`], or `None` as soon as log writes are failing (stalled) with `seq`
    /// not yet durable: for a caller that would rather go on and wait in the background.
    pub async fn durable_unless_stalled(&self, seq: u64) -> Option<Result<(), JournalError>> {
        self.wait(seq, true).await
    }

    async fn wait(&self, seq: u64, until_stalled: bool) -> Option<Result<(), JournalError>> {
        let fsync = self.inner.settings.fsync;
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
                Err(JournalError::NotDurable(format!(
                    "the change was applied but may not be on disk: {failed}"
                )))
            }),
            Err(_) => Some(Err(JournalError::NotDurable(
                "the log writer stopped before the change reached the disk".into(),
            ))),
        }
    }

    /// With `batch` and `never` under [`JournalSettings::held_log_bytes`]: once half of it
    /// was appended since the last time, evicts from memory every record the flusher wrote to
    /// its segment (readable there from then on, through the page cache).
    fn evict_written(&self, state: &mut BrokerState) {
        let Some(bound) = self.inner.settings.held_log_bytes else {
            return;
        };
        if !self.inner.writes_records() {
            return;
        }
        let pending = self.inner.lock();
        // Half the bound arrived since the last eviction, and a quarter of it was written since
        // (not while the flusher is behind, when there is little or nothing new to evict).
        if pending.appended_record_bytes - pending.evicted_record_bytes <= bound / 2
            || pending.written_record_bytes - pending.evicted_record_bytes < bound / 4
        {
            return;
        }
        // Read before the segments' ends: what they name is at least this much.
        let written = pending.written_record_bytes;
        drop(pending);
        state.evict(&self.inner.records.written_ends());
        self.inner.lock().evicted_record_bytes = written;
    }

    /// Between commands, with `state` locked: evicts from memory the records the last
    /// checkpoint put in record segments, and starts a background checkpoint of `state` if
    /// enough was logged since the last one.
    pub fn maybe_checkpoint(&self, state: &mut BrokerState) {
        self.evict_written(state);
        let mut pending = self.inner.lock();
        if !pending.snapshot_running && pending.checkpointing > 0 {
            match pending.evicted.take() {
                Some(evicted) => state.evict(&evicted),
                // It failed: its records stay in memory, for the next one to write.
                None => pending.since_snapshot += pending.checkpointing,
            }
            pending.checkpointing = 0;
        }
        let settings = &self.inner.settings;
        // Under the bound, checkpoints come every half of it: with `always` they take records
        // out of memory, and with every policy a restart replays into memory what was logged
        // since the last one.
        let due = settings
            .held_log_bytes
            .map_or(settings.snapshot_log_bytes, |held| {
                settings.snapshot_log_bytes.min(held / 2)
            });
        // A state that failed may hold half a change that no log entry explains: it is never
        // checkpointed; a restart rebuilds it from the log.
        if pending.snapshot_running
            || pending.refusing.is_some()
            || pending.broken.is_some()
            || pending.stopping
            || state.failure().is_some()
            || pending.since_snapshot < due.max(1)
        {
            return;
        }
        pending.snapshot_running = true;
        pending.checkpointing = pending.since_snapshot.max(1);
        pending.since_snapshot = 0;
        let seq = pending.next_seq;
        // Where the flusher writes the records, those of the entries below `seq` are those of
        // the batches appended so far: it tells the catalog once it wrote them, before any
        // later one. Otherwise (`always`) the checkpoint writes them.
        let catalog = self.inner.writes_records().then(|| {
            let (catalog_sender, catalog) = mpsc::sync_channel(1);
            let mut sealed = std::mem::take(&mut pending.batch);
            sealed.catalog = Some(catalog_sender);
            pending.sealed.push_back(sealed);
            self.inner.wake.notify_one();
            catalog
        });
        drop(pending);
        // The records the flusher writes need no copy in the image: it only says where they are.
        let (image, stored) = match catalog {
            Some(catalog) => {
                let (image, in_memory) = state.to_image_with_records_stored();
                (image, Some(Stored { catalog, in_memory }))
            }
            None => (state.to_image(), None),
        };
        let inner = Arc::clone(&self.inner);
        let spawned = std::thread::Builder::new()
            .name("broker-checkpoint".into())
            .spawn(move || {
                // Ends the checkpoint however this thread ends (a panic included), so that
                // nothing waits for it for ever.
                let ending = CheckpointEnds(&inner);
                let evicted = run_checkpoint(&inner, seq, image, stored);
                inner.lock().evicted = evicted;
                drop(ending);
            });
        match spawned {
            // The previous checkpoint ended before this one could start: its handle can go.
            Ok(thread) => {
                *self
                    .checkpointer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(thread);
            }
            Err(cause) => {
                warn!(cause = %cause, "cannot start the checkpoint thread");
                // Its records stay in memory, for the next one to write.
                let mut pending = self.inner.lock();
                pending.since_snapshot += pending.checkpointing;
                pending.checkpointing = 0;
                drop(pending);
                drop(CheckpointEnds(&self.inner));
            }
        }
    }

    /// Lets a running checkpoint end, writes and syncs everything appended, then stops the
    /// flusher. For shutdown: call once nothing is applied any more; blocks until both are done.
    /// (A checkpoint cut short would be safe, but recovery would then replay and keep in memory
    /// everything it covered.)
    pub fn finish(&self) {
        // Told first: a flusher that cannot write gives up now, so a checkpoint waiting for it
        // fails rather than waiting for ever.
        self.inner.lock().stopping = true;
        self.inner.wake.notify_one();
        let checkpointer = self
            .checkpointer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(checkpointer) = checkpointer {
            if checkpointer.join().is_err() {
                error!("the checkpoint thread panicked");
            }
        }
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

/// The bytes one [`PlacedRun`] takes in an entry.
const PLACED_RUN_BYTES: usize = 20;

/// Checks that `entry` with `extra` bytes more can be encoded within [`MAX_ENTRY_BYTES`],
/// encoding it nowhere.
fn check_entry(entry: &EntryRef<'_>, extra: usize) -> Result<(), StorageError> {
    /// Counts what is written to it.
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    bincode::serde::encode_into_std_write(entry, &mut counter, config())
        .map_err(|error| StorageError::Encode(error.to_string()))?;
    if counter.0 + extra > MAX_ENTRY_BYTES {
        return Err(StorageError::Encode(format!(
            "an entry of {} bytes exceeds the limit of {MAX_ENTRY_BYTES}",
            counter.0 + extra
        )));
    }
    Ok(())
}

/// Takes out of `command` (applied with `outcome`) the records it stored in topic `topic`,
/// which `appended` lists (the flusher writes them to their segments), and returns where they
/// went; none when it stored none, or when what it stored cannot be told apart (the command is
/// then logged whole).
fn placed_runs(
    command: &mut Command,
    outcome: &Outcome,
    topic: Option<u64>,
    appended: &[Appended],
) -> Vec<PlacedRun> {
    let (Some(topic), Some(placements)) = (topic, command.placements(outcome)) else {
        return Vec::new();
    };
    // The records it stored were appended in the order it lists them: each placement is
    // one of them if it is the next one appended (an idempotent producer's repeat, answered
    // with the offset of its first time, is not).
    let mut stored = appended
        .iter()
        .filter(|appended| appended.log.topic == topic)
        .map(|appended| (appended.log.partition, appended.offset))
        .peekable();
    let runs = PlacedRun::runs(&placements, |partition, offset| {
        let next = u32::try_from(partition)
            .is_ok_and(|partition| stored.peek() == Some(&(partition, offset)));
        if next {
            stored.next();
        }
        next
    });
    let mut parts = command.published_records_mut();
    if parts.len() != placements.len() {
        return Vec::new();
    }
    for run in &runs {
        for (number, _) in run.records() {
            parts[number].take();
        }
    }
    runs
}

/// Why the log takes no entry now, if it does not.
fn refused(pending: &Pending) -> Option<JournalError> {
    let reason = pending.broken.as_ref().or(pending.refusing.as_ref())?;
    Some(JournalError::Refused(reason.clone()))
}

/// A checkpoint on disk: its snapshot file, and the records it moved to record segments.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) path: PathBuf,
    /// For each partition whose records it wrote, the offset they now reach on disk.
    pub(crate) evicted: Vec<(LogId, i64)>,
    /// Record segments (and partition directories) removed because retention or a deletion
    /// left nothing in them that is still needed.
    pub(crate) removed: usize,
}

/// Marks the running checkpoint ended when dropped, and wakes whoever waits for it
/// ([`Journal::room_made`]).
struct CheckpointEnds<'a>(&'a Inner);

impl Drop for CheckpointEnds<'_> {
    fn drop(&mut self) {
        self.0.lock().snapshot_running = false;
        self.0.checkpoints.send_modify(|done| *done += 1);
    }
}

/// Writes a checkpoint of `image`, the state after exactly the log entries below `seq`: appends
/// the records it holds in memory to their partitions' record segments (fsynced), writes the
/// snapshot of the state without them and of the segment catalog, then removes the log
/// segments and snapshots it covers and the record segments no partition needs any more.
/// For a directory no flusher writes records to: at start, and with `--fsync always`.
pub(crate) fn checkpoint(
    dir: &DataDir,
    records: &RecordStore,
    seq: u64,
    mut image: StateImage,
    segment_bytes: u64,
) -> Result<Written, StorageError> {
    let written = records.write_out(&mut image, segment_bytes)?;
    let catalog = records.catalog();
    finish_checkpoint(dir, records, seq, image, written, catalog)
}

/// Writes the snapshot of `image` (whose records `written` took out) with the segments of
/// `catalog` it still needs, then removes the log segments and snapshots it covers and the
/// record segments no partition needs any more.
fn finish_checkpoint(
    dir: &DataDir,
    records: &RecordStore,
    seq: u64,
    image: StateImage,
    written: WrittenOut,
    catalog: Vec<SegmentImage>,
) -> Result<Written, StorageError> {
    // The snapshot names only the segments still needed; the others go once it is durable
    // (until then the previous snapshot names them).
    let path = dir.write_snapshot(
        seq,
        &Checkpoint {
            image,
            segments: without_retired(catalog, &written.bases),
        },
    )?;
    remove_covered(dir.path(), seq)?;
    let removed = records.retire_and_remove(&written)?;
    Ok(Written {
        path,
        evicted: written.evicted,
        removed,
    })
}

/// The records of a checkpoint's image that the flusher writes: where they are in memory, and
/// the catalog of record segments, sent once the flusher wrote and synced them.
struct Stored {
    catalog: mpsc::Receiver<Vec<SegmentImage>>,
    in_memory: Vec<(LogId, Range<i64>)>,
}

/// A checkpoint in the background of `image`, the state after the entries below `seq`: with
/// `stored`, waits for the flusher to have written (and synced) the records of every entry
/// below `seq` and to give the catalog as it stands then, and writes the checkpoint (see
/// [`finish_checkpoint`]); without, writes the records too (see [`checkpoint`]). Logs what
/// happened; returns what to evict, or `None` if it failed.
fn run_checkpoint(
    inner: &Inner,
    seq: u64,
    image: StateImage,
    stored: Option<Stored>,
) -> Option<Vec<(LogId, i64)>> {
    let started = Instant::now();
    let written = match stored {
        None => checkpoint(
            &inner.dir,
            &inner.records,
            seq,
            image,
            inner.settings.segment_bytes,
        ),
        Some(Stored { catalog, in_memory }) => catalog
            .recv()
            .map_err(|_| {
                StorageError::io("checkpoint", inner.dir.path())(std::io::Error::other(
                    "the log writer stopped before it wrote the records the checkpoint covers",
                ))
            })
            .and_then(|catalog| {
                let written = written_out(&image, &in_memory, &catalog, inner.dir.path())?;
                finish_checkpoint(&inner.dir, &inner.records, seq, image, written, catalog)
            }),
    };
    match written {
        Ok(written) => {
            info!(
                file = %written.path.display(),
                covers_entries = seq,
                partitions_written = written.evicted.len(),
                segments_removed = written.removed,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "checkpoint written"
            );
            Some(written.evicted)
        }
        Err(cause) => {
            warn!(cause = %cause, "writing a checkpoint failed; the log keeps growing until one succeeds");
            None
        }
    }
}

/// The flusher thread: takes what was appended, writes each batch's records to their segments
/// and then its entries to the log, fsyncs the log as the policy says (and the segments when a
/// checkpoint asks for their catalog), and publishes the progress, until shutdown or a failed
/// fsync.
///
/// With `batch`, the periodic fsyncs and those a checkpoint's catalog waits for run on a second
/// thread, the syncer, in the order handed, while the flusher goes on writing: over many
/// partitions they take a file each, and writing nothing meanwhile made publishers wait for
/// them.
fn flush(inner: &Inner, writer: LogWriter, progress: &watch::Sender<Progress>) {
    let _ends = FlusherEnds(inner);
    std::thread::scope(|scope| {
        let syncer = (inner.settings.fsync == Fsync::Batch)
            .then(|| {
                let (jobs, received) = mpsc::channel();
                let spawned = std::thread::Builder::new()
                    .name("broker-log-sync".into())
                    .spawn_scoped(scope, move || sync_in_background(inner, &received, progress));
                match spawned {
                    Ok(_) => Some(jobs),
                    Err(cause) => {
                        warn!(cause = %cause, "cannot start the log's sync thread; syncing from the writer");
                        None
                    }
                }
            })
            .flatten();
        // Returning drops `syncer`: the syncer finishes its job and ends, and the scope waits.
        write_and_sync(inner, writer, progress, syncer.as_ref());
    });
}

/// Syncs handed by the flusher to the syncer thread, one at a time, until the flusher ends.
fn sync_in_background(
    inner: &Inner,
    jobs: &mpsc::Receiver<SyncWork>,
    progress: &watch::Sender<Progress>,
) {
    let _ends = SyncerEnds(inner);
    for job in jobs {
        let synced = job.run(inner, progress);
        if let Err(cause) = &synced {
            fail_stop(inner, progress, cause);
        }
        inner.lock().syncing -= 1;
        inner.wake.notify_all();
        if synced.is_err() {
            return;
        }
    }
}

/// What the flusher hands the syncer.
enum SyncWork {
    /// The periodic sync of the log and the record files its entries name.
    Log(SyncJob),
    /// The files a checkpoint's catalog names, then the catalog to it.
    Checkpoint {
        files: RecordsToSync,
        catalog: Vec<SegmentImage>,
        to: mpsc::SyncSender<Vec<SegmentImage>>,
    },
}

impl SyncWork {
    /// Syncs what it holds, then reports it (see [`SyncJob::run`]), or sends the catalog.
    ///
    /// # Errors
    /// The failed fsync's, after which the journal must stop ([`fail_stop`]).
    fn run(self, inner: &Inner, progress: &watch::Sender<Progress>) -> Result<(), StorageError> {
        match self {
            SyncWork::Log(job) => job.run(inner, progress),
            SyncWork::Checkpoint { files, catalog, to } => {
                files.sync()?;
                // A checkpoint that gave up waiting is no reason to stop.
                drop(to.send(catalog));
                Ok(())
            }
        }
    }
}

/// Hands `work` to the syncer (counted as running until it is done), or gives it back when
/// there is none or it is gone: the caller then runs it, once no sync runs there.
fn hand(
    inner: &Inner,
    syncer: Option<&mpsc::Sender<SyncWork>>,
    work: SyncWork,
) -> Option<SyncWork> {
    let Some(jobs) = syncer else {
        return Some(work);
    };
    inner.lock().syncing += 1;
    jobs.send(work).err().map(|unsent| {
        inner.lock().syncing -= 1;
        unsent.0
    })
}

/// Ends the syncer however it ends: a sync it was running when it panicked counts as failed,
/// and the flusher, which may be waiting for it, is woken.
struct SyncerEnds<'a>(&'a Inner);

impl Drop for SyncerEnds<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        if std::mem::take(&mut pending.syncing) > 0 {
            pending.sync_failed = true;
            pending
                .broken
                .get_or_insert_with(|| "the log's sync thread stopped; restart the server".into());
        }
        drop(pending);
        self.0.wake.notify_all();
    }
}

/// A sync of the log up to an entry, with the record files its entries name first.
struct SyncJob {
    records: RecordsToSync,
    log: LogToSync,
    /// The sequence number of the first entry it may leave unsynced.
    up_to: u64,
}

impl SyncJob {
    /// What makes every entry written so far durable: the record files written since the
    /// last sync (counted as synced from now on), and the log's active segment.
    fn take(writer: &LogWriter, segments: &mut OpenSegments) -> SyncJob {
        SyncJob {
            records: segments.take_records_to_sync(),
            log: writer.to_sync(),
            up_to: writer.next_seq(),
        }
    }

    /// Syncs the records, then the log (an entry that holds only where its records are is
    /// durable once they are), tells the observer how long it took and publishes the progress.
    ///
    /// # Errors
    /// The failed fsync's, after which the journal must stop ([`fail_stop`]).
    fn run(&self, inner: &Inner, progress: &watch::Sender<Progress>) -> Result<(), StorageError> {
        let started = Instant::now();
        self.records.sync()?;
        self.log.sync()?;
        if let Some(observer) = inner.fsync_observer.get() {
            (observer.0)(started.elapsed());
        }
        // Only waiters of `always` wait for the fsync.
        let wake = inner.settings.fsync == Fsync::Always;
        progress.send_if_modified(|progress| {
            // A sync on the flusher's thread may have gone further while this one ran.
            let advanced = self.up_to > progress.synced;
            progress.synced = progress.synced.max(self.up_to);
            wake && advanced
        });
        Ok(())
    }
}

/// Waits until no sync runs on the syncer thread: what the flusher syncs next must not skip
/// files a running one took. Returns `false` if that sync failed (the journal is stopped).
fn background_sync_done(inner: &Inner) -> bool {
    let mut pending = inner.lock();
    while pending.syncing > 0 {
        pending = inner
            .wake
            .wait(pending)
            .unwrap_or_else(PoisonError::into_inner);
    }
    !pending.sync_failed
}

/// The flusher's loop ([`flush`]); `syncer` takes the periodic syncs of `batch`.
fn write_and_sync(
    inner: &Inner,
    mut writer: LogWriter,
    progress: &watch::Sender<Progress>,
    syncer: Option<&mpsc::Sender<SyncWork>>,
) {
    let settings = inner.settings;
    let mut last_sync = Instant::now();
    let mut unsynced = false;
    // Batches taken and not yet written, oldest first (a failed write keeps its batch here).
    let mut backlog: VecDeque<Batch> = VecDeque::new();
    let mut segments = OpenSegments::default();
    let mut failing_since: Option<Instant> = None;
    let mut last_report = Instant::now();
    loop {
        let stopping = {
            let mut pending = inner.lock();
            while pending.batch.is_empty()
                && pending.sealed.is_empty()
                && backlog.is_empty()
                && !pending.stopping
                && !pending.sync_failed
            {
                // While the syncer runs, it wakes this thread when it is done.
                let timeout = match (unsynced, settings.fsync) {
                    (true, Fsync::Batch) if pending.syncing == 0 => {
                        settings.fsync_interval.saturating_sub(last_sync.elapsed())
                    }
                    _ => Duration::from_secs(3600),
                };
                if unsynced && timeout.is_zero() {
                    break;
                }
                pending.flusher_waits = true;
                pending = inner
                    .wake
                    .wait_timeout(pending, timeout)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                pending.flusher_waits = false;
            }
            if pending.sync_failed {
                // The syncer stopped the journal ([`fail_stop`]).
                return;
            }
            let sealed = std::mem::take(&mut pending.sealed);
            backlog.extend(sealed);
            let batch = std::mem::take(&mut pending.batch);
            if !batch.is_empty() {
                backlog.push_back(batch);
            }
            pending.stopping
        };
        while let Some(batch) = backlog.front_mut() {
            // Rolling (below) syncs what the log names: a running sync must be done with the
            // files it took first.
            if writer.rolls_next() && !background_sync_done(inner) {
                return;
            }
            let written = inner
                .records
                .write(&batch.records, settings.segment_bytes, &mut segments)
                .and_then(|()| {
                    // Written: a retry of the entries must not count on them again.
                    batch.records = Vec::new();
                    if batch.buffer.is_empty() {
                        return Ok(());
                    }
                    if writer.rolls_next() && settings.fsync != Fsync::Always {
                        // Rolling syncs the log's active segment: the records of its entries
                        // are made durable first.
                        segments.sync_records()?;
                    }
                    writer.append(&batch.buffer, batch.entries)
                });
            if let Err(cause) = written {
                if cause.is_failed_sync() {
                    // Rolling to a new segment syncs the old one: that failure is final.
                    fail_stop(inner, progress, &cause);
                    return;
                }
                // Refuse new changes first: reporting the failure (below) may fail too.
                inner.lock().refusing = Some(format!("cannot write the log: {cause}"));
                progress
                    .send_if_modified(|progress| !std::mem::replace(&mut progress.stalled, true));
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
                if stopping {
                    error!(
                        lost_entries = backlog.iter().map(|batch| batch.entries).sum::<u64>(),
                        "shutting down with log entries not written"
                    );
                    return;
                }
                std::thread::sleep(WRITE_RETRY);
                break;
            }
            let record_bytes = std::mem::take(&mut batch.record_bytes);
            let entries_written = !batch.buffer.is_empty();
            if entries_written || record_bytes > 0 {
                let mut pending = inner.lock();
                if pending.sync_failed {
                    // An fsync failed on the syncer: nothing written since counts.
                    return;
                }
                pending.written_record_bytes += record_bytes;
                writable_again(&mut pending, &mut failing_since);
            }
            if !entries_written && record_bytes > 0 {
                // Publishes held back for the disk look again (and, after a failed write,
                // those let through to be refused).
                progress.send_modify(|progress| progress.stalled = false);
            }
            if entries_written {
                // Written: a retry must not write the entries again.
                batch.buffer = Vec::new();
                unsynced = true;
                // Waiters of `always` wait for the fsync: waking them now would only put them
                // back to sleep.
                let wake = settings.fsync != Fsync::Always;
                progress.send_if_modified(|progress| {
                    progress.written = writer.next_seq();
                    let was_stalled = std::mem::replace(&mut progress.stalled, false);
                    wake || was_stalled
                });
            }
            if let Some(to) = batch.catalog.take() {
                // On the syncer, after the syncs handed before it (which took files of the
                // catalog); the flusher writes on meanwhile.
                let (files, catalog) = inner.records.take_written(&mut segments);
                let work = SyncWork::Checkpoint { files, catalog, to };
                if let Some(work) = hand(inner, syncer.filter(|_| !stopping), work) {
                    if !background_sync_done(inner) {
                        return;
                    }
                    if let Err(cause) = work.run(inner, progress) {
                        fail_stop(inner, progress, &cause);
                        return;
                    }
                }
            }
            backlog.pop_front();
        }
        let sync_now = unsynced
            && (stopping
                || match settings.fsync {
                    Fsync::Always => true,
                    Fsync::Batch => last_sync.elapsed() >= settings.fsync_interval,
                    Fsync::Never => false,
                });
        // With a sync running on the syncer thread, the next is due once it is done (it wakes
        // this thread).
        let background = syncer.filter(|_| !stopping);
        if sync_now && !(background.is_some() && inner.lock().syncing > 0) {
            let job = SyncWork::Log(SyncJob::take(&writer, &mut segments));
            // Synced here: with `always`, when stopping, or with the syncer gone.
            if let Some(job) = hand(inner, background, job) {
                if !background_sync_done(inner) {
                    return;
                }
                if let Err(cause) = job.run(inner, progress) {
                    fail_stop(inner, progress, &cause);
                    return;
                }
            }
            last_sync = Instant::now();
            unsynced = false;
        }
        if stopping && backlog.is_empty() {
            let pending = inner.lock();
            if pending.batch.is_empty() && pending.sealed.is_empty() {
                return;
            }
        }
    }
}

/// A write of the flusher succeeded: changes are accepted again if its failures made the
/// journal refuse them (`failing_since` says since when).
fn writable_again(pending: &mut Pending, failing_since: &mut Option<Instant>) {
    if pending.refusing.take().is_some() {
        info!(
            failed_for_ms = failing_since.map_or(0, |since| since.elapsed().as_millis() as u64),
            "the log is writable again; accepting changes"
        );
    }
    *failing_since = None;
}

/// Ends the flusher however it ends (a failed fsync, shutdown, a panic): a checkpoint waiting
/// for the records of entries it will never write is told (its catalog's sender dropped), and
/// no later change or checkpoint waits for it.
struct FlusherEnds<'a>(&'a Inner);

impl Drop for FlusherEnds<'_> {
    fn drop(&mut self) {
        let mut pending = self.0.lock();
        pending.sealed.clear();
        pending.batch.catalog = None;
        if !pending.stopping {
            pending
                .broken
                .get_or_insert_with(|| "the log writer stopped; restart the server".into());
        }
    }
}

/// A failed fsync: stop writing for good and say so loudly.
fn fail_stop(inner: &Inner, progress: &watch::Sender<Progress>, cause: &StorageError) {
    let reason = format!("the log is stopped after a failed fsync ({cause}); restart the server");
    // Before the failure is published, in one lock: no write after it counts (the flusher
    // checks `sync_failed` before it publishes one), and no successful write clears it.
    let mut pending = inner.lock();
    pending.broken = Some(reason.clone());
    pending.sync_failed = true;
    drop(pending);
    progress.send_modify(|progress| progress.failed = Some(reason.into()));
    error!(
        cause = %cause,
        "FSYNC FAILED: the log may have lost entries; refusing every change until the server is \
         restarted and recovers from its data directory"
    );
}
