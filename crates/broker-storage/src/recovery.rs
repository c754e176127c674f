//! Recovery: the latest snapshot with its record segments, then the log tail replayed through
//! the core's `apply_at` (format 1 entries through `apply`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use broker_core::cold::{ColdStore, LogId};
use broker_core::{v1, BrokerState, Command, NameRules, Outcome, Revision};
use serde::de::DeserializeOwned;

use crate::format::{
    config, entry_crc, parse_name, read_segment_header, revision_of_format, segment_name, u32_at,
    Entry, PlacedRun, ENTRY_HEADER, FORMAT_VERSION, MAX_ENTRY_BYTES, SEGMENT_HEADER,
    SNAPSHOT_HEADER,
};
use crate::records::RecordStore;
use crate::repair::Repairs;
use crate::snapshot::{load_latest, v4, Checkpoint, LoadedSnapshot, Snapshot};
use crate::tails::{check_keeping_tails, Tails};

/// The first data directory format whose snapshots say which offsets each group stored.
const OFFSETS_STORED_FROM_FORMAT: u32 = 5;
use crate::StorageError;

/// The state rebuilt from a data directory.
#[derive(Debug)]
pub struct Recovery {
    /// The state after the snapshot and every log entry, reading evicted records from `records`.
    pub state: BrokerState,
    /// The record segments of the directory.
    pub records: Arc<RecordStore>,
    /// The sequence number the next log entry must get.
    pub next_seq: u64,
    /// The sequence number of the snapshot loaded, if any.
    pub snapshot_seq: Option<u64>,
    /// How many log entries were replayed after the snapshot.
    pub replayed: u64,
    /// How many bytes those entries take in the log.
    pub replayed_bytes: u64,
    /// The torn last entry that was cut off, if any.
    pub torn: Option<TornTail>,
    /// The oldest format version among the files read, when older than [`FORMAT_VERSION`]: the
    /// directory is migrated (rewritten in the current format) when the journal starts.
    pub migrated_from: Option<u32>,
}

/// A last entry cut off because the process died while writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The segment.
    pub path: PathBuf,
    /// Where the torn entry started; the segment is cut here before anything is logged.
    pub offset: u64,
    /// How many bytes were cut off.
    pub cut: u64,
}

