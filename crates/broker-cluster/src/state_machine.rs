//! The state machine: committed entries go into the broker (a [`Replica`]), and snapshots are
//! images of the broker's state, kept on disk.
//!
//! # The snapshot file (`raft/snapshot`, integers little-endian)
//!
//! Magic `BRKRAFTS`, format version `u32`, length of the meta `u32`, CRC-32 (IEEE) of everything
//! after this header `u32`, then the meta (openraft's `SnapshotMeta`: the last entry the
//! snapshot covers, the membership then, the snapshot's id) and the data: the broker's
//! [`StateImage`], both in the encoding of [`crate::codec`]. Written to `snapshot.tmp`, fsynced and
//! renamed.

use std::fs::{self, File};
use std::io::{self, Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use broker_core::image::StateImage;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership};

use crate::codec::{decode, encode};
use crate::types::{
    Applied, ClusterNode, Entry, LogId, NodeId, Proposal, StorageError, TypeConfig,
};

const SNAPSHOT_FILE: &str = "snapshot";
const SNAPSHOT_MAGIC: &[u8; 8] = b"BRKRAFTS";
const FORMAT_VERSION: u32 = 1;
const HEADER: usize = 20;

/// The broker as the cluster's state machine sees it: it applies committed proposals, and gives
/// and takes its whole state as an image.
pub trait Replica: Send + Sync + 'static {
    /// Applies one committed proposal. Must give the same answers on every node for the same
    /// state and proposal (everything it depends on is in the state and the proposal).
    fn apply(&self, proposal: Proposal) -> Applied;

    /// The whole state now.
    fn image(&self) -> StateImage;

    /// Replaces the whole state with an image's (a snapshot from the leader, or this node's own
    /// at start).
    ///
    /// # Errors
    /// The image is inconsistent; the state is left as it was.
    fn restore(&self, image: StateImage) -> Result<(), String>;
}

/// A snapshot as stored: its meta and its encoded image.
#[derive(Debug, Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, ClusterNode>,
    data: Vec<u8>,
}

/// Where snapshots are kept, shared by the state machine and its snapshot builders.
#[derive(Debug)]
struct Snapshots {
    dir: PathBuf,
    current: Mutex<Option<StoredSnapshot>>,
    /// Numbers the snapshots this process builds, so two at the same entry differ in id.
    built: AtomicU64,
}

impl Snapshots {
    fn current(&self) -> Option<StoredSnapshot> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes `snapshot` to disk and makes it the current one.
    fn keep(&self, snapshot: StoredSnapshot) -> io::Result<()> {
        write_snapshot(&self.dir, &snapshot)?;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(snapshot);
        Ok(())
    }
}

/// The state machine of one node.
pub struct StateMachine<R> {
    replica: Arc<R>,
    applied: Option<LogId>,
    membership: StoredMembership<NodeId, ClusterNode>,
    snapshots: Arc<Snapshots>,
}

impl<R: Replica> StateMachine<R> {
    /// The state machine over `replica`, keeping snapshots in `dir`: if a snapshot is there,
    /// the replica's state is restored from it.
    ///
    /// # Errors
    /// The snapshot cannot be read, is damaged, or its image is inconsistent.
    pub fn open(dir: &Path, replica: Arc<R>) -> io::Result<StateMachine<R>> {
        fs::create_dir_all(dir)?;
        let snapshot = read_snapshot(&dir.join(SNAPSHOT_FILE))?;
        let mut machine = StateMachine {
            replica,
            applied: None,
            membership: StoredMembership::default(),
            snapshots: Arc::new(Snapshots {
                dir: dir.to_owned(),
                current: Mutex::new(None),
                built: AtomicU64::new(0),
            }),
        };
        if let Some(snapshot) = snapshot {
            machine.restore(&snapshot)?;
            *machine
                .snapshots
                .current
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(snapshot);
        }
        Ok(machine)
    }

    /// Whether the node has a snapshot (it belongs to a cluster even if its log is empty).
    pub fn has_snapshot(&self) -> bool {
        self.snapshots.current().is_some()
    }

    fn restore(&mut self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let image: StateImage = decode(&snapshot.data).map_err(io::Error::other)?;
        self.replica
            .restore(image)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
        self.applied = snapshot.meta.last_log_id;
        self.membership = snapshot.meta.last_membership.clone();
        Ok(())
    }
}

/// Builds a snapshot of the state as it was when the builder was made.
pub struct SnapshotBuilder {
    image: StateImage,
    applied: Option<LogId>,
    membership: StoredMembership<NodeId, ClusterNode>,
    snapshots: Arc<Snapshots>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let data = encode(&self.image)
            .map_err(|error| StorageIOError::write_snapshot(None, &io::Error::other(error)))?;
        let number = self.snapshots.built.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match self.applied {
            Some(id) => format!("{}-{}-{number}", id.leader_id, id.index),
            None => format!("empty-{number}"),
        };
        let meta = SnapshotMeta {
            last_log_id: self.applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.snapshots
            .keep(stored.clone())
            .map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl<R: Replica> RaftStateMachine<TypeConfig> for StateMachine<R> {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, ClusterNode>), StorageError> {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut answers = Vec::new();
        for entry in entries {
            self.applied = Some(entry.log_id);
            let answer = match entry.payload {
                EntryPayload::Blank => Applied::default(),
                EntryPayload::Normal(proposal) => self.replica.apply(proposal),
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Applied::default()
                }
            };
            answers.push(answer);
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            image: self.replica.image(),
            applied: self.applied,
            membership: self.membership.clone(),
            snapshots: Arc::clone(&self.snapshots),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, ClusterNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        let failed =
            |error: io::Error| StorageIOError::read_snapshot(Some(meta.signature()), &error);
        self.restore(&stored).map_err(failed)?;
        self.snapshots
            .keep(stored)
            .map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error))?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.snapshots.current().map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

fn write_snapshot(dir: &Path, snapshot: &StoredSnapshot) -> io::Result<()> {
    let meta = encode(&snapshot.meta).map_err(io::Error::other)?;
    let meta_length = u32::try_from(meta.len()).map_err(io::Error::other)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&meta);
    crc.update(&snapshot.data);
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(SNAPSHOT_MAGIC);
    header.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    header.extend_from_slice(&meta_length.to_le_bytes());
    header.extend_from_slice(&crc.finalize().to_le_bytes());
    let path = dir.join(SNAPSHOT_FILE);
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary)?;
    file.write_all(&header)?;
    file.write_all(&meta)?;
    file.write_all(&snapshot.data)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, &path)?;
    File::open(dir)?.sync_all()
}

fn read_snapshot(path: &Path) -> io::Result<Option<StoredSnapshot>> {
    let mut bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let damaged = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {what}", path.display()),
        )
    };
    if bytes.len() < HEADER || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err(damaged("not a snapshot file"));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    if word(8) != FORMAT_VERSION {
        return Err(damaged(&format!("format version {}", word(8))));
    }
    let meta_length = word(12) as usize;
    if crc32fast::hash(&bytes[HEADER..]) != word(16) || bytes.len() < HEADER + meta_length {
        return Err(damaged("a checksum that does not match"));
    }
    let meta =
        decode(&bytes[HEADER..HEADER + meta_length]).map_err(|why| damaged(&why.to_string()))?;
    let data = bytes.split_off(HEADER + meta_length);
    Ok(Some(StoredSnapshot { meta, data }))
}
