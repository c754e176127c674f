//! Unit tests of the log, checkpoints, record segments, the lock and recovery: one rule, one
//! test.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use broker_core::cold::LogId;
use broker_core::image::{v1, StateImage};
use broker_core::{Assignor, BrokerState, Command, EventBroker, KeyHash};
use bytes::Bytes;

use crate::format::{segment_name, SEGMENT_HEADER};
use crate::journal::checkpoint;
use crate::{
    encode_entry, remove_covered, Checkpoint, DataDir, EntryRef, LogWriter, RecordStore,
    StorageError, FORMAT_VERSION, RECORD_OVERHEAD_BYTES,
};

const CAPACITY: i32 = 5;

/// A live broker that logs what it applies, as the server does.
struct Live {
    dir: DataDir,
    state: BrokerState,
    records: Arc<RecordStore>,
    writer: LogWriter,
    /// Where each entry of the active segment ends, for the torn-tail test.
    ends: Vec<u64>,
    /// The time of the next command: one millisecond later each time.
    now: i64,
}

impl Live {
    fn new(path: &Path) -> Live {
        Live::with_segments(path, 1 << 20)
    }

    fn with_segments(path: &Path, segment_bytes: u64) -> Live {
        let dir = DataDir::open(path).unwrap();
        let recovery = dir.recover(CAPACITY).unwrap();
        let writer = dir
            .log_writer(CAPACITY, recovery.next_seq, segment_bytes)
            .unwrap();
        Live {
            dir,
            now: recovery.state.clock_ms() + 1,
            state: recovery.state,
            records: recovery.records,
            writer,
            ends: Vec::new(),
        }
    }

    /// [`Live::call`] for a command whose answer (which may be a refusal) does not matter.
    fn run(&mut self, command: Command) {
        // Histories include calls the broker refuses, which are simply not logged.
        let _answer = self.call(command);
    }

    /// Applies `command` and logs it if it changed the state; each entry is written on its own.
    fn call(&mut self, command: Command) -> Result<broker_core::Outcome, broker_core::BrokerError> {
        let mut entry = Vec::new();
        let at_ms = self.now;
        self.now += 1;
        encode_entry(
            &EntryRef::Apply {
                at_ms,
                command: &command,
            },
            &mut entry,
        )
        .unwrap();
        let kind = command.kind();
        let dead_letters = self.state.dead_letter_events();
        let result = self.state.apply_at(at_ms, command);
        let moved = self.state.dead_letter_events() != dead_letters;
        if matches!(&result, Ok(outcome) if kind.changed_state(outcome) || moved) {
            // Unsynced: the tests never lose the page cache (the server's tests do).
            self.writer.append(&entry, 1).unwrap();
            let last = self.ends.last().copied().unwrap_or(SEGMENT_HEADER as u64);
            self.ends.push(last + entry.len() as u64);
        }
        result
    }

    fn describe(&self) -> broker_core::BrokerDescription {
        self.state.describe_all()
    }

    /// Takes a checkpoint as the journal does (records to their segments, the snapshot, the
    /// removals) and evicts what it wrote; returns the snapshot's path.
    fn checkpoint(&mut self, segment_bytes: u64) -> PathBuf {
        let seq = self.writer.next_seq();
        let written = checkpoint(
            &self.dir,
            &self.records,
            seq,
            self.state.to_image(),
            segment_bytes,
        )
        .unwrap();
        self.state.evict(&written.evicted);
        written.path
    }
}

fn recover(path: &Path) -> Result<crate::Recovery, StorageError> {
    DataDir::open(path)?.recover(CAPACITY)
}

fn publish(topic: &str, partition: i32, payload: &str) -> Command {
    Command::Publish {
        topic: topic.into(),
        partition,
        payload: Bytes::from(payload.to_owned()),
    }
}

fn member_command(kind: u8, member: &str, partition: i32, offset: i64) -> Command {
    let (topic, group, member) = ("t".to_owned(), "g".to_owned(), member.to_owned());
    match kind {
        0 => Command::Join {
            topic,
            group,
            member,
            assignor: None,
            settings: Vec::new(),
        },
        1 => Command::Leave {
            topic,
            group,
            member,
        },
        2 => Command::Poll {
            topic,
            group,
            member,
            max_records: 2,
            max_bytes: None,
        },
        3 => Command::Ack {
            topic,
            group,
            member,
            partition,
            offset,
        },
        4 => Command::Retry {
            topic,
            group,
            member,
            partition,
            offset,
        },
        5 => Command::Fetch {
            topic,
            group,
            member,
            max_records: 3,
            max_bytes: None,
        },
        6 => Command::Commit {
            topic,
            group,
            member,
            offsets: None,
        },
        7 => Command::Commit {
            topic,
            group,
            member,
            offsets: Some(BTreeMap::from([(partition, offset)])),
        },
        _ => Command::AckAndPoll {
            topic,
            group,
            member,
            acks: vec![(partition, offset), (0, offset)],
            max_records: 2,
            max_bytes: None,
        },
    }
}

/// A small deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// A live broker with a topic and a varied history: publishes, keyed publishes, a range group,
/// polls, acks, fetches and commits.
fn scripted(path: &Path) -> Live {
    let mut live = Live::new(path);
    live.run(Command::Create {
        topic: "t".into(),
        partition_count: 3,
        key_hash: KeyHash::Fnv1a,
        settings: Vec::new(),
    });
    live.run(Command::Join {
        topic: "t".into(),
        group: "r".into(),
        member: "a".into(),
        assignor: Some(Assignor::Range),
        settings: Vec::new(),
    });
    for i in 0..4 {
        live.run(publish("t", i % 3, &format!("p{i}")));
    }
    live.run(Command::PublishKeyed {
        topic: "t".into(),
        key: Some(Bytes::from_static(b"k")),
        payload: Bytes::from_static(b"keyed"),
    });
    live.run(member_command(0, "m1", 0, 0));
    live.run(member_command(2, "m1", 0, 0));
    live.run(member_command(3, "m1", 0, 0));
    live.run(member_command(5, "m1", 0, 0));
    live.run(member_command(6, "m1", 0, 0));
    live.writer.sync().unwrap();
    live
}

#[test]
fn recovery_replays_the_log_to_the_same_state() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let expected = live.describe();
    let next = live.writer.next_seq();
    drop(live);
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.state.describe_all(), expected);
    assert_eq!(recovery.next_seq, next);
    assert_eq!(recovery.replayed, next);
    assert_eq!(recovery.torn, None);
}

#[test]
fn random_histories_recover_to_the_same_description() {
    for seed in 1..=20u64 {
        let tmp = tempfile::tempdir().unwrap();
        // Small segments and a snapshot halfway exercise rolling and the snapshot path too.
        let mut live = Live::with_segments(tmp.path(), 300);
        live.run(Command::Create {
            topic: "t".into(),
            partition_count: 3,
            key_hash: KeyHash::Murmur2,
            settings: Vec::new(),
        });
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for step in 0..300 {
            let member = ["a", "b", "c"][rng.next(3) as usize];
            let partition = rng.next(3) as i32;
            let offset = rng.next(8) as i64;
            let command = match rng.next(11) {
                0..=2 => publish("t", partition, &format!("x{step}")),
                kind => member_command((kind - 2) as u8, member, partition, offset),
            };
            live.run(command);
            if step == 150 {
                live.checkpoint(64);
            }
        }
        let expected = live.describe();
        drop(live);
        let recovered = recover(tmp.path()).unwrap();
        assert_eq!(recovered.state.describe_all(), expected, "seed {seed}");
        // And the recovered broker behaves the same from here on.
        let broker = EventBroker::from_state(recovered.state);
        assert_eq!(broker.describe(), expected);
    }
}

#[test]
fn a_torn_last_entry_is_cut_off_at_every_byte_position() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let segment = live.writer_path();
    let ends = live.ends.clone();
    let full = fs::read(&segment).unwrap();
    drop(live);
    let last_start = ends[ends.len() - 2];
    let last_end = ends[ends.len() - 1];
    assert_eq!(last_end, full.len() as u64);
    // The state without the last entry: replay every entry but the last.
    fs::write(&segment, &full[..last_start as usize]).unwrap();
    let before_last = recover(tmp.path()).unwrap();
    assert_eq!(before_last.torn, None);
    let expected = before_last.state.describe_all();
    for cut in last_start + 1..last_end {
        fs::write(&segment, &full[..cut as usize]).unwrap();
        let recovery = recover(tmp.path()).unwrap();
        assert_eq!(recovery.state.describe_all(), expected, "cut at {cut}");
        assert_eq!(recovery.next_seq, before_last.next_seq, "cut at {cut}");
        assert_eq!(
            recovery.torn.as_ref().map(|torn| (torn.offset, torn.cut)),
            Some((last_start, cut - last_start)),
            "cut at {cut}"
        );
        assert_eq!(
            fs::metadata(&segment).unwrap().len(),
            last_start,
            "cut at {cut}"
        );
    }
}

#[test]
fn a_last_entry_with_a_bad_checksum_counts_as_torn() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let segment = live.writer_path();
    let last_start = live.ends[live.ends.len() - 2];
    drop(live);
    flip_byte(&segment, last_start + 10);
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.torn.unwrap().offset, last_start);
}

