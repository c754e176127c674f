//! The data directory and its lock: one server per directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::recovery::{recover, Recovery};
use crate::repair::Repairs;
use crate::segment::LogWriter;
use crate::snapshot::Checkpoint;
use crate::StorageError;

/// A data directory this process holds the lock of. The lock (an advisory `flock` on `LOCK`)
/// is released when the value is dropped or the process dies, even by `kill -9`.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates `path` if needed and takes its lock, writing this process's pid into `LOCK`.
    ///
    /// # Errors
    /// [`StorageError::Locked`] if another process holds the lock; [`StorageError::Io`] if the
    /// directory or the lock file cannot be created.
    pub fn open(path: &Path) -> Result<DataDir, StorageError> {
        if path.exists() && !path.is_dir() {
            let cause = io::Error::new(io::ErrorKind::NotADirectory, "it is not a directory");
            return Err(StorageError::io("open the data directory", path)(cause));
        }
        fs::create_dir_all(path).map_err(StorageError::io("create directory", path))?;
        let lock_path = path.join("LOCK");
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(StorageError::io("open", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let holder = lock
                    .read_to_string(&mut holder)
                    .ok()
                    .map(|_| holder.trim().to_owned())
                    .filter(|pid| !pid.is_empty());
                return Err(StorageError::Locked {
                    dir: path.to_owned(),
                    holder,
                });
            }
            Err(fs::TryLockError::Error(source)) => {
                return Err(StorageError::Io {
                    action: "lock",
                    path: lock_path,
                    cause: source,
                })
            }
        }
        let pid = std::process::id().to_string();
        lock.set_len(0)
            .and_then(|()| lock.seek(SeekFrom::Start(0)))
            .and_then(|_| lock.write_all(pid.as_bytes()))
            .map_err(StorageError::io("write", &lock_path))?;
        Ok(DataDir {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Rebuilds the state: the latest snapshot with its record segments, then every later log
    /// entry through [`broker_core::BrokerState::apply_at`]. Once all of it has been read and
    /// found sound, cuts off a torn last entry (with a warning), record segment tails an
    /// unfinished checkpoint wrote, files no checkpoint names and a leftover temporary
    /// snapshot; changes nothing else, and nothing at all when it refuses. `capacity` is the
    /// broker's capacity when the directory is new.
    ///
    /// # Errors
    /// As the crate documentation's "What recovery accepts" says.
    pub fn recover(&self, capacity: i32) -> Result<Recovery, StorageError> {
        let (recovery, repairs) = self.check(capacity)?;
        repairs.apply()?;
        Ok(recovery)
    }

    /// [`DataDir::recover`] without its repairs, which are returned to be made later.
    pub(crate) fn check(&self, capacity: i32) -> Result<(Recovery, Repairs), StorageError> {
        let mut repairs = Repairs::default();
        let recovery = recover(&self.path, capacity, &mut repairs)?;
        Ok((recovery, repairs))
    }

    /// A log writer that starts a new segment at `next_seq` (from [`Recovery::next_seq`]) and
    /// rolls to a new segment once one holds `segment_bytes`.
    ///
    /// # Errors
    /// [`StorageError::Io`] if the segment cannot be created.
    pub fn log_writer(
        &self,
        capacity: i32,
        next_seq: u64,
        segment_bytes: u64,
    ) -> Result<LogWriter, StorageError> {
        LogWriter::create(&self.path, capacity, next_seq, segment_bytes)
    }

    /// Writes a snapshot of `checkpoint`, covering every entry below `seq`; see
    /// [`crate::write_snapshot`].
    ///
    /// # Errors
    /// As [`crate::write_snapshot`].
    pub fn write_snapshot(
        &self,
        seq: u64,
        checkpoint: &Checkpoint,
    ) -> Result<PathBuf, StorageError> {
        crate::write_snapshot(&self.path, seq, checkpoint)
    }
}
