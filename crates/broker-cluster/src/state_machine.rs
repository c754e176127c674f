//! The state machine: committed entries go into the broker (a [`Replica`]), and snapshots are
//! checkpoints of it, as a single broker's data directory takes them: the records the broker
//! holds in memory move to record segment files, and the snapshot holds the state without them
//! and the catalog of the segments. Memory holds the records applied since the last snapshot.
//!
//! # Files, in the node's cluster directory
//!
//! - `snapshot`: the current snapshot;
//! - `store-<n>/records/`: the record segments it names, laid out as a data directory's (see
//!   [`broker_storage::RecordStore`]); `n` changes when a snapshot from the leader replaces
//!   them all;
//! - `incoming-<k>` and `outgoing-<k>/`: a snapshot being received, and links to the segment
//!   files of one being sent; removed when done, and at start;
//! - `revision`: written once the node applied an entry of a later revision of the core's
//!   rules than the original (the revision's number, as text), so that it knows the group's
//!   rules after a restart too, whatever its snapshot covers (see
//!   [`StateMachine::revision_applied`]). A hint: without it the node asks the members.
//!
//! Opening the state machine reads, and lists what it would remove and cut (the leftovers
//! above, what an unfinished snapshot appended to record segments) as repairs that the node
//! makes once nothing can refuse its start ([`StateMachine::check`]).
//!
//! # The snapshot file (integers little-endian)
//!
//! Magic `BRKRAFTS`, format version `u32`, length of the meta `u32`, CRC-32 (IEEE) of everything
//! after this header `u32`, then the meta (openraft's `SnapshotMeta`: the last entry the
//! snapshot covers, the membership then, the snapshot's id) and, in the encoding of
//! [`crate::codec`]:
//! - formats 5, 6 and 7: as formats 2, 3 and 4, with the broker's state image of version 5
//!   (groups say which partitions they stored an offset on). Every snapshot is written so;
//! - formats 2, 3 and 4 (written by earlier versions, still read) hold the state image of
//!   version 4:
//! - format 4: as format 3, then the group's departures (the topics leaving it or gone from
//!   it: see [`crate::ClusterChange::Depart`]) and arrivals (the records staged of topics
//!   arriving: see [`crate::ClusterChange::Stage`]). Written only while the group has some;
//! - format 3: as format 2, then the [`ClusterState`] (the cluster's data groups and which
//!   holds each topic). Written only once the cluster has groups, so that until then a node
//!   of an earlier release reads every snapshot;
//! - format 2: the number `n` of the store directory (`u64`), then the [`Checkpoint`]: the
//!   broker's [`StateImage`] without the records in segments, and the segment catalog;
//! - format 1 (written by earlier versions, still read): the broker's [`StateImage`] holding
//!   every retained record. The next snapshot moves them to segments.
//!
//! Written to `snapshot.tmp`, fsynced and renamed: the rename is what makes a snapshot (and,
//! for one from the leader, its store directory) current.
//!
//! # A snapshot as sent to another node
//!
//! Magic `BRKRSNAP`, format version `u32` (4; 5 once the cluster has groups; 6 while the
//! group has departures or arrivals; versions 1, 2 and 3 are the same with the state image of
//! version 4, which earlier versions send), CRC-32 of what follows the header up to the first segment
//! `u32`, its length `u64`, then the checkpoint (encoded as in the snapshot file) and, in
//! versions 2 and 3, the [`ClusterState`] (in version 3 followed by the departures and
//! arrivals); then, for each
//! segment
//! of its catalog in order, the bytes of its `.rec` file and then of its `.idx` file that the
//! catalog covers ([`segment_files`]). The sender reads the segments in place, chunk by chunk
//! (through links, so that a later snapshot removing them does not cut a transfer short); the
//! receiver writes the chunks to `incoming-<k>`, unpacks them into a new store directory,
//! checks it as at start, and makes it current.

use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use broker_core::cold::{self, ColdStore};
use broker_core::image::{RecordImage, StateImage, TopicImage};
use broker_core::{BrokerError, Command, GroupSetting, Outcome};
use broker_storage::{
    checkpoint_v4, segment_files, Checkpoint, RecordStore, Repairs, SegmentImage,
};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership};
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use crate::codec::{decode, decode_prefix, encode};
use crate::snapshot_stream::{Piece, RemovedOnDrop, SnapshotStream};
use crate::types::{
    Applied, BrokerChange, ClusterChange, ClusterNode, ClusterState, Entry, LogId, NodeId, Staged,
    StorageError, TypeConfig,
};

const SNAPSHOT_FILE: &str = "snapshot";

/// See the module's documentation.
const REVISION_FILE: &str = "revision";
const SNAPSHOT_MAGIC: &[u8; 8] = b"BRKRAFTS";
/// Snapshot files of this format hold a store number, a checkpoint and the cluster's state.
const FORMAT_WITH_CLUSTER: u32 = 3;
/// Snapshot files of this format hold a store number, a checkpoint, the cluster's state and
/// the group's departures and arrivals.
const FORMAT_WITH_MOVES: u32 = 4;
/// Snapshot files of this format hold a store number and a checkpoint.
const FORMAT_VERSION: u32 = 2;
/// Snapshot files of this format hold an image with every record.
const FORMAT_WHOLE_IMAGE: u32 = 1;
const HEADER: usize = 20;
const STREAM_MAGIC: &[u8; 8] = b"BRKRSNAP";
const STREAM_VERSION: u32 = 1;
/// Snapshots sent in this version carry the cluster's state after the checkpoint.
const STREAM_WITH_CLUSTER: u32 = 2;
/// Snapshots sent in this version carry the group's departures and arrivals after the
/// cluster's state.
const STREAM_WITH_MOVES: u32 = 3;
const STREAM_HEADER: usize = 24;
/// What the file formats and stream versions of state images of version 5 add to those of
/// version 4 (formats 2 to 4 become 5 to 7, stream versions 1 to 3 become 4 to 6).
const IMAGE_5_LATER_BY: u32 = 3;