#[test]
fn a_corrupt_entry_in_the_middle_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let segment = live.writer_path();
    let third_start = live.ends[1];
    drop(live);
    let before = fs::read(&segment).unwrap();
    flip_byte(&segment, third_start + 9);
    match recover(tmp.path()) {
        Err(StorageError::Corrupt {
            path,
            offset,
            reason,
        }) => {
            assert_eq!(path, segment);
            assert_eq!(offset, third_start);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Nothing was repaired or cut.
    assert_eq!(fs::read(&segment).unwrap().len(), before.len());
    // A length field damaged in the middle is corruption too, not a torn tail.
    fs::write(&segment, &before).unwrap();
    flip_byte(&segment, third_start);
    assert!(matches!(
        recover(tmp.path()),
        Err(StorageError::Corrupt { .. })
    ));
}

#[test]
fn a_snapshot_with_a_bad_checksum_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = scripted(tmp.path());
    let path = live.checkpoint(1 << 20);
    drop(live);
    assert!(recover(tmp.path()).is_ok());
    let len = fs::metadata(&path).unwrap().len();
    flip_byte(&path, len - 1);
    match recover(tmp.path()) {
        Err(StorageError::Corrupt {
            path: at, reason, ..
        }) => {
            assert_eq!(at, path);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn a_snapshot_with_a_valid_checksum_over_an_inconsistent_state_refuses_to_start() {
    // A state no build would make, as a hand-edited file would hold, written with a valid
    // checksum: each is refused at load instead of panicking when first used.
    // What the error names, and how the state's image is broken.
    type Breakage = (&'static str, fn(&mut StateImage));
    let breakages: [Breakage; 4] = [
        ("retained bytes", |image| image.retained_bytes += 1),
        ("group \"g\"", |image| {
            image.topics[0].1.groups[0].1.partitions[0].owner = Some(7);
        }),
        ("offsets", |image| {
            image.topics[0].1.groups[0].1.partitions[1].committed = -5;
        }),
        ("partition 0", |image| {
            image.topics[0].1.partitions[0].base = i64::MAX;
        }),
    ];
    for (expected, breakage) in breakages {
        let tmp = tempfile::tempdir().unwrap();
        let live = scripted(tmp.path());
        let mut broken = live.state.to_image();
        assert_eq!(broken.topics[0].0, "t");
        assert_eq!(broken.topics[0].1.groups[0].0, "g");
        breakage(&mut broken);
        assert!(BrokerState::from_image(broken.clone(), None).is_err());
        let seq = live.writer.next_seq();
        let checkpoint = Checkpoint {
            image: broken,
            segments: Vec::new(),
        };
        let path = live.dir.write_snapshot(seq, &checkpoint).unwrap();
        drop(live);
        match recover(tmp.path()) {
            Err(StorageError::Corrupt {
                path: at, reason, ..
            }) => {
                assert_eq!(at, path);
                assert!(reason.contains(expected), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn an_incompatible_format_version_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let segment = live.writer_path();
    drop(live);
    // The version is the u32 after the 8-byte magic.
    let mut bytes = fs::read(&segment).unwrap();
    bytes[8] = 9;
    fs::write(&segment, &bytes).unwrap();
    let error = recover(tmp.path()).unwrap_err();
    assert!(
        matches!(&error, StorageError::Incompatible { found: 9, supported: FORMAT_VERSION, path } if *path == segment),
        "{error:?}"
    );
    assert!(error.to_string().contains("format version 9"), "{error}");

    let tmp = tempfile::tempdir().unwrap();
    let mut live = scripted(tmp.path());
    let path = live.checkpoint(1 << 20);
    drop(live);
    // A snapshot of the next format, from a newer release.
    let newer = FORMAT_VERSION + 1;
    let mut bytes = fs::read(&path).unwrap();
    bytes[8..12].copy_from_slice(&newer.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        recover(tmp.path()),
        Err(StorageError::Incompatible { found, .. }) if found == newer
    ));
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let first = DataDir::open(tmp.path()).unwrap();
    let error = DataDir::open(tmp.path()).unwrap_err();
    assert!(matches!(error, StorageError::Locked { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("in use by another broker-server"),
        "{message}"
    );
    assert!(
        message.contains(&std::process::id().to_string()),
        "{message}"
    );
    drop(first);
    assert!(DataDir::open(tmp.path()).is_ok());
}

#[test]
fn a_file_given_as_the_data_directory_is_refused_as_not_a_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    fs::write(&file, "not a directory").unwrap();
    let error = DataDir::open(&file).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "cannot open the data directory {}: it is not a directory",
            file.display()
        )
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), "not a directory");
}

#[test]
fn the_log_replays_under_the_capacity_it_was_written_with_whatever_is_configured() {
    let tmp = tempfile::tempdir().unwrap();
    let expected = scripted(tmp.path()).describe();
    let recovery = DataDir::open(tmp.path())
        .unwrap()
        .recover(CAPACITY + 1)
        .unwrap();
    assert_eq!(recovery.state.capacity_per_partition(), CAPACITY);
    assert_eq!(recovery.state.describe_all(), expected);
}

#[test]
fn a_missing_segment_refuses_to_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = Live::with_segments(tmp.path(), 100);
    live.run(Command::Create {
        topic: "t".into(),
        partition_count: 1,
        key_hash: KeyHash::Murmur2,
        settings: Vec::new(),
    });
    for i in 0..20 {
        live.run(publish("t", 0, &format!("payload number {i}")));
    }
    drop(live);
    let mut segments = segment_files(tmp.path());
    assert!(segments.len() >= 3, "{segments:?}");
    fs::remove_file(segments.remove(1)).unwrap();
    assert!(matches!(
        recover(tmp.path()),
        Err(StorageError::MissingEntries { .. })
    ));
}

#[test]
fn a_snapshot_makes_covered_segments_removable_and_recovery_continues_after_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = Live::with_segments(tmp.path(), 100);
    live.run(Command::Create {
        topic: "t".into(),
        partition_count: 2,
        key_hash: KeyHash::Murmur2,
        settings: Vec::new(),
    });
    for i in 0..10 {
        live.run(publish("t", i % 2, &format!("payload {i}")));
    }
    let seq = live.writer.next_seq();
    let before = segment_files(tmp.path()).len();
    live.checkpoint(1 << 20);
    assert!(segment_files(tmp.path()).len() < before);
    assert_eq!(remove_covered(tmp.path(), seq).unwrap(), 0);
    for i in 0..3 {
        live.run(publish("t", 1, &format!("after {i}")));
    }
    let expected = live.describe();
    drop(live);
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.snapshot_seq, Some(seq));
    assert_eq!(recovery.replayed, 3);
    assert_eq!(recovery.state.describe_all(), expected);
}

#[test]
fn a_restart_continues_the_sequence_in_a_new_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let next = live.writer.next_seq();
    drop(live);
    let mut live = Live::new(tmp.path());
    assert_eq!(live.writer.next_seq(), next);
    live.run(publish("t", 0, "after restart"));
    let expected = live.describe();
    drop(live);
    assert_eq!(segment_files(tmp.path()).len(), 2);
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.state.describe_all(), expected);
    assert_eq!(recovery.next_seq, next + 1);
}

#[test]
fn empty_polls_and_read_only_commands_are_not_logged() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = scripted(tmp.path());
    let next = live.writer.next_seq();
    live.run(member_command(0, "idle", 0, 0));
    let after_join = live.writer.next_seq();
    assert_eq!(after_join, next + 1);
    live.run(Command::Describe { topic: None });
    live.run(Command::Lag {
        topic: "t".into(),
        group: "g".into(),
    });
    // Drain, then poll and fetch with nothing left: nothing is logged.
    for _ in 0..10 {
        live.run(member_command(5, "idle", 0, 0));
    }
    let drained = live.writer.next_seq();
    live.run(member_command(5, "idle", 0, 0));
    live.run(Command::Poll {
        topic: "t".into(),
        group: "other".into(),
        member: "nobody".into(),
        max_records: 1,
        max_bytes: None,
    });
    assert_eq!(live.writer.next_seq(), drained);
}

impl Live {
    fn writer_path(&self) -> PathBuf {
        self.dir.path().join(segment_name(
            self.writer.next_seq() - self.ends.len() as u64,
        ))
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    files.sort();
    files
}

fn flip_byte(path: &Path, at: u64) {
    let mut bytes = fs::read(path).unwrap();
    bytes[at as usize] ^= 0x5a;
    fs::write(path, &bytes).unwrap();
}

#[test]
fn a_failed_fsync_is_told_apart_from_other_io_errors() {
    let failed = |action| StorageError::Io {
        action,
        path: PathBuf::from("wal"),
        cause: std::io::Error::other("disk"),
    };
    assert!(failed("fsync").is_failed_sync());
    assert!(!failed("write").is_failed_sync());
}

/// The snapshot of the format version 1 fixture (written by the first releases, from the
/// state's own serde encoding) decodes as a version 1 `StateImage` that encodes back to exactly
/// the same bytes: the image type is that format, field for field.
#[test]
fn a_version_1_snapshot_is_a_state_image_byte_for_byte() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/data-v1");
    let snapshot = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.extension().is_some_and(|ext| ext == "snap"))
        .unwrap();
    let bytes = fs::read(&snapshot).unwrap();
    let body = &bytes[crate::format::SNAPSHOT_HEADER..];
    let (image, used): (v1::StateImage, usize) =
        bincode::serde::decode_from_slice(body, crate::config()).unwrap();
    assert_eq!(used, body.len());
    let encoded = bincode::serde::encode_to_vec(&image, crate::config()).unwrap();
    assert_eq!(
        encoded, body,
        "the image does not re-encode to the snapshot's bytes"
    );
    assert!(BrokerState::from_image_v1(image).is_ok());
}

