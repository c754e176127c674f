//! Snapshots (checkpoints): the state in one checksummed file, written atomically, and the
//! removal of the log segments and older snapshots a new snapshot makes unnecessary.
//!
//! A snapshot of format 5 holds a [`Checkpoint`]: the state's image, whose records are in
//! record segments (see [`crate::records`]) except those logged after the checkpoint started,
//! and the catalog of those segments. Formats 4, 3 and 2 hold the same in the state images of
//! versions 4, 3 and 2 ([`v4::Checkpoint`], [`v3::Checkpoint`], [`v2::Checkpoint`]); format 1
//! a [`broker_core::image::v1::StateImage`] with every record in it.

use std::fs::{self, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use broker_core::image::{v1, StateImage};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::format::{
    check_version, config, parse_name, segment_name, snapshot_name, u32_at, u64_at, FORMAT_VERSION,
    SNAPSHOT_HEADER, SNAPSHOT_MAGIC,
};
use crate::records::SegmentImage;
use crate::repair::Repairs;
use crate::segment::sync_dir;
use crate::StorageError;

/// The temporary name a snapshot is written under before it is renamed into place.
pub(crate) const SNAPSHOT_TMP: &str = "snap.tmp";

/// The checkpoint of data directory format 2, frozen.
pub mod v2 {
    use broker_core::image::v2::StateImage;
    use serde::{Deserialize, Serialize};

    use crate::records::SegmentImage;

    /// What a snapshot of format 2 holds: as a [`super::Checkpoint`], with the state image of
    /// version 2.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Checkpoint {
        /// The state.
        pub image: StateImage,
        /// The record segments.
        pub segments: Vec<SegmentImage>,
    }

    impl From<Checkpoint> for super::Checkpoint {
        fn from(checkpoint: Checkpoint) -> super::Checkpoint {
            let image = broker_core::image::v3::StateImage::from(checkpoint.image);
            super::v4::Checkpoint::from(super::v3::Checkpoint {
                image,
                segments: checkpoint.segments,
            })
            .into()
        }
    }
}

/// The checkpoint of data directory format 3, frozen.
pub mod v3 {
    use broker_core::image::v3::StateImage;
    use serde::{Deserialize, Serialize};

    use crate::records::SegmentImage;

    /// What a snapshot of format 3 holds: as a [`super::Checkpoint`], with the state image of
    /// version 3.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Checkpoint {
        /// The state.
        pub image: StateImage,
        /// The record segments.
        pub segments: Vec<SegmentImage>,
    }

    impl From<Checkpoint> for super::v4::Checkpoint {
        fn from(checkpoint: Checkpoint) -> super::v4::Checkpoint {
            super::v4::Checkpoint {
                image: checkpoint.image.into(),
                segments: checkpoint.segments,
            }
        }
    }
}

/// The checkpoint of data directory format 4, frozen.
pub mod v4 {
    use broker_core::image::v4::StateImage;
    use serde::{Deserialize, Serialize};

    use crate::records::SegmentImage;

    /// What a snapshot of format 4 holds: as a [`super::Checkpoint`], with the state image of
    /// version 4.
    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    pub struct Checkpoint {
        /// The state.
        pub image: StateImage,
        /// The record segments.
        pub segments: Vec<SegmentImage>,
    }

    impl From<Checkpoint> for super::Checkpoint {
        fn from(checkpoint: Checkpoint) -> super::Checkpoint {
            super::Checkpoint {
                image: checkpoint.image.into(),
                segments: checkpoint.segments,
            }
        }
    }
}

/// What a snapshot of format 5 holds: the state and the record segments its evicted records
/// are in. Encoded as `image` then `segments` (a `u64` count, then each segment's fields in
/// order), in the data directory's bincode encoding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The state after every log entry below the snapshot's sequence number.
    pub image: StateImage,
    /// Every record segment the state reads evicted records from.
    pub segments: Vec<SegmentImage>,
}