/// The version of the broker's state image a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageVersion {
    /// Version 4, as earlier versions wrote it: read, never written.
    Four,
    /// The current version, 5.
    Current,
}

impl ImageVersion {
    /// What the file format or stream version of a snapshot holding this image adds to that
    /// of the same shape holding an image of version 4.
    fn offset(self) -> u32 {
        match self {
            ImageVersion::Four => 0,
            ImageVersion::Current => IMAGE_5_LATER_BY,
        }
    }

    /// The checkpoint at the start of `bytes`, in this version, as the current one, and how
    /// many bytes it took.
    fn decode_checkpoint(
        self,
        bytes: &[u8],
    ) -> Result<(Checkpoint, usize), bincode::error::DecodeError> {
        match self {
            ImageVersion::Current => decode_prefix(bytes),
            ImageVersion::Four => decode_prefix::<checkpoint_v4::Checkpoint>(bytes)
                .map(|(checkpoint, read)| (checkpoint.into(), read)),
        }
    }
}

/// The broker as the cluster's state machine sees it: it applies committed proposals, gives its
/// state as an image, takes a whole new state, and lets records that are on disk leave memory.
pub trait Replica: Send + Sync + 'static {
    /// Applies one committed proposal's change. Must give the same answers on every node for
    /// the same state and change (everything it depends on is in the state and the change).
    fn apply(&self, change: BrokerChange) -> Applied;

    /// Whether the broker holds a topic named `topic` now.
    fn holds_topic(&self, topic: &str) -> bool;

    /// The whole state now.
    fn image(&self) -> StateImage;

    /// Replaces the whole state with an image's (a snapshot from the leader, or this node's own
    /// at start), reading the records the image places in a cold store from `records`, which
    /// also takes the records of later snapshots.
    ///
    /// # Errors
    /// The image is inconsistent; the state is left as it was.
    fn restore(&self, image: StateImage, records: Arc<dyn ColdStore>) -> Result<(), String>;

    /// For each `(log, offset)`: the records of `log` below `offset` are in the record store
    /// now, so they may leave memory (see [`broker_core::BrokerState::evict`]).
    fn evict(&self, written: &[(cold::LogId, i64)]);

    /// Holds `topic` as `image` describes it from now on (see
    /// [`broker_core::BrokerState::import_topic`]).
    ///
    /// # Errors
    /// The topic exists, the broker holds its most topics, or the image is inconsistent;
    /// nothing changed.
    fn import_topic(&self, topic: &str, image: TopicImage) -> Result<(), BrokerError>;

    /// Drops `topic` and everything it holds, as a delete does; whether it existed.
    fn drop_topic(&self, topic: &str) -> bool;

    /// The topics `topic` is tied to by dead-letter topics (see
    /// [`broker_core::BrokerState::dead_letter_ties`]): it cannot leave without them.
    fn dead_letter_ties(&self, topic: &str) -> Vec<String>;

    /// Why the state refuses every command, if it does: a record could not be read from disk
    /// while a change was applied (see [`broker_core::BrokerState::failure`]). The node then
    /// stops applying: its state may differ from the others'.
    fn failure(&self) -> Option<String>;
}

/// What a snapshot holds after the broker's checkpoint: the oldest shape that holds the
/// group's [`ClusterState`] is written, so that a node of an earlier release reads every
/// snapshot it could hold the state of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Nothing: a group that never had groups placed, topics placed, or topics leaving.
    Checkpoint,
    /// The cluster's state without departures.
    WithCluster,
    /// The cluster's state, then the group's departures and arrivals.
    WithMoves,
}

impl Shape {
    fn of(cluster: &ClusterState) -> Shape {
        let moves = cluster.departures.is_empty() && cluster.arrivals.is_empty();
        match (cluster.is_empty(), moves) {
            (_, false) => Shape::WithMoves,
            (false, true) => Shape::WithCluster,
            (true, true) => Shape::Checkpoint,
        }
    }

    /// The snapshot file format of this shape holding an image of `image`'s version.
    fn file_format(self, image: ImageVersion) -> u32 {
        image.offset()
            + match self {
                Shape::Checkpoint => FORMAT_VERSION,
                Shape::WithCluster => FORMAT_WITH_CLUSTER,
                Shape::WithMoves => FORMAT_WITH_MOVES,
            }
    }

    /// The shape and image version of snapshot file format `format`, if it is one holding a
    /// store number.
    fn of_file_format(format: u32) -> Option<(Shape, ImageVersion)> {
        Shape::every().find(|(shape, image)| shape.file_format(*image) == format)
    }

    /// The version of snapshot streams of this shape holding an image of `image`'s version.
    fn stream_version(self, image: ImageVersion) -> u32 {
        image.offset()
            + match self {
                Shape::Checkpoint => STREAM_VERSION,
                Shape::WithCluster => STREAM_WITH_CLUSTER,
                Shape::WithMoves => STREAM_WITH_MOVES,
            }
    }

    /// The shape and image version of snapshot stream version `version`, if it is one.
    fn of_stream_version(version: u32) -> Option<(Shape, ImageVersion)> {
        Shape::every().find(|(shape, image)| shape.stream_version(*image) == version)
    }