/// A command of a random history that reaches records on disk: publishes (some with headers),
/// consumption in both modes, resets, purges, and deletions.
fn disk_command(rng: &mut Rng, step: u64) -> Command {
    let topic = ["t", "limits", "aged"][rng.next(3) as usize].to_owned();
    let partition = rng.next(2) as i32;
    match rng.next(14) {
        0..=4 => Command::PublishBatch {
            topic,
            records: (0..1 + rng.next(3))
                .map(|i| broker_core::PublishRecord {
                    partition: Some(partition),
                    key: (i % 2 == 0).then(|| Bytes::from(format!("k{step}"))),
                    payload: Bytes::from(
                        format!("payload {step}.{i}").repeat(rng.next(4) as usize),
                    ),
                    headers: vec![broker_core::Header {
                        name: "n".into(),
                        value: Some(Bytes::from(vec![b'h'; rng.next(3) as usize])),
                    }],
                    timestamp_ms: None,
                })
                .collect(),
        },
        5 | 6 => Command::Fetch {
            topic,
            group: "g".into(),
            member: "m".into(),
            max_records: 1 + rng.next(5) as i32,
            max_bytes: Some(rng.next(60)),
        },
        7 => Command::Commit {
            topic,
            group: "g".into(),
            member: "m".into(),
            offsets: None,
        },
        8 => Command::Poll {
            topic,
            group: "a".into(),
            member: "m".into(),
            max_records: 2,
            max_bytes: None,
        },
        9 => Command::Redeliver {
            topic,
            group: "a".into(),
            member: "m".into(),
            max_records: 2,
            max_bytes: None,
        },
        10 => Command::ResetGroup {
            topic,
            group: "g".into(),
            partitions: None,
            to: match rng.next(3) {
                0 => broker_core::ResetTo::Earliest,
                1 => broker_core::ResetTo::Timestamp(step as i64 - rng.next(40) as i64),
                _ => broker_core::ResetTo::ShiftBy(-(rng.next(5) as i64)),
            },
        },
        11 => Command::Purge {
            topic,
            partition,
            before: rng.next(30) as i64,
        },
        12 => Command::OffsetForTime {
            topic,
            partition,
            timestamp_ms: step as i64 - rng.next(50) as i64,
        },
        _ => Command::Describe { topic: None },
    }
}

/// The topics of [`disk_command`] and their groups: interest retention, limits retention by
/// count and bytes, and interest retention with an age.
fn disk_setup() -> Vec<Command> {
    let mut setup = Vec::new();
    for (topic, settings) in [
        ("t", Vec::new()),
        (
            "limits",
            vec![
                broker_core::TopicSetting::Retention(broker_core::Retention::Limits),
                broker_core::TopicSetting::MaxRecords(12),
                broker_core::TopicSetting::MaxBytes(300),
            ],
        ),
        ("aged", vec![broker_core::TopicSetting::MaxAgeMs(40)]),
    ] {
        setup.push(Command::Create {
            topic: topic.into(),
            partition_count: 2,
            key_hash: KeyHash::Murmur2,
            settings,
        });
        for group in ["g", "a"] {
            setup.push(Command::Join {
                topic: topic.into(),
                group: group.into(),
                member: "m".into(),
                assignor: None,
                settings: Vec::new(),
            });
        }
    }
    setup
}

/// Records moved to record segments by checkpoints (small segments, so that they roll and
/// leave a segment at a time) answer every command exactly as records in memory do: the same
/// history applied to a broker in memory gives the same answers, step by step, and recovery
/// from the directory gives the same state.
#[test]
fn records_on_disk_answer_exactly_as_records_in_memory() {
    for seed in 1..=12u64 {
        let tmp = tempfile::tempdir().unwrap();
        let mut live = Live::new(tmp.path());
        // Large enough for every topic limit: the interest topic refuses past it.
        let mut memory = BrokerState::new(CAPACITY).unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let setup = disk_setup();
        for (step, command) in setup
            .into_iter()
            .map(|command| (0, command))
            .chain((1..400).map(|step| (step, disk_command(&mut rng, step))))
        {
            let at = live.now;
            let expected = memory.apply_at(at, command.clone());
            assert_eq!(
                live.call(command.clone()),
                expected,
                "seed {seed} step {step}: {command:?}"
            );
            assert_eq!(
                live.describe(),
                memory.describe_all(),
                "seed {seed} step {step}: {command:?}"
            );
            if step % 37 == 0 {
                live.checkpoint(256);
            }
            if step % 50 == 0 {
                assert_eq!(live.state.advance_clock(at), memory.advance_clock(at));
            }
        }
        // Consuming everything from the start reads every retained record back, from disk.
        for topic in ["t", "limits", "aged"] {
            let reset = Command::ResetGroup {
                topic: topic.into(),
                group: "g".into(),
                partitions: None,
                to: broker_core::ResetTo::Earliest,
            };
            let fetch = Command::Fetch {
                topic: topic.into(),
                group: "g".into(),
                member: "m".into(),
                max_records: 10_000,
                max_bytes: None,
            };
            for command in [reset, fetch] {
                let at = live.now;
                assert_eq!(
                    live.call(command.clone()),
                    memory.apply_at(at, command),
                    "seed {seed}"
                );
            }
        }
        let expected = live.describe();
        drop(live);
        let recovery = recover(tmp.path()).unwrap();
        assert_eq!(recovery.state.describe_all(), expected, "seed {seed}");
        assert!(
            recovery.state.check_consistency().is_ok(),
            "seed {seed}: {:?}",
            recovery.state.check_consistency()
        );
    }
}

#[test]
fn a_tail_of_zero_bytes_after_the_last_entry_is_cut_like_a_torn_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let segment = live.writer_path();
    let expected = live.describe();
    let len = fs::metadata(&segment).unwrap().len();
    drop(live);
    let mut bytes = fs::read(&segment).unwrap();
    bytes.extend_from_slice(&[0; 16]);
    fs::write(&segment, &bytes).unwrap();
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.state.describe_all(), expected);
    assert_eq!(
        recovery.torn.as_ref().map(|torn| (torn.offset, torn.cut)),
        Some((len, 16))
    );
    assert_eq!(fs::metadata(&segment).unwrap().len(), len);
    // Zero bytes in the middle of the log, with entries after them, are corruption.
    let mut damaged = fs::read(&segment).unwrap();
    // The first entry's time (its body starts with the variant, 0, then the time).
    let middle = SEGMENT_HEADER + 8 + 4;
    damaged[middle..middle + 8].fill(0);
    fs::write(&segment, &damaged).unwrap();
    let result = recover(tmp.path());
    assert!(
        matches!(result, Err(StorageError::Corrupt { .. })),
        "{:?}",
        result.map(|r| r.torn)
    );
}

/// The record files of the directory at `dir`, sorted.
fn record_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for log in fs::read_dir(dir.join("records")).unwrap() {
        for file in fs::read_dir(log.unwrap().path()).unwrap() {
            files.push(file.unwrap().path());
        }
    }
    files.sort();
    files
}

/// A live broker with one topic of two partitions, `records` records published to partition 0
/// and a checkpoint that moved them to disk.
fn on_disk(path: &Path, records: usize) -> Live {
    let mut live = Live::new(path);
    live.run(Command::Create {
        topic: "d".into(),
        partition_count: 2,
        key_hash: KeyHash::Murmur2,
        settings: vec![broker_core::TopicSetting::MaxRecords(1000)],
    });
    for i in 0..records {
        live.run(publish("d", 0, &format!("record {i}")));
    }
    live.checkpoint(128);
    live
}

#[test]
fn a_damaged_record_is_refused_with_its_file_named_and_the_broker_stops_changing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = on_disk(tmp.path(), 6);
    let data = record_files(tmp.path())
        .into_iter()
        .find(|path| path.extension().is_some_and(|ext| ext == "rec"))
        .unwrap();
    // The first record's payload, past the 32-byte header and the 8-byte record header.
    flip_byte(&data, 32 + 8 + 20);
    live.run(Command::Join {
        topic: "d".into(),
        group: "g".into(),
        member: "m".into(),
        assignor: None,
        settings: Vec::new(),
    });
    let poll = Command::Poll {
        topic: "d".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 1,
        max_bytes: None,
    };
    match live.state.apply_at(live.now, poll.clone()) {
        Err(broker_core::BrokerError::Storage(why)) => {
            assert!(why.contains(&data.display().to_string()), "{why}");
            assert!(why.contains("checksum"), "{why}");
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
    assert!(live.state.failure().is_some());
    assert!(matches!(
        live.state.apply_at(live.now, publish("d", 1, "more")),
        Err(broker_core::BrokerError::Storage(_))
    ));
}

#[test]
fn recovery_cuts_what_an_unfinished_checkpoint_wrote_and_removes_files_no_checkpoint_names() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = on_disk(tmp.path(), 5);
    let expected = live.describe();
    let files = record_files(tmp.path());
    let lengths: Vec<u64> = files
        .iter()
        .map(|path| fs::metadata(path).unwrap().len())
        .collect();
    // A checkpoint that appended records and a new segment, then died before its snapshot.
    for i in 0..40 {
        live.run(publish("d", 0, &format!("later {i}")));
    }
    let image = live.state.to_image();
    let records = &image.topics[0].1.partitions[0];
    live.records
        .append(
            broker_core::cold::LogId {
                topic: image.topics[0].1.id,
                partition: 0,
            },
            records.cold_end,
            &records.records,
            128,
        )
        .unwrap();
    live.records
        .append(
            broker_core::cold::LogId {
                topic: 99,
                partition: 0,
            },
            0,
            &records.records,
            128,
        )
        .unwrap();
    assert!(record_files(tmp.path()).len() > files.len());
    // The log entries of the later publishes are lost with the page cache, say.
    let segment = live.writer_path();
    drop(live);
    let entries = fs::read(&segment).unwrap();
    fs::write(&segment, &entries[..SEGMENT_HEADER]).unwrap();
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.state.describe_all(), expected);
    assert_eq!(record_files(tmp.path()), files);
    let after: Vec<u64> = files
        .iter()
        .map(|path| fs::metadata(path).unwrap().len())
        .collect();
    assert_eq!(after, lengths);
}