/// Writes a snapshot of `checkpoint`, whose state must hold the effect of exactly the log
/// entries below `seq`, into `dir` atomically: to a temporary file, fsync, rename to
/// `snap-<seq>.snap`, fsync the directory. A crash at any point leaves either the previous
/// snapshot or this one.
///
/// # Errors
/// [`StorageError::Io`] or [`StorageError::Encode`]; the temporary file may remain (recovery
/// removes it).
pub fn write_snapshot(
    dir: &Path,
    seq: u64,
    checkpoint: &Checkpoint,
) -> Result<PathBuf, StorageError> {
    let image = &checkpoint.image;
    let tmp = dir.join(SNAPSHOT_TMP);
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&tmp)
        .map_err(StorageError::io("create", &tmp))?;
    let mut out = Checksummed {
        inner: BufWriter::new(file),
        crc: crc32fast::Hasher::new(),
        len: 0,
    };
    out.inner
        .write_all(&[0; SNAPSHOT_HEADER])
        .map_err(StorageError::io("write", &tmp))?;
    bincode::serde::encode_into_std_write(checkpoint, &mut out, config())
        .map_err(|error| StorageError::Encode(format!("snapshot {}: {error}", tmp.display())))?;
    let Checksummed { inner, crc, len } = out;
    let mut file = inner.into_inner().map_err(|error| StorageError::Io {
        action: "write",
        path: tmp.clone(),
        cause: error.into_error(),
    })?;
    let mut header = [0; SNAPSHOT_HEADER];
    header[..8].copy_from_slice(&SNAPSHOT_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    // The capacity is at most 2,147,483,647 in every image a state makes.
    header[12..16].copy_from_slice(&(image.capacity as u32).to_le_bytes());
    header[16..24].copy_from_slice(&seq.to_le_bytes());
    header[24..32].copy_from_slice(&len.to_le_bytes());
    header[32..36].copy_from_slice(&crc.finalize().to_le_bytes());
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.write_all(&header))
        .map_err(StorageError::io("write", &tmp))?;
    file.sync_all().map_err(StorageError::io("fsync", &tmp))?;
    drop(file);
    let path = dir.join(snapshot_name(seq));
    fs::rename(&tmp, &path).map_err(StorageError::io("rename into place", &path))?;
    sync_dir(dir)?;
    Ok(path)
}