    /// Every shape with every image version.
    fn every() -> impl Iterator<Item = (Shape, ImageVersion)> {
        [Shape::Checkpoint, Shape::WithCluster, Shape::WithMoves]
            .into_iter()
            .flat_map(|shape| {
                [ImageVersion::Four, ImageVersion::Current]
                    .into_iter()
                    .map(move |image| (shape, image))
            })
    }
}

/// What a snapshot holds besides its meta, encoded: the broker's checkpoint and, once the
/// group has a cluster state, that state after it.
#[derive(Debug, Clone)]
struct Held {
    bytes: Vec<u8>,
    /// What `bytes` hold after the checkpoint.
    shape: Shape,
}

impl Held {
    fn encode(checkpoint: &Checkpoint, cluster: &ClusterState) -> io::Result<Held> {
        let mut bytes = encode(checkpoint).map_err(io::Error::other)?;
        let shape = Shape::of(cluster);
        if shape != Shape::Checkpoint {
            bytes.extend(encode(cluster).map_err(io::Error::other)?);
        }
        if shape == Shape::WithMoves {
            let moves = (&cluster.departures, &cluster.arrivals);
            bytes.extend(encode(&moves).map_err(io::Error::other)?);
        }
        Ok(Held { bytes, shape })
    }

    /// The checkpoint and cluster state `bytes` of `shape` encode, with a state image of
    /// `image`'s version (an empty cluster state when they hold none).
    fn decode(
        bytes: &[u8],
        shape: Shape,
        image: ImageVersion,
    ) -> Result<(Checkpoint, ClusterState), bincode::error::DecodeError> {
        let (checkpoint, read) = image.decode_checkpoint(bytes)?;
        if shape == Shape::Checkpoint {
            if read != bytes.len() {
                return Err(bincode::error::DecodeError::OtherString(format!(
                    "{} bytes after the checkpoint",
                    bytes.len() - read
                )));
            }
            return Ok((checkpoint, ClusterState::default()));
        }
        if shape == Shape::WithCluster {
            return Ok((checkpoint, decode(&bytes[read..])?));
        }
        let (mut cluster, more): (ClusterState, usize) = decode_prefix(&bytes[read..])?;
        (cluster.departures, cluster.arrivals) = decode(&bytes[read + more..])?;
        Ok((checkpoint, cluster))
    }
}

/// The current snapshot.
#[derive(Debug, Clone)]
struct Current {
    meta: SnapshotMeta<NodeId, ClusterNode>,
    /// What it holds.
    held: Held,
    /// The checkpoint's segment catalog.
    segments: Vec<SegmentImage>,
}

/// The snapshot and the record segments of one node, shared by its state machine and its
/// snapshot builders. Building, installing and starting to send a snapshot each hold it
/// throughout.
struct Store {
    dir: PathBuf,
    /// The number of the store directory in use.
    number: u64,
    records: Arc<RecordStore>,
    current: Option<Current>,
    segment_bytes: u64,
}

impl Store {
    fn store_dir(&self, number: u64) -> PathBuf {
        self.dir.join(format!("store-{number}"))
    }

    /// Writes the snapshot file for `meta` and `held` (whose catalog is `segments`) and
    /// makes it current.
    fn keep(
        &mut self,
        meta: SnapshotMeta<NodeId, ClusterNode>,
        held: Held,
        segments: Vec<SegmentImage>,
    ) -> io::Result<()> {
        write_snapshot(&self.dir, &meta, self.number, &held)?;
        self.current = Some(Current {
            meta,
            held,
            segments,
        });
        Ok(())
    }

    /// The current snapshot as a stream to send: with `links`, its segment files are linked
    /// (or, where the file system has no links, copied) into an `outgoing-<links>` directory
    /// that goes with the stream, so that a later snapshot removing them cannot cut the
    /// transfer short; without, they are read where they are (for a snapshot just built, of
    /// which the consensus engine keeps only the meta).
    fn stream(&self, links: Option<u64>) -> io::Result<Option<Snapshot<TypeConfig>>> {
        let Some(current) = &self.current else {
            return Ok(None);
        };
        let mut pieces = vec![Piece::Bytes(stream_header(&current.held))];
        let store_dir = self.store_dir(self.number);
        let mut linked = None;
        if let Some(id) = links.filter(|_| !current.segments.is_empty()) {
            let dir = self.dir.join(format!("outgoing-{id}"));
            fs::create_dir(&dir)?;
            // Removed on drop from here on, also if linking fails half way.
            linked = Some(RemovedOnDrop(dir));
        }
        for (number, segment) in current.segments.iter().enumerate() {
            for (kind, (path, length)) in ["rec", "idx"]
                .into_iter()
                .zip(segment_files(&store_dir, segment))
            {
                let path = match &linked {
                    Some(dir) => {
                        let link = dir.0.join(format!("{number}.{kind}"));
                        fs::hard_link(&path, &link)
                            .or_else(|_| copy_start(&path, &link, length))?;
                        link
                    }
                    None => path,
                };
                pieces.push(Piece::File { path, length });
            }
        }
        let links = linked;
        Ok(Some(Snapshot {
            meta: current.meta.clone(),
            snapshot: Box::new(SnapshotStream::sending(pieces, links)),
        }))
    }
}

/// Copies the first `length` bytes of `from` to a new file `to`.
fn copy_start(from: &Path, to: &Path, length: u64) -> io::Result<()> {
    let copied = io::copy(&mut File::open(from)?.take(length), &mut File::create(to)?)?;
    if copied == length {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{} is shorter than its snapshot says", from.display()),
        ))
    }
}

