//! Why the storage refused: each variant says what went wrong and where.

use std::io;
use std::path::PathBuf;

/// A storage failure. Start-up errors name the file and offset at fault, so an operator can
/// decide what to do with the data directory, which a refused start leaves untouched; the
/// storage repairs nothing by itself but what a crash leaves (a torn last entry, the files of
/// an unfinished checkpoint).
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file operation failed.
    #[error("cannot {action} {}: {cause}", path.display())]
    Io {
        /// What was being done, such as `write` or `fsync`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error (in the message, so it is not also a `source`, which
        /// would print it twice in an error chain).
        cause: io::Error,
    },
    /// Another process holds the data directory's lock.
    #[error(
        "data directory {} is in use by another broker-server{} (lock file {} is held)",
        dir.display(),
        holder.as_deref().map(|pid| format!(" (pid {pid})")).unwrap_or_default(),
        dir.join("LOCK").display()
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The pid written in the lock file by its holder, if readable.
        holder: Option<String>,
    },
    /// A file is damaged in a way that is not a torn last write.
    #[error("corrupt data in {} at byte {offset}: {reason}", path.display())]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Where the damage starts.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A file was written in a format version this build does not read.
    #[error(
        "{} has format version {found}; this broker-server reads versions 1 to {supported} \
         (a newer broker-server wrote it)",
        path.display()
    )]
    Incompatible {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// Log entries the state needs are missing (a deleted or lost segment).
    #[error(
        "log entries {from} to {} are missing from {} (next file: {})",
        to - 1,
        dir.display(),
        next.display()
    )]
    MissingEntries {
        /// The data directory.
        dir: PathBuf,
        /// The first missing sequence number.
        from: u64,
        /// The first sequence number present again.
        to: u64,
        /// The file that starts at `to`.
        next: PathBuf,
    },
    /// The core refused a logged command on replay: the log does not match this build's rules.
    #[error("replaying entry {seq} of {} failed: {reason}", path.display())]
    Replay {
        /// The segment holding the entry.
        path: PathBuf,
        /// The entry's sequence number.
        seq: u64,
        /// The core's error.
        reason: String,
    },
    /// A value could not be encoded (too large for an entry, or a bug).
    #[error("cannot encode: {0}")]
    Encode(String),
}

impl StorageError {
    /// A [`StorageError::Io`] for `action` on `path`. The path is copied only when an error
    /// is made: this is on the path of every record written.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> Self {
        move |cause| StorageError::Io {
            action,
            path: path.into(),
            cause,
        }
    }

    /// A [`StorageError::Corrupt`].
    pub(crate) fn corrupt(
        path: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        StorageError::Corrupt {
            path: path.into(),
            offset,
            reason: reason.into(),
        }
    }
}

impl StorageError {
    /// Whether this is a failed fsync (also one inside [`crate::LogWriter::append`] when it
    /// rolls to a new segment): the kernel may have dropped pages already written, so the
    /// caller must stop the log (fail-stop) instead of retrying, since a retried fsync can
    /// succeed without bringing them back.
    pub fn is_failed_sync(&self) -> bool {
        matches!(
            self,
            StorageError::Io {
                action: "fsync",
                ..
            }
        )
    }
}
