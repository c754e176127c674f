//! Records written to their partitions' segments after the last checkpoint's catalog. The
//! journal's flusher writes every record as it comes, and a log entry of format 6 holds only
//! where its published records went ([`crate::format::EntryRef::Placed`]): recovery finds
//! these records ([`check_keeping_tails`]), reads them back to put them into the
//! commands it replays ([`Tails::record`]), and keeps them as far as the recovered state
//! reaches ([`Tails::keep`]). The rest (records whose entries never reached the log) is cut.
//!
//! A partition's tail is a run of records at consecutive offsets from its end in the snapshot
//! (0 for a partition created since): the end of its last cataloged segment past the catalog's
//! length, or a segment file the catalog does not name starting there (or, for a partition the
//! catalog names no segment of, holding that offset: the flusher went on writing to a segment
//! the checkpoint retired), then the files that continue it, each starting where the one before
//! ends. It ends at the first record that is cut short or fails its checksum. Files that
//! continue no tail (segments a checkpoint retired but did not remove before the process
//! stopped) are removed. Its `.idx` entries are not trusted (an index is derived data, synced
//! at checkpoints): those of the records kept are written again from the `.rec` file.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use broker_core::cold::LogId;
use broker_core::image::{RecordImage, StateImage};

use crate::format::config;
use crate::records::{
    header, index_entry, RecordStore, SegmentImage, TailFiles, Unnamed, DATA_MAGIC, HEADER,
    INDEX_ENTRY, INDEX_MAGIC, RECORD_HEADER,
};
use crate::repair::Repairs;
use crate::StorageError;

/// The records past the catalog of every partition that has some.
#[derive(Debug, Default)]
pub(crate) struct Tails {
    logs: HashMap<LogId, Vec<TailSegment>>,
    /// The partitions the catalog names segments of: their directories stay.
    cataloged: HashSet<LogId>,
}

/// The part of one segment past the catalog.
#[derive(Debug)]
struct TailSegment {
    log: LogId,
    /// The segment's base offset.
    base: i64,
    /// What the catalog says of the segment, when it names it (the partition's last one).
    cataloged: Option<SegmentImage>,
    data_path: PathBuf,
    index_path: PathBuf,
    /// The length of the `.rec` file.
    data_len: u64,
    /// The records of the tail, from its first.
    records: Vec<TailRecord>,
}

/// One record of a tail.
#[derive(Debug)]
struct TailRecord {
    /// Where its entry starts in the `.rec` file.
    position: u64,
    /// Where its entry ends.
    end: u64,
    record: RecordImage,
}

impl TailSegment {
    /// The offset of the first record of the tail.
    fn first(&self) -> i64 {
        self.cataloged
            .as_ref()
            .map_or(self.base, |segment| segment.base + segment.count as i64)
    }

    /// One past the offset of the last record of the tail.
    fn end(&self) -> i64 {
        self.first() + self.records.len() as i64
    }

    /// Where the next segment file continues this one: its end, if every byte of its `.rec`
    /// file is a valid record (one cut short ends the partition's tail).
    fn continued(&self) -> Option<i64> {
        let whole = self
            .records
            .last()
            .map_or(self.first_position(), |record| record.end);
        (whole == self.data_len).then(|| self.end())
    }

    /// Where the tail starts in the `.rec` file.
    fn first_position(&self) -> u64 {
        self.cataloged
            .as_ref()
            .map_or(HEADER, |segment| segment.data_len)
    }
}

/// [`RecordStore::check`] of the segments of a single broker's data directory, whose flusher
/// wrote records past the catalog: those records are not cut but returned as the tails
/// recovery reads back and keeps (see [`Tails`]). A partition's tail starts at its end in the
/// snapshot, `ends` (0 for one it does not name). The tails recovery keeps are named by the
/// catalog before their index is written again (by the repairs): nothing may read them from
/// the store before the repairs are made (the recovered state holds them in memory).
///
/// # Errors
/// As [`RecordStore::check`], and [`StorageError::Io`] if a tail cannot be read.
pub(crate) fn check_keeping_tails(
    dir: &Path,
    catalog: Vec<SegmentImage>,
    ends: &HashMap<LogId, i64>,
    repairs: &mut Repairs,
) -> Result<(RecordStore, Tails), StorageError> {
    let cataloged: HashSet<LogId> = catalog.iter().map(SegmentImage::log).collect();
    let mut found = TailFiles::default();
    let store = RecordStore::check_files(dir, catalog, repairs, Some(&mut found))?;
    let tails = Tails::find(found.last, found.unnamed, &cataloged, ends, repairs)?;
    Ok((store, tails))
}