#[test]
fn segments_whose_records_all_left_are_removed_at_the_next_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = on_disk(tmp.path(), 30);
    let before = record_files(tmp.path()).len();
    assert!(before >= 6, "small segments roll: {before} files");
    live.run(Command::Purge {
        topic: "d".into(),
        partition: 0,
        before: 25,
    });
    live.checkpoint(128);
    let after = record_files(tmp.path()).len();
    assert!(after < before, "{after} files of {before} remain");
    live.call(Command::Join {
        topic: "d".into(),
        group: "g".into(),
        member: "m".into(),
        assignor: None,
        settings: Vec::new(),
    })
    .unwrap();
    let fetched = live.call(Command::Fetch {
        topic: "d".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 100,
        max_bytes: None,
    });
    let expected = live.describe();
    let Ok(broker_core::Outcome::Records(records)) = fetched else {
        panic!("{fetched:?}")
    };
    let offsets: Vec<i64> = records.iter().map(|record| record.offset).collect();
    assert_eq!(offsets, (25..30).collect::<Vec<_>>());
    drop(live);
    // Deleting the topic removes its directory at the next checkpoint.
    let mut live = Live::new(tmp.path());
    assert_eq!(live.describe(), expected);
    live.call(Command::DeleteTopic { topic: "d".into() })
        .unwrap();
    live.checkpoint(128);
    assert!(record_files(tmp.path()).is_empty());
}

/// What an idempotent producer stored survives a checkpoint, the log replayed after it and a
/// restart: a batch sent again is answered with its first offsets, and the producer goes on
/// from its next sequence number.
#[test]
fn idempotent_producers_are_remembered_across_checkpoints_and_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = Live::new(tmp.path());
    live.run(Command::Create {
        topic: "p".into(),
        partition_count: 2,
        key_hash: KeyHash::Murmur2,
        settings: vec![broker_core::TopicSetting::MaxRecords(1000)],
    });
    let batch = |sequence: u64, payloads: &[&str]| Command::PublishIdempotent {
        topic: "p".into(),
        producer: 0xfeed,
        batches: vec![broker_core::PartitionBatch {
            partition: 1,
            sequence,
            records: payloads
                .iter()
                .map(|payload| broker_core::PublishRecord::keyed(None, payload.to_string()))
                .collect(),
        }],
    };
    let first = live.call(batch(0, &["a", "b"])).unwrap();
    live.checkpoint(1 << 20);
    let second = live.call(batch(2, &["c"])).unwrap();
    drop(live);
    let mut live = Live::new(tmp.path());
    assert_eq!(live.call(batch(0, &["a", "b"])).unwrap(), first);
    assert_eq!(live.call(batch(2, &["c"])).unwrap(), second);
    assert_eq!(
        live.call(batch(3, &["d"])).unwrap(),
        broker_core::Outcome::PublishedBatch(vec![(1, 3)])
    );
    // Nothing was stored twice.
    assert_eq!(live.describe().topics[0].partitions[1].end_offset, 4);
}

/// Every file under `dir` but the lock, with its bytes.
fn every_file(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|name| name != "LOCK") {
                let bytes = fs::read(&path).unwrap();
                files.insert(path, bytes);
            }
        }
    }
    files
}

/// The files `before` and `after` (from [`every_file`]) disagree on: created, removed or
/// changed.
fn changed(
    before: &BTreeMap<PathBuf, Vec<u8>>,
    after: &BTreeMap<PathBuf, Vec<u8>>,
) -> Vec<PathBuf> {
    before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// A directory as a crash in the middle of a checkpoint leaves it: records appended to a
/// segment the last snapshot names and to a partition it does not name, a temporary snapshot,
/// and the log since the snapshot, whose last entry is torn. Returns the active log segment
/// and where each of its entries ends.
fn interrupted_checkpoint(path: &Path) -> (PathBuf, Vec<u64>) {
    let mut live = on_disk(path, 5);
    for i in 0..10 {
        live.run(publish("d", 0, &format!("later {i}")));
    }
    let image = live.state.to_image();
    let (_, topic) = &image.topics[0];
    let records = &topic.partitions[0];
    for log in [topic.id, 99] {
        let log = broker_core::cold::LogId {
            topic: log,
            partition: 0,
        };
        live.records
            .append(log, records.cold_end, &records.records, 1 << 20)
            .unwrap();
    }
    fs::write(path.join(crate::snapshot::SNAPSHOT_TMP), b"half a snapshot").unwrap();
    let segment = live.writer_path();
    let ends = live.ends.clone();
    drop(live);
    let len = fs::metadata(&segment).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    (segment, ends)
}

#[test]
fn a_refused_start_changes_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (segment, ends) = interrupted_checkpoint(tmp.path());
    let pristine = fs::read(&segment).unwrap();
    // An entry with entries after it: a flipped byte in its body, then a length one too long.
    let damaged = ends[ends.len() - 4];
    for (at, change) in [(damaged + 9, 0x5a), (damaged, 1)] {
        let mut bytes = pristine.clone();
        bytes[at as usize] ^= change;
        fs::write(&segment, &bytes).unwrap();
        let before = every_file(tmp.path());
        assert!(before
            .keys()
            .any(|path| path.starts_with(tmp.path().join("records"))));
        match crate::Storage::open(tmp.path(), CAPACITY) {
            Err(StorageError::Corrupt { path, offset, .. }) => {
                assert_eq!((path, offset), (segment.clone(), damaged), "at {at}");
            }
            other => panic!("expected Corrupt at {at}, got {other:?}"),
        }
        let after = every_file(tmp.path());
        assert_eq!(changed(&before, &after), Vec::<PathBuf>::new(), "at {at}");
        assert!(recover(tmp.path()).is_err());
        let after = every_file(tmp.path());
        assert_eq!(changed(&before, &after), Vec::<PathBuf>::new(), "at {at}");
    }
}

#[test]
fn opening_storage_repairs_nothing_until_it_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let (segment, ends) = interrupted_checkpoint(tmp.path());
    let before = every_file(tmp.path());
    let storage = crate::Storage::open(tmp.path(), CAPACITY).unwrap();
    assert!(storage.recovery().torn.is_some());
    // A caller that refuses the start after reading the state (the server checks its limits).
    drop(storage);
    let after = every_file(tmp.path());
    assert_eq!(changed(&before, &after), Vec::<PathBuf>::new());
    let settings = crate::JournalSettings {
        fsync: crate::Fsync::Always,
        fsync_interval: std::time::Duration::from_millis(10),
        snapshot_log_bytes: 1 << 20,
        segment_bytes: 1 << 20,
        held_log_bytes: None,
    };
    let (_, journal) = crate::Storage::open(tmp.path(), CAPACITY)
        .unwrap()
        .start(settings, |state| state)
        .unwrap();
    journal.finish();
    assert!(!tmp.path().join(crate::snapshot::SNAPSHOT_TMP).exists());
    assert_eq!(fs::metadata(&segment).unwrap().len(), ends[ends.len() - 2]);
    let unnamed = format!("{:020}-{:010}", 99, 0);
    assert!(!tmp.path().join("records").join(unnamed).exists());
}

#[test]
fn a_change_of_a_topics_settings_is_replayed_from_the_log_and_kept_by_a_snapshot() {
    use broker_core::{Retention, TopicSetting};
    let tmp = tempfile::tempdir().unwrap();
    let mut live = Live::with_segments(tmp.path(), 100);
    live.run(Command::Create {
        topic: "t".into(),
        partition_count: 1,
        key_hash: KeyHash::Murmur2,
        settings: vec![TopicSetting::Retention(Retention::Limits)],
    });
    for i in 0..10 {
        live.run(publish("t", 0, &format!("payload {i}")));
    }
    // The records move to segment files: the change evicts records from there.
    live.checkpoint(64);
    let configure = |settings: Vec<TopicSetting>| Command::ConfigureTopic {
        topic: "t".into(),
        settings,
    };
    live.call(configure(vec![TopicSetting::MaxBytes(30)]))
        .unwrap();
    live.run(publish("t", 0, "after"));
    let expected = live.describe();
    assert_eq!(expected.topics[0].partitions[0].earliest_offset, 8);
    drop(live);
    let recovery = recover(tmp.path()).unwrap();
    assert_eq!(recovery.state.describe_all(), expected);
    // Once more after a snapshot that holds the changed settings.
    let mut live = Live::with_segments(tmp.path(), 100);
    live.checkpoint(64);
    live.call(configure(vec![TopicSetting::MaxRecords(1)]))
        .unwrap();
    let expected = live.describe();
    assert_eq!(expected.topics[0].partitions[0].records, 1);
    drop(live);
    assert_eq!(recover(tmp.path()).unwrap().state.describe_all(), expected);
}

/// A journal started in `dir` with `settings`, and its state, holding topic `t` of
/// `partitions` partitions under limits retention.
fn journal_with_topic(
    dir: &Path,
    settings: crate::JournalSettings,
    partitions: i32,
) -> (BrokerState, crate::Journal) {
    let (mut state, journal) = crate::Storage::open(dir, CAPACITY)
        .unwrap()
        .start(settings, |state| state)
        .unwrap();
    let create = broker_core::Command::Create {
        topic: "t".into(),
        partition_count: partitions,
        key_hash: broker_core::KeyHash::default(),
        settings: vec![broker_core::TopicSetting::Retention(
            broker_core::Retention::Limits,
        )],
    };
    journal.apply(&mut state, 1, create).result.unwrap();
    (state, journal)
}

/// How many records `state` holds in memory, across every partition.
fn in_memory(state: &BrokerState) -> usize {
    state
        .to_image()
        .topics
        .iter()
        .flat_map(|(_, topic)| &topic.partitions)
        .map(|partition| partition.records.len())
        .sum()
}