/// See [`crate::DataDir::recover`], without its changes to the directory: those are added to
/// `repairs`, to be made once nothing refuses the start. `capacity` is the state's capacity
/// when the directory holds nothing that says otherwise.
pub(crate) fn recover(
    dir: &Path,
    capacity: i32,
    repairs: &mut Repairs,
) -> Result<Recovery, StorageError> {
    let segments = list_segments(dir)?;
    let snapshot = load_latest(dir, repairs)?;
    let mut migrated_from = None;
    let (records, tails, mut state, snapshot_seq) = match snapshot {
        Some(LoadedSnapshot {
            snapshot: Snapshot::V1(image),
            seq,
            path,
        }) => {
            migrated_from = Some(1);
            let (records, tails) = check_keeping_tails(dir, Vec::new(), &HashMap::new(), repairs)?;
            let records = Arc::new(records);
            let state = BrokerState::from_image_v1(image)
                .map_err(|why| inconsistent(&path, &why))?
                .with_cold_store(records.clone());
            (records, tails, state, Some(seq))
        }
        Some(LoadedSnapshot {
            snapshot: Snapshot::V2(checkpoint),
            seq,
            path,
        }) => {
            migrated_from = Some(2);
            let (records, tails, state) = open_checkpoint(dir, checkpoint.into(), &path, repairs)?;
            (records, tails, state, Some(seq))
        }
        Some(LoadedSnapshot {
            snapshot: Snapshot::V3(checkpoint),
            seq,
            path,
        }) => {
            migrated_from = Some(3);
            let checkpoint = v4::Checkpoint::from(checkpoint).into();
            let (records, tails, state) = open_checkpoint(dir, checkpoint, &path, repairs)?;
            (records, tails, state, Some(seq))
        }
        Some(LoadedSnapshot {
            snapshot: Snapshot::V4(checkpoint),
            seq,
            path,
        }) => {
            migrated_from = Some(4);
            let (records, tails, state) = open_checkpoint(dir, checkpoint.into(), &path, repairs)?;
            (records, tails, state, Some(seq))
        }
        Some(LoadedSnapshot {
            snapshot: Snapshot::Current(checkpoint),
            seq,
            path,
        }) => {
            let (records, tails, state) = open_checkpoint(dir, checkpoint, &path, repairs)?;
            (records, tails, state, Some(seq))
        }
        None => {
            // With no snapshot, the log starts from an empty broker of the capacity its first
            // segment was logged under.
            let logged = match segments.first() {
                Some(&first) => first_capacity(&dir.join(segment_name(first)))?,
                None => None,
            };
            let (records, tails) = check_keeping_tails(dir, Vec::new(), &HashMap::new(), repairs)?;
            let records = Arc::new(records);
            let state = BrokerState::new(logged.unwrap_or(capacity))
                .map_err(|error| StorageError::Replay {
                    path: dir.to_owned(),
                    seq: 0,
                    reason: error.to_string(),
                })?
                .with_cold_store(records.clone());
            (records, tails, state, None)
        }
    };
    // The log holds only commands that were applied, each under the name rules of its time:
    // replayed under the widest rules, every one applies as it did. The rules go back to the
    // default after the replay: the broker opening the directory sets its own.
    state.set_names(NameRules::Kafka);
    // Whether the state holds what a format before 5 wrote, which did not say which offsets a
    // group stored: a snapshot of such a format, or an entry replayed from such a segment.
    let mut unmarked_offsets = migrated_from.is_some();
    let mut next = snapshot_seq.unwrap_or(0);
    let mut replayed = 0;
    let mut replayed_bytes = 0;
    let mut torn = None;
    let count = segments.len();
    for (index, first) in segments.into_iter().enumerate() {
        let path = dir.join(segment_name(first));
        let last = index + 1 == count;
        if first > next {
            return Err(StorageError::MissingEntries {
                dir: dir.to_owned(),
                from: next,
                to: first,
                next: path,
            });
        }
        let bytes = fs::read(&path).map_err(StorageError::io("read", &path))?;
        if bytes.len() < SEGMENT_HEADER {
            if last {
                // The process died while creating the segment: nothing was logged in it.
                repairs.remove(
                    path,
                    format!(
                        "removing a log segment with a torn header ({} bytes; the server \
                         stopped while creating it)",
                        bytes.len()
                    ),
                );
                break;
            }
            return Err(StorageError::corrupt(
                &path,
                0,
                "segment shorter than its header",
            ));
        }
        let header = read_segment_header(&path, &bytes)?;
        if header.first_seq != first {
            return Err(StorageError::corrupt(
                &path,
                16,
                format!(
                    "header names first entry {}, the file name {first}",
                    header.first_seq
                ),
            ));
        }
        // Each entry applies under the rules it was first applied under.
        state.set_revision(revision_of_format(header.version));
        let mut offset = SEGMENT_HEADER;
        let mut seq = first;
        while offset < bytes.len() {
            let entry = match read_entry(&bytes, offset) {
                Ok(entry) => entry,
                Err(damage) if last && damage.may_be_torn => {
                    let cut = (bytes.len() - offset) as u64;
                    repairs.cut(
                        path.clone(),
                        offset as u64,
                        bytes.len() as u64,
                        format!(
                            "cutting off a torn last log entry ({}; the server stopped while \
                             writing it)",
                            damage.reason
                        ),
                    );
                    torn = Some(TornTail {
                        path: path.clone(),
                        offset: offset as u64,
                        cut,
                    });
                    break;
                }
                Err(damage) => {
                    return Err(StorageError::corrupt(&path, offset as u64, damage.reason));
                }
            };
            if seq >= next {
                if header.capacity != state.capacity_per_partition() {
                    return Err(StorageError::corrupt(
                        &path,
                        12,
                        format!(
                            "entries logged under capacity {} follow a state of capacity {}",
                            header.capacity,
                            state.capacity_per_partition()
                        ),
                    ));
                }
                let replay = |error: String| StorageError::Replay {
                    path: path.clone(),
                    seq,
                    reason: error,
                };
                let undecodable = |why: String| StorageError::corrupt(&path, offset as u64, why);
                if header.version == 1 {
                    let command: v1::Command = decode(entry.body).map_err(undecodable)?;
                    state
                        .apply(command.into())
                        .map_err(|error| replay(error.to_string()))?;
                } else {
                    match decode(entry.body).map_err(undecodable)? {
                        Entry::Apply { at_ms, command } => state
                            .apply_at(at_ms, command)
                            .map(drop)
                            .map_err(|error| replay(error.to_string()))?,
                        Entry::Tick { at_ms } => state
                            .advance_clock(at_ms)
                            .map(drop)
                            .map_err(|error| replay(error.to_string()))?,
                        Entry::Placed {
                            at_ms,
                            command,
                            placed,
                        } => {
                            let command = match put_back(&state, &tails, command, &placed) {
                                Ok(command) => command,
                                Err(PutBack::Missing(why)) if last => {
                                    // Written to the log before its records reached the disk,
                                    // by a power loss between syncs: never acknowledged as
                                    // durable, like a torn entry, and so is what follows.
                                    let cut = (bytes.len() - offset) as u64;
                                    repairs.cut(
                                        path.clone(),
                                        offset as u64,
                                        bytes.len() as u64,
                                        format!(
                                            "cutting off the last log entries from one whose \
                                             records did not reach the disk ({why})"
                                        ),
                                    );
                                    torn = Some(TornTail {
                                        path: path.clone(),
                                        offset: offset as u64,
                                        cut,
                                    });
                                    break;
                                }
                                Err(PutBack::Missing(why) | PutBack::Wrong(why)) => {
                                    return Err(undecodable(why));
                                }
                            };
                            let expected = command.clone();
                            let outcome = state
                                .apply_at(at_ms, command)
                                .map_err(|error| replay(error.to_string()))?;
                            check_placed(&expected, &outcome, &placed).map_err(replay)?;
                        }
                    }
                }
                unmarked_offsets |= header.version < OFFSETS_STORED_FROM_FORMAT;
                // An entry of an earlier format replayed: the start migrates the directory. (A
                // segment of one whose entries the snapshot covers, which the checkpoint that
                // migrated it left as the log's last, counts for nothing: the next checkpoint
                // removes it.)
                if header.version < FORMAT_VERSION {
                    migrated_from =
                        Some(migrated_from.unwrap_or(header.version).min(header.version));
                }
                next = seq + 1;
                replayed += 1;
                replayed_bytes += (entry.end - offset) as u64;
            }
            seq += 1;
            offset = entry.end;
        }
    }
    state.set_names(NameRules::default());
    state.set_revision(Revision::NEWEST);
    // The records written after the checkpoint that the state holds are kept where they are.
    tails.keep(&records, &state.to_image(), repairs)?;
    // Formats before 5 did not say which offsets a group stored: every one counts as stored,
    // those of the groups the log created as well as the snapshot's. (A segment of such a
    // format whose entries the snapshot covers, left by the checkpoint that migrated the
    // directory, counts for nothing.)
    if unmarked_offsets {
        state.count_every_offset_as_stored();
    }
    Ok(Recovery {
        state,
        records,
        next_seq: next,
        snapshot_seq,
        replayed,
        replayed_bytes,
        torn,
        migrated_from,
    })
}