impl Tails {
    /// Reads the tails of every partition, which start at its end in the snapshot (`ends`; 0
    /// for a partition created since): that of its last cataloged segment (`last`, with its
    /// paths and the length of its `.rec` file, when longer than the catalog says), then the
    /// files of `unnamed` that continue it. Files that do not continue a tail (those of
    /// segments a checkpoint retired but did not remove before the process stopped, say) are
    /// added to `repairs` for removal, and a cataloged segment's records past the catalog that
    /// do not start where the partition ends for cutting.
    pub(crate) fn find(
        last: Vec<(SegmentImage, PathBuf, PathBuf, u64)>,
        mut unnamed: HashMap<LogId, Unnamed>,
        cataloged: &HashSet<LogId>,
        ends: &HashMap<LogId, i64>,
        repairs: &mut Repairs,
    ) -> Result<Tails, StorageError> {
        let start = |log: &LogId| ends.get(log).copied().unwrap_or(0);
        let mut tails = Tails {
            cataloged: cataloged.clone(),
            ..Tails::default()
        };
        let first_directory: HashMap<LogId, PathBuf> = unnamed
            .iter()
            .filter_map(|(log, files)| {
                let (_, data_path, _) = files.first()?;
                Some((*log, data_path.parent()?.to_path_buf()))
            })
            .collect();
        let mut continued: HashMap<LogId, i64> = HashMap::new();
        for (segment, data_path, index_path, data_len) in last {
            let log = LogId {
                topic: segment.topic,
                partition: segment.partition,
            };
            let first = segment.base + segment.count as i64;
            if first != start(&log) {
                let index_len = HEADER + segment.count * INDEX_ENTRY;
                let why = "cutting records written after the last checkpoint that continue no \
                           partition's records";
                repairs.cut(data_path, segment.data_len, data_len, why);
                repairs.write(index_path, index_len, Vec::new(), why);
                continue;
            }
            let records = scan(&data_path, segment.data_len, data_len)?;
            let tail = TailSegment {
                log,
                base: segment.base,
                cataloged: Some(segment),
                data_path,
                index_path,
                data_len,
                records,
            };
            let next = tail.continued();
            if let Some(next) = next {
                continued.insert(log, next);
            }
            tails.logs.entry(log).or_default().push(tail);
        }
        for (log, files) in &mut unnamed {
            files.sort_unstable_by_key(|(base, _, _)| *base);
            let start = start(log);
            let named = cataloged.contains(log);
            let mut next = match tails.logs.get(log) {
                // Its last cataloged segment has a tail: the files continue it if it is whole.
                Some(_) => continued.get(log).copied().map(Follow::At),
                None => Some(Follow::Start),
            };
            let mut kept_any = tails.logs.contains_key(log);
            for (base, data_path, index_path) in files.drain(..) {
                let tail = match next {
                    Some(Follow::At(at)) if base == at => {
                        segment_tail(*log, base, data_path.clone(), index_path.clone())?
                    }
                    // The first file: at the partition's end in the snapshot, or, for a
                    // partition the catalog does not name, holding it (the flusher went on
                    // writing to a segment the checkpoint retired).
                    Some(Follow::Start) if base == start || (!named && base < start) => {
                        segment_tail(*log, base, data_path.clone(), index_path.clone())?
                            .filter(|tail| tail.base == start || tail.end() >= start)
                    }
                    _ => None,
                };
                let Some(tail) = tail else {
                    let why = "removing a record file that continues no partition's records";
                    repairs.remove(data_path, why);
                    repairs.remove(index_path, why);
                    continue;
                };
                next = tail.continued().map(Follow::At);
                kept_any = true;
                tails.logs.entry(*log).or_default().push(tail);
            }
            if !kept_any && !named {
                // Nothing in it: a partition deleted, or every file a leftover.
                if let Some(directory) = first_directory.get(log) {
                    repairs.remove(
                        directory.clone(),
                        "removing record files no checkpoint names",
                    );
                }
            }
        }
        Ok(tails)
    }

    /// The tail's record at `offset` of `log`, if the tail holds it.
    pub(crate) fn record(&self, log: LogId, offset: i64) -> Option<RecordImage> {
        let segments = self.logs.get(&log)?;
        let segment = segments
            .iter()
            .find(|segment| segment.first() <= offset && offset < segment.end())?;
        let index = usize::try_from(offset - segment.first()).ok()?;
        segment
            .records
            .get(index)
            .map(|record| record.record.clone())
    }