/// The journal's own checkpoints take records out of memory: after many of them, the state
/// holds in memory only what the last one did not cover.
#[test]
fn background_checkpoints_take_records_out_of_memory() {
    use broker_core::Command;
    let tmp = tempfile::tempdir().unwrap();
    let settings = crate::JournalSettings {
        fsync: crate::Fsync::Batch,
        fsync_interval: std::time::Duration::from_millis(10),
        snapshot_log_bytes: 64 * 1024,
        segment_bytes: 1 << 20,
        held_log_bytes: None,
    };
    let (mut state, journal) = journal_with_topic(tmp.path(), settings, 4);
    for n in 0..20_000 {
        let publish = Command::Publish {
            topic: "t".into(),
            partition: n % 4,
            payload: vec![7u8; 100].into(),
        };
        journal.apply(&mut state, 1, publish).result.unwrap();
        journal.maybe_checkpoint(&mut state);
    }
    // The checkpoints run in the background: let the last finish (within 10 s), then take its
    // evictions. What stays in memory is what was logged since it started: less than one
    // checkpoint's 64 KiB of log, under 600 entries of 100-byte records.
    for _ in 0..200 {
        journal.maybe_checkpoint(&mut state);
        if in_memory(&state) < 600 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let in_memory = in_memory(&state);
    journal.finish();
    assert!(
        in_memory < 600,
        "{in_memory} records of 20,000 still in memory"
    );
    // Each checkpoint's catalog named the records of the entries it covered, no more, while
    // the flusher went on writing later ones: the directory recovers to the same state.
    drop(journal);
    let recovered = recover(tmp.path()).unwrap().state;
    assert_eq!(recovered.describe_all(), state.describe_all());
}

/// With a bound on the records held in memory (`--max-memory`), records the flusher wrote
/// leave memory without waiting for a checkpoint: the state holds at most about the bound,
/// publishes are held back only while the flusher is behind, and every record reads back the
/// same from its segment.
#[test]
fn records_leave_memory_once_written_under_a_bound() {
    use broker_core::Command;
    let tmp = tempfile::tempdir().unwrap();
    let bound = 64 * 1024;
    let settings = crate::JournalSettings {
        fsync: crate::Fsync::Batch,
        fsync_interval: std::time::Duration::from_millis(10),
        snapshot_log_bytes: 1 << 30,
        segment_bytes: 1 << 20,
        held_log_bytes: Some(bound),
    };
    let (mut state, journal) = journal_with_topic(tmp.path(), settings, 4);
    let publish = |n: usize| Command::Publish {
        topic: "t".into(),
        partition: (n % 4) as i32,
        payload: vec![(n % 251) as u8; 100].into(),
    };
    // Written, past half the bound: the next call between commands evicts them all, before
    // the checkpoint it starts (whose evictions come at a later call) could.
    let mut last = None;
    for n in 0..1_000 {
        last = journal.apply(&mut state, 1, publish(n)).entry.or(last);
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    assert_eq!(in_memory(&state), 1_000);
    journal.maybe_checkpoint(&mut state);
    assert_eq!(in_memory(&state), 0);
    // 100-byte records take about 133 bytes in their segments: the bound holds about 490.
    let mut most = 0;
    for n in 1_000..20_000 {
        while journal.over_memory() {
            futures::executor::block_on(journal.room_made());
        }
        journal.apply(&mut state, 1, publish(n)).result.unwrap();
        journal.maybe_checkpoint(&mut state);
        most = most.max(in_memory(&state));
    }
    assert!(
        most < 600,
        "{most} records of 20,000 held in memory at once"
    );
    let expected = state.clone().read("t", 1, 0, 10_000, None).unwrap();
    assert_eq!(expected.records.len(), 5_000);
    for (n, record) in expected.records.iter().enumerate() {
        assert_eq!(
            record.payload,
            vec![((4 * n + 1) % 251) as u8; 100],
            "record {n}"
        );
    }
    journal.finish();
    drop(journal);
    let recovered = recover(tmp.path()).unwrap().state;
    assert_eq!(recovered.describe_all(), state.describe_all());
}

/// With `--fsync batch` (and `never`), the flusher writes each record to its partition's
/// segment as it writes its entry, before any checkpoint: a checkpoint then writes no record,
/// and a restart after it replays nothing into memory.
#[test]
fn records_reach_their_segments_with_their_entries_and_checkpoints_write_none() {
    use broker_core::Command;
    let tmp = tempfile::tempdir().unwrap();
    let settings = crate::JournalSettings {
        fsync: crate::Fsync::Batch,
        fsync_interval: std::time::Duration::from_millis(10),
        // Reached by the end, where the one checkpoint is asked for.
        snapshot_log_bytes: 16 * 1024,
        segment_bytes: 4096,
        held_log_bytes: None,
    };
    let (mut state, journal) = journal_with_topic(tmp.path(), settings, 2);
    let mut last = None;
    for n in 0..300 {
        let publish = Command::Publish {
            topic: "t".into(),
            partition: n % 2,
            payload: vec![n as u8; 100].into(),
        };
        last = journal.apply(&mut state, 1, publish).entry;
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    let topic = state.to_image().topics[0].1.id;
    for partition in 0..2 {
        let log = LogId { topic, partition };
        assert_eq!(
            journal.records().end(log),
            Some(150),
            "partition {partition}"
        );
    }
    let written_before = record_files(tmp.path())
        .iter()
        .map(|file| fs::metadata(file).unwrap().len())
        .sum::<u64>();
    // Rolled at 4 KiB: more than one segment per partition.
    assert!(record_files(tmp.path()).len() > 4);
    journal.maybe_checkpoint(&mut state);
    journal.finish();
    let written_after = record_files(tmp.path())
        .iter()
        .map(|file| fs::metadata(file).unwrap().len())
        .sum::<u64>();
    assert_eq!(
        written_after, written_before,
        "the checkpoint wrote records"
    );
    drop(journal);
    let recovered = recover(tmp.path()).unwrap();
    assert_eq!(recovered.replayed, 0);
    let image = recovered.state.to_image();
    assert!(image.topics[0]
        .1
        .partitions
        .iter()
        .all(|p| p.records.is_empty()));
    assert_eq!(recovered.state.describe_all(), state.describe_all());
}

/// A clean stop lets a running checkpoint end: the next start finds its records in segments,
/// not a log to replay into memory.
#[test]
fn finishing_the_journal_lets_a_running_checkpoint_end() {
    use broker_core::Command;
    let tmp = tempfile::tempdir().unwrap();
    let settings = crate::JournalSettings {
        fsync: crate::Fsync::Never,
        fsync_interval: std::time::Duration::from_millis(10),
        snapshot_log_bytes: 1,
        segment_bytes: 1 << 30,
        held_log_bytes: None,
    };
    let (mut state, journal) = journal_with_topic(tmp.path(), settings, 1);
    for _ in 0..20_000 {
        let publish = Command::Publish {
            topic: "t".into(),
            partition: 0,
            payload: vec![7u8; 100].into(),
        };
        journal.apply(&mut state, 1, publish).result.unwrap();
    }
    // The first checkpoint starts, covering every record, and is still running.
    journal.maybe_checkpoint(&mut state);
    journal.finish();
    drop(journal);
    let recovered = recover(tmp.path()).unwrap().state;
    let image = recovered.to_image();
    let partition = &image.topics[0].1.partitions[0];
    assert_eq!(partition.records.len(), 0, "records replayed into memory");
    assert_eq!(
        recovered.describe_all().topics[0].partitions[0].records,
        20_000
    );
}

/// A log of format 4, which did not say which offsets a group stored, recovers with every
/// offset of every group counted as stored, the groups the log created included (as those of
/// a format 4 snapshot are); a log of this format keeps what it says.
#[test]
fn groups_of_a_format_4_log_count_every_offset_as_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let live = scripted(tmp.path());
    let segment = live.writer_path();
    drop(live);
    let current = recover(tmp.path()).unwrap().state;
    assert_eq!(
        current.stored_offsets("t", "r").unwrap(),
        [None, None, None],
        "group r never consumed"
    );
    // The same log as a release of format 4 wrote it: its entries are the same, its header
    // says 4 (with the header's checksum after it).
    let mut bytes = fs::read(&segment).unwrap();
    bytes[8..12].copy_from_slice(&4u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..24]);
    bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    fs::write(&segment, &bytes).unwrap();
    let recovered = recover(tmp.path()).unwrap();
    assert_eq!(recovered.migrated_from, Some(4));
    for group in ["r", "g"] {
        let stored = recovered.state.stored_offsets("t", group).unwrap();
        assert!(stored.iter().all(Option::is_some), "{group}: {stored:?}");
    }
    // Migrated: a checkpoint of this format, then a group that never consumes. A segment of
    // format 4 that the checkpoint covers, left behind, changes nothing at the next start.
    let old_segment = fs::read(&segment).unwrap();
    let mut live = Live::new(tmp.path());
    live.run(Command::Join {
        topic: "t".into(),
        group: "late".into(),
        member: "l".into(),
        assignor: None,
        settings: Vec::new(),
    });
    live.checkpoint(1 << 20);
    drop(live);
    fs::write(&segment, &old_segment).unwrap();
    let restarted = recover(tmp.path()).unwrap().state;
    assert_eq!(
        restarted.stored_offsets("t", "late").unwrap(),
        [None, None, None]
    );
    assert!(restarted
        .stored_offsets("t", "r")
        .unwrap()
        .iter()
        .all(Option::is_some));
}

/// A command of [`disk_command`]'s history, or now and then an idempotent producer's batch
/// (sent again at times, as after a lost answer), or a keyed publish to a chosen partition.
fn journal_command(rng: &mut Rng, step: u64, sequences: &mut [u64; 2]) -> Command {
    match rng.next(8) {
        0 => {
            let partition = rng.next(2) as usize;
            let again = rng.next(3) == 0 && sequences[partition] >= 2;
            if !again {
                sequences[partition] += 2;
            }
            Command::PublishIdempotent {
                topic: "limits".into(),
                producer: 7,
                batches: vec![broker_core::PartitionBatch {
                    partition: partition as i32,
                    sequence: sequences[partition] - 2,
                    records: (0..2)
                        .map(|i| broker_core::PublishRecord {
                            partition: None,
                            key: Some(Bytes::from(format!("idem {step}"))),
                            payload: Bytes::from(format!("idempotent {step}.{i}")),
                            headers: Vec::new(),
                            timestamp_ms: None,
                        })
                        .collect(),
                }],
            }
        }
        1 => Command::PublishKeyed {
            topic: "t".into(),
            key: Some(Bytes::from(format!("key {}", rng.next(5)))),
            payload: Bytes::from(format!("keyed {step}")),
        },
        2 => publish("aged", rng.next(2) as i32, &format!("single {step}")),
        _ => disk_command(rng, step),
    }
}

/// Histories applied through the journal (with `batch`, whose entries hold only where their
/// records went, and with `always`) recover to the state they left: from the last snapshot and
/// the records written after it, then again after a start that keeps those records and more
/// history.
#[test]
fn histories_through_the_journal_recover_from_the_records_written_after_the_checkpoint() {
    for (seed, fsync) in (1..=8u64).zip([crate::Fsync::Batch, crate::Fsync::Always].repeat(4)) {
        let tmp = tempfile::tempdir().unwrap();
        let settings = crate::JournalSettings {
            fsync,
            fsync_interval: std::time::Duration::from_millis(5),
            snapshot_log_bytes: 6 * 1024,
            segment_bytes: 600,
            held_log_bytes: None,
        };
        let mut memory = BrokerState::new(CAPACITY).unwrap();
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut sequences = [0; 2];
        let mut now = 1;
        let mut placed_entries = 0;
        for round in 0..3u64 {
            let storage = crate::Storage::open(tmp.path(), CAPACITY).unwrap();
            if round > 0 {
                assert!(storage.recovery().replayed > 0, "seed {seed} round {round}");
            }
            let (mut state, journal) = storage.start(settings, |state| state).unwrap();
            assert_eq!(
                state.describe_all(),
                memory.describe_all(),
                "seed {seed} round {round}: recovered"
            );
            let setup = if round == 0 { disk_setup() } else { Vec::new() };
            let history = (0..200).map(|step| {
                let step = round * 1000 + step;
                journal_command(&mut rng, step, &mut sequences)
            });
            let commands: Vec<Command> = setup.into_iter().chain(history).collect();
            let mut last = None;
            for command in commands {
                now += 1;
                let expected = memory.apply_at(now, command.clone());
                placed_entries += u64::from(command.largest_record().is_some());
                let applied = journal.apply(&mut state, now, command.clone());
                assert_eq!(
                    applied.result,
                    expected.map_err(crate::JournalError::Broker),
                    "seed {seed} round {round}: {command:?}"
                );
                last = applied.entry.or(last);
                journal.maybe_checkpoint(&mut state);
            }
            // An entry after the last checkpoint, whenever that one ran: the next start replays
            // it (a checkpoint that came with the round's last command would leave none).
            now += 1;
            let closing = publish("t", 0, &format!("closing {round}"));
            let expected = memory.apply_at(now, closing.clone());
            let applied = journal.apply(&mut state, now, closing);
            assert_eq!(
                applied.result,
                expected.map_err(crate::JournalError::Broker)
            );
            last = applied.entry.or(last);
            if let Some(last) = last {
                futures::executor::block_on(journal.durable(last)).unwrap();
            }
            journal.finish();
        }
        assert!(
            placed_entries > 100,
            "seed {seed}: {placed_entries} publishes"
        );
        let recovered = recover(tmp.path()).unwrap().state;
        assert_eq!(
            recovered.describe_all(),
            memory.describe_all(),
            "seed {seed}"
        );
        assert_eq!(recovered.check_consistency(), Ok(()), "seed {seed}");
    }
}

/// A journal syncing by `fsync` (every 10 ms with `batch`) that takes no checkpoint, with
/// record segments of 64 KiB.
fn without_checkpoints(fsync: crate::Fsync) -> crate::JournalSettings {
    crate::JournalSettings {
        fsync,
        fsync_interval: std::time::Duration::from_millis(10),
        snapshot_log_bytes: 1 << 30,
        segment_bytes: 64 * 1024,
        held_log_bytes: None,
    }
}

/// Publishes `count` records of 1,000 bytes through a journal on `dir` syncing by `fsync`
/// (one topic `t` of one partition, no checkpoint), waits until they are durable and stops it
/// cleanly.
fn publish_through_journal(dir: &Path, count: usize, fsync: crate::Fsync) {
    let settings = without_checkpoints(fsync);
    let (mut state, journal) = journal_with_topic(dir, settings, 1);
    let mut last = None;
    for n in 0..count {
        let publish = Command::Publish {
            topic: "t".into(),
            partition: 0,
            payload: vec![(n % 251) as u8; 1000].into(),
        };
        last = journal.apply(&mut state, 2, publish).entry;
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    journal.finish();
}

fn log_bytes(dir: &Path) -> u64 {
    segment_files(dir)
        .iter()
        .map(|file| fs::metadata(file).unwrap().len())
        .sum()
}

/// With `--fsync always`, a publish's entry keeps its records, so that a group commit syncs
/// the log alone: recovery takes them from the log, and keeps those already in their segments.
#[test]
fn with_fsync_always_a_published_record_stays_in_its_entry() {
    let tmp = tempfile::tempdir().unwrap();
    publish_through_journal(tmp.path(), 200, crate::Fsync::Always);
    assert!(log_bytes(tmp.path()) > 200_000);
    let recovered = recover(tmp.path()).unwrap();
    assert_eq!(
        recovered.state.describe_all().topics[0].partitions[0].records,
        200
    );
    assert_eq!(recovered.torn, None);
}

/// With `--fsync batch` (and `never`), each record is written once: to its partition's
/// segment. Its log entry says only where it went, and recovery puts it back from there.
#[test]
fn a_published_record_is_written_to_its_segment_only() {
    let tmp = tempfile::tempdir().unwrap();
    publish_through_journal(tmp.path(), 200, crate::Fsync::Batch);
    // 200,000 bytes of payload; the log holds a few dozen bytes per entry.
    let logged = log_bytes(tmp.path());
    assert!(logged < 20_000, "{logged} bytes of log");
    let recovered = recover(tmp.path()).unwrap();
    assert_eq!(recovered.replayed, 201);
    let description = recovered.state.describe_all();
    assert_eq!(description.topics[0].partitions[0].records, 200);
    let records = recovered
        .state
        .clone()
        .read("t", 0, 0, 1000, None)
        .unwrap()
        .records;
    assert_eq!(records.len(), 200);
    for (n, record) in records.iter().enumerate() {
        assert_eq!(record.payload, vec![(n % 251) as u8; 1000], "record {n}");
    }
    // The start keeps those records where they are (with their index written again), and a
    // second recovery reads them from the checkpoint it took.
    let settings = without_checkpoints(crate::Fsync::Batch);
    let segments_before = record_files(tmp.path());
    let (_, journal) = crate::Storage::open(tmp.path(), CAPACITY)
        .unwrap()
        .start(settings, |state| state)
        .unwrap();
    journal.finish();
    drop(journal);
    assert_eq!(record_files(tmp.path()), segments_before);
    let again = recover(tmp.path()).unwrap();
    assert_eq!(again.replayed, 0);
    assert_eq!(again.state.describe_all(), description);
    let read_back = again.state.clone().read("t", 0, 0, 1000, None).unwrap();
    assert_eq!(read_back.records, records);
}

/// With `batch`, the periodic fsyncs run on their own thread, not on the one that writes: entries
/// written while one runs are answered without waiting for it, and every sync still ends up
/// covering them.
#[test]
fn with_fsync_batch_the_periodic_syncs_run_beside_the_writes() {
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let (mut state, journal) =
        journal_with_topic(tmp.path(), without_checkpoints(crate::Fsync::Batch), 16);
    let syncers = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&syncers);
    journal.observe_fsyncs(move |_| {
        let name = std::thread::current().name().map(str::to_owned);
        seen.lock().unwrap().push(name);
    });
    let on_the_syncer = || {
        syncers
            .lock()
            .unwrap()
            .iter()
            .filter(|name| name.as_deref() == Some("broker-log-sync"))
            .count()
    };
    let mut last = None;
    let mut published = 0;
    // Rounds of 100 publishes until three syncs ran on the syncer (a busy machine may take a
    // few more rounds), at most 100 rounds.
    for round in 0..100 {
        if on_the_syncer() >= 3 {
            break;
        }
        for n in 0..100 {
            let publish = Command::Publish {
                topic: "t".into(),
                partition: n % 16,
                payload: vec![round as u8; 1000].into(),
            };
            last = journal.apply(&mut state, 2, publish).entry.or(last);
            published += 1;
        }
        futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
        // Past the 10 ms interval: the next write hands a sync to the syncer.
        std::thread::sleep(std::time::Duration::from_millis(15));
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    journal.finish();
    drop(journal);
    assert!(on_the_syncer() >= 3, "{:?}", syncers.lock().unwrap());
    let recovered = recover(tmp.path()).unwrap();
    let partitions = &recovered.state.describe_all().topics[0].partitions;
    assert_eq!(partitions.iter().map(|p| p.records).sum::<u64>(), published);
}

/// A log entry whose records did not reach the disk (a power loss between syncs) ends the
/// log like a torn entry when it is in the last log segment: it and what follows are cut.
#[test]
fn entries_whose_records_did_not_reach_the_disk_are_cut_like_a_torn_tail() {
    let tmp = tempfile::tempdir().unwrap();
    publish_through_journal(tmp.path(), 100, crate::Fsync::Batch);
    // The segment holding the records from offset 70 on loses them.
    let files = record_files(tmp.path());
    let data = files
        .iter()
        .filter(|file| file.extension().is_some_and(|ext| ext == "rec"))
        .max()
        .unwrap();
    let base: i64 = data.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    assert!(base < 70, "segment from {base}");
    let per_record = RECORD_OVERHEAD_BYTES - 24 + 1000;
    let keep = 32 + (70 - base) as u64 * per_record;
    let file = fs::OpenOptions::new().write(true).open(data).unwrap();
    file.set_len(keep).unwrap();
    // Where record 70 started, a header announcing 4 GiB: read as the end of what the
    // segment holds, without reading (or allocating) past the file.
    std::os::unix::fs::FileExt::write_all_at(&file, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1], keep)
        .unwrap();
    drop(file);
    let recovered = recover(tmp.path()).unwrap();
    assert!(recovered.torn.is_some());
    assert_eq!(
        recovered.state.describe_all().topics[0].partitions[0].records,
        70
    );
}

/// Records written to their segment whose log entry did not make it (the process died between
/// the two writes) were never acknowledged: the start cuts them, and their offsets go to the
/// next records.
#[test]
fn records_whose_entry_never_reached_the_log_are_cut_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    publish_through_journal(tmp.path(), 10, crate::Fsync::Batch);
    // The last entry torn: the tenth record is in its segment, not in the log.
    let segment = segment_files(tmp.path()).pop().unwrap();
    let len = fs::metadata(&segment).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    let settings = without_checkpoints(crate::Fsync::Batch);
    let storage = crate::Storage::open(tmp.path(), CAPACITY).unwrap();
    assert!(storage.recovery().torn.is_some());
    let (mut state, journal) = storage.start(settings, |state| state).unwrap();
    let publish = Command::Publish {
        topic: "t".into(),
        partition: 0,
        payload: Bytes::from_static(b"after the crash"),
    };
    let applied = journal.apply(&mut state, 3, publish);
    assert_eq!(applied.result, Ok(broker_core::Outcome::Published(9)));
    futures::executor::block_on(journal.durable(applied.entry.unwrap())).unwrap();
    journal.finish();
    drop(journal);
    let recovered = recover(tmp.path()).unwrap().state;
    let records = recovered.read("t", 0, 8, 10, None).unwrap().records;
    let payloads: Vec<Bytes> = records.into_iter().map(|record| record.payload).collect();
    assert_eq!(
        payloads,
        [
            Bytes::from(vec![8u8; 1000]),
            Bytes::from_static(b"after the crash")
        ]
    );
}

