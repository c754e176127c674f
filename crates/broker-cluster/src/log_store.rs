//! The Raft log and vote of one node, on disk.
//!
//! # Files (in the node's `raft/` directory; integers little-endian)
//!
//! ```text
//! raft-log, raft-log-0000000001, raft-log-0000000002, ...
//!             the log's segments, in order: the entries in index order
//! raft-meta   the vote and the id of the last purged entry, replaced atomically
//! ```
//!
//! Each segment is a header, 12 bytes (magic `BRKRAFTL`, format version `u32`), then records:
//! body length `u32`, CRC-32 (IEEE) of the body `u32`, body: one [`Entry`] in bincode 2.0.1's
//! serde encoding with fixed-width integers (see [`crate::codec`]). Appends go to the end of the
//! last segment and are fsynced as [`LogSync`] says before openraft is told they are stored;
//! once the last segment holds [`SEGMENT_BYTES`], the next append starts a new one (the old one
//! fsynced first). A truncation cuts the segment holding the first removed record there and
//! removes the segments after it; a purge removes the segments whose entries are all purged,
//! without rewriting anything (entries up to the last purged one that remain in a segment are
//! skipped when it is read).
//!
//! `raft-meta` is magic `BRKRAFTM`, format version `u32`, body length `u32`, CRC-32 of the body
//! `u32`, body: a [`Meta`]. It is written to `raft-meta.tmp`, fsynced and renamed, so a crash
//! leaves the old or the new one. Format 2 says the log may be in several segments (format 1,
//! written by earlier versions, had `raft-log` alone, and is read the same way); an earlier
//! version refuses format 2 instead of reading the first segment only.
//!
//! Every entry is on disk; the log keeps in memory only the newest, up to
//! [`CACHED_ENTRY_BYTES`] of records (the ones the consensus engine reads to apply them and to
//! send them to followers that keep up), with where each entry lies. An older entry is read
//! back from its segment, outside the log's lock, its checksum and log id checked again: for a
//! follower catching up (on the leader, and on the follower applying what it was sent), and
//! when a restarted node applies its log after the snapshot. A read that the log changed under
//! (a purge removing a segment) is made again under the lock.
//!
//! A log whose last segment ends inside a record or with a record whose checksum fails is cut
//! back to its last whole record (the write that died was never reported durable); anything
//! else wrong refuses to open, naming the file and the offset. Reading the log changes nothing
//! ([`LogStore::check`]): the cut, like the node's other repairs, is made once nothing can
//! refuse the node's start any more, and the log takes writes only after that
//! ([`LogStore::start`]), so a refused start leaves every file as it was.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use broker_storage::Repairs;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, RaftLogId, RaftLogReader, StorageIOError, Vote};
use serde::{Deserialize, Serialize};

use crate::codec::{decode, encode};
use crate::types::{Entry, LogId, NodeId, StorageError, TypeConfig};

const LOG_FILE: &str = "raft-log";
const META_FILE: &str = "raft-meta";
const LOG_MAGIC: &[u8; 8] = b"BRKRAFTL";
const META_MAGIC: &[u8; 8] = b"BRKRAFTM";
/// The format of the log's segments.
const LOG_FORMAT_VERSION: u32 = 1;
/// The format of `raft-meta` this build writes: the log may be in several segments.
const META_FORMAT_VERSION: u32 = 2;
/// The format of `raft-meta` of a log in `raft-log` alone, which this build also reads.
const META_SINGLE_FILE: u32 = 1;
/// A new segment is started once the last one holds this many bytes.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// The most bytes of records (as written in the segments) whose entries the log keeps in
/// memory besides on disk: the newest ones (always the last, whatever its size).
pub const CACHED_ENTRY_BYTES: u64 = 32 * 1024 * 1024;
const LOG_HEADER: usize = 12;
const RECORD_HEADER: usize = 8;
/// No entry is larger: a length above it is damage, not an entry.
const MAX_RECORD: u32 = 1 << 30;

/// When appends to the log reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSync {
    /// Every append is fsynced before it counts as stored (survives power loss).
    EveryAppend,
    /// Appends are written at once and fsynced by a thread of their own at this interval
    /// (survives `kill -9`; a power loss of a majority loses at most the interval).
    Every(Duration),
    /// Appends are written; the operating system decides when they reach the disk.
    Never,
}

/// What `raft-meta` holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    /// The node the files belong to: a directory never serves another node (its vote and log
    /// are that node's).
    node_id: Option<NodeId>,
    /// The last vote this node cast or saw.
    vote: Option<Vote<NodeId>>,
    /// The last entry removed from the log (covered by a snapshot).
    last_purged: Option<LogId>,
}

/// The node's log on disk, shared by the storage handle openraft writes through and the readers
/// it replicates from.
#[derive(Debug, Clone)]
pub struct LogStore {
    files: Arc<Mutex<LogFiles>>,
}