    /// Keeps the records of each tail that `image` (the recovered state) holds, as the
    /// partition's records from the tail's first: `store`'s catalog names them from now on.
    /// What follows them is added to `repairs` to be cut or removed, and the `.idx` entries of
    /// the records kept to be written again.
    ///
    /// # Errors
    /// [`StorageError::Corrupt`] naming the segment when a record kept differs from the one the
    /// state holds at its offset, or when the state holds records before the tail's first
    /// that no segment holds.
    pub(crate) fn keep(
        self,
        store: &Arc<RecordStore>,
        image: &StateImage,
        repairs: &mut Repairs,
    ) -> Result<(), StorageError> {
        let mut held: HashMap<LogId, (i64, &[RecordImage])> = HashMap::new();
        for (_, topic) in &image.topics {
            for (number, partition) in topic.partitions.iter().enumerate() {
                let log = LogId {
                    topic: topic.id,
                    partition: number as u32,
                };
                held.insert(log, (partition.cold_end, &partition.records));
            }
        }
        for (log, segments) in self.logs {
            let Some(&(memory_start, records)) = held.get(&log) else {
                // A partition of a topic deleted since: none of its records is kept, and a
                // directory the catalog names no segment in goes whole (one it does keeps its
                // segments until the start's checkpoint retires them).
                let directory = (!self.cataloged.contains(&log))
                    .then(|| segments.first().and_then(|s| s.data_path.parent()))
                    .flatten()
                    .map(Path::to_path_buf);
                match directory {
                    Some(directory) => repairs.remove(
                        directory,
                        "removing the record files of a topic the log deleted",
                    ),
                    None => {
                        for segment in segments {
                            segment.keep(store, 0, repairs);
                        }
                    }
                }
                continue;
            };
            let end = memory_start + records.len() as i64;
            if let Some(first) = segments.first() {
                if first.first() > memory_start && end > memory_start {
                    return Err(StorageError::corrupt(
                        &first.data_path,
                        0,
                        format!(
                            "the log holds records of the partition from offset {memory_start}, \
                             and its segments only from {}",
                            first.first()
                        ),
                    ));
                }
            }
            let kept_of =
                |segment: &TailSegment| (end.min(segment.end()) - segment.first()).max(0) as usize;
            if !self.cataloged.contains(&log) && segments.iter().all(|s| kept_of(s) == 0) {
                // None of its records was logged: its directory goes whole, as the catalog
                // names no segment in it.
                if let Some(directory) = segments.first().and_then(|s| s.data_path.parent()) {
                    repairs.remove(
                        directory.to_path_buf(),
                        "removing record files whose records the log does not hold",
                    );
                }
                continue;
            }
            for segment in segments {
                let kept = kept_of(&segment);
                for (index, tail) in segment.records.iter().take(kept).enumerate() {
                    let offset = segment.first() + index as i64;
                    let Some(held) = usize::try_from(offset - memory_start)
                        .ok()
                        .and_then(|at| records.get(at))
                    else {
                        continue;
                    };
                    if *held != tail.record {
                        return Err(StorageError::corrupt(
                            &segment.data_path,
                            tail.position,
                            format!(
                                "the record at offset {offset} differs from the one the log \
                                 gives"
                            ),
                        ));
                    }
                }
                segment.keep(store, kept, repairs);
            }
        }
        Ok(())
    }
}

impl TailSegment {
    /// Keeps the first `kept` records of the tail: the catalog names them, the `.rec` file is
    /// cut after them and their index entries are written again (or, keeping none of a file
    /// the catalog does not name, both files are removed).
    fn keep(self, store: &Arc<RecordStore>, kept: usize, repairs: &mut Repairs) {
        let (mut segment, index_at) = match self.cataloged.clone() {
            Some(segment) => {
                let index_at = HEADER + segment.count * INDEX_ENTRY;
                (segment, index_at)
            }
            None if kept == 0 => {
                let why = "removing a record file whose records the log does not hold";
                repairs.remove(self.data_path, why);
                repairs.remove(self.index_path, why);
                return;
            }
            None => {
                let first = &self.records[0].record;
                let segment = SegmentImage {
                    topic: self.log.topic,
                    partition: self.log.partition,
                    base: self.base,
                    count: 0,
                    bytes: 0,
                    data_len: HEADER,
                    first_timestamp_ms: first.timestamp_ms,
                    last_timestamp_ms: first.timestamp_ms,
                    largest: 0,
                };
                (segment, 0)
            }
        };
        let mut index = Vec::with_capacity(kept * INDEX_ENTRY as usize + HEADER as usize);
        if self.cataloged.is_none() {
            index.extend_from_slice(&header(INDEX_MAGIC, self.log, self.base));
        }
        for tail in &self.records[..kept] {
            index.extend_from_slice(&index_entry(
                tail.position,
                tail.record.timestamp_ms,
                segment.bytes,
            ));
            let size = tail.record.size();
            segment.count += 1;
            segment.bytes += size;
            segment.data_len = tail.end;
            segment.last_timestamp_ms = tail.record.timestamp_ms;
            segment.largest = segment.largest.max(size);
        }
        if self.data_len > segment.data_len {
            repairs.cut(
                self.data_path.clone(),
                segment.data_len,
                self.data_len,
                "cutting records written after the last checkpoint whose entries never reached \
                 the log",
            );
        }
        repairs.write(
            self.index_path.clone(),
            index_at,
            index,
            "writing again the index of records written after the last checkpoint",
        );
        if kept > 0 {
            // What the next checkpoint names (and the log it removes no longer holds) must be
            // on disk, not only in the page cache a `kill -9` left it in.
            repairs.sync(self.data_path.clone());
            // Named once its index is written again: before, a read of the records the catalog
            // named already (checks made before the start) would read the index entries a
            // power loss may have taken.
            let store = Arc::clone(store);
            repairs.then("naming a tail kept in the catalog", move || {
                store.name(segment)
            });
        }
    }
}