/// The header of a snapshot stream and what the snapshot holds.
fn stream_header(held: &Held) -> Vec<u8> {
    let version = held.shape.stream_version(ImageVersion::Current);
    let held = &held.bytes;
    let mut bytes = Vec::with_capacity(STREAM_HEADER + held.len());
    bytes.extend_from_slice(STREAM_MAGIC);
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(held).to_le_bytes());
    bytes.extend_from_slice(&(held.len() as u64).to_le_bytes());
    bytes.extend_from_slice(held);
    bytes
}

/// A storage error as an I/O error, for the consensus engine's error types.
fn io_error(error: broker_storage::StorageError) -> io::Error {
    io::Error::other(error)
}

fn lock_store(store: &Mutex<Store>) -> tokio::sync::MutexGuard<'_, Store> {
    store.blocking_lock()
}

/// The state machine of one node.
pub struct StateMachine<R> {
    replica: Arc<R>,
    /// The cluster's state, as applied so far.
    cluster: Arc<watch::Sender<ClusterState>>,
    applied: Option<LogId>,
    membership: StoredMembership<NodeId, ClusterNode>,
    dir: PathBuf,
    store: Arc<Mutex<Store>>,
    had_snapshot: bool,
    /// Numbers snapshots built and transfers, so that their ids and files differ.
    counter: Arc<AtomicU64>,
    /// Set once this node applied an entry of a later revision than the original (see
    /// [`StateMachine::revision_applied`]).
    revision_applied: Arc<std::sync::atomic::AtomicBool>,
}

impl<R: Replica> StateMachine<R> {
    /// Applies `change` to the broker, but for the commands about a topic leaving this group
    /// or gone from it, which are refused with [`BrokerError::Moving`] (in their place among
    /// the answers).
    fn apply_to_broker(&self, change: BrokerChange) -> Applied {
        let refused: Vec<Option<String>> = match &change {
            BrokerChange::Commands { commands, .. } => {
                let state = self.cluster.borrow();
                if state.departures.is_empty() {
                    return self.replica.apply(change);
                }
                commands
                    .iter()
                    .map(|command| {
                        named_topics(command)
                            .find(|topic| state.departures.contains_key(*topic))
                            .map(str::to_owned)
                    })
                    .collect()
            }
            BrokerChange::Tick { .. } | BrokerChange::Budget { .. } => {
                return self.replica.apply(change)
            }
        };
        if refused.iter().all(Option::is_none) {
            return self.replica.apply(change);
        }
        let BrokerChange::Commands {
            now_ms,
            names,
            revision,
            commands,
        } = change
        else {
            return self.replica.apply(change);
        };
        let kept = commands
            .into_iter()
            .zip(&refused)
            .filter(|(_, refused)| refused.is_none())
            .map(|(command, _)| command)
            .collect();
        let mut applied = self.replica.apply(BrokerChange::Commands {
            now_ms,
            names,
            revision,
            commands: kept,
        });
        let mut answers = applied.results.into_iter();
        applied.results = refused
            .into_iter()
            .map(|refused| match refused {
                Some(topic) => Err(BrokerError::Moving { topic }),
                None => answers.next().unwrap_or_else(|| {
                    Err(BrokerError::Storage("a command went unanswered".to_owned()))
                }),
            })
            .collect();
        applied
    }

    /// Applies `change` to the group's [`ClusterState`] and, for a topic arriving or gone, to
    /// the broker.
    fn apply_to_cluster(&self, change: ClusterChange) -> Applied {
        let replica = &self.replica;
        match change {
            ClusterChange::Stage {
                topic,
                attempt,
                piece,
                partition,
                records,
            } => {
                let mut staged = Staged::Refused;
                self.cluster.send_modify(|state| {
                    staged = state.stage(&topic, attempt, piece, partition, records);
                });
                let result = match staged {
                    Staged::Next(next) => Ok(Outcome::Offset(i64::try_from(next).unwrap_or(-1))),
                    Staged::Refused => Err(BrokerError::Moving { topic }),
                };
                Applied {
                    results: vec![result],
                    ..Applied::default()
                }
            }
            ClusterChange::Arrive {
                topic,
                attempt,
                image,
            } => self.arrive_change(replica, topic, attempt, *image),
            ClusterChange::ArriveImage4 {
                topic,
                attempt,
                image,
            } => self.arrive_change(replica, topic, attempt, (*image).into()),
            ClusterChange::Departed { topic } => {
                let leaving =
                    self.cluster
                        .send_if_modified(|state| match state.departures.get_mut(&topic) {
                            Some(departure) if !departure.gone => {
                                departure.gone = true;
                                true
                            }
                            _ => false,
                        });
                let dropped = leaving && replica.drop_topic(&topic);
                Applied {
                    results: vec![Ok(Outcome::Deleted(dropped))],
                    changed: vec![topic],
                    group: None,
                }
            }
            ClusterChange::Depart { ref topic, .. }
                if !replica.dead_letter_ties(topic).is_empty() =>
            {
                let ties = replica.dead_letter_ties(topic).join(", ");
                let why = format!(
                    "topic {topic:?} is tied to {ties} by dead-letter topics (a record moves to \
                     its dead-letter topic in one step, within one group), so it cannot move \
                     alone: configure the groups without their dead-letter topic (`broker group \
                     configure --no-dead-letter`), move the topics, then configure them again"
                );
                Applied {
                    results: vec![Err(BrokerError::InvalidArgument(why))],
                    group: Some(0),
                    ..Applied::default()
                }
            }
            change => {
                let mut group = None;
                self.cluster.send_modify(|state| {
                    group = Some(state.apply(change, |topic| replica.holds_topic(topic)));
                });
                Applied {
                    group,
                    ..Applied::default()
                }
            }
        }
    }
}

