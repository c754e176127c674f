//! Record segments: every record of a partition, in append-only files with a dense offset and
//! time index, written as records come (by the journal's flusher, [`RecordStore::write`]) or by
//! a checkpoint (at start, and in a cluster's snapshots, [`RecordStore::write_out`]). The
//! [`RecordStore`] is the broker's [`ColdStore`]: the state reads evicted records, their sizes
//! and their times through it.
//!
//! # Files
//!
//! ```text
//! records/<topic id, 20 digits>-<partition, 10 digits>/<base offset, 20 digits>.rec
//! records/<topic id, 20 digits>-<partition, 10 digits>/<base offset, 20 digits>.idx
//! ```
//!
//! Both files of a segment start with the same 32-byte header: magic (`BROKRREC` or
//! `BROKRIDX`), format version `u32` ([`RECORD_FORMAT_VERSION`]), the partition `u32`, the topic
//! id `u64`, the base offset `i64` (all little-endian).
//!
//! `.rec` then holds the records at offsets `base`, `base + 1`, ... each as: body length `u32`,
//! CRC-32 of the body `u32`, body: the [`RecordImage`] in the data directory's bincode encoding
//! (key `Option<bytes>`, payload `bytes`, headers `Vec<(name String, value Option<bytes>)>`,
//! time `i64`).
//!
//! `.idx` holds one 24-byte entry per record, in offset order: where the record starts in
//! `.rec` (`u64`), its time (`i64`), and the size (payload, key and header bytes) of the
//! segment's records before it (`u64`). Offsets index it directly; times never decrease, so a
//! time is found by binary search.
//!
//! Which segments exist and how far each is valid is written in every checkpoint (the
//! catalog, [`SegmentImage`]); recovery trusts the catalog, reads back what was appended
//! after it for the log entries that name those records, keeps what the replayed log holds and
//! cuts the rest (see the tails module), and removes files it does not name. A record is
//! checked against its CRC whenever it is read.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use broker_core::cold::{Appended, ColdError, ColdStore, LogId};
use broker_core::image::{RecordImage, StateImage};
use serde::{Deserialize, Serialize};
use tracing::info;

use crate::format::config;
use crate::repair::{remove_path, Repairs};
use crate::segment::sync_dir;
use crate::StorageError;

/// The directory under the data directory that holds record segments.
pub(crate) const RECORDS_DIR: &str = "records";

/// The format version of record segments and their indexes this build writes and reads.
pub const RECORD_FORMAT_VERSION: u32 = 1;

pub(crate) const DATA_MAGIC: [u8; 8] = *b"BROKRREC";
pub(crate) const INDEX_MAGIC: [u8; 8] = *b"BROKRIDX";
pub(crate) const HEADER: u64 = 32;
pub(crate) const INDEX_ENTRY: u64 = 24;
pub(crate) const RECORD_HEADER: usize = 8;

/// Encoded record bytes past which [`fill`] writes what it holds to the segment's file (it holds
/// at most this much and one record more).
const WRITE_CHUNK: usize = 256 * 1024;

/// The bytes a record takes on disk beyond its payload and key, in a segment and its index:
/// entry header, the encoding's length prefixes and tags, its time and its index entry. A
/// record's headers add their name and value bytes plus 17 bytes each.
pub const RECORD_OVERHEAD_BYTES: u64 = RECORD_HEADER as u64 + 1 + 8 + 8 + 8 + INDEX_ENTRY;

/// Most segments (two files each) the flusher keeps open for writing at once: past it, the
/// least recently written is closed (its unsynced writes synced later by path), and opened
/// again when written to.
const OPEN_FOR_WRITING: usize = 64;

/// Most segment files kept open for reading at once; older ones are closed and reopened when
/// read again.
const OPEN_FILES: usize = 256;

/// One record segment as the catalog describes it: what a checkpoint names, and what recovery
/// trusts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentImage {
    /// The topic's id.
    pub topic: u64,
    /// The partition.
    pub partition: u32,
    /// The offset of the segment's first record.
    pub base: i64,
    /// How many records it holds (offsets `base..base + count`).
    pub count: u64,
    /// The size of its records (payload, key and header bytes).
    pub bytes: u64,
    /// The valid length of its `.rec` file.
    pub data_len: u64,
    /// The time of its first record.
    pub first_timestamp_ms: i64,
    /// The time of its last record.
    pub last_timestamp_ms: i64,
    /// The size of its largest record.
    pub largest: u64,
}

impl SegmentImage {
    pub(crate) fn log(&self) -> LogId {
        LogId {
            topic: self.topic,
            partition: self.partition,
        }
    }

    /// One past its last offset.
    fn end(&self) -> i64 {
        self.base + self.count as i64
    }
}

/// The record segments of a data directory: written by checkpoints, read by the state.
#[derive(Debug)]
pub struct RecordStore {
    root: PathBuf,
    catalog: Mutex<HashMap<LogId, Vec<SegmentImage>>>,
    open: Mutex<OpenFiles>,
    /// Held by whatever changes segment files (appends, retirement), one at a time: a
    /// checkpoint's removals never meet the flusher's appends to the same log. Readers never
    /// take it.
    writing: Mutex<()>,
}

/// The segment files the one writer that appends records as they come (the journal's flusher,
/// [`RecordStore::write`]) keeps open between writes, and which of them hold records not yet
/// synced ([`RecordStore::take_written`]).
#[derive(Debug, Default)]
pub struct OpenSegments {
    files: HashMap<(LogId, i64), WriteFiles>,
    /// Segments closed with writes not yet synced: `.rec` and `.idx` paths, and which of the
    /// two are unsynced. Synced by path with the open ones; one entry per segment however often
    /// it was closed, taken back when it is opened again.
    closed: HashMap<(LogId, i64), (PathBuf, PathBuf, [bool; 2])>,
    /// Counts writes, for the least recently written segment to be closed first.
    writes: u64,
}

/// The two files of a segment open for appending, positioned at the end of what it holds.
#[derive(Debug)]
struct WriteFiles {
    /// Shared with a [`RecordsToSync`] that syncs it on another thread.
    data: Arc<File>,
    data_path: PathBuf,
    /// Shared with a [`RecordsToSync`] too.
    index: Arc<File>,
    index_path: PathBuf,
    /// Whether `.rec` and `.idx` hold writes not yet synced.
    unsynced: [bool; 2],
    /// When it was last written to, in [`OpenSegments::writes`].
    written: u64,
}

impl WriteFiles {
    /// Opens the files of `segment`, cutting anything past what it holds.
    fn open(store: &RecordStore, segment: &SegmentImage) -> Result<WriteFiles, StorageError> {
        let (data_path, index_path) = store.paths(segment.log(), segment.base);
        Ok(WriteFiles {
            data: Arc::new(open_for_append(&data_path, segment.data_len)?),
            index: Arc::new(open_for_append(
                &index_path,
                HEADER + segment.count * INDEX_ENTRY,
            )?),
            data_path,
            index_path,
            unsynced: [false; 2],
            written: 0,
        })
    }