/// Removes what the snapshot at `seq` makes unnecessary: older snapshots, and every log segment
/// whose entries are all below `seq` (a segment followed by one starting at or below `seq`).
/// The last segment is never removed. Returns how many files were removed.
///
/// # Errors
/// [`StorageError::Io`] if the directory cannot be listed or a file cannot be removed.
pub fn remove_covered(dir: &Path, seq: u64) -> Result<usize, StorageError> {
    let mut segments = Vec::new();
    let mut snapshots = Vec::new();
    for entry in fs::read_dir(dir).map_err(StorageError::io("list", dir))? {
        let entry = entry.map_err(StorageError::io("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(first) = parse_name(name, "wal-", ".log") {
            segments.push(first);
        } else if let Some(at) = parse_name(name, "snap-", ".snap") {
            snapshots.push(at);
        }
    }
    segments.sort_unstable();
    let mut doomed: Vec<PathBuf> = segments
        .windows(2)
        .filter(|pair| pair[1] <= seq)
        .map(|pair| dir.join(segment_name(pair[0])))
        .collect();
    doomed.extend(
        snapshots
            .into_iter()
            .filter(|&at| at < seq)
            .map(|at| dir.join(snapshot_name(at))),
    );
    for path in &doomed {
        fs::remove_file(path).map_err(StorageError::io("remove", path))?;
    }
    if !doomed.is_empty() {
        sync_dir(dir)?;
    }
    Ok(doomed.len())
}

/// What a snapshot holds, by format.
pub(crate) enum Snapshot {
    /// Format 1: the whole state, every record in it.
    V1(v1::StateImage),
    /// Format 2: as format 3, in the state image of version 2 (no idempotent producers).
    V2(v2::Checkpoint),
    /// Format 3: as format 4, in the state image of version 3 (no maximum of deliveries).
    V3(v3::Checkpoint),
    /// Format 4: as format 5, in the state image of version 4 (no stored offsets marked).
    V4(v4::Checkpoint),
    /// Format 5.
    Current(Checkpoint),
}

/// A snapshot read back: what it holds, the sequence number it covers and its file.
pub(crate) struct LoadedSnapshot {
    pub(crate) snapshot: Snapshot,
    pub(crate) seq: u64,
    pub(crate) path: PathBuf,
}

/// Reads the latest snapshot in `dir` (the highest sequence number), if there is one; adds the
/// removal of a leftover temporary snapshot to `repairs`.
pub(crate) fn load_latest(
    dir: &Path,
    repairs: &mut Repairs,
) -> Result<Option<LoadedSnapshot>, StorageError> {
    let tmp = dir.join(SNAPSHOT_TMP);
    match fs::symlink_metadata(&tmp) {
        Ok(_) => repairs.remove(tmp, "removing an unfinished snapshot"),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(cause) => return Err(StorageError::io("read the metadata of", &tmp)(cause)),
    }
    let mut latest = None;
    for entry in fs::read_dir(dir).map_err(StorageError::io("list", dir))? {
        let entry = entry.map_err(StorageError::io("list", dir))?;
        let name = entry.file_name();
        if let Some(seq) = name.to_str().and_then(|n| parse_name(n, "snap-", ".snap")) {
            latest = latest.max(Some(seq));
        }
    }
    let Some(seq) = latest else {
        return Ok(None);
    };
    let path = dir.join(snapshot_name(seq));
    let bytes = fs::read(&path).map_err(StorageError::io("read", &path))?;
    if bytes.len() < SNAPSHOT_HEADER || bytes[..8] != SNAPSHOT_MAGIC {
        return Err(StorageError::corrupt(
            &path,
            0,
            "not a snapshot (bad magic or too short)",
        ));
    }
    let version = u32_at(&bytes, 8);
    check_version(&path, version)?;
    if u64_at(&bytes, 16) != seq {
        return Err(StorageError::corrupt(
            &path,
            16,
            "sequence number does not match the name",
        ));
    }
    let body = &bytes[SNAPSHOT_HEADER..];
    if u64_at(&bytes, 24) != body.len() as u64 {
        return Err(StorageError::corrupt(
            &path,
            24,
            format!(
                "the header announces {} body bytes, the file has {}",
                u64_at(&bytes, 24),
                body.len()
            ),
        ));
    }
    if crc32fast::hash(body) != u32_at(&bytes, 32) {
        return Err(StorageError::corrupt(
            &path,
            SNAPSHOT_HEADER as u64,
            "snapshot checksum mismatch",
        ));
    }
    let snapshot = match version {
        1 => Snapshot::V1(decode_body(&path, body)?),
        2 => Snapshot::V2(decode_body(&path, body)?),
        3 => Snapshot::V3(decode_body(&path, body)?),
        4 => Snapshot::V4(decode_body(&path, body)?),
        _ => Snapshot::Current(decode_body(&path, body)?),
    };
    Ok(Some(LoadedSnapshot {
        snapshot,
        seq,
        path,
    }))
}

/// Decodes a snapshot's body, which must be consumed exactly.
fn decode_body<T: DeserializeOwned>(path: &Path, body: &[u8]) -> Result<T, StorageError> {
    match bincode::serde::decode_from_slice(body, config()) {
        Ok((value, used)) if used == body.len() => Ok(value),
        Ok(_) => Err(StorageError::corrupt(
            path,
            SNAPSHOT_HEADER as u64,
            "trailing bytes after the state",
        )),
        Err(error) => Err(StorageError::corrupt(
            path,
            SNAPSHOT_HEADER as u64,
            format!("the state does not decode: {error}"),
        )),
    }
}

/// A writer that counts and checksums what passes through it.
struct Checksummed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    len: u64,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.crc.update(&buf[..written]);
        self.len += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