impl<R: Replica> StateMachine<R> {
    /// Applies [`ClusterChange::Arrive`] of `topic` as `image` with the records staged by
    /// `attempt`: nothing changes if the group holds it already.
    fn arrive_change(
        &self,
        replica: &R,
        topic: String,
        attempt: u64,
        image: TopicImage,
    ) -> Applied {
        let result = match replica.holds_topic(&topic) {
            true => Ok(Outcome::Created(false)),
            false => self.arrive(&topic, attempt, image),
        };
        if result.is_ok() {
            self.cluster.send_if_modified(|state| {
                let staged = state.arrivals.remove(&topic).is_some();
                state.departures.remove(&topic).is_some() || staged
            });
        }
        Applied {
            results: vec![result],
            changed: vec![topic],
            group: None,
        }
    }

    /// `topic` arriving as `image` with the records staged by `attempt`: imported, or refused
    /// with [`BrokerError::Moving`] when they are not all staged (the sender starts over), or
    /// with the import's refusal. The staged records are taken either way.
    fn arrive(
        &self,
        topic: &str,
        attempt: u64,
        mut image: TopicImage,
    ) -> Result<Outcome, BrokerError> {
        let moving = || BrokerError::Moving {
            topic: topic.to_owned(),
        };
        let mut staged = None;
        self.cluster.send_if_modified(|state| {
            if state
                .arrivals
                .get(topic)
                .is_some_and(|staging| staging.attempt == attempt)
            {
                staged = state.arrivals.remove(topic);
            }
            staged.is_some()
        });
        let staged = staged
            .map(|staging| staging.partitions)
            .ok_or_else(moving)?;
        if staged.len() > image.partitions.len() {
            return Err(moving());
        }
        for (partition, records) in image.partitions.iter_mut().zip(staged) {
            partition.records = records;
        }
        // Every record staged: each partition holds the bytes its image counts.
        let whole = image.partitions.iter().all(|partition| {
            let bytes: u64 = partition.records.iter().map(RecordImage::size).sum();
            bytes == partition.retained_bytes
        });
        if !whole {
            return Err(moving());
        }
        self.replica
            .import_topic(topic, image)
            .map(|()| Outcome::Created(true))
    }
}

/// The topics `command` is about: its own, and the dead-letter topic a group is given (which
/// records of the group's topic may move to).
fn named_topics(command: &Command) -> impl Iterator<Item = &str> {
    let dead_letter = match command {
        Command::Join { settings, .. } | Command::ConfigureGroup { settings, .. } => {
            settings.iter().find_map(|setting| match setting {
                GroupSetting::DeadLetter(topic) => Some(topic.as_str()),
                _ => None,
            })
        }
        _ => None,
    };
    command.topic().into_iter().chain(dead_letter)
}

impl<R: Replica> StateMachine<R> {
    /// The state machine over `replica`, keeping snapshots and record segments in `dir`, with
    /// segment files of about `segment_bytes`: the replica's state is restored from the
    /// snapshot there, if there is one, and reads its records on disk from the segments.
    /// Leftovers of transfers and of snapshots that did not finish are removed. Blocks on file
    /// I/O.
    ///
    /// # Errors
    /// The snapshot or a segment it names cannot be read or is damaged, or the image is
    /// inconsistent.
    pub fn open(dir: &Path, replica: Arc<R>, segment_bytes: u64) -> io::Result<StateMachine<R>> {
        let mut repairs = Repairs::default();
        let machine = StateMachine::check(dir, replica, segment_bytes, &mut repairs)?;
        repairs.apply().map_err(io_error)?;
        Ok(machine)
    }

    /// [`StateMachine::open`] that changes no file: removing the leftovers and cutting what an
    /// unfinished snapshot appended to record segments are added to `repairs`, which must be
    /// made before the machine builds or installs a snapshot. (The replica is restored: its
    /// state is not a file.)
    ///
    /// # Errors
    /// As [`StateMachine::open`]; nothing is changed then.
    pub(crate) fn check(
        dir: &Path,
        replica: Arc<R>,
        segment_bytes: u64,
        repairs: &mut Repairs,
    ) -> io::Result<StateMachine<R>> {
        let stored = read_snapshot(&dir.join(SNAPSHOT_FILE))?;
        let (number, image, cluster, current) = match stored {
            None => (0, replica.image(), ClusterState::default(), None),
            Some(stored) => {
                let image = stored.checkpoint.image.clone();
                let current = Current {
                    meta: stored.meta,
                    held: Held::encode(&stored.checkpoint, &stored.cluster)?,
                    segments: stored.checkpoint.segments,
                };
                (stored.number, image, stored.cluster, Some(current))
            }
        };
        find_leftovers(dir, number, repairs)?;
        let store_dir = dir.join(format!("store-{number}"));
        let segments = current
            .as_ref()
            .map(|current| current.segments.clone())
            .unwrap_or_default();
        let records =
            Arc::new(RecordStore::check(&store_dir, segments, repairs).map_err(io_error)?);
        replica
            .restore(image, Arc::clone(&records) as Arc<dyn ColdStore>)
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
        let (applied, membership) = current.as_ref().map_or_else(Default::default, |current| {
            (
                current.meta.last_log_id,
                current.meta.last_membership.clone(),
            )
        });
        Ok(StateMachine {
            replica,
            cluster: Arc::new(watch::Sender::new(cluster)),
            applied,
            membership,
            had_snapshot: current.is_some(),
            dir: dir.to_owned(),
            store: Arc::new(Mutex::new(Store {
                dir: dir.to_owned(),
                number,
                records,
                current,
                segment_bytes,
            })),
            counter: Arc::new(AtomicU64::new(0)),
            revision_applied: Arc::new(std::sync::atomic::AtomicBool::new(revision_noted(dir))),
        })
    }