#[derive(Debug)]
pub(crate) struct LogFiles {
    dir: PathBuf,
    /// The numbers of the segments, in order; the last is appended to. Empty until a new log
    /// is started.
    segments: Vec<u64>,
    /// The last segment, opened for appending (shared with the thread that syncs it on an
    /// interval); `None` until the log is started ([`LogStore::start`]), before which it takes
    /// no write.
    log: Option<Arc<File>>,
    /// Whether appends were written since the last sync.
    pub(crate) unsynced: bool,
    /// Why a sync of the thread that syncs on an interval failed: the kernel may have dropped
    /// the writes, so the log takes no write any more (the node stops; a restart reads what
    /// is on disk).
    sync_failed: Option<String>,
    /// The byte length of the last segment.
    end: u64,
    /// Where each entry not purged lies, by index.
    located: BTreeMap<u64, Located>,
    /// The newest entries, kept in memory besides on disk.
    cache: Cache,
    meta: Meta,
    /// Whether `raft-meta` is to be written when the log starts: it is missing, names no node,
    /// or is of an earlier format.
    meta_stale: bool,
    /// When appends are fsynced.
    sync: LogSync,
    /// A new segment is started once the last one holds this many bytes.
    segment_bytes: u64,
}

/// Where an entry lies in the log.
#[derive(Debug, Clone, Copy)]
struct Located {
    /// The number of its segment.
    segment: u64,
    /// Where its record starts in the segment.
    at: u64,
    /// The length of its record, header included.
    bytes: u64,
    /// Its id.
    log_id: LogId,
}

/// The file of segment `number` in `dir`.
fn segment_path(dir: &Path, number: u64) -> PathBuf {
    match number {
        0 => dir.join(LOG_FILE),
        _ => dir.join(format!("{LOG_FILE}-{number:010}")),
    }
}

/// The numbers of the segments in `dir`, in order (none if `dir` does not exist).
fn list_segments(dir: &Path) -> io::Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut numbers = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let number = match name.strip_prefix(LOG_FILE) {
            Some("") => Some(0),
            Some(rest) => rest
                .strip_prefix('-')
                .filter(|digits| digits.len() == 10)
                .and_then(|digits| digits.parse::<u64>().ok()),
            None => None,
        };
        numbers.extend(number);
    }
    numbers.sort_unstable();
    Ok(numbers)
}

impl LogStore {
    /// Opens (or creates) the log of node `node_id` in `dir`, syncing appends as `sync` says:
    /// cuts a torn last record off, and readies the log for writes.
    ///
    /// # Errors
    /// The directory cannot be read or written, a file in it is damaged, or it holds another
    /// node's log.
    pub fn open(dir: &Path, node_id: NodeId, sync: LogSync) -> io::Result<LogStore> {
        LogStore::open_with(dir, node_id, sync, SEGMENT_BYTES)
    }

    /// [`LogStore::open`], starting a new segment once the last one holds `segment_bytes`.
    pub(crate) fn open_with(
        dir: &Path,
        node_id: NodeId,
        sync: LogSync,
        segment_bytes: u64,
    ) -> io::Result<LogStore> {
        let mut repairs = Repairs::default();
        let store = LogStore::check(
            dir,
            node_id,
            sync,
            segment_bytes,
            CACHED_ENTRY_BYTES,
            &mut repairs,
        )?;
        repairs.apply().map_err(io::Error::other)?;
        store.start()?;
        Ok(store)
    }

    /// Reads the log of node `node_id` in `dir` (an empty one if there is none) without
    /// changing anything: creating the directory and cutting a torn last record off are added
    /// to `repairs`. The log serves reads at once, leaving the torn record out; it takes writes
    /// once `repairs` are made and it is started ([`LogStore::start`]).
    ///
    /// # Errors
    /// As [`LogStore::open`], for reading.
    pub(crate) fn check(
        dir: &Path,
        node_id: NodeId,
        sync: LogSync,
        segment_bytes: u64,
        cache_limit: u64,
        repairs: &mut Repairs,
    ) -> io::Result<LogStore> {
        let (meta, meta_version) = read_meta(&dir.join(META_FILE))?;
        check_owner(dir, &meta, node_id)?;
        repairs.create(dir.to_owned());
        let segments = list_segments(dir)?;
        let purged = meta.last_purged.map(|id| id.index);
        let mut located = BTreeMap::new();
        let mut cache = Cache::new(cache_limit);
        let mut last_read: Option<u64> = None;
        let mut end = LOG_HEADER as u64;
        for (position, &number) in segments.iter().enumerate() {
            let path = segment_path(dir, number);
            let read = read_log(&path, purged, last_read)?;
            if read.end != read.length {
                if position + 1 != segments.len() {
                    return Err(damaged(
                        path.as_path(),
                        read.end,
                        "a damaged record before the end",
                    ));
                }
                // Appends go on after the last whole record.
                repairs.cut(
                    path.clone(),
                    read.end,
                    read.length,
                    "cutting a torn record off the Raft log (the node stopped while writing it)",
                );
            }
            last_read = read.last_index.or(last_read);
            for (index, (at, bytes, entry)) in read.entries {
                let place = Located {
                    segment: number,
                    at,
                    bytes,
                    log_id: *entry.get_log_id(),
                };
                located.insert(index, place);
                cache.insert(index, bytes, entry);
            }
            end = read.end;
        }
        // The consensus engine reads the log from the entry after the last purged one (from
        // the very first, 0, when none was purged): the segment that held it is missing.
        let first_kept = purged.map_or(0, |purged| purged + 1);
        if let Some((&first, place)) = located.first_key_value() {
            if first != first_kept {
                return Err(damaged(
                    &segment_path(dir, place.segment),
                    place.at,
                    &format!(
                        "entry {first} where entry {first_kept} should be (the segment \
                         holding the entries before it is missing)"
                    ),
                ));
            }
        }
        // Also rewritten in this build's format, which an earlier version refuses.
        let meta_stale = meta.node_id.is_none() || meta_version != META_FORMAT_VERSION;
        let files = LogFiles {
            dir: dir.to_owned(),
            segments,
            log: None,
            unsynced: false,
            sync_failed: None,
            end,
            located,
            cache,
            meta: Meta {
                node_id: Some(node_id),
                ..meta
            },
            meta_stale,
            sync,
            segment_bytes,
        };
        Ok(LogStore {
            files: Arc::new(Mutex::new(files)),
        })
    }