/// A checkpoint removes the segments of topics deleted before its image, and keeps those the
/// flusher wrote meanwhile for topics and partitions created after it.
#[test]
fn a_checkpoint_keeps_the_segments_of_topics_and_partitions_newer_than_its_image() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = on_disk(tmp.path(), 5);
    live.run(Command::Create {
        topic: "gone".into(),
        partition_count: 1,
        key_hash: KeyHash::Murmur2,
        settings: Vec::new(),
    });
    live.run(publish("gone", 0, "soon deleted"));
    live.checkpoint(128);
    live.run(Command::DeleteTopic {
        topic: "gone".into(),
    });
    let image = live.state.to_image();
    let topic = &image.topics[0].1;
    let record = broker_core::image::RecordImage {
        key: None,
        payload: Bytes::from_static(b"written after the image"),
        headers: Vec::new(),
        timestamp_ms: 1,
    };
    let newer_topic = LogId {
        topic: image.next_topic_id,
        partition: 0,
    };
    let newer_partition = LogId {
        topic: topic.id,
        partition: topic.partitions.len() as u32,
    };
    for log in [newer_topic, newer_partition] {
        live.records
            .append(log, 0, std::slice::from_ref(&record), 1 << 20)
            .unwrap();
    }
    let dir_of = |log: LogId| {
        tmp.path()
            .join("records")
            .join(format!("{:020}-{:010}", log.topic, log.partition))
    };
    let deleted = dir_of(LogId {
        topic: image.next_topic_id - 1,
        partition: 0,
    });
    assert!(deleted.exists());
    live.checkpoint(128);
    assert!(!deleted.exists(), "the deleted topic's records stay");
    for log in [newer_topic, newer_partition] {
        assert!(dir_of(log).exists(), "{log:?} removed");
        assert_eq!(live.records.end(log), Some(1), "{log:?}");
    }
}