    /// Whether the node had a snapshot when it started (it belongs to a cluster even if its
    /// log is empty).
    pub fn has_snapshot(&self) -> bool {
        self.had_snapshot
    }

    /// The cluster's state as this node applies it: changed by every [`crate::Proposal::Cluster`]
    /// entry and every snapshot installed.
    pub fn cluster_state(&self) -> watch::Receiver<ClusterState> {
        self.cluster.subscribe()
    }

    /// Writes the `revision` file (see the module's documentation): once, at the first entry of
    /// a later revision this node applies. A failure is logged and changes nothing else.
    fn note_revision(&self, revision: Option<broker_core::Revision>) {
        let number = revision.map_or(0, broker_core::Revision::number);
        if let Err(cause) = fs::write(self.dir.join(REVISION_FILE), number.to_string()) {
            warn!(%cause, "cannot note the group's revision; after a restart the node asks again");
        }
    }

    /// Set once this node applies an entry of the group's log written under a later revision
    /// of the core's rules than the original ([`crate::Proposal::Revised`]), or did before a
    /// restart (the `revision` file): every member applied such entries when it was written,
    /// so the node proposes under that revision too when it leads (see
    /// [`crate::Cluster::adopt_revision`]).
    pub(crate) fn revision_applied(&self) -> Arc<std::sync::atomic::AtomicBool> {
        Arc::clone(&self.revision_applied)
    }
}

/// Whether the node noted in `dir` that it applied an entry of a later revision than the
/// original (see the module's documentation).
fn revision_noted(dir: &Path) -> bool {
    fs::read_to_string(dir.join(REVISION_FILE))
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .and_then(broker_core::Revision::from_number)
        .is_some_and(|revision| revision > broker_core::Revision::Original)
}

/// Whether the node's cluster directory `dir` holds a snapshot, checked without opening it.
pub(crate) fn snapshot_exists(dir: &Path) -> bool {
    dir.join(SNAPSHOT_FILE).exists()
}

/// Adds to `repairs` the removal, from a node's cluster directory `dir` (if it exists) whose
/// store directory is `store-<number>`, of the other store directories (of a snapshot from the
/// leader that was not made current, or of the one it replaced) and the files of transfers.
fn find_leftovers(dir: &Path, number: u64, repairs: &mut Repairs) -> io::Result<()> {
    let keep = format!("store-{number}");
    // Only names this module gives: `<prefix><digits>`.
    let numbered = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let leftover = (numbered(&name, "store-") && name != keep)
            || numbered(&name, "incoming-")
            || numbered(&name, "outgoing-");
        if leftover {
            repairs.remove(entry.path(), "removing what an unfinished snapshot left");
        }
    }
    Ok(())
}

/// Builds a snapshot of the state as it was when the builder was made.
pub struct SnapshotBuilder<R> {
    /// Taken by the build.
    image: Option<StateImage>,
    /// The cluster's state at the same entry.
    cluster: ClusterState,
    applied: Option<LogId>,
    membership: StoredMembership<NodeId, ClusterNode>,
    /// The store directory the image's records are in.
    number: u64,
    store: Arc<Mutex<Store>>,
    replica: Arc<R>,
    counter: Arc<AtomicU64>,
}

impl<R: Replica> SnapshotBuilder<R> {
    /// Moves the image's records to segments, writes the snapshot, lets the replica evict
    /// them, and removes the segments nothing retains any more. Blocks on file I/O.
    fn build(self) -> io::Result<Option<Snapshot<TypeConfig>>> {
        let SnapshotBuilder {
            image,
            cluster,
            applied,
            membership,
            number,
            store,
            replica,
            counter,
        } = self;
        let mut image = image.ok_or_else(|| io::Error::other("a snapshot builder used twice"))?;
        let id = counter.fetch_add(1, Ordering::Relaxed);
        let (records, segment_bytes) = {
            let store = lock_store(&store);
            if store.number != number {
                // A snapshot from the leader replaced the state since the image was taken: it
                // is newer than this one would be.
                return store.stream(None);
            }
            (Arc::clone(&store.records), store.segment_bytes)
        };
        // The long part (writing and syncing the records) holds no lock: the current snapshot
        // can be sent meanwhile.
        let written = records.write_out(&mut image, segment_bytes);
        let mut store = lock_store(&store);
        if store.number != number {
            // Replaced meanwhile: what was written went with the old store directory.
            return store.stream(None);
        }
        let written = written.map_err(io_error)?;
        let segments = store.records.catalog_without_retired(&written.bases);
        let checkpoint = Checkpoint { image, segments };
        let held = Held::encode(&checkpoint, &cluster)?;
        let snapshot_id = match applied {
            Some(applied) => format!("{}-{}-{id}", applied.leader_id, applied.index),
            None => format!("empty-{id}"),
        };
        let meta = SnapshotMeta {
            last_log_id: applied,
            last_membership: membership,
            snapshot_id,
        };
        store.keep(meta, held, checkpoint.segments)?;
        let retired = store.records.retire(&written);
        replica.evict(&written.evicted);
        if let Err(error) = store.records.remove(&retired) {
            // They are named by no snapshot: the next start removes them.
            warn!(%error, "cannot remove record segments nothing retains any more");
        }
        store.stream(None)
    }
}