    /// Syncs the `.rec` file and, with `index`, the `.idx` file, if they hold unsynced writes.
    fn sync(&mut self, index: bool) -> Result<(), StorageError> {
        if self.unsynced[0] {
            self.data
                .sync_data()
                .map_err(StorageError::io("fsync", &self.data_path))?;
            self.unsynced[0] = false;
        }
        if index && self.unsynced[1] {
            self.index
                .sync_data()
                .map_err(StorageError::io("fsync", &self.index_path))?;
            self.unsynced[1] = false;
        }
        Ok(())
    }
}

impl OpenSegments {
    /// Closes `files` without syncing them (no fsync is added to the writes' path), keeping
    /// what they hold unsynced to be synced by path with the open files.
    fn close(&mut self, key: (LogId, i64), files: WriteFiles) {
        if files.unsynced.contains(&true) {
            let (_, _, unsynced) =
                self.closed
                    .entry(key)
                    .or_insert((files.data_path, files.index_path, [false; 2]));
            unsynced[0] |= files.unsynced[0];
            unsynced[1] |= files.unsynced[1];
        }
    }

    /// Closes the least recently written segment once [`OPEN_FOR_WRITING`] are open, so that
    /// no more are kept open however many partitions are written to.
    fn make_room(&mut self) {
        if self.files.len() < OPEN_FOR_WRITING {
            return;
        }
        let oldest = self
            .files
            .iter()
            .min_by_key(|(_, files)| files.written)
            .map(|(key, _)| *key);
        if let Some(key) = oldest {
            if let Some(files) = self.files.remove(&key) {
                self.close(key, files);
            }
        }
    }

    /// Syncs the `.rec` files written through these, open or closed since (not their indexes,
    /// which recovery writes again from them): the records written so far are durable.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a file cannot be synced.
    pub fn sync_records(&mut self) -> Result<(), StorageError> {
        self.take_records_to_sync().sync()
    }

    /// Takes the `.rec` files written through these since they were last synced, open or
    /// closed since, and counts them as synced: the caller syncs them ([`RecordsToSync::sync`],
    /// on any thread) before it counts on their records, and before any later
    /// [`OpenSegments::sync_records`] or [`RecordStore::take_written`] (which skip them).
    pub fn take_records_to_sync(&mut self) -> RecordsToSync {
        let mut files = Vec::new();
        for written in self.files.values_mut() {
            if std::mem::take(&mut written.unsynced[0]) {
                files.push(FileToSync::Open(
                    Arc::clone(&written.data),
                    written.data_path.clone(),
                ));
            }
        }
        for (data_path, _, unsynced) in self.closed.values_mut() {
            if std::mem::take(&mut unsynced[0]) {
                files.push(FileToSync::Closed(data_path.clone()));
            }
        }
        self.closed
            .retain(|_, (_, _, unsynced)| unsynced.contains(&true));
        RecordsToSync(files)
    }

    /// Takes every file written through these since it was last synced, `.rec` and `.idx`,
    /// open or closed since, and counts them as synced: the caller syncs them
    /// ([`RecordsToSync::sync`]) before it counts on them.
    fn take_all_to_sync(&mut self) -> RecordsToSync {
        let mut files = Vec::new();
        for written in self.files.values_mut() {
            let [data, index] = std::mem::take(&mut written.unsynced);
            if data {
                files.push(FileToSync::Open(
                    Arc::clone(&written.data),
                    written.data_path.clone(),
                ));
            }
            if index {
                files.push(FileToSync::Open(
                    Arc::clone(&written.index),
                    written.index_path.clone(),
                ));
            }
        }
        for (data_path, index_path, unsynced) in std::mem::take(&mut self.closed).into_values() {
            for (path, was) in [(data_path, unsynced[0]), (index_path, unsynced[1])] {
                if was {
                    files.push(FileToSync::Closed(path));
                }
            }
        }
        RecordsToSync(files)
    }
}

#[cfg(test)]
impl OpenSegments {
    /// How many segments are closed with writes not yet synced.
    pub(crate) fn closed_len(&self) -> usize {
        self.closed.len()
    }
}

/// Record files taken by [`OpenSegments::take_records_to_sync`], to be synced elsewhere.
#[derive(Debug)]
pub struct RecordsToSync(Vec<FileToSync>);

/// A `.rec` file with writes not yet synced.
#[derive(Debug)]
enum FileToSync {
    /// Still open for appending (the handle is shared with the writer).
    Open(Arc<File>, PathBuf),
    /// Closed since it was written: synced by path.
    Closed(PathBuf),
}

impl RecordsToSync {
    /// Syncs the files one after the other (side by side, fsyncs took longer on the disks
    /// measured); a closed file removed meanwhile (its segment retired) needs none.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a file cannot be synced: what it held may be lost.
    pub fn sync(&self) -> Result<(), StorageError> {
        self.0.iter().try_for_each(|file| match file {
            FileToSync::Open(file, path) => {
                file.sync_data().map_err(StorageError::io("fsync", path))
            }
            FileToSync::Closed(path) => sync_path(path),
        })
    }
}

/// Opens the files of `segment` (of `key`) for writing, taking back from `closed` what they
/// held unsynced when they were last closed ([`OpenSegments::closed`]).
fn reopen(
    closed: &mut HashMap<(LogId, i64), (PathBuf, PathBuf, [bool; 2])>,
    store: &RecordStore,
    key: (LogId, i64),
    segment: &SegmentImage,
) -> Result<WriteFiles, StorageError> {
    let mut files = WriteFiles::open(store, segment)?;
    if let Some((_, _, unsynced)) = closed.remove(&key) {
        files.unsynced = unsynced;
    }
    Ok(files)
}

