//! The changes recovery makes to a data directory: cutting what a crash left unfinished,
//! removing what no checkpoint names and writing again the index of records it keeps. Recovery
//! only reads while it checks the directory and lists these as it goes; they are made once
//! everything has been checked, so a start that is refused leaves the directory exactly as the
//! crash left it, for the operator to inspect.
//! (A cluster node lists the repairs of its Raft files in the same list as those of its record
//! segments.)

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

use crate::segment::sync_dir;
use crate::StorageError;

/// The changes a recovery found necessary, in the order they were found: listed while the
/// files are checked (see [`RecordStore::check`](crate::RecordStore::check)), made by
/// [`Repairs::apply`] once nothing can refuse the start any more.
#[derive(Debug, Default)]
#[must_use = "the directory is only repaired by `Repairs::apply`"]
pub struct Repairs(Vec<Repair>);

enum Repair {
    /// A directory later writes need: created if missing, its entry made durable.
    Create(PathBuf),
    /// A file or directory tree a crash left that nothing names.
    Remove { path: PathBuf, why: String },
    /// Bytes to write at `at` of a file (created if missing), which then ends after them:
    /// derived data written again from what it derives from.
    Write {
        path: PathBuf,
        at: u64,
        bytes: Vec<u8>,
        why: String,
    },
    /// A file whose contents must be durable before a checkpoint names them.
    Sync(PathBuf),
    /// A file whose bytes from `len` on a crash left unfinished.
    Cut {
        path: PathBuf,
        len: u64,
        cut: u64,
        why: String,
    },
    /// What is to be done once the repairs before it are made (a segment whose index they
    /// write again named in the record store's catalog, say), and what it is.
    Then(Box<dyn FnOnce() + Send>, &'static str),
}

impl std::fmt::Debug for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Repair::Create(path) => f.debug_tuple("Create").field(path).finish(),
            Repair::Remove { path, why } => f
                .debug_struct("Remove")
                .field("path", path)
                .field("why", why)
                .finish(),
            Repair::Write {
                path,
                at,
                bytes,
                why,
            } => f
                .debug_struct("Write")
                .field("path", path)
                .field("at", at)
                .field("bytes", &bytes.len())
                .field("why", why)
                .finish(),
            Repair::Sync(path) => f.debug_tuple("Sync").field(path).finish(),
            Repair::Cut {
                path,
                len,
                cut,
                why,
            } => f
                .debug_struct("Cut")
                .field("path", path)
                .field("len", len)
                .field("cut", cut)
                .field("why", why)
                .finish(),
            Repair::Then(_, what) => f.debug_tuple("Then").field(what).finish(),
        }
    }
}

impl Repairs {
    /// Adds making sure the directory `path` exists.
    pub fn create(&mut self, path: PathBuf) {
        self.0.push(Repair::Create(path));
    }

    /// Adds removing `path` (a file or a directory tree), logged with `why` when it is made.
    pub fn remove(&mut self, path: PathBuf, why: impl Into<String>) {
        self.0.push(Repair::Remove {
            path,
            why: why.into(),
        });
    }

    /// Adds cutting `path`, now `from` bytes long, to `len` bytes, logged with `why` when it is
    /// made.
    pub fn cut(&mut self, path: PathBuf, len: u64, from: u64, why: impl Into<String>) {
        self.0.push(Repair::Cut {
            path,
            len,
            cut: from.saturating_sub(len),
            why: why.into(),
        });
    }

    /// Adds writing `bytes` at `at` of `path` (created if missing), cutting the file after
    /// them, logged with `why` when it is made.
    pub fn write(&mut self, path: PathBuf, at: u64, bytes: Vec<u8>, why: impl Into<String>) {
        self.0.push(Repair::Write {
            path,
            at,
            bytes,
            why: why.into(),
        });
    }

    /// Adds making the contents of the file `path` durable (records recovery keeps, which a
    /// `kill -9` may have left in the page cache only).
    pub fn sync(&mut self, path: PathBuf) {
        self.0.push(Repair::Sync(path));
    }

    /// Adds `action`, `what` it does, to be done once the repairs listed before it are made.
    pub(crate) fn then(&mut self, what: &'static str, action: impl FnOnce() + Send + 'static) {
        self.0.push(Repair::Then(Box::new(action), what));
    }

    /// Makes the changes, each durable before the next.
    ///
    /// # Errors
    /// [`StorageError::Io`] naming the file that could not be changed; those before it were.
    pub fn apply(self) -> Result<(), StorageError> {
        for repair in self.0 {
            match repair {
                Repair::Create(path) => {
                    fs::create_dir_all(&path)
                        .map_err(StorageError::io("create directory", &path))?;
                    if let Some(parent) = path.parent() {
                        sync_dir(parent)?;
                    }
                }
                Repair::Remove { path, why } => {
                    warn!(file = %path.display(), "{why}");
                    remove_path(&path)?;
                }
                Repair::Sync(path) => {
                    File::open(&path)
                        .and_then(|file| file.sync_all())
                        .map_err(StorageError::io("fsync", &path))?;
                }
                Repair::Write {
                    path,
                    at,
                    bytes,
                    why,
                } => {
                    info!(file = %path.display(), offset = at, bytes = bytes.len(), "{why}");
                    write_at(&path, at, &bytes)?;
                }
                Repair::Cut {
                    path,
                    len,
                    cut,
                    why,
                } => {
                    warn!(file = %path.display(), offset = len, cut_bytes = cut, "{why}");
                    truncate(&path, len)?;
                }
                Repair::Then(action, _) => action(),
            }
        }
        Ok(())
    }
}

/// Writes `bytes` at `at` of `path` (created if missing), cuts it after them and makes that
/// durable.
fn write_at(path: &Path, at: u64, bytes: &[u8]) -> Result<(), StorageError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(StorageError::io("open", path))?;
    file.write_all_at(bytes, at)
        .and_then(|()| file.set_len(at + bytes.len() as u64))
        .and_then(|()| file.sync_all())
        .map_err(StorageError::io("write", path))
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

/// Removes a file or a directory with everything in it; one already gone is fine.
pub(crate) fn remove_path(path: &Path) -> Result<(), StorageError> {
    let removed = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match removed {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(cause) => Err(StorageError::Io {
            action: "remove",
            path: path.to_owned(),
            cause,
        }),
    }
}