/// The record segments a checkpoint (read from `path`) names, the records written after them,
/// and its state reading from them; what is to be cut and removed under them is added to
/// `repairs`.
fn open_checkpoint(
    dir: &Path,
    checkpoint: Checkpoint,
    path: &Path,
    repairs: &mut Repairs,
) -> Result<(Arc<RecordStore>, Tails, BrokerState), StorageError> {
    // Where each partition's records past the snapshot start: at its end in the image (or at 0
    // for a partition created since).
    let ends = checkpoint
        .image
        .topics
        .iter()
        .flat_map(|(_, topic)| {
            topic.partitions.iter().enumerate().map(|(number, log)| {
                let id = LogId {
                    topic: topic.id,
                    partition: number as u32,
                };
                (id, log.cold_end + log.records.len() as i64)
            })
        })
        .collect();
    let (records, tails) = check_keeping_tails(dir, checkpoint.segments, &ends, repairs)?;
    let records = Arc::new(records);
    let cold: Arc<dyn ColdStore> = records.clone();
    let state = BrokerState::from_image(checkpoint.image, Some(cold))
        .map_err(|why| inconsistent(path, &why))?;
    Ok((records, tails, state))
}

/// Why the records of a [`Entry::Placed`] could not be put back into its command.
enum PutBack {
    /// One is not in its partition's segments.
    Missing(String),
    /// The entry does not fit its command.
    Wrong(String),
}

/// `command` of a [`Entry::Placed`] with the records `placed` names put back from the records
/// written after the checkpoint.
fn put_back(
    state: &BrokerState,
    tails: &Tails,
    mut command: Command,
    placed: &[PlacedRun],
) -> Result<Command, PutBack> {
    let topic = command
        .topic()
        .and_then(|topic| state.topic_id(topic))
        .ok_or_else(|| PutBack::Wrong("the entry's topic does not exist".into()))?;
    let mut parts = command.published_records_mut();
    for run in placed {
        let partition = u32::try_from(run.partition)
            .map_err(|_| PutBack::Wrong(format!("partition {} in the entry", run.partition)))?;
        let log = LogId { topic, partition };
        for (number, offset) in run.records() {
            let record = tails.record(log, offset).ok_or_else(|| {
                PutBack::Missing(format!(
                    "record {offset} of partition {partition} of topic id {topic} is not in its                      segment files"
                ))
            })?;
            if !parts.get_mut(number).is_some_and(|parts| parts.put(record)) {
                return Err(PutBack::Wrong(format!(
                    "the entry places a record its command does not hold (number {number})"
                )));
            }
        }
    }
    drop(parts);
    Ok(command)
}

