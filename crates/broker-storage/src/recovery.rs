//! Recovery: the latest snapshot, then the log tail replayed through the core's `apply`.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use broker_core::{BrokerState, Command};
use tracing::warn;

use crate::format::{
    config, entry_crc, parse_name, read_segment_header, segment_name, u32_at, ENTRY_HEADER,
    MAX_ENTRY_BYTES, SEGMENT_HEADER,
};
use crate::snapshot::load_latest;
use crate::StorageError;

/// The state rebuilt from a data directory.
#[derive(Debug)]
pub struct Recovery {
    /// The state after the snapshot and every log entry.
    pub state: BrokerState,
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
}

/// A last entry cut off because the process died while writing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    /// The segment.
    pub path: PathBuf,
    /// Where the torn entry started; the segment now ends here.
    pub offset: u64,
    /// How many bytes were cut off.
    pub cut: u64,
}

/// See [`crate::DataDir::recover`].
pub(crate) fn recover(dir: &Path, capacity: i32) -> Result<Recovery, StorageError> {
    let snapshot = load_latest(dir, capacity)?;
    let (mut state, snapshot_seq) = match snapshot {
        Some(snapshot) => (snapshot.state, Some(snapshot.seq)),
        None => (
            BrokerState::new(capacity).map_err(|error| StorageError::Replay {
                path: dir.to_owned(),
                seq: 0,
                reason: error.to_string(),
            })?,
            None,
        ),
    };
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(StorageError::io("list", dir))? {
        let entry = entry.map_err(StorageError::io("list", dir))?;
        let name = entry.file_name();
        if let Some(first) = name.to_str().and_then(|n| parse_name(n, "wal-", ".log")) {
            segments.push(first);
        }
    }
    segments.sort_unstable();
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
                warn!(file = %path.display(), bytes = bytes.len(), "removing a segment with a torn header");
                fs::remove_file(&path).map_err(StorageError::io("remove", &path))?;
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
        if header.capacity != capacity {
            return Err(StorageError::CapacityMismatch {
                path,
                stored: header.capacity,
                configured: capacity,
            });
        }
        let mut offset = SEGMENT_HEADER;
        let mut seq = first;
        while offset < bytes.len() {
            let entry = match read_entry(&bytes, offset) {
                Ok(entry) => entry,
                Err(damage) if last && damage.may_be_torn => {
                    let cut = (bytes.len() - offset) as u64;
                    warn!(
                        file = %path.display(),
                        offset,
                        cut_bytes = cut,
                        reason = damage.reason,
                        "cutting off a torn last log entry (the server stopped while writing it)"
                    );
                    truncate(&path, offset as u64)?;
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
                let command: Command = match bincode::serde::decode_from_slice(entry.body, config())
                {
                    Ok((command, used)) if used == entry.body.len() => command,
                    Ok(_) => {
                        return Err(StorageError::corrupt(
                            &path,
                            offset as u64,
                            "trailing bytes after the command",
                        ))
                    }
                    Err(error) => {
                        return Err(StorageError::corrupt(
                            &path,
                            offset as u64,
                            format!("the command does not decode: {error}"),
                        ))
                    }
                };
                state.apply(command).map_err(|error| StorageError::Replay {
                    path: path.clone(),
                    seq,
                    reason: error.to_string(),
                })?;
                next = seq + 1;
                replayed += 1;
                replayed_bytes += (entry.end - offset) as u64;
            }
            seq += 1;
            offset = entry.end;
        }
    }
    Ok(Recovery {
        state,
        next_seq: next,
        snapshot_seq,
        replayed,
        replayed_bytes,
        torn,
    })
}

/// One entry read from a segment.
struct Entry<'a> {
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

fn read_entry(bytes: &[u8], offset: usize) -> Result<Entry<'_>, Damage> {
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
    Ok(Entry { body, end })
}

/// Cuts `path` to `len` bytes and makes that durable.
fn truncate(path: &Path, len: u64) -> Result<(), StorageError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(StorageError::io("open", path))?;
    file.set_len(len)
        .and_then(|()| file.sync_all())
        .map_err(StorageError::io("truncate", path))
}