    /// Readies the log [`LogStore::check`] read for writes, once the repairs it listed are
    /// made: writes the first segment of a new log, opens the last one for appends, writes
    /// `raft-meta` naming the node in this build's format if it does not, and starts the
    /// thread that syncs appends on an interval ([`LogSync::Every`]). Called once.
    ///
    /// # Errors
    /// A file cannot be written or opened, or the thread cannot start.
    pub(crate) fn start(&self) -> io::Result<()> {
        let sync = {
            let mut files = self.files();
            if files.segments.is_empty() {
                write_empty_segment(&segment_path(&files.dir, 0))?;
                files.segments.push(0);
            }
            let last = segment_path(&files.dir, files.last_segment());
            files.log = Some(Arc::new(OpenOptions::new().append(true).open(last)?));
            if files.meta_stale {
                let meta = files.meta.clone();
                files.write_meta(meta)?;
                files.meta_stale = false;
            }
            files.sync
        };
        if let LogSync::Every(interval) = sync {
            sync_every(Arc::downgrade(&self.files), interval)?;
        }
        Ok(())
    }

    /// Whether the log in `dir` holds no entry (or there is none), checked without opening it.
    ///
    /// # Errors
    /// The directory cannot be listed.
    pub fn holds_no_entries(dir: &Path) -> io::Result<bool> {
        for number in list_segments(dir)? {
            if fs::metadata(segment_path(dir, number))?.len() > LOG_HEADER as u64 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Checks, without opening it, that the log in `dir` (if any) is node `node_id`'s.
    ///
    /// # Errors
    /// It is another node's, or its meta file cannot be read.
    pub fn check_owner(dir: &Path, node_id: NodeId) -> io::Result<()> {
        check_owner(dir, &read_meta(&dir.join(META_FILE))?.0, node_id)
    }

    pub(crate) fn files(&self) -> MutexGuard<'_, LogFiles> {
        // Every change below either completes or returns an error before touching the maps,
        // so a lock poisoned by a panic elsewhere still guards consistent data.
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The index of the last entry in the log, if any.
    pub fn last_index(&self) -> Option<u64> {
        let files = self.files();
        files
            .located
            .keys()
            .next_back()
            .copied()
            .or(files.meta.last_purged.map(|id| id.index))
    }
}

impl LogFiles {
    /// The last segment, open for appends: `Err` before the log is started, which takes no
    /// write before the node's files are repaired.
    fn appending(&self) -> io::Result<&Arc<File>> {
        if let Some(why) = &self.sync_failed {
            return Err(io::Error::other(format!(
                "the Raft log takes no write since a sync failed ({why}); restart the node"
            )));
        }
        self.log.as_ref().ok_or_else(|| {
            io::Error::other("the Raft log takes no write before the node's start has repaired it")
        })
    }

    fn write_meta(&mut self, meta: Meta) -> io::Result<()> {
        self.appending()?;
        let body = encode(&meta).map_err(io::Error::other)?;
        let mut bytes = Vec::with_capacity(20 + body.len());
        bytes.extend_from_slice(META_MAGIC);
        bytes.extend_from_slice(&META_FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
        bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        bytes.extend_from_slice(&body);
        replace_file(&self.dir.join(META_FILE), &bytes)?;
        self.meta = meta;
        Ok(())
    }

    /// Writes `records` (encoded by [`Records::of`]) at the end of the log and adds their
    /// entries. Returns the files to fsync before the entries count as stored: the last
    /// segment with [`LogSync::EveryAppend`] (a segment this append closed is synced before
    /// the next starts). The caller syncs them after letting go of the lock, so that readers
    /// of the log are not held up by the disk.
    fn append(&mut self, records: Records) -> io::Result<Vec<Arc<File>>> {
        let mut to_sync = Vec::new();
        if self.end >= self.segment_bytes {
            self.start_segment(true)?;
        }
        let log = Arc::clone(self.appending()?);
        (&*log).write_all(&records.bytes)?;
        let start = self.end;
        self.end += records.bytes.len() as u64;
        let segment = self.last_segment();
        for (at, bytes, entry) in records.entries {
            let log_id = *entry.get_log_id();
            let place = Located {
                segment,
                at: start + at,
                bytes,
                log_id,
            };
            self.located.insert(log_id.index, place);
            self.cache.insert(log_id.index, bytes, entry);
        }
        match self.sync {
            LogSync::EveryAppend => to_sync.push(log),
            LogSync::Every(_) => self.unsynced = true,
            LogSync::Never => {}
        }
        Ok(to_sync)
    }

    /// Lets go of the cached entries no longer located (cut or purged).
    fn uncache_gone(&mut self) {
        let located = &self.located;
        self.cache.retain(|index| located.contains_key(&index));
    }

    /// What a read of `range` takes: each entry in memory, or where it lies on disk.
    fn plan(&self, range: impl RangeBounds<u64>) -> Vec<Planned> {
        self.located
            .range(range)
            .map(|(index, place)| match self.cache.get(*index) {
                Some(entry) => Planned::Held(entry.clone()),
                None => Planned::OnDisk(*place),
            })
            .collect()
    }

    /// The entries of `range`, from memory or read back from their segments (under the lock:
    /// see [`LogStore`]'s reads for the way without it).
    pub(crate) fn entries(&self, range: impl RangeBounds<u64>) -> io::Result<Vec<Entry>> {
        read_planned(&self.dir, self.plan(range))
    }
}

/// An entry of a read: in memory already, or where it lies on disk.
enum Planned {
    Held(Entry),
    OnDisk(Located),
}

/// The entries `plan` names, those on disk read back from their segments in `dir`.
fn read_planned(dir: &Path, plan: Vec<Planned>) -> io::Result<Vec<Entry>> {
    let mut opened: BTreeMap<u64, File> = BTreeMap::new();
    plan.into_iter()
        .map(|planned| match planned {
            Planned::Held(entry) => Ok(entry),
            Planned::OnDisk(place) => read_back(dir, &place, &mut opened),
        })
        .collect()
}

/// The entry at `place`, read from its segment in `dir` (opened once per read in `opened`),
/// its checksum and id checked.
fn read_back(dir: &Path, place: &Located, opened: &mut BTreeMap<u64, File>) -> io::Result<Entry> {
    use std::os::unix::fs::FileExt;
    let path = segment_path(dir, place.segment);
    let file = match opened.entry(place.segment) {
        std::collections::btree_map::Entry::Occupied(file) => file.into_mut(),
        std::collections::btree_map::Entry::Vacant(slot) => slot.insert(File::open(&path)?),
    };
    let mut record = vec![0; usize::try_from(place.bytes).map_err(io::Error::other)?];
    file.read_exact_at(&mut record, place.at)?;
    let body = record
        .get(RECORD_HEADER..)
        .filter(|body| {
            body.len() == u32_at(&record, 0) as usize && crc32fast::hash(body) == u32_at(&record, 4)
        })
        .ok_or_else(|| damaged(&path, place.at, "a damaged record"))?;
    let entry: Entry = decode(body).map_err(|why| damaged(&path, place.at, &why.to_string()))?;
    match entry.get_log_id() == &place.log_id {
        true => Ok(entry),
        false => Err(damaged(
            &path,
            place.at,
            "another entry than the one written there",
        )),
    }
}

impl LogFiles {
    fn last_segment(&self) -> u64 {
        self.segments.last().copied().unwrap_or(0)
    }

    /// Starts a new last segment, once the one it closes is synced (unless it is about to be
    /// removed, `keep_closed` false): a segment never follows one whose end a power loss could
    /// still take (a log with a gap, or a damaged record before its end, does not open).
    fn start_segment(&mut self, keep_closed: bool) -> io::Result<()> {
        let closing = self.appending()?;
        if keep_closed {
            closing.sync_data()?;
        }
        let number = self.last_segment() + 1;
        let path = segment_path(&self.dir, number);
        write_empty_segment(&path)?;
        let closed = self
            .log
            .replace(Arc::new(OpenOptions::new().append(true).open(&path)?));
        self.segments.push(number);
        self.end = LOG_HEADER as u64;
        self.unsynced = false;
        drop(closed);
        Ok(())
    }

    /// Removes the entries from `index` on: cuts the segment holding the first of them and
    /// removes the segments after it.
    pub(crate) fn truncate(&mut self, index: u64) -> io::Result<()> {
        self.appending()?;
        let Some(&Located { segment, at, .. }) =
            self.located.range(index..).next().map(|(_, place)| place)
        else {
            return Ok(());
        };
        // The later segments go first, last to first, durably: a crash at any point leaves a
        // log that ends early (what is left to cut is cut again), never one with a gap.
        while self.last_segment() > segment {
            let removed = self.last_segment();
            fs::remove_file(segment_path(&self.dir, removed))?;
            self.segments.pop();
        }
        File::open(&self.dir)?.sync_all()?;
        let path = segment_path(&self.dir, segment);
        let log = OpenOptions::new().append(true).open(&path)?;
        log.set_len(at)?;
        log.sync_all()?;
        self.log = Some(Arc::new(log));
        self.end = at;
        self.located.split_off(&index);
        self.uncache_gone();
        Ok(())
    }

    /// Removes the entries up to and including `upto`.
    fn purge(&mut self, upto: LogId) -> io::Result<()> {
        // The meta first: a crash between the two leaves entries that open() skips.
        let meta = Meta {
            last_purged: Some(upto),
            ..self.meta.clone()
        };
        self.write_meta(meta)?;
        self.located = self.located.split_off(&(upto.index + 1));
        self.uncache_gone();
        if self.located.is_empty() && self.end > LOG_HEADER as u64 {
            // Nothing is left (a snapshot from the leader covers the whole log): the next
            // entries, which need not follow the purged ones, go to a new segment. (The one
            // it closes goes below: nothing in it is needed, so it is not synced first.)
            self.start_segment(false)?;
        }
        // Every segment before the one holding the first entry kept holds only purged ones;
        // the last segment stays, for appends.
        let first_kept = self
            .located
            .values()
            .next()
            .map_or(self.last_segment(), |place| place.segment);
        let removed = self.segments.partition_point(|&number| number < first_kept);
        for number in self.segments.drain(..removed) {
            fs::remove_file(segment_path(&self.dir, number))?;
        }
        if removed > 0 {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Starts the thread that fsyncs the log every `interval` while something was appended since
/// the last sync, until the log is dropped. The sync runs outside the lock: appends go on
/// meanwhile.
fn sync_every(files: Weak<Mutex<LogFiles>>, interval: Duration) -> io::Result<()> {
    std::thread::Builder::new()
        .name("raft-log-sync".to_owned())
        .spawn(move || loop {
            std::thread::sleep(interval);
            let Some(held) = files.upgrade() else {
                return;
            };
            let log = {
                let mut held = held.lock().unwrap_or_else(PoisonError::into_inner);
                if !std::mem::take(&mut held.unsynced) {
                    continue;
                }
                held.log.clone()
            };
            drop(held);
            // (Only appends leave writes unsynced, and the log takes them once it is open.)
            let Some(log) = log else { continue };
            if let Err(cause) = log.sync_data() {
                // Not tried again: the kernel may have dropped the pages it could not write.
                tracing::error!(%cause, "syncing the Raft log failed; it takes no more writes, restart the node");
                if let Some(held) = files.upgrade() {
                    held.lock().unwrap_or_else(PoisonError::into_inner).sync_failed =
                        Some(cause.to_string());
                }
                return;
            }
        })?;
    Ok(())
}

/// Entries encoded as records, ready to append: the bytes, and each entry with where its
/// record starts in them and its length.
struct Records {
    bytes: Vec<u8>,
    entries: Vec<(u64, u64, Entry)>,
}

/// The newest entries of a log, kept in memory besides on disk: those of the last `limit`
/// bytes of records, and always the last one.
#[derive(Debug)]
struct Cache {
    /// By index: the bytes of its record, and the entry.
    entries: BTreeMap<u64, (u64, Entry)>,
    /// The bytes of the records of `entries`.
    bytes: u64,
    limit: u64,
}

impl Cache {
    fn new(limit: u64) -> Cache {
        Cache {
            entries: BTreeMap::new(),
            bytes: 0,
            limit,
        }
    }

    /// Adds `entry`, at `index`, whose record takes `bytes`, then lets the oldest go past the
    /// limit.
    fn insert(&mut self, index: u64, bytes: u64, entry: Entry) {
        if let Some((replaced, _)) = self.entries.insert(index, (bytes, entry)) {
            self.bytes -= replaced;
        }
        self.bytes += bytes;
        while self.bytes > self.limit && self.entries.len() > 1 {
            let Some((_, (oldest, _))) = self.entries.pop_first() else {
                break;
            };
            self.bytes -= oldest;
        }
    }

    fn get(&self, index: u64) -> Option<&Entry> {
        self.entries.get(&index).map(|(_, entry)| entry)
    }

    /// Keeps only the entries whose index `keep` says.
    fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        self.entries.retain(|index, _| keep(*index));
        self.bytes = self.entries.values().map(|(bytes, _)| bytes).sum();
    }
}

impl Records {
    /// `entries` encoded (before taking the log's lock).
    fn of(entries: impl IntoIterator<Item = Entry>) -> io::Result<Records> {
        let mut records = Records {
            bytes: Vec::new(),
            entries: Vec::new(),
        };
        for entry in entries {
            let at = records.bytes.len() as u64;
            push_record(&mut records.bytes, &entry)?;
            let length = records.bytes.len() as u64 - at;
            records.entries.push((at, length, entry));
        }
        Ok(records)
    }
}

/// Appends one record (length, checksum, body) for `entry` to `out`.
fn push_record(out: &mut Vec<u8>, entry: &Entry) -> io::Result<()> {
    let body = encode(entry).map_err(io::Error::other)?;
    let length = u32::try_from(body.len())
        .ok()
        .filter(|&length| length <= MAX_RECORD)
        .ok_or_else(|| io::Error::other(format!("a log entry of {} bytes", body.len())))?;
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// Writes a segment holding no entry yet at `path` (through a temporary file, fsynced and
/// renamed).
fn write_empty_segment(path: &Path) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(LOG_HEADER);
    bytes.extend_from_slice(LOG_MAGIC);
    bytes.extend_from_slice(&LOG_FORMAT_VERSION.to_le_bytes());
    replace_file(path, &bytes)
}

/// Replaces `path` with `bytes` atomically and durably.
fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Refuses a log that `meta` says belongs to a node other than `node_id`.
fn check_owner(dir: &Path, meta: &Meta, node_id: NodeId) -> io::Result<()> {
    match meta.node_id {
        Some(owner) if owner != node_id => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds the log of node {owner}, not of node {node_id}: start node {owner} \
                 with it, or give node {node_id} a directory of its own",
                dir.display()
            ),
        )),
        _ => Ok(()),
    }
}

fn damaged(path: &Path, at: u64, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: {what} at byte {at}", path.display()),
    )
}

/// The meta file at `path` and its format version (0 for none).
fn read_meta(path: &Path) -> io::Result<(Meta, u32)> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok((Meta::default(), 0)),
        Err(error) => return Err(error),
    };
    if bytes.len() < 20 || &bytes[..8] != META_MAGIC {
        return Err(damaged(path, 0, "not a Raft meta file"));
    }
    let version = u32_at(&bytes, 8);
    if version != META_FORMAT_VERSION && version != META_SINGLE_FILE {
        return Err(damaged(path, 8, &format!("format version {version}")));
    }
    let length = u32_at(&bytes, 12) as usize;
    let body = bytes
        .get(20..20 + length)
        .filter(|body| crc32fast::hash(body) == u32_at(&bytes, 16))
        .ok_or_else(|| damaged(path, 20, "a damaged body"))?;
    let meta = decode(body).map_err(|why| damaged(path, 20, &why.to_string()))?;
    Ok((meta, version))
}