impl<R: Replica> RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder<R> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let builder = SnapshotBuilder {
            image: self.image.take(),
            cluster: self.cluster.clone(),
            applied: self.applied,
            membership: self.membership.clone(),
            number: self.number,
            store: Arc::clone(&self.store),
            replica: Arc::clone(&self.replica),
            counter: Arc::clone(&self.counter),
        };
        let failed = |error: io::Error| StorageIOError::write_snapshot(None, &error);
        let built = tokio::task::spawn_blocking(move || builder.build())
            .await
            .map_err(|error| failed(io::Error::other(error)))?
            .map_err(failed)?;
        let snapshot = built.ok_or_else(|| {
            failed(io::Error::other(
                "a snapshot from the leader replaced the state, but there is none",
            ))
        })?;
        info!(
            snapshot = %snapshot.meta.snapshot_id,
            "snapshot written; records applied before it are on disk"
        );
        Ok(snapshot)
    }
}

impl<R: Replica> RaftStateMachine<TypeConfig> for StateMachine<R> {
    type SnapshotBuilder = SnapshotBuilder<R>;

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
                EntryPayload::Normal(proposal) => match proposal.into_change() {
                    Ok(change) => {
                        if change.revision() > Some(broker_core::Revision::Original)
                            && !self.revision_applied.swap(true, Ordering::AcqRel)
                        {
                            self.note_revision(change.revision());
                        }
                        self.apply_to_broker(change)
                    }
                    Err(change) => self.apply_to_cluster(change),
                },
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Applied::default()
                }
            };
            answers.push(answer);
        }
        // Once per batch: a failed state refuses every later command anyway, and the error
        // stops the node before any of these answers is sent.
        if let (Some(last), Some(failure)) = (self.applied, self.replica.failure()) {
            return Err(StorageIOError::apply(last, &io::Error::other(failure)).into());
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let cluster = self.cluster.borrow().clone();
        SnapshotBuilder {
            image: Some(self.replica.image()),
            cluster,
            applied: self.applied,
            membership: self.membership.clone(),
            number: self.store.lock().await.number,
            store: Arc::clone(&self.store),
            replica: Arc::clone(&self.replica),
            counter: Arc::clone(&self.counter),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotStream>, StorageError> {
        let id = self.counter.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("incoming-{id}"));
        let stream = SnapshotStream::receiving(path)
            .map_err(|error| StorageIOError::write_snapshot(None, &error))?;
        Ok(Box::new(stream))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, ClusterNode>,
        snapshot: Box<SnapshotStream>,
    ) -> Result<(), StorageError> {
        let failed =
            |error: io::Error| StorageIOError::read_snapshot(Some(meta.signature()), &error);
        let store = Arc::clone(&self.store);
        let replica = Arc::clone(&self.replica);
        let cluster = Arc::clone(&self.cluster);
        let installing = meta.clone();
        tokio::task::spawn_blocking(move || {
            let path = snapshot.received().ok_or_else(|| {
                io::Error::other("a snapshot to install must be one that was received")
            })?;
            install(
                &mut lock_store(&store),
                &*replica,
                &cluster,
                installing,
                path,
            )
        })
        .await
        .map_err(|error| failed(io::Error::other(error)))?
        .map_err(failed)?;
        self.applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        info!(snapshot = %meta.snapshot_id, "installed a snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let store = Arc::clone(&self.store);
        let id = self.counter.fetch_add(1, Ordering::Relaxed);
        let failed = |error: io::Error| StorageIOError::read_snapshot(None, &error);
        tokio::task::spawn_blocking(move || lock_store(&store).stream(Some(id)))
            .await
            .map_err(|error| failed(io::Error::other(error)))?
            .map_err(|error| failed(error).into())
    }
}

/// Installs the snapshot received in `path`: unpacks its segments into a new store directory,
/// checks them, restores the replica and the cluster's state from it, and makes it current;
/// the old store directory goes.
fn install<R: Replica>(
    store: &mut Store,
    replica: &R,
    cluster: &watch::Sender<ClusterState>,
    meta: SnapshotMeta<NodeId, ClusterNode>,
    path: &Path,
) -> io::Result<()> {
    let number = store.number + 1;
    let store_dir = store.store_dir(number);
    if store_dir.exists() {
        fs::remove_dir_all(&store_dir)?;
    }
    fs::create_dir_all(&store_dir)?;
    let (checkpoint, cluster_state, held) = unpack(path, &store_dir)?;
    sync_tree(&store_dir)?;
    let records =
        Arc::new(RecordStore::open(&store_dir, checkpoint.segments.clone()).map_err(io_error)?);
    replica
        .restore(checkpoint.image, Arc::clone(&records) as Arc<dyn ColdStore>)
        .map_err(|why| received_damaged(&why))?;
    cluster.send_replace(cluster_state);
    let old = store.store_dir(store.number);
    store.number = number;
    store.records = records;
    store.keep(meta, held, checkpoint.segments)?;
    if let Err(error) = fs::remove_dir_all(&old) {
        if error.kind() != io::ErrorKind::NotFound {
            // No snapshot names it: the next start removes it.
            warn!(path = %old.display(), %error, "cannot remove the record segments a snapshot replaced");
        }
    }
    Ok(())
}

fn received_damaged(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the snapshot received from the leader: {what}"),
    )
}