/// Where the next segment file of a partition's tail must start.
#[derive(Debug, Clone, Copy)]
enum Follow {
    /// At the partition's end in the snapshot (no file of its tail found yet).
    Start,
    /// At this offset, where the last file of its tail ends.
    At(i64),
}

/// The records of the segment file `base` of `log` that the catalog does not name, if it has
/// the header of that segment.
fn segment_tail(
    log: LogId,
    base: i64,
    data_path: PathBuf,
    index_path: PathBuf,
) -> Result<Option<TailSegment>, StorageError> {
    if !has_header(&data_path, log, base)? {
        return Ok(None);
    }
    let data_len = file_len(&data_path)?;
    let records = scan(&data_path, HEADER, data_len)?;
    Ok(Some(TailSegment {
        log,
        base,
        cataloged: None,
        data_path,
        index_path,
        data_len,
        records,
    }))
}

/// Whether the `.rec` file at `path` starts with the header of segment `base` of `log`.
fn has_header(path: &Path, log: LogId, base: i64) -> Result<bool, StorageError> {
    let file = File::open(path).map_err(StorageError::io("open", path))?;
    let mut found = [0; HEADER as usize];
    match file.read_exact_at(&mut found, 0) {
        Ok(()) => Ok(found == header(DATA_MAGIC, log, base)),
        // Shorter than a header: a segment whose creation a crash cut short.
        Err(cause) if cause.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        // Anything else is no reason to take the file for a leftover.
        Err(cause) => Err(StorageError::io("read", path)(cause)),
    }
}

fn file_len(path: &Path) -> Result<u64, StorageError> {
    Ok(std::fs::metadata(path)
        .map_err(StorageError::io("read the length of", path))?
        .len())
}

/// The valid records of the `.rec` file at `path` from byte `start` to `len`, up to the first
/// one cut short, failing its checksum or not decoding. Read one record at a time, so that a
/// damaged file (a length field gone wrong, a file far longer than its records) costs no more
/// memory than the records it holds.
fn scan(path: &Path, start: u64, len: u64) -> Result<Vec<TailRecord>, StorageError> {
    let mut file = File::open(path).map_err(StorageError::io("open", path))?;
    file.seek(SeekFrom::Start(start))
        .map_err(StorageError::io("read", path))?;
    let mut input = BufReader::new(file);
    let mut records = Vec::new();
    let mut position = start;
    let mut body = Vec::new();
    loop {
        let mut header = [0; RECORD_HEADER];
        if position + RECORD_HEADER as u64 > len {
            break;
        }
        // Within the file's length, a read that fails is an I/O error, not a torn record:
        // taking it for one would cut records the log may name.
        input
            .read_exact(&mut header)
            .map_err(StorageError::io("read", path))?;
        let [l0, l1, l2, l3, c0, c1, c2, c3] = header;
        let length = u32::from_le_bytes([l0, l1, l2, l3]);
        let crc = u32::from_le_bytes([c0, c1, c2, c3]);
        let end = position + RECORD_HEADER as u64 + u64::from(length);
        if end > len {
            break;
        }
        body.resize(length as usize, 0);
        input
            .read_exact(&mut body)
            .map_err(StorageError::io("read", path))?;
        if crc32fast::hash(&body) != crc {
            break;
        }
        let record = match bincode::serde::decode_from_slice::<RecordImage, _>(&body, config()) {
            Ok((record, used)) if used == body.len() => record,
            _ => break,
        };
        records.push(TailRecord {
            position,
            end,
            record,
        });
        position = end;
    }
    Ok(records)
}
