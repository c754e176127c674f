//! Writing the log: appending encoded entries to the active segment and rolling to new ones.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::{segment_header, segment_name, SEGMENT_HEADER};
use crate::StorageError;
use tracing::info;

/// Appends entries to the log's active segment. Not thread-safe by itself: one flusher owns it.
///
/// A failed write leaves the segment as it was before that write: the next call first cuts the
/// file back to its last good length, so a retry (for example once disk space returns) never
/// leaves a damaged entry in the middle of the log.
#[derive(Debug)]
pub struct LogWriter {
    dir: PathBuf,
    capacity: i32,
    segment_bytes: u64,
    /// Shared with a [`LogToSync`] that syncs it on another thread.
    file: Arc<File>,
    path: PathBuf,
    /// Bytes of the active segment known to be written completely.
    len: u64,
    /// Whether a write failed after `len`, so the file may hold a partial entry there.
    dirty: bool,
    /// The sequence number of the next entry appended.
    next_seq: u64,
}

impl LogWriter {
    /// Creates a segment starting at `next_seq` (replacing an empty one of that name) and
    /// fsyncs it and the directory.
    pub(crate) fn create(
        dir: &Path,
        capacity: i32,
        next_seq: u64,
        segment_bytes: u64,
    ) -> Result<LogWriter, StorageError> {
        let (file, path) = new_segment(dir, capacity, next_seq)?;
        Ok(LogWriter {
            dir: dir.to_owned(),
            capacity,
            segment_bytes: segment_bytes.max(1),
            file: Arc::new(file),
            path,
            len: SEGMENT_HEADER as u64,
            dirty: false,
            next_seq,
        })
    }

    /// The sequence number the next appended entry gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Writes `count` encoded entries (from [`crate::encode_entry`]) to the operating system,
    /// first rolling to a new segment if the active one is full. Not durable until
    /// [`LogWriter::sync`].
    ///
    /// # Errors
    /// [`StorageError::Io`]; nothing of `entries` counts as written, and the call may be
    /// repeated with the same entries.
    pub fn append(&mut self, entries: &[u8], count: u64) -> Result<(), StorageError> {
        if self.dirty {
            let len = self.len;
            self.file
                .set_len(len)
                .and_then(|()| (&*self.file).seek(SeekFrom::Start(len)))
                .map_err(StorageError::io("truncate", &self.path))?;
            self.dirty = false;
        }
        if self.rolls_next() {
            self.roll()?;
        }
        if let Err(source) = (&*self.file).write_all(entries) {
            self.dirty = true;
            return Err(StorageError::Io {
                action: "write",
                path: self.path.clone(),
                cause: source,
            });
        }
        self.len += entries.len() as u64;
        self.next_seq += count;
        Ok(())
    }

    /// Whether the next [`LogWriter::append`] rolls to a new segment, syncing the active one.
    pub fn rolls_next(&self) -> bool {
        self.len >= self.segment_bytes && self.len > SEGMENT_HEADER as u64
    }

    /// Makes everything appended so far durable (`fdatasync`).
    ///
    /// # Errors
    /// [`StorageError::Io`]. After a failed fsync the kernel may have dropped the written pages,
    /// so the caller must treat every entry since the last successful sync as lost and stop
    /// writing (fail-stop); retrying cannot make them durable.
    pub fn sync(&mut self) -> Result<(), StorageError> {
        sync_segment(&self.file, &self.path)
    }

    /// The active segment, for [`LogToSync::sync`] on another thread to make every entry
    /// appended before this call durable (those of earlier segments were synced when it
    /// rolled). Appending may go on meanwhile; rolling waits until it is done, or a crash
    /// could keep the next segment's entries without what they name.
    pub(crate) fn to_sync(&self) -> LogToSync {
        LogToSync {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
        }
    }

    /// Syncs the active segment and starts a new one at the next sequence number.
    fn roll(&mut self) -> Result<(), StorageError> {
        self.sync()?;
        let (file, path) = new_segment(&self.dir, self.capacity, self.next_seq)?;
        info!(
            closed = %self.path.display(),
            started = %path.display(),
            "log segment rolled"
        );
        self.file = Arc::new(file);
        self.path = path;
        self.len = SEGMENT_HEADER as u64;
        Ok(())
    }
}

/// A log segment to sync, from [`LogWriter::to_sync`].
#[derive(Debug)]
pub(crate) struct LogToSync {
    file: Arc<File>,
    path: PathBuf,
}

impl LogToSync {
    /// Syncs the segment (`fdatasync`).
    ///
    /// # Errors
    /// [`StorageError::Io`], after which the entries it held must count as lost (see
    /// [`LogWriter::sync`]).
    pub fn sync(&self) -> Result<(), StorageError> {
        sync_segment(&self.file, &self.path)
    }
}

fn sync_segment(file: &File, path: &Path) -> Result<(), StorageError> {
    file.sync_data().map_err(StorageError::io("fsync", path))
}

/// Creates (or truncates) the segment file starting at `first_seq`, writes its header and
/// fsyncs it and the directory, so the segment exists after a crash.
fn new_segment(dir: &Path, capacity: i32, first_seq: u64) -> Result<(File, PathBuf), StorageError> {
    let path = dir.join(segment_name(first_seq));
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(StorageError::io("create", &path))?;
    file.write_all(&segment_header(capacity, first_seq))
        .map_err(StorageError::io("write", &path))?;
    file.sync_all().map_err(StorageError::io("fsync", &path))?;
    sync_dir(dir)?;
    Ok((file, path))
}

/// Fsyncs a directory, making the creation, renaming or removal of its entries durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(StorageError::io("fsync directory", dir))
}