/// Reads the snapshot received in `path`, writing the segment files it carries under
/// `store_dir`; returns its checkpoint and cluster state, decoded, and what it holds, encoded.
/// A leader of an earlier version sends its state's whole image (records included, no
/// segments): that is read too.
fn unpack(path: &Path, store_dir: &Path) -> io::Result<(Checkpoint, ClusterState, Held)> {
    let mut received = BufReader::new(File::open(path)?);
    let mut header = [0; STREAM_HEADER];
    let read = received.read(&mut header)?;
    if read < STREAM_MAGIC.len() || header[..STREAM_MAGIC.len()] != STREAM_MAGIC[..] {
        let mut whole = header[..read].to_vec();
        received.read_to_end(&mut whole)?;
        let image: broker_core::image::v4::StateImage =
            decode(&whole).map_err(|error| received_damaged(&error.to_string()))?;
        let checkpoint = Checkpoint {
            image: image.into(),
            segments: Vec::new(),
        };
        let cluster = ClusterState::default();
        let held = Held::encode(&checkpoint, &cluster)?;
        return Ok((checkpoint, cluster, held));
    }
    received
        .read_exact(&mut header[read..])
        .map_err(|error| received_damaged(&format!("its header: {error}")))?;
    let version = u32_at(&header, 8);
    let Some((shape, image)) = Shape::of_stream_version(version) else {
        return Err(received_damaged(&format!(
            "format version {version}, which a later version of this node reads"
        )));
    };
    let length = u64_at(&header, 16);
    let mut encoded = Vec::new();
    received.by_ref().take(length).read_to_end(&mut encoded)?;
    if encoded.len() as u64 != length || crc32fast::hash(&encoded) != u32_at(&header, 12) {
        return Err(received_damaged("a checksum that does not match"));
    }
    let (checkpoint, cluster) = Held::decode(&encoded, shape, image)
        .map_err(|error| received_damaged(&error.to_string()))?;
    for segment in &checkpoint.segments {
        for (file, length) in segment_files(store_dir, segment) {
            if let Some(parent) = file.parent() {
                fs::create_dir_all(parent)?;
            }
            let mut out = File::create(&file)?;
            let copied = io::copy(&mut received.by_ref().take(length), &mut out)?;
            if copied != length {
                return Err(received_damaged(&format!(
                    "it ends inside {} ({copied} of {length} bytes)",
                    file.display()
                )));
            }
            out.flush()?;
            out.sync_all()?;
        }
    }
    if received.read(&mut [0])? != 0 {
        return Err(received_damaged("bytes after its last segment"));
    }
    let held = match image {
        ImageVersion::Current => Held {
            bytes: encoded,
            shape,
        },
        // Kept in the current shapes, as this node writes and sends snapshots.
        ImageVersion::Four => Held::encode(&checkpoint, &cluster)?,
    };
    Ok((checkpoint, cluster, held))
}

/// Fsyncs every directory under `dir` and `dir` itself (after their files were).
fn sync_tree(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            sync_tree(&entry.path())?;
        }
    }
    File::open(dir)?.sync_all()?;
    if let Some(parent) = dir.parent() {
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn write_snapshot(
    dir: &Path,
    meta: &SnapshotMeta<NodeId, ClusterNode>,
    number: u64,
    held: &Held,
) -> io::Result<()> {
    let version = held.shape.file_format(ImageVersion::Current);
    let checkpoint = &held.bytes;
    let meta = encode(meta).map_err(io::Error::other)?;
    let meta_length = u32::try_from(meta.len()).map_err(io::Error::other)?;
    let number = number.to_le_bytes();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&meta);
    crc.update(&number);
    crc.update(checkpoint);
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(SNAPSHOT_MAGIC);
    header.extend_from_slice(&version.to_le_bytes());
    header.extend_from_slice(&meta_length.to_le_bytes());
    header.extend_from_slice(&crc.finalize().to_le_bytes());
    let path = dir.join(SNAPSHOT_FILE);
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary)?;
    file.write_all(&header)?;
    file.write_all(&meta)?;
    file.write_all(&number)?;
    file.write_all(checkpoint)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary, &path)?;
    File::open(dir)?.sync_all()
}

/// A snapshot file as read.
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, ClusterNode>,
    number: u64,
    checkpoint: Checkpoint,
    cluster: ClusterState,
}

fn read_snapshot(path: &Path) -> io::Result<Option<StoredSnapshot>> {
    let bytes = match fs::read(path) {
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
    let version = u32_at(&bytes, 8);
    let meta_length = u32_at(&bytes, 12) as usize;
    if crc32fast::hash(&bytes[HEADER..]) != u32_at(&bytes, 16) || bytes.len() < HEADER + meta_length
    {
        return Err(damaged("a checksum that does not match"));
    }
    let meta =
        decode(&bytes[HEADER..HEADER + meta_length]).map_err(|why| damaged(&why.to_string()))?;
    let data = &bytes[HEADER + meta_length..];
    let shape = Shape::of_file_format(version);
    let (number, (checkpoint, cluster)) = match (version, shape) {
        (_, Some((shape, image))) if data.len() >= 8 => (
            u64_at(data, 0),
            Held::decode(&data[8..], shape, image).map_err(|why| damaged(&why.to_string()))?,
        ),
        (FORMAT_WHOLE_IMAGE, _) => {
            let image: broker_core::image::v4::StateImage =
                decode(data).map_err(|why| damaged(&why.to_string()))?;
            let checkpoint = Checkpoint {
                image: image.into(),
                segments: Vec::new(),
            };
            (0, (checkpoint, ClusterState::default()))
        }
        (_, Some(_)) => return Err(damaged("no store number")),
        (other, None) => return Err(damaged(&format!("format version {other}"))),
    };
    Ok(Some(StoredSnapshot {
        meta,
        number,
        checkpoint,
        cluster,
    }))
}