/// Checks that replaying `command` (whose `outcome` this is) stored its records where the log
/// entry says it did.
fn check_placed(command: &Command, outcome: &Outcome, placed: &[PlacedRun]) -> Result<(), String> {
    let placements = command.placements(outcome).unwrap_or_default();
    for run in placed {
        for (number, offset) in run.records() {
            let found = placements.get(number).copied();
            if found != Some((run.partition, offset)) {
                return Err(format!(
                    "the log entry says its record {number} was stored at offset {offset} of \
                     partition {}; replayed, it went to {found:?}",
                    run.partition
                ));
            }
        }
    }
    Ok(())
}

/// The first sequence number of every log segment in `dir`, ascending.
fn list_segments(dir: &Path) -> Result<Vec<u64>, StorageError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(StorageError::io("list", dir))? {
        let entry = entry.map_err(StorageError::io("list", dir))?;
        let name = entry.file_name();
        if let Some(first) = name.to_str().and_then(|n| parse_name(n, "wal-", ".log")) {
            segments.push(first);
        }
    }
    segments.sort_unstable();
    Ok(segments)
}

/// The capacity a segment was logged under, if its header is complete.
fn first_capacity(path: &Path) -> Result<Option<i32>, StorageError> {
    let bytes = fs::read(path).map_err(StorageError::io("read", path))?;
    if bytes.len() < SEGMENT_HEADER {
        return Ok(None);
    }
    Ok(Some(read_segment_header(path, &bytes)?.capacity))
}

/// A snapshot whose checksum is valid but whose state breaks the core's invariants (a
/// hand-edited file, or a buggy build): refused here rather than panicking on first use.
fn inconsistent(path: &Path, why: &str) -> StorageError {
    StorageError::corrupt(
        path,
        SNAPSHOT_HEADER as u64,
        format!("the state is inconsistent: {why}"),
    )
}

/// Decodes an entry body, which must be consumed exactly.
fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    match bincode::serde::decode_from_slice(body, config()) {
        Ok((value, used)) if used == body.len() => Ok(value),
        Ok(_) => Err("trailing bytes after the entry".to_owned()),
        Err(error) => Err(format!("the entry does not decode: {error}")),
    }
}

/// One entry read from a segment.
struct LogEntry<'a> {
    body: &'a [u8],
    /// Where the next entry starts.
    end: usize,
}

/// Why an entry could not be read, and whether a write cut short could explain it.
struct Damage {
    reason: String,
    /// The entry reaches the end of the file: a torn write if this is the last segment.
    may_be_torn: bool,
}

fn read_entry(bytes: &[u8], offset: usize) -> Result<LogEntry<'_>, Damage> {
    if bytes[offset..].iter().all(|&byte| byte == 0) {
        // What some filesystems leave after a power loss: the file grew, its data did not
        // arrive. Nothing after it can be valid, so it is a torn tail like any other.
        return Err(Damage {
            reason: format!("{} zero bytes after the last entry", bytes.len() - offset),
            may_be_torn: true,
        });
    }
    let remaining = bytes.len() - offset;
    if remaining < ENTRY_HEADER {
        return Err(Damage {
            reason: format!("{remaining} bytes left, less than an entry header"),
            may_be_torn: true,
        });
    }
    let length = u32_at(bytes, offset) as usize;
    let end = offset + ENTRY_HEADER + length;
    if end > bytes.len() {
        return Err(Damage {
            reason: format!(
                "the entry announces {length} bytes, only {} follow",
                remaining - ENTRY_HEADER
            ),
            may_be_torn: true,
        });
    }
    if length > MAX_ENTRY_BYTES {
        return Err(Damage {
            reason: format!("the entry announces {length} bytes, more than the limit"),
            may_be_torn: end == bytes.len(),
        });
    }
    let mut length_bytes = [0; 4];
    length_bytes.copy_from_slice(&bytes[offset..offset + 4]);
    let body = &bytes[offset + ENTRY_HEADER..end];
    if entry_crc(length_bytes, body) != u32_at(bytes, offset + 4) {
        return Err(Damage {
            reason: "entry checksum mismatch".into(),
            may_be_torn: end == bytes.len(),
        });
    }
    Ok(LogEntry { body, end })
}