/// Segment files a checkpoint retired but did not remove (the process stopped in between) are
/// not taken for the records written past the catalog: those continue the partition where the
/// snapshot says it ends, and the leftovers are removed at start.
#[test]
fn segments_a_checkpoint_retired_but_did_not_remove_are_not_taken_for_a_tail() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = Live::new(tmp.path());
    live.run(Command::Create {
        topic: "r".into(),
        partition_count: 1,
        key_hash: KeyHash::Murmur2,
        settings: vec![
            broker_core::TopicSetting::Retention(broker_core::Retention::Limits),
            broker_core::TopicSetting::MaxRecords(5),
        ],
    });
    let mut stash = BTreeMap::new();
    for round in 0..4 {
        for i in 0..5 {
            live.run(publish("r", 0, &format!("record {round}.{i}")));
        }
        stash.extend(every_file(&tmp.path().join("records")));
        live.checkpoint(64);
    }
    // The retired segments come back, as if the last checkpoint stopped before removing them.
    let mut restored = 0;
    for (path, bytes) in &stash {
        if !path.exists() {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, bytes).unwrap();
            restored += 1;
        }
    }
    assert!(restored >= 4, "{restored} files restored");
    // Records past the catalog, in a segment of their own, as the flusher writes them.
    for i in 0..5 {
        live.run(publish("r", 0, &format!("after {i}")));
    }
    let image = live.state.to_image();
    let topic = &image.topics[0].1;
    let log = LogId {
        topic: topic.id,
        partition: 0,
    };
    let partition = &topic.partitions[0];
    live.records
        .append(log, partition.cold_end, &partition.records, 64)
        .unwrap();
    let expected = live.describe();
    drop(live);
    let recovered = recover(tmp.path()).unwrap();
    assert_eq!(recovered.state.describe_all(), expected);
    for path in stash.keys() {
        let base: i64 = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        assert!(base >= 15 || !path.exists(), "{} left", path.display());
    }
    let again = recover(tmp.path()).unwrap();
    assert_eq!(again.state.describe_all(), expected);
    let records = again.state.clone().read("r", 0, 0, 100, None).unwrap();
    assert_eq!(records.records.len(), 5);
}

/// A topic deleted after the last checkpoint keeps the segments the checkpoint names until the
/// next one retires them: recovery removes only what it wrote after, so that a crash before
/// that checkpoint still finds every file the snapshot names.
#[test]
fn recovery_keeps_the_named_segments_of_a_topic_deleted_since_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let mut live = on_disk(tmp.path(), 5);
    let image = live.state.to_image();
    let topic = &image.topics[0].1;
    let log = LogId {
        topic: topic.id,
        partition: 0,
    };
    let named = record_files(tmp.path());
    assert!(!named.is_empty());
    // A record past the catalog in a segment of its own, as the flusher starts one.
    live.run(publish("d", 0, "after the checkpoint"));
    let image = live.state.to_image();
    let partition = &image.topics[0].1.partitions[0];
    live.records
        .append(log, partition.cold_end, &partition.records, 1)
        .unwrap();
    assert!(record_files(tmp.path()).len() > named.len());
    live.run(Command::DeleteTopic { topic: "d".into() });
    drop(live);
    for _ in 0..2 {
        let recovered = recover(tmp.path()).unwrap();
        assert!(recovered.state.describe_all().topics.is_empty());
        assert_eq!(record_files(tmp.path()), named);
    }
}

/// More partitions written than the flusher keeps segments open for: the least recently
/// written are closed and their records still synced before the log, and every record comes
/// back.
#[test]
fn more_partitions_than_open_segments_recover_every_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut state, journal) = crate::Storage::open(tmp.path(), CAPACITY)
        .unwrap()
        .start(without_checkpoints(crate::Fsync::Batch), |state| state)
        .unwrap();
    let mut memory = BrokerState::new(CAPACITY).unwrap();
    let mut commands = Vec::new();
    for topic in ["a", "b"] {
        commands.push(Command::Create {
            topic: topic.into(),
            partition_count: 40,
            key_hash: KeyHash::Murmur2,
            settings: vec![broker_core::TopicSetting::Retention(
                broker_core::Retention::Limits,
            )],
        });
    }
    for round in 0..3 {
        for partition in 0..80 {
            let topic = if partition < 40 { "a" } else { "b" };
            commands.push(publish(
                topic,
                partition % 40,
                &format!("{round}.{partition}"),
            ));
        }
    }
    let mut last = None;
    for command in commands {
        let expected = memory.apply_at(2, command.clone());
        let applied = journal.apply(&mut state, 2, command);
        assert_eq!(
            applied.result,
            expected.map_err(crate::JournalError::Broker)
        );
        last = applied.entry.or(last);
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    journal.finish();
    drop(journal);
    let recovered = recover(tmp.path()).unwrap();
    assert_eq!(recovered.torn, None);
    assert_eq!(recovered.state.describe_all(), memory.describe_all());
}