/// What a segment holds.
struct Segment {
    /// The entries after the last purged one, each with where its record starts and its
    /// length.
    entries: BTreeMap<u64, (u64, u64, Entry)>,
    /// The index of its last entry, purged or not.
    last_index: Option<u64>,
    /// The length of its whole records (a torn tail is left out).
    end: u64,
    /// The length of the file.
    length: u64,
}

/// Reads the segment at `path`, skipping entries up to `purged`; its first entry must follow
/// `previous`, the last entry of the segment before it (if any).
fn read_log(path: &Path, purged: Option<u64>, previous: Option<u64>) -> io::Result<Segment> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    if bytes.len() < LOG_HEADER || &bytes[..8] != LOG_MAGIC {
        return Err(damaged(path, 0, "not a Raft log file"));
    }
    let version = u32_at(&bytes, 8);
    if version != LOG_FORMAT_VERSION {
        return Err(damaged(path, 8, &format!("format version {version}")));
    }
    let mut entries = BTreeMap::new();
    let mut at = LOG_HEADER;
    let mut previous = previous;
    while at < bytes.len() {
        let Some(header) = bytes.get(at..at + RECORD_HEADER) else {
            break;
        };
        let length = u32_at(header, 0);
        if length > MAX_RECORD {
            // No write makes such a record: a torn one leaves zeros or the record's own bytes.
            return Err(damaged(
                path,
                at as u64,
                "a record length no entry can have",
            ));
        }
        let next = at + RECORD_HEADER + length as usize;
        let body = bytes.get(at + RECORD_HEADER..next);
        let Some(body) = body.filter(|body| crc32fast::hash(body) == u32_at(header, 4)) else {
            // Only the last write can be torn: a bad record with whole records after it is
            // damage (zeroes after the end are a file grown by a write that did not finish).
            if next < bytes.len() && bytes[at..].iter().any(|&byte| byte != 0) {
                return Err(damaged(path, at as u64, "a damaged record before the end"));
            }
            break;
        };
        let entry: Entry =
            decode(body).map_err(|why| damaged(path, at as u64, &why.to_string()))?;
        let index = entry.get_log_id().index;
        // Entries follow each other, but for the first one after purged ones: a snapshot may
        // cover more than the log held (its purge starts a new segment, and a crash may leave
        // the old one), and the first entry kept is checked against the purge by the caller.
        let purged_before = |previous: u64| purged.is_some_and(|purged| previous <= purged);
        if previous.is_some_and(|previous| index != previous + 1 && !purged_before(previous)) {
            return Err(damaged(path, at as u64, "a gap in entry indexes"));
        }
        previous = Some(index);
        if purged.is_none_or(|purged| index > purged) {
            entries.insert(index, (at as u64, (next - at) as u64, entry));
        }
        at += RECORD_HEADER + length as usize;
    }
    Ok(Segment {
        entries,
        last_index: previous,
        end: at.min(bytes.len()) as u64,
        length: bytes.len() as u64,
    })
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        // Read back outside the lock, so that appends go on meanwhile; should the log change
        // under the read (a purge removing a segment), it is read again under the lock.
        let (dir, plan) = {
            let files = self.files();
            (files.dir.clone(), files.plan(range.clone()))
        };
        if plan
            .iter()
            .all(|planned| matches!(planned, Planned::Held(_)))
        {
            return read_planned(&dir, plan)
                .map_err(|error| StorageIOError::read_logs(&error).into());
        }
        let read = tokio::task::spawn_blocking(move || read_planned(&dir, plan))
            .await
            .unwrap_or_else(|stopped| Err(io::Error::other(stopped.to_string())));
        read.or_else(|_| self.files().entries(range))
            .map_err(|error| StorageIOError::read_logs(&error).into())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let files = self.files();
        let last_purged_log_id = files.meta.last_purged;
        let last_log_id = files
            .located
            .values()
            .next_back()
            .map(|place| place.log_id)
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let mut files = self.files();
        let meta = Meta {
            vote: Some(*vote),
            ..files.meta.clone()
        };
        files
            .write_meta(meta)
            .map_err(|error| StorageIOError::write_vote(&error).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.files().meta.vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let appended = match Records::of(entries).and_then(|records| self.files().append(records)) {
            // Outside the lock (openraft issues no other write to the log until this returns),
            // and on a thread that may block: the runtime's workers go on serving meanwhile.
            Ok(to_sync) if to_sync.is_empty() => Ok(()),
            Ok(to_sync) => tokio::task::spawn_blocking(move || {
                to_sync.iter().try_for_each(|log| log.sync_data())
            })
            .await
            .unwrap_or_else(|stopped| Err(io::Error::other(stopped.to_string()))),
            Err(error) => Err(error),
        };
        match appended {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(error) => {
                let reported = io::Error::new(error.kind(), error.to_string());
                callback.log_io_completed(Err(reported));
                Err(StorageIOError::write_logs(&error).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.files()
            .truncate(log_id.index)
            .map_err(|error| StorageIOError::write_logs(&error).into())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.files()
            .purge(log_id)
            .map_err(|error| StorageIOError::write_logs(&error).into())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::types::Proposal;

    fn entry(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Proposal::Tick {
                now_ms: index as i64,
            }),
        }
    }

    /// Appends `entries` and syncs them as the store's policy says.
    fn append(files: &mut LogFiles, entries: impl IntoIterator<Item = Entry>) {
        for log in files.append(Records::of(entries).unwrap()).unwrap() {
            log.sync_data().unwrap();
        }
    }

    fn indexes(store: &LogStore) -> Vec<u64> {
        store.files().located.keys().copied().collect()
    }

    #[test]
    fn only_the_newest_entries_stay_in_memory_and_the_others_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let open = || LogStore::open_with(dir.path(), 1, LogSync::Never, 300).unwrap();
        let all = |store: &LogStore| store.files().entries(..).unwrap();
        {
            let store = open();
            let mut files = store.files();
            // Room for about three entries.
            let record = Records::of([entry(0)]).unwrap().bytes.len() as u64;
            files.cache = Cache::new(3 * record);
            for index in 0..=20 {
                append(&mut files, [entry(index)]);
            }
            assert_eq!(
                files.cache.entries.keys().copied().collect::<Vec<_>>(),
                [18, 19, 20]
            );
            assert_eq!(files.cache.bytes, 3 * record);
            drop(files);
            assert_eq!(all(&store), (0..=20).map(entry).collect::<Vec<_>>());
            // Cut and purged entries leave memory too; the others are still read back.
            let mut files = store.files();
            files.truncate(19).unwrap();
            assert_eq!(
                files.cache.entries.keys().copied().collect::<Vec<_>>(),
                [18]
            );
            files
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 4))
                .unwrap();
            assert_eq!(files.entries(3..=6).unwrap(), vec![entry(5), entry(6)]);
            append(&mut files, (19..=22).map(entry));
            assert_eq!(
                files.cache.entries.keys().copied().collect::<Vec<_>>(),
                [20, 21, 22]
            );
            assert_eq!(files.cache.bytes, 3 * record);
        }
        // Reopened, the log reads every entry back, however many segments it spans.
        let store = open();
        assert_eq!(all(&store), (5..=22).map(entry).collect::<Vec<_>>());
        assert!(list_segments(dir.path()).unwrap().len() > 3);
        // A record damaged after it was read is refused when it is read back, not served.
        let damaged = {
            let mut files = store.files();
            files.cache = Cache::new(0);
            files.located[&7]
        };
        let path = segment_path(dir.path(), damaged.segment);
        let mut bytes = fs::read(&path).unwrap();
        let last = usize::try_from(damaged.at + damaged.bytes).unwrap() - 1;
        bytes[last] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let error = store.files().entries(7..=7).unwrap_err();
        assert!(error.to_string().contains("a damaged record"), "{error}");
        assert_eq!(store.files().entries(8..=8).unwrap(), vec![entry(8)]);
    }

    #[test]
    fn entries_vote_truncation_and_purge_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), 1, LogSync::EveryAppend).unwrap();
            let mut files = store.files();
            append(&mut files, (1..=10).map(entry));
            files.truncate(8).unwrap();
            files
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 3))
                .unwrap();
            let meta = Meta {
                vote: Some(Vote::new(2, 7)),
                ..files.meta.clone()
            };
            files.write_meta(meta).unwrap();
            append(&mut files, [entry(8)]);
        }
        let store = LogStore::open(dir.path(), 1, LogSync::EveryAppend).unwrap();
        assert_eq!(indexes(&store), vec![4, 5, 6, 7, 8]);
        assert_eq!(store.files().meta.vote, Some(Vote::new(2, 7)));
        assert_eq!(store.last_index(), Some(8));
        assert_eq!(store.files().entries(8..).unwrap(), vec![entry(8)]);
    }

    #[test]
    fn a_purge_past_the_end_cut_short_by_a_crash_leaves_a_log_that_opens() {
        let dir = tempfile::tempdir().unwrap();
        let open = || LogStore::open(dir.path(), 1, LogSync::EveryAppend).unwrap();
        let first = {
            let store = open();
            let mut files = store.files();
            append(&mut files, (0..=3).map(entry));
            let first = segment_path(dir.path(), files.segments[0]);
            let kept = std::fs::read(&first).unwrap();
            // A snapshot covering more than the log: the purge starts a new segment, then
            // removes the old one; the crash comes before the removal reached the disk.
            files
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 10))
                .unwrap();
            std::fs::write(&first, kept).unwrap();
            first
        };
        {
            let store = open();
            assert!(first.exists());
            append(&mut store.files(), (11..=12).map(entry));
        }
        // The entries after the purged ones follow them, not the purged ones left behind.
        assert_eq!(indexes(&open()), vec![11, 12]);
    }

    #[test]
    fn the_log_rolls_into_segments_that_purges_remove_and_truncations_cut() {
        let dir = tempfile::tempdir().unwrap();
        let segments = || list_segments(dir.path()).unwrap();
        let open = || LogStore::open_with(dir.path(), 1, LogSync::EveryAppend, 100).unwrap();
        {
            let store = open();
            let mut files = store.files();
            // Each append lands in the last segment; a segment past 100 bytes is followed by
            // a new one at the next append.
            for index in 0..=12 {
                append(&mut files, [entry(index)]);
            }
        }
        let rolled = segments();
        assert!(rolled.len() >= 4, "{rolled:?}");
        let store = open();
        assert_eq!(indexes(&store), (0..=12).collect::<Vec<_>>());
        {
            let mut files = store.files();
            // A truncation inside an earlier segment removes the ones after it.
            files.truncate(5).unwrap();
            append(&mut files, (5..=9).map(entry));
            // A purge removes the segments holding only purged entries, rewriting nothing.
            files
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 6))
                .unwrap();
            assert_eq!(files.segments, segments());
        }
        drop(store);
        let left = segments();
        assert!(!left.contains(&0), "the first segment went: {left:?}");
        let store = open();
        assert_eq!(indexes(&store), vec![7, 8, 9]);
        append(&mut store.files(), [entry(10)]);
        drop(store);
        assert_eq!(indexes(&open()), vec![7, 8, 9, 10]);

        // A segment other than the last that ends inside a record is damage.
        let first = segment_path(dir.path(), segments()[0]);
        let length = fs::metadata(&first).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&first)
            .unwrap()
            .set_len(length - 1)
            .unwrap();
        let error = LogStore::open_with(dir.path(), 1, LogSync::Never, 100).unwrap_err();
        assert!(error.to_string().contains("before the end"), "{error}");
    }

    #[test]
    fn a_log_missing_the_segment_of_its_first_entries_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let open = || LogStore::open_with(dir.path(), 1, LogSync::Never, 100);
        {
            let store = open().unwrap();
            let mut files = store.files();
            for index in 0..=6 {
                append(&mut files, [entry(index)]);
            }
            // The first segment holds entry 1 too: it stays.
            files
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 0))
                .unwrap();
        }
        fs::remove_file(segment_path(dir.path(), 0)).unwrap();
        let error = open().unwrap_err();
        assert!(
            error.to_string().contains("where entry 1 should be"),
            "{error}"
        );
    }

    #[test]
    fn a_purge_past_the_last_entry_lets_the_log_go_on_after_a_gap() {
        // A follower that installs a leader's snapshot beyond its log: everything is purged
        // and the next entry follows the snapshot, not the purged entries.
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
            let mut files = store.files();
            append(&mut files, (1..=5).map(entry));
            files
                .purge(LogId::new(CommittedLeaderId::new(1, 1), 200))
                .unwrap();
            append(&mut files, [entry(201)]);
        }
        let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
        assert_eq!(indexes(&store), vec![201]);
        assert_eq!(list_segments(dir.path()).unwrap().len(), 1);
    }

    #[test]
    fn a_log_of_the_single_file_format_opens_and_its_meta_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
            append(&mut store.files(), (0..=2).map(entry));
        }
        // As an earlier version left it: raft-log alone and a meta of format 1.
        let path = dir.path().join(META_FILE);
        let mut meta = fs::read(&path).unwrap();
        meta[8..12].copy_from_slice(&META_SINGLE_FILE.to_le_bytes());
        fs::write(&path, &meta).unwrap();
        let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
        assert_eq!(indexes(&store), vec![0, 1, 2]);
        let meta = fs::read(&path).unwrap();
        assert_eq!(&meta[8..12], &META_FORMAT_VERSION.to_le_bytes());
    }

    #[test]
    fn appends_are_synced_on_the_interval_and_the_thread_ends_with_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            LogStore::open(dir.path(), 1, LogSync::Every(Duration::from_millis(5))).unwrap();
        append(&mut store.files(), [entry(1)]);
        assert!(store.files().unsynced);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.files().unsynced {
            assert!(std::time::Instant::now() < deadline, "never synced");
            std::thread::sleep(Duration::from_millis(5));
        }
        let files = Arc::downgrade(&store.files);
        drop(store);
        // The thread holds the log only while it syncs.
        while files.upgrade().is_some() {
            assert!(
                std::time::Instant::now() < deadline,
                "the log outlived its store"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_directory_serves_only_its_own_node() {
        let dir = tempfile::tempdir().unwrap();
        drop(LogStore::open(dir.path(), 1, LogSync::Never).unwrap());
        let error = LogStore::open(dir.path(), 2, LogSync::Never).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("holds the log of node 1, not of node 2"),
            "{error}"
        );
        assert!(LogStore::open(dir.path(), 1, LogSync::Never).is_ok());
    }

    #[test]
    fn a_torn_tail_is_cut_and_appends_go_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
            append(&mut store.files(), (0..=2).map(entry));
        }
        let path = dir.path().join(LOG_FILE);
        let length = fs::metadata(&path).unwrap().len();
        // The last record loses its last byte, as if the machine died inside the write.
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(length - 1)
            .unwrap();
        let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
        assert_eq!(indexes(&store), vec![0, 1]);
        append(&mut store.files(), [entry(2)]);
        drop(store);
        let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
        assert_eq!(indexes(&store), vec![0, 1, 2]);
    }

    #[test]
    fn a_record_length_no_entry_can_have_is_damage_not_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
            append(&mut store.files(), (0..=2).map(entry));
        }
        let path = dir.path().join(LOG_FILE);
        let mut bytes = fs::read(&path).unwrap();
        // The second record's length field, flipped: it claims to run past the end.
        let first = LOG_HEADER + RECORD_HEADER + u32_at(&bytes, LOG_HEADER) as usize;
        bytes[first..first + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        let error = LogStore::open(dir.path(), 1, LogSync::Never).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("a record length no entry can have"),
            "{error}"
        );
    }

    #[test]
    fn damage_before_the_end_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = LogStore::open(dir.path(), 1, LogSync::Never).unwrap();
            append(&mut store.files(), (1..=3).map(entry));
        }
        let path = dir.path().join(LOG_FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes[0] = b'X';
        fs::write(&path, &bytes).unwrap();
        let error = LogStore::open(dir.path(), 1, LogSync::Never).unwrap_err();
        assert!(error.to_string().contains("not a Raft log file"), "{error}");
    }
}