/// Syncs the file at `path`, if it still exists.
fn sync_path(path: &Path) -> Result<(), StorageError> {
    match File::open(path) {
        Ok(file) => file.sync_data().map_err(StorageError::io("fsync", path)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(StorageError::io("open", path)(cause)),
    }
}

/// What [`RecordStore::write_out`] moved from a state's image to record segments.
#[derive(Debug, Default)]
pub struct WrittenOut {
    /// For each partition whose records it wrote, the offset they now reach on disk: what the
    /// state may evict ([`broker_core::BrokerState::evict`]).
    pub evicted: Vec<(LogId, i64)>,
    /// Every partition of the image and its oldest retained offset: what
    /// [`RecordStore::catalog_without_retired`] and [`RecordStore::retire`] go by.
    pub bases: HashMap<LogId, i64>,
    /// The ids of the image's topics, and the id its next topic gets: a log of neither is of
    /// a topic deleted before the image, and one of a later id of a topic created after it.
    pub topics: (HashSet<u64>, u64),
}

impl WrittenOut {
    /// Nothing moved yet from `image`: its topics, and its partitions' bases.
    fn of(image: &StateImage) -> WrittenOut {
        let mut bases = HashMap::new();
        for (_, topic) in &image.topics {
            for (number, partition) in topic.partitions.iter().enumerate() {
                let log = LogId {
                    topic: topic.id,
                    // At most 65,536 partitions: the image was checked when the state was built.
                    partition: number as u32,
                };
                bases.insert(log, partition.base);
            }
        }
        WrittenOut {
            evicted: Vec::new(),
            bases,
            topics: (
                image.topics.iter().map(|(_, topic)| topic.id).collect(),
                image.next_topic_id,
            ),
        }
    }

    /// Whether the image had `log`'s topic deleted: no segment of the log is needed any more
    /// (a partition or topic created after the image is not).
    fn deleted(&self, log: &LogId) -> bool {
        let (topics, next_topic_id) = &self.topics;
        log.topic < *next_topic_id && !topics.contains(&log.topic)
    }
}

/// The segment files of a partition that the catalog does not name, by base offset: the
/// `.rec` and `.idx` paths.
pub(crate) type Unnamed = Vec<(i64, PathBuf, PathBuf)>;

/// What [`RecordStore::check_files`] found that may be records written past the catalog: the
/// last cataloged segments longer than the catalog says (with their paths and `.rec` length)
/// and the files the catalog does not name.
#[derive(Debug, Default)]
pub(crate) struct TailFiles {
    pub(crate) last: Vec<(SegmentImage, PathBuf, PathBuf, u64)>,
    pub(crate) unnamed: HashMap<LogId, Unnamed>,
}

/// Segments and logs dropped from the catalog, whose files are to be removed.
#[derive(Debug, Default)]
pub struct Retired {
    segments: Vec<(LogId, i64)>,
    logs: Vec<LogId>,
}

/// Segment files open for reading, least recently used first.
#[derive(Debug, Default)]
struct OpenFiles {
    files: HashMap<(LogId, i64), Arc<SegmentFiles>>,
    order: VecDeque<(LogId, i64)>,
}

#[derive(Debug)]
struct SegmentFiles {
    data: File,
    data_path: PathBuf,
    index: File,
    index_path: PathBuf,
}

/// One index entry.
#[derive(Debug, Clone, Copy)]
struct IndexEntry {
    position: u64,
    timestamp_ms: i64,
    bytes_before: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these; the data is consistent after a panic elsewhere.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn log_dir_name(log: LogId) -> String {
    format!("{:020}-{:010}", log.topic, log.partition)
}

fn parse_log_dir(name: &str) -> Option<LogId> {
    let (topic, partition) = name.split_once('-')?;
    if topic.len() != 20 || partition.len() != 10 {
        return None;
    }
    Some(LogId {
        topic: topic.parse().ok()?,
        partition: partition.parse().ok()?,
    })
}

pub(crate) fn header(magic: [u8; 8], log: LogId, base: i64) -> [u8; HEADER as usize] {
    let mut header = [0; HEADER as usize];
    header[..8].copy_from_slice(&magic);
    header[8..12].copy_from_slice(&RECORD_FORMAT_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&log.partition.to_le_bytes());
    header[16..24].copy_from_slice(&log.topic.to_le_bytes());
    header[24..32].copy_from_slice(&base.to_le_bytes());
    header
}

/// The two files of `segment` in the store opened on `dir` ([`RecordStore::open`]), each with
/// the length the segment's records take in it: the records (`.rec`), then the index (`.idx`).
/// A copy of a store is those bytes of every segment of its catalog.
pub fn segment_files(dir: &Path, segment: &SegmentImage) -> [(PathBuf, u64); 2] {
    let log_dir = dir.join(RECORDS_DIR).join(log_dir_name(segment.log()));
    [
        (
            log_dir.join(format!("{:020}.rec", segment.base)),
            segment.data_len,
        ),
        (
            log_dir.join(format!("{:020}.idx", segment.base)),
            // Saturating: a catalog from another node is checked against the bytes it
            // brings, which no huge count can match.
            segment
                .count
                .saturating_mul(INDEX_ENTRY)
                .saturating_add(HEADER),
        ),
    ]
}

impl RecordStore {
    /// Opens the record segments under `dir` that `catalog` (from the latest checkpoint) names:
    /// each must exist with a valid header and at least the length the catalog gives; what a
    /// later, unfinished checkpoint appended is cut, and files and directories the catalog does
    /// not name are removed.
    ///
    /// # Errors
    /// [`StorageError::Corrupt`] naming a segment that is missing, short or not what the
    /// catalog says (nothing is changed then); [`StorageError::Io`] if the directory cannot be
    /// read or cleaned.
    pub fn open(dir: &Path, catalog: Vec<SegmentImage>) -> Result<RecordStore, StorageError> {
        let mut repairs = Repairs::default();
        let store = RecordStore::check(dir, catalog, &mut repairs)?;
        repairs.apply()?;
        Ok(store)
    }

    /// [`RecordStore::open`] that changes nothing: what it would cut and remove is added to
    /// `repairs`. The store reads only what the catalog names, so it may serve reads before
    /// the repairs are made; it must take no write until they are.
    ///
    /// # Errors
    /// As [`RecordStore::open`], but for cleaning: nothing is changed.
    pub fn check(
        dir: &Path,
        catalog: Vec<SegmentImage>,
        repairs: &mut Repairs,
    ) -> Result<RecordStore, StorageError> {
        RecordStore::check_files(dir, catalog, repairs, None)
    }

    /// [`RecordStore::check`], collecting into `tails` (when given) what could be a tail
    /// instead of cutting or removing it.
    pub(crate) fn check_files(
        dir: &Path,
        catalog: Vec<SegmentImage>,
        repairs: &mut Repairs,
        mut tails: Option<&mut TailFiles>,
    ) -> Result<RecordStore, StorageError> {
        let root = dir.join(RECORDS_DIR);
        // Made durable in the data directory too, for segments later created in it.
        repairs.create(root.clone());
        let mut logs: HashMap<LogId, Vec<SegmentImage>> = HashMap::new();
        for segment in catalog {
            logs.entry(segment.log()).or_default().push(segment);
        }
        for segments in logs.values_mut() {
            segments.sort_unstable_by_key(|segment| segment.base);
        }
        let store = RecordStore {
            root,
            catalog: Mutex::new(HashMap::new()),
            open: Mutex::new(OpenFiles::default()),
            writing: Mutex::new(()),
        };
        store.find_unnamed(
            &logs,
            repairs,
            tails.as_mut().map(|tails| &mut tails.unnamed),
        )?;
        for segments in logs.values() {
            for (index, segment) in segments.iter().enumerate() {
                let last = index + 1 == segments.len();
                let tail = tails.as_mut().filter(|_| last).map(|tails| &mut tails.last);
                store.check_segment(segment, repairs, tail)?;
            }
        }
        *lock(&store.catalog) = logs;
        Ok(store)
    }

    fn log_dir(&self, log: LogId) -> PathBuf {
        self.root.join(log_dir_name(log))
    }

    fn paths(&self, log: LogId, base: i64) -> (PathBuf, PathBuf) {
        let dir = self.log_dir(log);
        (
            dir.join(format!("{base:020}.rec")),
            dir.join(format!("{base:020}.idx")),
        )
    }

    /// Names `segment` in the catalog from now on, in place of the segment of its log with the
    /// same base (or after the others): a tail recovery keeps.
    pub(crate) fn name(&self, segment: SegmentImage) {
        let mut catalog = lock(&self.catalog);
        let segments = catalog.entry(segment.log()).or_default();
        match segments.last_mut() {
            Some(last) if last.base == segment.base => *last = segment,
            _ => segments.push(segment),
        }
    }

    /// Appends the records `image` holds in memory to their partitions' segments ([`append`],
    /// fsynced) and takes them out of the image, which then counts them as in a cold store:
    /// the image is what a checkpoint of the state with those records evicted holds.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a segment cannot be written (see [`RecordStore::append`]); the
    /// image may then have lost some partitions' records and must not be used.
    ///
    /// [`append`]: RecordStore::append
    pub fn write_out(
        &self,
        image: &mut StateImage,
        segment_bytes: u64,
    ) -> Result<WrittenOut, StorageError> {
        take_records(image, |log, first, records| {
            self.append(log, first, records, segment_bytes)
        })
    }

    /// Adds the removal of the directories and segment files `logs` does not name to
    /// `repairs`; with `unnamed`, segment files (`.rec` and `.idx` of one base) go there
    /// instead, by log, for the tails to decide.
    fn find_unnamed(
        &self,
        logs: &HashMap<LogId, Vec<SegmentImage>>,
        repairs: &mut Repairs,
        mut unnamed: Option<&mut HashMap<LogId, Unnamed>>,
    ) -> Result<(), StorageError> {
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            // A directory that never held records: nothing to remove.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(cause) => return Err(StorageError::io("list", &self.root)(cause)),
        };
        for entry in entries {
            let entry = entry.map_err(StorageError::io("list", &self.root))?;
            let path = entry.path();
            let Some(log) = entry.file_name().to_str().and_then(parse_log_dir) else {
                repairs.remove(path, "removing record files no checkpoint names");
                continue;
            };
            let named = logs.get(&log);
            if named.is_none() && unnamed.is_none() {
                repairs.remove(path, "removing record files no checkpoint names");
                continue;
            }
            let mut files: HashMap<i64, [bool; 2]> = HashMap::new();
            for file in fs::read_dir(&path).map_err(StorageError::io("list", &path))? {
                let file = file.map_err(StorageError::io("list", &path))?;
                let name = file.file_name();
                let segment_file = name.to_str().and_then(|name| {
                    let base = name.get(..20)?.parse::<i64>().ok()?;
                    match name.get(20..)? {
                        ".rec" => Some((base, 0)),
                        ".idx" => Some((base, 1)),
                        _ => None,
                    }
                });
                let is_named = |base| named.is_some_and(|s| s.iter().any(|s| s.base == base));
                match segment_file {
                    Some((base, _)) if is_named(base) => {}
                    Some((base, kind)) if unnamed.is_some() => {
                        files.entry(base).or_default()[kind] = true;
                    }
                    _ => repairs.remove(file.path(), "removing a record file no checkpoint names"),
                }
            }
            if named.is_none() && !files.values().any(|[data, _]| *data) {
                // No record in it (a segment's directory made just before a stop, or one
                // whose files all went): nothing to keep.
                repairs.remove(path, "removing record files no checkpoint names");
                continue;
            }
            for (base, [data, index]) in files {
                let (data_path, index_path) = self.paths(log, base);
                match unnamed.as_mut() {
                    // An index alone holds no record.
                    Some(unnamed) if data => {
                        unnamed
                            .entry(log)
                            .or_default()
                            .push((base, data_path, index_path));
                    }
                    _ => {
                        if index {
                            repairs
                                .remove(index_path, "removing a record file no checkpoint names");
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks that a cataloged segment's files hold at least what the catalog says, and adds
    /// cutting anything after it to `repairs`; with `tail`, records past it in the `.rec` file
    /// go there instead (with the file's length), for the tails to decide.
    fn check_segment(
        &self,
        segment: &SegmentImage,
        repairs: &mut Repairs,
        tail: Option<&mut Vec<(SegmentImage, PathBuf, PathBuf, u64)>>,
    ) -> Result<(), StorageError> {
        let log = segment.log();
        let (data_path, index_path) = self.paths(log, segment.base);
        let index_len = HEADER + segment.count * INDEX_ENTRY;
        let mut lengths = [0; 2];
        for (at, (path, magic, len)) in [
            (&data_path, DATA_MAGIC, segment.data_len),
            (&index_path, INDEX_MAGIC, index_len),
        ]
        .into_iter()
        .enumerate()
        {
            let file = File::open(path).map_err(|cause| {
                StorageError::corrupt(
                    path,
                    0,
                    format!("a record segment the last checkpoint names cannot be opened: {cause}"),
                )
            })?;
            let actual = file
                .metadata()
                .map_err(StorageError::io("read the length of", path))?
                .len();
            if actual < len {
                return Err(StorageError::corrupt(
                    path,
                    actual,
                    format!("the file ends at byte {actual}; the last checkpoint says {len}"),
                ));
            }
            let mut found = [0; HEADER as usize];
            file.read_exact_at(&mut found, 0)
                .map_err(StorageError::io("read", path))?;
            if found != header(magic, log, segment.base) {
                return Err(StorageError::corrupt(
                    path,
                    0,
                    "the header is not the one of the segment the file name and the last \
                     checkpoint give",
                ));
            }
            lengths[at] = actual;
        }
        let [data_actual, index_actual] = lengths;
        match tail {
            // The tail's records decide what of both files is kept.
            Some(tails) if data_actual > segment.data_len => {
                tails.push((segment.clone(), data_path, index_path, data_actual));
            }
            _ => {
                for (path, len, actual) in [
                    (data_path, segment.data_len, data_actual),
                    (index_path, index_len, index_actual),
                ] {
                    if actual > len {
                        repairs.cut(
                            path,
                            len,
                            actual,
                            "cutting records written after the last checkpoint",
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// The segments of every log, for the next checkpoint's catalog, sorted by log and base.
    pub fn catalog(&self) -> Vec<SegmentImage> {
        let catalog = lock(&self.catalog);
        let mut segments: Vec<SegmentImage> = catalog.values().flatten().cloned().collect();
        segments.sort_unstable_by_key(|segment| (segment.log(), segment.base));
        segments
    }

    /// Each log's end in its segments: the offset after the last record written (readable)
    /// of the run of segments that follow on from its first, for the state to evict what is
    /// below it (never a record past a gap between segments).
    pub fn written_ends(&self) -> Vec<(LogId, i64)> {
        lock(&self.catalog)
            .iter()
            .filter_map(|(log, segments)| {
                let (first, rest) = segments.split_first()?;
                let mut end = first.end();
                for segment in rest {
                    if segment.base != end {
                        break;
                    }
                    end = segment.end();
                }
                Some((*log, end))
            })
            .collect()
    }

    /// The offset after the last record stored for `log` (`None` if none is).
    pub fn end(&self, log: LogId) -> Option<i64> {
        lock(&self.catalog)
            .get(&log)
            .and_then(|segments| segments.last())
            .map(SegmentImage::end)
    }

    /// Appends `records`, the records of `log` from offset `first`, to its last segment (or a
    /// new one if the offsets do not follow on), rolling to a new segment whenever one holds
    /// `segment_bytes`; writes and fsyncs them. Records already stored (below the log's end)
    /// are skipped. The catalog names them only
    /// once they are durable.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a file cannot be written or synced; the catalog names what was
    /// durable before, and the files may hold a partial tail, which the next append (or
    /// recovery) cuts.
    pub fn append(
        &self,
        log: LogId,
        first: i64,
        records: &[RecordImage],
        segment_bytes: u64,
    ) -> Result<(), StorageError> {
        let _writing = lock(&self.writing);
        self.append_to(
            log,
            first,
            records,
            segment_bytes,
            &mut OpenSegments::default(),
            true,
        )
    }

    /// Appends the records a state reported appended (lists as
    /// [`broker_core::BrokerState::take_appended`] gave them, in order) to their partitions'
    /// segments as [`RecordStore::append`] does, but without syncing them: the catalog names them at once (readers may read them back), and
    /// [`RecordStore::take_written`] makes them durable. `open` keeps the files open from one
    /// call to the next; only one writer may use this at a time.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a file cannot be written: what was written before stays named,
    /// and calling again with the same records writes the rest.
    pub fn write(
        &self,
        appended: &[Vec<Appended>],
        segment_bytes: u64,
        open: &mut OpenSegments,
    ) -> Result<(), StorageError> {
        if appended.iter().all(Vec::is_empty) {
            // Most batches of `always`, and every one without a publish.
            return Ok(());
        }
        let _writing = lock(&self.writing);
        // Each log's records in offset order, in runs of consecutive offsets.
        let mut runs: Vec<(LogId, i64, Vec<&RecordImage>)> = Vec::new();
        let mut last_run: HashMap<LogId, usize> = HashMap::new();
        for Appended {
            log,
            offset,
            record,
        } in appended.iter().flatten()
        {
            match last_run.get(log).map(|&index| &mut runs[index]) {
                Some((_, first, records)) if *first + records.len() as i64 == *offset => {
                    records.push(record);
                }
                _ => {
                    last_run.insert(*log, runs.len());
                    runs.push((*log, *offset, vec![record]));
                }
            }
        }
        for (log, first, records) in runs {
            self.append_to(log, first, &records, segment_bytes, open, false)?;
        }
        Ok(())
    }

    /// Takes every segment file [`RecordStore::write`] wrote through `open` since it was last
    /// synced (counted as synced from now on, for the caller to sync them, on any thread), and
    /// closes those a log no longer appends to; returns them with the catalog, which names
    /// exactly what is durable once they are synced (no write is made meanwhile).
    pub fn take_written(&self, open: &mut OpenSegments) -> (RecordsToSync, Vec<SegmentImage>) {
        let _writing = lock(&self.writing);
        let files = open.take_all_to_sync();
        let catalog = lock(&self.catalog);
        open.files.retain(|(log, base), _| {
            catalog
                .get(log)
                .and_then(|segments| segments.last())
                .is_some_and(|last| last.base == *base)
        });
        drop(catalog);
        (files, self.catalog())
    }

    /// [`RecordStore::append`], with the writing lock held, through the files `open` holds
    /// (opening those it lacks), fsyncing each segment before the catalog names it when `sync`
    /// says so, and otherwise leaving them for [`RecordStore::take_written`].
    fn append_to<R: Borrow<RecordImage>>(
        &self,
        log: LogId,
        first: i64,
        records: &[R],
        segment_bytes: u64,
        open: &mut OpenSegments,
        sync: bool,
    ) -> Result<(), StorageError> {
        let end = self.end(log);
        let skip = end.map_or(0, |end| {
            (end - first).clamp(0, records.len() as i64) as usize
        });
        let mut records = &records[skip..];
        let mut next = first + skip as i64;
        while !records.is_empty() {
            let last = lock(&self.catalog)
                .get(&log)
                .and_then(|segments| segments.last().cloned());
            let segment = match last {
                Some(last) if last.end() == next && last.data_len < segment_bytes => last,
                _ => {
                    self.create_segment(log, next)?;
                    SegmentImage {
                        topic: log.topic,
                        partition: log.partition,
                        base: next,
                        count: 0,
                        bytes: 0,
                        data_len: HEADER,
                        first_timestamp_ms: records[0].borrow().timestamp_ms,
                        last_timestamp_ms: records[0].borrow().timestamp_ms,
                        largest: 0,
                    }
                }
            };
            let key = (log, segment.base);
            if !open.files.contains_key(&key) {
                open.make_room();
            }
            open.writes += 1;
            let written = open.writes;
            let files = match open.files.entry(key) {
                std::collections::hash_map::Entry::Occupied(files) => files.into_mut(),
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(reopen(&mut open.closed, self, key, &segment)?)
                }
            };
            files.written = written;
            let filled = fill(segment, &mut records, segment_bytes, files).and_then(|segment| {
                if sync {
                    files.sync(true)?;
                }
                Ok(segment)
            });
            let segment = match filled {
                Ok(segment) => segment,
                Err(error) => {
                    // Where the files stand is unknown: the next attempt opens them again,
                    // cut to what the catalog names. What they hold of earlier writes, whose
                    // log entries may be written already, is still synced with the others.
                    if let Some(files) = open.files.remove(&key) {
                        open.close(key, files);
                    }
                    return Err(error);
                }
            };
            next = segment.end();
            let mut catalog = lock(&self.catalog);
            let segments = catalog.entry(log).or_default();
            match segments.last_mut() {
                Some(last) if last.base == segment.base => *last = segment,
                _ => segments.push(segment),
            }
        }
        Ok(())
    }

    /// Creates the two files of a new segment of `log` at `base`, durable with their directory.
    fn create_segment(&self, log: LogId, base: i64) -> Result<(), StorageError> {
        let dir = self.log_dir(log);
        fs::create_dir_all(&dir).map_err(StorageError::io("create directory", &dir))?;
        let (data_path, index_path) = self.paths(log, base);
        for (path, magic) in [(&data_path, DATA_MAGIC), (&index_path, INDEX_MAGIC)] {
            let mut file = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .open(path)
                .map_err(StorageError::io("create", path))?;
            file.write_all(&header(magic, log, base))
                .map_err(StorageError::io("write", path))?;
            file.sync_all().map_err(StorageError::io("fsync", path))?;
        }
        sync_dir(&dir)?;
        // Also when the directory was made by an earlier attempt that failed before this.
        sync_dir(&self.root)?;
        info!(file = %data_path.display(), first_offset = base, "record segment started");
        Ok(())
    }

    /// The catalog as it will be once [`RecordStore::retire`] of `bases` has run: what a
    /// checkpoint with those bases records.
    pub fn catalog_without_retired(&self, bases: &HashMap<LogId, i64>) -> Vec<SegmentImage> {
        without_retired(self.catalog(), bases)
    }

    /// Drops from the catalog the segments no longer needed after the checkpoint of the image
    /// `written` describes: those of topics deleted before it, and those whose records are all
    /// below their log's oldest retained offset in `written.bases` (segments of logs created
    /// after the image stay). Returns what to pass to [`RecordStore::remove`] once a checkpoint
    /// with the catalog without them is durable (until then, the previous checkpoint still
    /// names them).
    pub fn retire(&self, written: &WrittenOut) -> Retired {
        let mut retired = Retired::default();
        let mut catalog = lock(&self.catalog);
        catalog.retain(|log, segments| match written.bases.get(log) {
            None if written.deleted(log) => {
                retired.logs.push(*log);
                false
            }
            None => true,
            Some(&base) => {
                segments.retain(|segment| {
                    let keep = segment.end() > base;
                    if !keep {
                        retired.segments.push((*log, segment.base));
                    }
                    keep
                });
                // A log with no segment left keeps no directory either.
                if segments.is_empty() {
                    retired.logs.push(*log);
                }
                !segments.is_empty()
            }
        });
        retired
    }

    /// [`RecordStore::retire`] then [`RecordStore::remove`], with no append in between (one
    /// could otherwise start a segment in a log directory about to be removed).
    ///
    /// # Errors
    /// As [`RecordStore::remove`].
    pub fn retire_and_remove(&self, written: &WrittenOut) -> Result<usize, StorageError> {
        let _writing = lock(&self.writing);
        let retired = self.retire(written);
        self.remove(&retired)
    }

    /// Removes the files of segments [`RecordStore::retire`] dropped; returns how many
    /// segments and logs went.
    ///
    /// # Errors
    /// [`StorageError::Io`] if a file or directory cannot be removed.
    pub fn remove(&self, retired: &Retired) -> Result<usize, StorageError> {
        {
            let mut open = lock(&self.open);
            let OpenFiles { files, order } = &mut *open;
            files.retain(|(log, base), _| {
                !retired.logs.contains(log) && !retired.segments.contains(&(*log, *base))
            });
            order.retain(|key| files.contains_key(key));
        }
        for &(log, base) in &retired.segments {
            let (data_path, index_path) = self.paths(log, base);
            remove_path(&data_path)?;
            remove_path(&index_path)?;
        }
        for &log in &retired.logs {
            remove_path(&self.log_dir(log))?;
        }
        if !retired.logs.is_empty() {
            sync_dir(&self.root)?;
        }
        Ok(retired.segments.len() + retired.logs.len())
    }

    /// The segments of `log` that hold offsets of `range`, in order, or why not every offset of
    /// the range is stored.
    fn covering(&self, log: LogId, range: &Range<i64>) -> Result<Vec<SegmentImage>, ColdError> {
        let catalog = lock(&self.catalog);
        let segments = catalog.get(&log).map(Vec::as_slice).unwrap_or_default();
        let mut covering = Vec::new();
        let mut next = range.start;
        for segment in segments {
            if segment.end() <= next || next >= range.end {
                continue;
            }
            if segment.base > next {
                break;
            }
            covering.push(segment.clone());
            next = segment.end();
        }
        if next < range.end {
            return Err(ColdError(format!(
                "offset {next} of topic id {} partition {} is in no record segment under {}",
                log.topic,
                log.partition,
                self.root.display()
            )));
        }
        Ok(covering)
    }

    /// The open files of a segment.
    fn files(&self, segment: &SegmentImage) -> Result<Arc<SegmentFiles>, ColdError> {
        let key = (segment.log(), segment.base);
        let mut open = lock(&self.open);
        if let Some(files) = open.files.get(&key) {
            let files = Arc::clone(files);
            open.order.retain(|k| *k != key);
            open.order.push_back(key);
            return Ok(files);
        }
        let (data_path, index_path) = self.paths(key.0, key.1);
        let open_file = |path: &Path| {
            File::open(path)
                .map_err(|cause| ColdError(format!("cannot open {}: {cause}", path.display())))
        };
        let files = Arc::new(SegmentFiles {
            data: open_file(&data_path)?,
            data_path,
            index: open_file(&index_path)?,
            index_path,
        });
        if open.order.len() >= OPEN_FILES {
            if let Some(oldest) = open.order.pop_front() {
                open.files.remove(&oldest);
            }
        }
        open.files.insert(key, Arc::clone(&files));
        open.order.push_back(key);
        Ok(files)
    }

    /// The index entries of `segment` for its records `from..to` (indexes within it).
    fn index_entries(
        &self,
        segment: &SegmentImage,
        from: u64,
        to: u64,
    ) -> Result<Vec<IndexEntry>, ColdError> {
        let files = self.files(segment)?;
        let mut bytes = vec![0; ((to - from) * INDEX_ENTRY) as usize];
        files
            .index
            .read_exact_at(&mut bytes, HEADER + from * INDEX_ENTRY)
            .map_err(|cause| {
                ColdError(format!(
                    "cannot read {}: {cause}",
                    files.index_path.display()
                ))
            })?;
        let entries: Vec<IndexEntry> = bytes
            .chunks_exact(INDEX_ENTRY as usize)
            .map(|entry| IndexEntry {
                position: u64_of(&entry[..8]),
                timestamp_ms: u64_of(&entry[8..16]) as i64,
                bytes_before: u64_of(&entry[16..24]),
            })
            .collect();
        // An index is not checksummed: what arithmetic relies on is checked instead. Positions
        // ascend within the records, running totals do not descend past the segment's bytes,
        // times do not descend.
        let in_order = entries.windows(2).all(|pair| {
            pair[0].position < pair[1].position
                && pair[0].bytes_before <= pair[1].bytes_before
                && pair[0].timestamp_ms <= pair[1].timestamp_ms
        });
        let in_bounds = entries.iter().all(|entry| {
            (HEADER..segment.data_len).contains(&entry.position)
                && entry.bytes_before <= segment.bytes
        });
        if !in_order || !in_bounds {
            return Err(ColdError(format!(
                "corrupt index {}: entries {from} to {to} are out of order or out of bounds",
                files.index_path.display()
            )));
        }
        Ok(entries)
    }

    /// The index entry of the record at `offset` of `segment`.
    fn index_entry(&self, segment: &SegmentImage, offset: i64) -> Result<IndexEntry, ColdError> {
        let at = (offset - segment.base) as u64;
        let entries = self.index_entries(segment, at, at + 1)?;
        entries
            .into_iter()
            .next()
            .ok_or_else(|| ColdError("an index read returned nothing".to_owned()))
    }

    /// The size of `log`'s records from the start of `segments[0]` up to `offset` (within or at
    /// the end of `segments`).
    fn bytes_before(&self, segments: &[SegmentImage], offset: i64) -> Result<u64, ColdError> {
        let mut total = 0;
        for segment in segments {
            if offset >= segment.end() {
                total += segment.bytes;
            } else {
                if offset > segment.base {
                    total += self.index_entry(segment, offset)?.bytes_before;
                }
                break;
            }
        }
        Ok(total)
    }

    /// The sizes of the records `from..to` of `segment`.
    fn sizes(&self, segment: &SegmentImage, from: i64, to: i64) -> Result<Vec<u64>, ColdError> {
        let first = (from - segment.base) as u64;
        let last = (to - segment.base) as u64;
        let with_next = (last + 1).min(segment.count);
        let entries = self.index_entries(segment, first, with_next)?;
        Ok((0..(last - first) as usize)
            .map(|i| {
                let after = entries
                    .get(i + 1)
                    .map_or(segment.bytes, |next| next.bytes_before);
                after - entries[i].bytes_before
            })
            .collect())
    }
}

impl ColdStore for RecordStore {
    fn read(
        &self,
        log: LogId,
        range: Range<i64>,
        max_bytes: Option<u64>,
    ) -> Result<Vec<RecordImage>, ColdError> {
        let mut records = Vec::new();
        // What the records read so far take; past `max_bytes` (after the first) reading stops.
        let mut taken = 0u64;
        for segment in self.covering(log, &range)? {
            let from = range.start.max(segment.base);
            let to = range.end.min(segment.end());
            let first = (from - segment.base) as u64;
            let last = (to - segment.base) as u64;
            let entries = self.index_entries(&segment, first, (last + 1).min(segment.count))?;
            // How many of this segment's records fit: their sizes are the differences of the
            // index's running totals.
            let mut count = 0;
            while count < (last - first) as usize {
                let after = entries
                    .get(count + 1)
                    .map_or(segment.bytes, |next| next.bytes_before);
                taken += after - entries[count].bytes_before;
                let first_of_all = records.is_empty() && count == 0;
                if !first_of_all && max_bytes.is_some_and(|max| taken > max) {
                    break;
                }
                count += 1;
            }
            if count == 0 {
                break;
            }
            let start = entries[0].position;
            let end = entries
                .get(count)
                .map_or(segment.data_len, |entry| entry.position);
            let files = self.files(&segment)?;
            let damaged = |at: u64, offset: i64, why: &str| {
                ColdError(format!(
                    "corrupt record segment {} at byte {at}, the record at offset {offset}: {why}",
                    files.data_path.display()
                ))
            };
            let mut bytes = vec![0; (end - start) as usize];
            files
                .data
                .read_exact_at(&mut bytes, start)
                .map_err(|cause| {
                    ColdError(format!(
                        "cannot read {}: {cause}",
                        files.data_path.display()
                    ))
                })?;
            for (offset, entry) in (from..).zip(&entries[..count]) {
                let at = (entry.position - start) as usize;
                let damaged = |why: &str| damaged(entry.position, offset, why);
                let Some(head) = bytes.get(at..at + RECORD_HEADER) else {
                    return Err(damaged("the index points past the records"));
                };
                let length = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
                let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
                let Some(body) = bytes.get(at + RECORD_HEADER..at + RECORD_HEADER + length) else {
                    return Err(damaged("a record runs past the segment"));
                };
                if crc32fast::hash(body) != crc {
                    return Err(damaged("record checksum mismatch"));
                }
                match bincode::serde::decode_from_slice::<RecordImage, _>(body, config()) {
                    Ok((record, used)) if used == body.len() => records.push(record),
                    _ => return Err(damaged("the record does not decode")),
                }
            }
            if count < (last - first) as usize {
                break;
            }
        }
        Ok(records)
    }

    fn bytes(&self, log: LogId, range: Range<i64>) -> Result<u64, ColdError> {
        if range.is_empty() {
            return Ok(0);
        }
        let segments = self.covering(log, &range)?;
        let before_start = self.bytes_before(&segments, range.start)?;
        let before_end = self.bytes_before(&segments, range.end)?;
        // An index whose entries are out of order is damaged: said so, never a wrapped size.
        before_end.checked_sub(before_start).ok_or_else(|| {
            ColdError(format!(
                "the index of {log:?} is damaged: offset {} lies {before_end} bytes in, before \
                 offset {} at {before_start}",
                range.end, range.start
            ))
        })
    }

    fn timestamp(&self, log: LogId, offset: i64) -> Result<i64, ColdError> {
        let segments = self.covering(log, &(offset..offset + 1))?;
        let segment = segments
            .first()
            .ok_or_else(|| ColdError(format!("offset {offset} is in no record segment")))?;
        Ok(self.index_entry(segment, offset)?.timestamp_ms)
    }

    fn first_at_or_after(
        &self,
        log: LogId,
        range: Range<i64>,
        timestamp_ms: i64,
    ) -> Result<i64, ColdError> {
        if range.is_empty() {
            return Ok(range.end);
        }
        for segment in self.covering(log, &range)? {
            if segment.last_timestamp_ms < timestamp_ms {
                continue;
            }
            let (mut low, mut high) = (range.start.max(segment.base), range.end.min(segment.end()));
            while low < high {
                let middle = low + (high - low) / 2;
                if self.index_entry(&segment, middle)?.timestamp_ms < timestamp_ms {
                    low = middle + 1;
                } else {
                    high = middle;
                }
            }
            return Ok(low);
        }
        Ok(range.end)
    }

    fn first_within_bytes(
        &self,
        log: LogId,
        range: Range<i64>,
        bytes: u64,
    ) -> Result<i64, ColdError> {
        if range.is_empty() {
            return Ok(range.end);
        }
        let segments = self.covering(log, &range)?;
        let total = self.bytes_before(&segments, range.end)?;
        let (mut low, mut high) = (range.start, range.end);
        while low < high {
            let middle = low + (high - low) / 2;
            if total - self.bytes_before(&segments, middle)? > bytes {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        Ok(low)
    }

    fn largest(&self, log: LogId, range: Range<i64>) -> Result<u64, ColdError> {
        if range.is_empty() {
            return Ok(0);
        }
        let mut largest = 0;
        for segment in self.covering(log, &range)? {
            let from = range.start.max(segment.base);
            let to = range.end.min(segment.end());
            largest = largest.max(if from == segment.base && to == segment.end() {
                segment.largest
            } else {
                self.sizes(&segment, from, to)?
                    .into_iter()
                    .max()
                    .unwrap_or(0)
            });
        }
        Ok(largest)
    }
}

fn u64_of(bytes: &[u8]) -> u64 {
    let mut buf = [0; 8];
    buf.copy_from_slice(bytes);
    u64::from_le_bytes(buf)
}

/// Writes the first of `records` to `segment` through `files` until it holds `segment_bytes`
/// (at least one), unsynced, and returns the segment as it is now; `records` keeps the rest.
fn fill<R: Borrow<RecordImage>>(
    mut segment: SegmentImage,
    records: &mut &[R],
    segment_bytes: u64,
    files: &mut WriteFiles,
) -> Result<SegmentImage, StorageError> {
    files.unsynced = [true; 2];
    let WriteFiles {
        data,
        data_path,
        index,
        index_path,
        ..
    } = &*files;
    // Records are encoded into one buffer and written a chunk at a time (each chunk's records
    // before their index entries): a publish's records take one `write` of each file.
    let mut data_out = Vec::with_capacity(WRITE_CHUNK.min(records.len() * 256));
    let mut index_out = Vec::with_capacity(records.len().min(WRITE_CHUNK / 64) * 24);
    let out = |data_out: &mut Vec<u8>, index_out: &mut Vec<u8>| {
        (&**data)
            .write_all(data_out)
            .map_err(StorageError::io("write", data_path))?;
        (&**index)
            .write_all(index_out)
            .map_err(StorageError::io("write", index_path))?;
        data_out.clear();
        index_out.clear();
        Ok::<(), StorageError>(())
    };
    let mut written = 0;
    for record in records.iter() {
        let record = record.borrow();
        if written > 0 && segment.data_len >= segment_bytes {
            break;
        }
        // The header (length, then checksum of the body) is filled in once the body is encoded
        // after it.
        let start = data_out.len();
        data_out.extend_from_slice(&[0; RECORD_HEADER]);
        bincode::serde::encode_into_std_write(record, &mut data_out, config())
            .map_err(|error| StorageError::Encode(format!("a record: {error}")))?;
        let body = &data_out[start + RECORD_HEADER..];
        let length = u32::try_from(body.len())
            .map_err(|_| StorageError::Encode(format!("a record of {} bytes", body.len())))?;
        let checksum = crc32fast::hash(body);
        data_out[start..start + 4].copy_from_slice(&length.to_le_bytes());
        data_out[start + 4..start + RECORD_HEADER].copy_from_slice(&checksum.to_le_bytes());
        index_out.extend_from_slice(&index_entry(
            segment.data_len,
            record.timestamp_ms,
            segment.bytes,
        ));
        let size = record.size();
        segment.count += 1;
        segment.bytes += size;
        segment.data_len += (RECORD_HEADER as u64) + u64::from(length);
        segment.last_timestamp_ms = record.timestamp_ms;
        segment.largest = segment.largest.max(size);
        written += 1;
        if data_out.len() >= WRITE_CHUNK {
            out(&mut data_out, &mut index_out)?;
        }
    }
    *records = &records[written..];
    out(&mut data_out, &mut index_out)?;
    Ok(segment)
}

/// The segments of `catalog` that [`RecordStore::retire`] of `bases` keeps.
pub fn without_retired(
    catalog: Vec<SegmentImage>,
    bases: &HashMap<LogId, i64>,
) -> Vec<SegmentImage> {
    catalog
        .into_iter()
        .filter(|segment| {
            bases
                .get(&segment.log())
                .is_some_and(|&base| segment.end() > base)
        })
        .collect()
}

/// The index entry of a record whose entry starts at `position` of its `.rec` file, with time
/// `timestamp_ms`, after records of `bytes_before` bytes in its segment.
pub(crate) fn index_entry(
    position: u64,
    timestamp_ms: i64,
    bytes_before: u64,
) -> [u8; INDEX_ENTRY as usize] {
    let mut entry = [0; INDEX_ENTRY as usize];
    entry[..8].copy_from_slice(&position.to_le_bytes());
    entry[8..16].copy_from_slice(&timestamp_ms.to_le_bytes());
    entry[16..24].copy_from_slice(&bytes_before.to_le_bytes());
    entry
}

/// Takes the records `image` holds in memory out of it after `store` put each partition's
/// (its log, the offset of the first, the records) where a cold store reads them: the image
/// then counts them as in a cold store.
fn take_records(
    image: &mut StateImage,
    mut store: impl FnMut(LogId, i64, &[RecordImage]) -> Result<(), StorageError>,
) -> Result<WrittenOut, StorageError> {
    let mut written = WrittenOut::of(image);
    for (_, topic) in &mut image.topics {
        for (number, partition) in topic.partitions.iter_mut().enumerate() {
            let log = LogId {
                topic: topic.id,
                // At most 65,536 partitions: the image was checked when the state was built.
                partition: number as u32,
            };
            if partition.records.is_empty() {
                continue;
            }
            store(log, partition.cold_end, &partition.records)?;
            let moved = std::mem::take(&mut partition.records);
            partition.cold_bytes += moved.iter().map(RecordImage::size).sum::<u64>();
            partition.cold_end += moved.len() as i64;
            written.evicted.push((log, partition.cold_end));
        }
    }
    Ok(written)
}

/// What an image whose records were written already (see
/// [`broker_core::BrokerState::to_image_with_records_stored`]) moved to record segments, once
/// `catalog` ([`RecordStore::take_written`]) is checked to name every record of `in_memory`
/// (the records the state held in memory, by log).
///
/// # Errors
/// [`StorageError::Corrupt`] naming the first partition whose records `catalog` lacks (under
/// the data directory `dir`); the image must not be used then.
pub fn written_out(
    image: &StateImage,
    in_memory: &[(LogId, Range<i64>)],
    catalog: &[SegmentImage],
    dir: &Path,
) -> Result<WrittenOut, StorageError> {
    let mut segments: HashMap<LogId, Vec<&SegmentImage>> = HashMap::new();
    for segment in catalog {
        segments.entry(segment.log()).or_default().push(segment);
    }
    let mut written = WrittenOut::of(image);
    for (log, range) in in_memory {
        let mut covered = range.start;
        for segment in segments.get(log).into_iter().flatten() {
            if segment.base <= covered && segment.end() > covered {
                covered = segment.end();
            }
        }
        if covered < range.end {
            return Err(StorageError::corrupt(
                dir.join(RECORDS_DIR).join(log_dir_name(*log)),
                0,
                format!(
                    "records {covered} to {} of the partition were not written to its segments",
                    range.end - 1
                ),
            ));
        }
        written.evicted.push((*log, range.end));
    }
    Ok(written)
}

/// Opens `path` for writing at `len`, cutting anything after it (a partial tail of a failed
/// append).
fn open_for_append(path: &Path, len: u64) -> Result<File, StorageError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(StorageError::io("open", path))?;
    file.set_len(len)
        .map_err(StorageError::io("truncate", path))?;
    let mut file = file;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(len))
        .map_err(StorageError::io("seek", path))?;
    Ok(file)
}