/// At start, a record directory the checkpoint names no segment in goes whole when it keeps no
/// record: empty (made just before a stop), holding an index alone, or holding only records
/// whose entries never reached the log.
#[test]
fn record_directories_left_without_a_record_are_removed_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut state, journal) =
        journal_with_topic(tmp.path(), without_checkpoints(crate::Fsync::Batch), 2);
    let mut last = None;
    for (partition, payload) in [(0, "a"), (0, "b"), (1, "only in its segment")] {
        last = journal
            .apply(&mut state, 2, publish("t", partition, payload))
            .entry;
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    journal.finish();
    drop(journal);
    let topic = state.to_image().topics[0].1.id;
    let directory = |topic: u64, partition: u32| {
        tmp.path()
            .join("records")
            .join(crate::records::log_dir_name(LogId { topic, partition }))
    };
    assert!(directory(topic, 1).is_dir());
    // The last entry (partition 1's publish) torn.
    let log = segment_files(tmp.path()).pop().unwrap();
    let len = fs::metadata(&log).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 3)
        .unwrap();
    fs::create_dir(directory(topic + 10, 0)).unwrap();
    fs::create_dir(directory(topic + 11, 0)).unwrap();
    fs::write(
        directory(topic + 11, 0).join(format!("{:020}.idx", 0)),
        [0u8; 32],
    )
    .unwrap();
    let (recovered, journal) = crate::Storage::open(tmp.path(), CAPACITY)
        .unwrap()
        .start(without_checkpoints(crate::Fsync::Batch), |state| state)
        .unwrap();
    journal.finish();
    for (topic, partition) in [(topic + 10, 0), (topic + 11, 0), (topic, 1)] {
        assert!(
            !directory(topic, partition).exists(),
            "{}",
            directory(topic, partition).display()
        );
    }
    assert!(directory(topic, 0).is_dir());
    assert_eq!(
        recovered.read("t", 0, 0, 10, None).unwrap().records.len(),
        2
    );
    assert_eq!(recovered.end_offset("t", 1), Ok(0));
}

/// A power loss can take the index entries written after the last checkpoint (`.idx` files are
/// synced at checkpoints only). Recovery writes them again from the records, and nothing reads
/// the segment by its longer catalog entry before: the checks made before the start (the
/// largest record retained) answer, and the start then serves every record.
#[test]
fn index_entries_a_power_loss_took_are_read_by_nothing_before_they_are_written_again() {
    let tmp = tempfile::tempdir().unwrap();
    let settings = without_checkpoints(crate::Fsync::Batch);
    publish_through_journal(tmp.path(), 10, crate::Fsync::Batch);
    // The start checkpoints the ten records replayed: their segment is cataloged.
    let (mut state, journal) = crate::Storage::open(tmp.path(), CAPACITY)
        .unwrap()
        .start(settings, |state| state)
        .unwrap();
    let mut last = None;
    for n in 10..15u8 {
        let publish = Command::Publish {
            topic: "t".into(),
            partition: 0,
            payload: vec![n; 1000].into(),
        };
        last = journal.apply(&mut state, 3, publish).entry;
    }
    futures::executor::block_on(journal.durable(last.unwrap())).unwrap();
    journal.finish();
    drop(journal);
    let index = record_files(tmp.path())
        .into_iter()
        .find(|path| path.extension().is_some_and(|extension| extension == "idx"))
        .unwrap();
    assert_eq!(fs::metadata(&index).unwrap().len(), 32 + 15 * 24);
    // The power loss: the entries of the five records written after the checkpoint are gone.
    fs::OpenOptions::new()
        .write(true)
        .open(&index)
        .unwrap()
        .set_len(32 + 10 * 24)
        .unwrap();
    let storage = crate::Storage::open(tmp.path(), CAPACITY).unwrap();
    assert_eq!(storage.recovery().state.largest_retained_record(), Ok(1000));
    let (state, journal) = storage.start(settings, |state| state).unwrap();
    journal.finish();
    assert_eq!(fs::metadata(&index).unwrap().len(), 32 + 15 * 24);
    let payloads: Vec<Bytes> = state
        .read("t", 0, 0, 20, None)
        .unwrap()
        .records
        .into_iter()
        .map(|record| record.payload)
        .collect();
    let expected: Vec<Bytes> = (0..15u8)
        .map(|n| Bytes::from(vec![if n < 10 { n % 251 } else { n }; 1000]))
        .collect();
    assert_eq!(payloads, expected);
}

/// A segment file recovery cannot read (an I/O error, here a directory in its place) refuses
/// the start, naming it, rather than being taken for a leftover and removed.
#[test]
fn a_segment_file_that_cannot_be_read_refuses_the_start_and_stays() {
    let tmp = tempfile::tempdir().unwrap();
    publish_through_journal(tmp.path(), 3, crate::Fsync::Batch);
    let log_dir = record_files(tmp.path())[0].parent().unwrap().to_path_buf();
    let unreadable = log_dir.join(format!("{:020}.rec", 3));
    fs::create_dir(&unreadable).unwrap();
    let before = every_file(tmp.path());
    let refused = crate::Storage::open(tmp.path(), CAPACITY).err().unwrap();
    assert!(
        refused
            .to_string()
            .contains(&unreadable.display().to_string()),
        "{refused}"
    );
    assert!(unreadable.is_dir());
    assert_eq!(every_file(tmp.path()), before);
}

/// Writing to more partitions than the flusher keeps open closes and reopens their segments
/// over and over: what they hold unsynced is remembered once per segment, however often it is
/// closed, and every record written is durable once the files taken are synced.
#[test]
fn segments_closed_again_and_again_are_remembered_once() {
    use broker_core::cold::{Appended, ColdStore};
    use broker_core::image::RecordImage;
    let tmp = tempfile::tempdir().unwrap();
    let store = RecordStore::open(tmp.path(), Vec::new()).unwrap();
    let record = |n: i64| RecordImage {
        key: None,
        payload: Bytes::from(n.to_string()),
        headers: Vec::new(),
        timestamp_ms: n,
    };
    let logs = 100u32;
    let mut open = crate::records::OpenSegments::default();
    for round in 0..5i64 {
        for partition in 0..logs {
            let appended = vec![vec![Appended {
                log: LogId {
                    topic: 1,
                    partition,
                },
                offset: round,
                record: record(round),
            }]];
            store.write(&appended, 1 << 20, &mut open).unwrap();
        }
        assert!(
            open.closed_len() <= logs as usize,
            "round {round}: {} closed",
            open.closed_len()
        );
    }
    let (files, catalog) = store.take_written(&mut open);
    files.sync().unwrap();
    assert_eq!(catalog.len(), logs as usize);
    for partition in 0..logs {
        let log = LogId {
            topic: 1,
            partition,
        };
        assert_eq!(
            store.read(log, 0..5, None).unwrap(),
            (0..5).map(record).collect::<Vec<_>>()
        );
    }
}

/// A log that delivers a record a second time past its group's maximum of one delivery: the
/// first poll at its time, a second one 100 ms later, past the group's acknowledgement timeout
/// and before any tick. Applied live under `revision`.
fn poll_past_the_timeout(path: &Path, revision: broker_core::Revision) -> Live {
    let mut live = Live::new(path);
    live.state.set_revision(revision);
    live.run(Command::Create {
        topic: "t".into(),
        partition_count: 1,
        key_hash: KeyHash::default(),
        settings: Vec::new(),
    });
    live.run(Command::Join {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        assignor: None,
        settings: vec![
            broker_core::GroupSetting::MaxDeliveries(1),
            broker_core::GroupSetting::DeadLetter(broker_core::TopicName::new("dlq").unwrap()),
            broker_core::GroupSetting::AckTimeoutMs(10),
        ],
    });
    live.run(publish("t", 0, "a"));
    let poll = Command::Poll {
        topic: "t".into(),
        group: "g".into(),
        member: "m".into(),
        max_records: 1,
        max_bytes: None,
    };
    live.run(poll.clone());
    live.now += 100;
    live.run(poll);
    live
}

/// Rewrites the format version in the header of the log segment at `path` (and its checksum).
fn set_segment_format(path: &Path, version: u32) {
    let mut bytes = fs::read(path).unwrap();
    bytes[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32fast::hash(&bytes[..24]);
    bytes[24..28].copy_from_slice(&crc.to_le_bytes());
    fs::write(path, &bytes).unwrap();
}

#[test]
fn each_log_segment_replays_under_the_rules_of_its_format() {
    use broker_core::Revision;
    let original = tempfile::tempdir().unwrap();
    let live = poll_past_the_timeout(original.path(), Revision::Original);
    let (segment, as_applied) = (live.writer_path(), live.describe());
    drop(live);
    // Format 6: written by a release before revisions.
    set_segment_format(&segment, 6);
    let recovered = recover(original.path()).unwrap();
    assert_eq!(recovered.state.describe_all(), as_applied);
    assert_eq!(recovered.migrated_from, Some(6));
    assert_eq!(recovered.state.revision(), Revision::NEWEST);
    // The record went out a second time: no dead-letter topic.
    assert!(!recovered.state.holds_topic("dlq"));

    let bounded = tempfile::tempdir().unwrap();
    let live = poll_past_the_timeout(bounded.path(), Revision::Bounded);
    let as_applied = live.describe();
    drop(live);
    let recovered = recover(bounded.path()).unwrap();
    assert_eq!(recovered.state.describe_all(), as_applied);
    assert_eq!(recovered.migrated_from, None);
    assert!(recovered.state.holds_topic("dlq"));
}

#[test]
fn formats_map_to_the_revisions_they_were_written_under() {
    use broker_core::Revision;
    for version in crate::OLDEST_FORMAT_VERSION..=6 {
        assert_eq!(crate::revision_of_format(version), Revision::Original);
    }
    assert_eq!(crate::revision_of_format(FORMAT_VERSION), Revision::NEWEST);
}
