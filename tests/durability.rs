//! Durability against the real `broker-server` with `--data-dir`: crash rounds with `kill -9` in
//! the middle of a concurrent workload (every acknowledged publish, ack and commit must be there
//! after the restart, and offsets continue without reuse), the same while records move to
//! segment files, roll and leave by retention, groups are reset, partitions purged and topics
//! deleted, recovery equivalence (`describe()` before a restart equals `describe()` after it,
//! graceful or `kill -9`), the formats of earlier releases, and the lock that keeps a second
//! server off a data directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use broker_client::{Client, PartitionBatch, PublishRecord};
use broker_testkit::files::every_file;
use broker_testkit::{process::refused_start, process::ServerProcess, rng::Rng};
use tokio::sync::watch;

const TOPIC: &str = "t";
const PARTITIONS: i32 = 4;
/// How long a test waits for something that should happen quickly before it fails.
const PATIENCE: Duration = Duration::from_secs(20);

fn start(dir: &Path, fsync: &str) -> ServerProcess {
    start_with(dir, fsync, "16384")
}

/// A server on `dir` writing a snapshot after every `snapshot_bytes` bytes of log.
fn start_with(dir: &Path, fsync: &str, snapshot_bytes: &str) -> ServerProcess {
    ServerProcess::start(&[
        "--data-dir",
        dir.to_str().unwrap(),
        "--fsync",
        fsync,
        "--capacity",
        "1000",
        // Small, so that checkpoints move records to segment files during the tests, and the
        // segments roll.
        "--snapshot-log-bytes",
        snapshot_bytes,
        "--segment-bytes",
        "4096",
    ])
}

async fn connect(server: &ServerProcess) -> Client {
    Client::connect(server.addr_string())
        .await
        .expect("connect to broker-server")
}

/// What the workload was told: acknowledged operations only.
#[derive(Debug, Default)]
struct Model {
    /// `(partition, offset)` to payload of every acknowledged publish.
    published: HashMap<(i32, i64), String>,
    /// Per partition, the highest offset an acknowledged `ack` of group "acks" committed past.
    acked: BTreeMap<i32, i64>,
    /// Per partition, the highest offset an acknowledged `commit` of group "fetches" stored.
    committed: BTreeMap<i32, i64>,
    /// Per partition, the highest offset ever acknowledged to a publisher.
    max_offset: BTreeMap<i32, i64>,
}

impl Model {
    /// The offsets of the model, without the payloads, to check without holding its lock.
    fn copy_of_progress(&self) -> Model {
        Model {
            published: HashMap::new(),
            acked: self.acked.clone(),
            committed: self.committed.clone(),
            max_offset: self.max_offset.clone(),
        }
    }
}

type Shared = Arc<Mutex<Model>>;

async fn publisher(client: Client, model: Shared, progress: watch::Sender<u64>, id: String) {
    for i in 0u64.. {
        let partition = (i % PARTITIONS as u64) as i32;
        let payload = format!("{id}-{i}");
        let Ok(offset) = client.publish(TOPIC, partition, payload.clone()).await else {
            return;
        };
        if offset >= 0 {
            let mut model = model.lock().unwrap();
            assert!(
                model
                    .published
                    .insert((partition, offset), payload)
                    .is_none(),
                "offset {offset} of partition {partition} acknowledged twice"
            );
            let max = model.max_offset.entry(partition).or_insert(-1);
            *max = (*max).max(offset);
        }
        progress.send_modify(|n| *n += 1);
    }
}

/// Checks a delivered record against the model: an acknowledged offset keeps its payload.
fn check_record(model: &Shared, record: &broker_client::BrokerRecord) {
    let model = model.lock().unwrap();
    if let Some(payload) = model.published.get(&(record.partition, record.offset)) {
        assert_eq!(
            record.payload,
            payload.as_bytes(),
            "partition {} offset {} changed its payload",
            record.partition,
            record.offset
        );
    }
}

async fn acker(client: Client, model: Shared) {
    // Leaving first cancels the deliveries left in flight by the crash (restored with the
    // state), as a restarting consumer that lost them must.
    if client.leave(TOPIC, "acks", "a").await.is_err()
        || client.join(TOPIC, "acks", "a").await.is_err()
    {
        return;
    }
    loop {
        let Ok(records) = client.poll(TOPIC, "acks", "a", 4).await else {
            return;
        };
        for record in records {
            check_record(&model, &record);
            match client
                .ack(TOPIC, "acks", "a", record.partition, record.offset)
                .await
            {
                Ok(true) => {
                    let mut model = model.lock().unwrap();
                    let acked = model.acked.entry(record.partition).or_insert(-1);
                    *acked = (*acked).max(record.offset);
                }
                Ok(false) => panic!("ack of an in-flight delivery refused: {record:?}"),
                Err(_) => return,
            }
        }
        tokio::task::yield_now().await;
    }
}

async fn fetcher(client: Client, model: Shared) {
    if client.join(TOPIC, "fetches", "f").await.is_err() {
        return;
    }
    loop {
        let Ok(records) = client.fetch(TOPIC, "fetches", "f", 20).await else {
            return;
        };
        let mut reached = BTreeMap::new();
        for record in &records {
            check_record(&model, record);
            reached.insert(record.partition, record.offset + 1);
        }
        if client.commit(TOPIC, "fetches", "f", None).await.is_err() {
            return;
        }
        {
            let mut model = model.lock().unwrap();
            for (partition, offset) in reached {
                let committed = model.committed.entry(partition).or_insert(0);
                *committed = (*committed).max(offset);
            }
        }
        tokio::task::yield_now().await;
    }
}

/// Checks the restarted broker against everything acknowledged before the crash.
async fn check_after_restart(client: &Client, model: &Shared) {
    let model = model.lock().unwrap().copy_of_progress();
    for partition in 0..PARTITIONS {
        let end = client.end_offset(TOPIC, partition).await.unwrap();
        let max = model.max_offset.get(&partition).copied().unwrap_or(-1);
        assert!(
            end > max,
            "partition {partition}: end offset {end}, but {max} was acknowledged"
        );
        if let Some(&acked) = model.acked.get(&partition) {
            let committed = client.committed(TOPIC, "acks", partition).await.unwrap();
            assert!(
                committed > acked,
                "partition {partition}: group acks committed {committed}, but {acked} was acked"
            );
        }
        if let Some(&stored) = model.committed.get(&partition) {
            let committed = client.committed(TOPIC, "fetches", partition).await.unwrap();
            assert!(
                committed >= stored,
                "partition {partition}: group fetches committed {committed}, but {stored} was \
                 acknowledged"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_operations_survive_kill_9_at_varied_moments() {
    let dir = tempfile::tempdir().unwrap();
    let model: Shared = Arc::default();
    let started = Instant::now();
    // Kill after this many more acknowledged publishes in each round, and with this policy.
    let rounds = [
        (40, "always"),
        (300, "batch"),
        (7, "never"),
        (150, "always"),
        (600, "never"),
        (1, "batch"),
        (90, "always"),
    ];
    for (round, (publishes, fsync)) in rounds.into_iter().enumerate() {
        let mut server = start(dir.path(), fsync);
        let client = connect(&server).await;
        if round == 0 {
            assert!(client.create(TOPIC, PARTITIONS).await.unwrap());
        } else {
            check_after_restart(&client, &model).await;
        }
        let (progress, mut published) = watch::channel(0u64);
        let mut tasks = Vec::new();
        for p in 0..3 {
            let client = connect(&server).await;
            tasks.push(tokio::spawn(publisher(
                client,
                Arc::clone(&model),
                progress.clone(),
                format!("r{round}p{p}"),
            )));
        }
        tasks.push(tokio::spawn(acker(
            connect(&server).await,
            Arc::clone(&model),
        )));
        tasks.push(tokio::spawn(fetcher(
            connect(&server).await,
            Arc::clone(&model),
        )));
        drop(progress);
        tokio::time::timeout(PATIENCE, published.wait_for(|&n| n >= publishes))
            .await
            .expect("the workload made no progress")
            .expect("every publisher stopped");
        // In the middle of the workload: publishes, polls, acks, fetches and commits in flight.
        server.kill();
        for task in tasks {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("a worker did not notice the crash")
                .expect("a worker panicked");
        }
    }
    let server = start(dir.path(), "always");
    let client = connect(&server).await;
    check_after_restart(&client, &model).await;
    // Offsets continue without reuse: a new publish lands after every acknowledged one.
    let published = model.lock().unwrap().published.len();
    let model = model.lock().unwrap().copy_of_progress();
    for partition in 0..PARTITIONS {
        let offset = client.publish(TOPIC, partition, "after").await.unwrap();
        let max = model.max_offset.get(&partition).copied().unwrap_or(-1);
        assert!(
            offset > max,
            "partition {partition}: offset {offset} reused (max {max})"
        );
    }
    assert!(published > 500, "only {published} publishes acknowledged");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
}

/// Random calls of every kind, errors included (they must change nothing).
async fn random_operations(client: &Client, seed: u64, count: usize) {
    let mut rng = Rng(seed);
    client
        .create_with(TOPIC, 3, broker_client::KeyHash::Fnv1a)
        .await
        .unwrap();
    for i in 0..count {
        let member = ["m1", "m2", "m3"][rng.below(3) as usize];
        let group = ["g1", "g2"][rng.below(2) as usize];
        let partition = rng.below(4) as i32 - 1;
        let offset = rng.below(12) as i64;
        // Group g2 gives a record two deliveries, then moves it to topic dlq. (No
        // acknowledgement timeout: a release by the clock is logged when the clock ticks, which
        // no answer waits for, so a describe may show one that a kill -9 then loses, and that
        // the clock makes again after the restart.)
        let settings = match group {
            "g2" => vec![
                broker_client::GroupSetting::MaxDeliveries(2),
                broker_client::GroupSetting::DeadLetter(
                    broker_client::TopicName::new("dlq").unwrap(),
                ),
            ],
            _ => Vec::new(),
        };
        let _ = match rng.below(15) {
            0..=2 => client
                .publish(TOPIC, partition, format!("x{i}"))
                .await
                .map(drop),
            3 => client
                .publish_keyed(TOPIC, Some(format!("k{}", i % 7).as_bytes()), "keyed")
                .await
                .map(drop),
            4 => client
                .join_group(TOPIC, group, member, None, &settings)
                .await
                .map(drop),
            5 => client.leave(TOPIC, group, member).await.map(drop),
            6 => client.poll(TOPIC, group, member, 2).await.map(drop),
            7 => client
                .ack(TOPIC, group, member, partition, offset)
                .await
                .map(drop),
            8 => client
                .retry(TOPIC, group, member, partition, offset)
                .await
                .map(drop),
            9 => client.fetch(TOPIC, group, member, 3).await.map(drop),
            10 => client.commit(TOPIC, group, member, None).await,
            11 => client
                .ack_and_poll(TOPIC, group, member, &[(partition, offset), (0, offset)], 2)
                .await
                .map(drop),
            12 | 13 => {
                // Delays that end during the run, and one that outlasts the restart.
                let delay = [0, 20, 3_600_000][rng.below(3) as usize];
                client
                    .retry_after(
                        TOPIC,
                        group,
                        member,
                        partition,
                        offset,
                        Duration::from_millis(delay),
                    )
                    .await
                    .map(drop)
            }
            _ => {
                client
                    .commit(
                        TOPIC,
                        group,
                        member,
                        Some(BTreeMap::from([(partition, offset)])),
                    )
                    .await
            }
        };
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_ack_and_poll_answers_its_acks_once_durable_and_they_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), "always");
    let client = connect(&server).await;
    client.create(TOPIC, 2).await.unwrap();
    client.publish(TOPIC, 0, "a").await.unwrap();
    client.join(TOPIC, "g", "m").await.unwrap();
    assert_eq!(client.poll(TOPIC, "g", "m", 1).await.unwrap().len(), 1);
    // The ack matches and is logged; the poll finds nothing and waits until it times out.
    let (acked, records) = client
        .ack_and_poll_wait(
            TOPIC,
            "g",
            "m",
            &[(0, 0), (1, 3)],
            4,
            Duration::from_millis(300),
        )
        .await
        .unwrap();
    assert_eq!(acked, [true, false]);
    assert!(records.is_empty());
    let before = client.describe().await.unwrap();
    drop(client);
    server.kill();
    let server = start(dir.path(), "always");
    let client = connect(&server).await;
    assert_eq!(client.describe().await.unwrap(), before);
    assert_eq!(client.committed(TOPIC, "g", 0).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_is_the_same_after_a_graceful_restart_and_after_kill_9() {
    let cases = [
        (7u64, true, "1000000"),
        (99, false, "1000000"),
        (12345, true, "2000"),
        (4242, false, "3000"),
    ];
    for (seed, graceful, snapshot_bytes) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut server = start_with(dir.path(), "always", snapshot_bytes);
        let client = connect(&server).await;
        random_operations(&client, seed, 400).await;
        let before = client.describe().await.unwrap();
        drop(client);
        if graceful {
            assert!(server.terminate(PATIENCE).success());
        } else {
            server.kill();
        }
        let server = start(dir.path(), "never");
        let after = connect(&server).await.describe().await.unwrap();
        assert_eq!(after, before, "seed {seed}, graceful {graceful}");
    }
}

#[test]
fn a_second_server_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = start(dir.path(), "always");
    let second = refused_start(
        &[
            "--capacity",
            "1000",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
        PATIENCE,
    );
    assert!(!second.status.success(), "the second server started");
    assert!(
        second.stdout.is_empty(),
        "it announced an address: {:?}",
        second.stdout
    );
    assert!(
        second.stderr.contains("is in use by another broker-server"),
        "unexpected message: {}",
        second.stderr
    );
}

/// Records are delivered whole: a restart whose payload limit is below a retained record would
/// let a poll reserve a record no answer can carry, so it is refused with the size needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_limit_below_a_retained_record_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    store_a_record_of_2000_bytes(data).await;
    refuse_a_payload_limit_of_1000_bytes(data);
    // With room for it, the record is there and is delivered.
    let server = ServerProcess::start(&["--data-dir", data, "--max-payload-bytes", "2000"]);
    let client = connect(&server).await;
    client.join(TOPIC, "g", "m").await.unwrap();
    let records = client.poll(TOPIC, "g", "m", 1).await.unwrap();
    assert_eq!(records[0].payload.len(), 2_000);
}

/// Starts a server on the data directory `data`, stores a record of 2,000 bytes and stops it.
async fn store_a_record_of_2000_bytes(data: &str) {
    let mut server = ServerProcess::start(&["--data-dir", data]);
    let client = connect(&server).await;
    client.create(TOPIC, 1).await.unwrap();
    client.publish(TOPIC, 0, vec![7u8; 2_000]).await.unwrap();
    server.terminate(PATIENCE);
}

/// Starts a server on `data` (which retains a record of 2,000 bytes) with a payload limit of
/// 1,000 bytes: it refuses, saying the limit it needs.
fn refuse_a_payload_limit_of_1000_bytes(data: &str) {
    let refusal = refused_start(
        &["--data-dir", data, "--max-payload-bytes", "1000"],
        PATIENCE,
    );
    assert!(!refusal.status.success(), "{}", refusal.stderr);
    assert!(
        refusal.stderr.contains("--max-payload-bytes 2000"),
        "{}",
        refusal.stderr
    );
}

/// What a crash leaves for recovery to cut (a torn last log entry, an unfinished snapshot) is
/// cut only once the start is certain: a start refused after the directory was read, here for
/// its payload limit, leaves every file as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_start_leaves_the_data_directory_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    store_a_record_of_2000_bytes(data).await;
    let last_segment = every_file(dir.path())
        .into_keys()
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .max()
        .unwrap();
    let mut log = std::fs::read(&last_segment).unwrap();
    // Less than an entry's header: a write the crash cut short.
    log.extend_from_slice(&[1, 2, 3]);
    std::fs::write(&last_segment, log).unwrap();
    std::fs::write(dir.path().join("snap.tmp"), b"half a snapshot").unwrap();
    let before = every_file(dir.path());
    refuse_a_payload_limit_of_1000_bytes(data);
    let after = every_file(dir.path());
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    for (path, bytes) in &before {
        assert!(after[path] == *bytes, "{} changed", path.display());
    }
    // Started for good, it cuts them.
    let _server = ServerProcess::start(&["--data-dir", data, "--max-payload-bytes", "2000"]);
    assert!(!dir.path().join("snap.tmp").exists());
}

/// A record at the payload limit that goes to a dead-letter topic gains headers that say where it
/// came from, and so passes the limit: the server still starts on its data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_record_at_the_payload_limit_does_not_stop_a_restart() {
    use broker_client::{GroupSetting, TopicName};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let args = ["--data-dir", data, "--max-payload-bytes", "1000"];
    let mut server = ServerProcess::start(&args);
    let client = connect(&server).await;
    client.create(TOPIC, 1).await.unwrap();
    let settings = [
        GroupSetting::MaxDeliveries(1),
        GroupSetting::DeadLetter(TopicName::new("dlq").unwrap()),
    ];
    client
        .join_group(TOPIC, "g", "m", None, &settings)
        .await
        .unwrap();
    client.publish(TOPIC, 0, vec![7u8; 1_000]).await.unwrap();
    assert_eq!(client.poll(TOPIC, "g", "m", 1).await.unwrap().len(), 1);
    assert!(client.retry(TOPIC, "g", "m", 0, 0).await.unwrap());
    drop(client);
    server.terminate(PATIENCE);
    let server = ServerProcess::start(&args);
    let client = connect(&server).await;
    client.join("dlq", "audit", "a").await.unwrap();
    let dead = client.fetch("dlq", "audit", "a", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].payload.len(), 1_000);
    assert!(dead[0].headers.len() >= 6, "{:?}", dead[0].headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_members_get_a_fresh_session_and_expire_without_their_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let flags = |dir: &Path| {
        vec![
            "--data-dir".to_owned(),
            dir.to_str().unwrap().to_owned(),
            "--session-timeout-ms".to_owned(),
            "1500".to_owned(),
        ]
    };
    let args = flags(dir.path());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = ServerProcess::start(&args);
    let client = connect(&server).await;
    client.create(TOPIC, 2).await.unwrap();
    assert_eq!(client.join(TOPIC, "g", "m1").await.unwrap(), vec![0, 1]);
    server.kill();

    let server = ServerProcess::start(&args);
    let client = connect(&server).await;
    let members = |description: broker_client::BrokerDescription| {
        description.topics[0].groups[0].members.len()
    };
    let started = Instant::now();
    assert_eq!(members(client.describe().await.unwrap()), 1);
    // Nobody speaks for m1: its restored session expires and the removal is logged.
    while members(client.describe().await.unwrap()) == 1 {
        assert!(
            started.elapsed() < PATIENCE,
            "the restored member never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "the restored member expired after {:?}, before a fresh session timeout",
        started.elapsed()
    );
    drop(client);
    drop(server);
    let server = ServerProcess::start(&args);
    let description = connect(&server).await.describe().await.unwrap();
    assert_eq!(members(description), 0, "the expiry was not logged");
}

/// A small filesystem (tmpfs) mounted for the full-disk test, unmounted on drop.
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    /// `None` when this process may not mount (the test then has nothing to check).
    fn mount(parent: &Path, size: &str) -> Option<SmallDisk> {
        let path = parent.join("small");
        std::fs::create_dir_all(&path).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        mounted.then_some(SmallDisk { path })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.path).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_changes_with_a_storage_error_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::mount(dir.path(), "512k") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let data = disk.path.join("data");
    let data_arg = data.to_str().unwrap().to_owned();
    let mut server = ServerProcess::start(&["--data-dir", &data_arg, "--capacity", "1000"]);
    let mut client = connect(&server).await;
    client.create(TOPIC, 1).await.unwrap();
    // Leave about 64 KiB free.
    let filler = disk.path.join("filler");
    std::fs::write(&filler, vec![0u8; 448 * 1024]).unwrap();
    let payload = "x".repeat(1000);
    let mut acknowledged = 0i64;
    let mut attempts = 0;
    let refusal = loop {
        attempts += 1;
        assert!(attempts < 200, "the disk never filled up");
        // The publish whose write fails first waits for the retry: give up on it after a while.
        let publish = client.publish(TOPIC, 0, payload.clone());
        match tokio::time::timeout(Duration::from_millis(500), publish).await {
            Ok(Ok(offset)) => {
                assert_eq!(offset, acknowledged);
                acknowledged += 1;
            }
            Ok(Err(error)) => break error,
            // Applied, waiting for its entry to be written. Answers keep request order, so
            // the connection's later answers wait behind it: go on over a new connection.
            Err(_) => client = connect(&server).await,
        }
    };
    match &refusal {
        broker_client::Error::Server(broker_client::ErrorReply::Storage(message)) => {
            assert!(message.contains("No space left"), "{message}");
        }
        other => panic!("expected a storage error, got {other:?}"),
    }
    // Reads go on.
    let end_while_full = client.end_offset(TOPIC, 0).await.unwrap();
    assert!(end_while_full >= acknowledged);
    std::fs::remove_file(&filler).unwrap();
    let started = Instant::now();
    let after = loop {
        match client.publish(TOPIC, 0, "after").await {
            Ok(offset) => break offset,
            Err(_) => {
                assert!(started.elapsed() < PATIENCE, "changes still refused");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    // No offset was consumed by a refused publish.
    assert_eq!(after, end_while_full);
    server.kill();
    let server = ServerProcess::start(&["--data-dir", &data_arg, "--capacity", "1000"]);
    let end = connect(&server).await.end_offset(TOPIC, 0).await.unwrap();
    assert_eq!(
        end,
        after + 1,
        "acknowledged publishes lost or refused ones kept"
    );
    drop(server);
    drop(disk);
}

/// A server on `dir` with a capacity of `capacity` records per partition and a memory budget
/// of 300 bytes (payloads up to 100 bytes).
fn start_with_capacity(dir: &Path, capacity: &str) -> ServerProcess {
    ServerProcess::start(&[
        "--data-dir",
        dir.to_str().unwrap(),
        "--max-payload-bytes",
        "100",
        "--max-memory",
        "300",
        "--capacity",
        capacity,
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_refused_at_capacity_stay_refused_after_a_restart_with_another_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let payload = vec![b'x'; 100];
    let mut server = start_with_capacity(dir.path(), "3");
    let client = connect(&server).await;
    client.create(TOPIC, 1).await.unwrap();
    let offsets = [
        client.publish(TOPIC, 0, payload.clone()).await.unwrap(),
        client.publish(TOPIC, 0, payload.clone()).await.unwrap(),
        client.publish(TOPIC, 0, payload.clone()).await.unwrap(),
        client.publish(TOPIC, 0, payload.clone()).await.unwrap(),
    ];
    assert_eq!(offsets, [0, 1, 2, -1], "the fourth is over the capacity");
    let before = client.describe().await.unwrap();
    server.kill();

    // A larger capacity now must not turn the refused publish into a stored one on replay; the
    // memory budget (300 bytes, three records) does not apply with a data directory.
    let mut server = start_with_capacity(dir.path(), "100");
    let client = connect(&server).await;
    let reopened = client.describe().await.unwrap();
    assert_eq!(reopened.topics, before.topics);
    assert_eq!(reopened.capacity_per_partition, 100);
    assert_eq!(client.publish(TOPIC, 0, payload.clone()).await.unwrap(), 3);
    let after = client.describe().await.unwrap();
    server.kill();

    // And the publish the larger capacity accepted stays accepted under a smaller one.
    let server = start_with_capacity(dir.path(), "3");
    let client = connect(&server).await;
    assert_eq!(client.describe().await.unwrap().topics, after.topics);
    assert_eq!(client.publish(TOPIC, 0, payload).await.unwrap(), -1);
}

/// Copies the fixture directory `name` (with its subdirectories) into a new temporary directory.
fn fixture_copy(name: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&fixtures().join(name), dir.path());
    dir
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// A server on a copy of the fixture directory `name` (with the capacity it was written with),
/// a client of it, and the directory.
async fn open_fixture(name: &str) -> (tempfile::TempDir, ServerProcess, Client) {
    let dir = fixture_copy(name);
    let server = ServerProcess::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--capacity",
        "50",
    ]);
    let client = connect(&server).await;
    (dir, server, client)
}

/// The JSON fixture file `name`, parsed.
fn fixture_json<T: serde::de::DeserializeOwned>(name: &str) -> T {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

/// Every record of the fixture's `topics`, read by a new group from the earliest retained
/// offset, as `broker consume --json` printed them: with the fields of protocol version 2 (time,
/// headers, delivery count) when `v2`. Compared with the lines the fixture's release printed,
/// `expected`.
async fn check_fixture_records(client: &Client, topics: &[&str], expected: &str, v2: bool) {
    let text = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
    let mut read = Vec::new();
    for &topic in topics {
        client.join(topic, "fixture-check", "reader").await.unwrap();
        loop {
            let records = client
                .fetch(topic, "fixture-check", "reader", 1000)
                .await
                .unwrap();
            if records.is_empty() {
                break;
            }
            for record in records {
                let mut json = serde_json::json!({
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "key": record.key.as_deref().map(text),
                    "payload": text(&record.payload),
                });
                if v2 {
                    json["timestamp_ms"] = record.timestamp_ms.into();
                    json["headers"] = record
                        .headers
                        .iter()
                        .map(|h| serde_json::json!({"name": h.name, "value": h.value.as_deref().map(text)}))
                        .collect();
                    json["delivery_count"] = record.delivery_count.into();
                }
                read.push(json);
            }
        }
    }
    let expected: Vec<serde_json::Value> = std::fs::read_to_string(fixtures().join(expected))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(read, expected);
}

/// A data directory written by the first releases (format version 1: `tests/fixtures/data-v1`,
/// made by `tests/fixtures/make-data-v1.sh`) opens with the same topics, groups, offsets,
/// deliveries in flight and records as the server that wrote it described.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_1_opens_unchanged() {
    let (_dir, _server, client) = open_fixture("data-v1").await;
    // What the first release described, in the shapes of protocol version 1.
    let expected: broker_core::v1::BrokerDescription = fixture_json("expected-v1.json");
    let described = client.describe().await.unwrap();
    // Everything version 1 had is unchanged; what version 2 added is what a record and a topic
    // of the first release mean: time 0, interest retention.
    for topic in &described.topics {
        assert_eq!(
            topic.settings,
            [broker_core::TopicSetting::Retention(
                broker_core::Retention::Interest
            )]
        );
        for partition in &topic.partitions {
            assert_eq!(
                partition.earliest_timestamp_ms,
                (partition.records > 0).then_some(0)
            );
        }
    }
    let as_v1 = broker_core::v1::Outcome::try_from(broker_core::Outcome::Description(described));
    assert_eq!(as_v1, Ok(broker_core::v1::Outcome::Description(expected)));
    check_fixture_records(
        &client,
        &["events", "orders"],
        "expected-records-v1.jsonl",
        false,
    )
    .await;
}

/// A data directory of format version 2 (`tests/fixtures/data-v2`, made by
/// `tests/fixtures/make-data-v2.sh`: records in segment files and in the log, limits retention,
/// headers, a deleted topic, a reset group, a purged partition) opens with the same description
/// and the same records, times and headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_2_opens_unchanged() {
    let (_dir, _server, client) = open_fixture("data-v2").await;
    let expected: broker_client::BrokerDescription = fixture_json("expected-v2.json");
    assert_eq!(client.describe().await.unwrap(), expected);
    check_fixture_records(
        &client,
        &["events", "orders"],
        "expected-records-v2.jsonl",
        true,
    )
    .await;
}

/// A data directory of format version 4 (`tests/fixtures/data-v4`, made by
/// `tests/fixtures/make-data-v4.sh`: records in segment files and in the log, an idempotent
/// producer's topic, and groups with a maximum of deliveries and a dead-letter topic, created
/// before the last checkpoint and after it) opens with the same description, group settings
/// and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_4_opens_unchanged() {
    let (_dir, _server, client) = open_fixture("data-v4").await;
    let expected: broker_client::BrokerDescription = fixture_json("expected-v4.json");
    assert_eq!(client.describe().await.unwrap(), expected);
    let settings: Vec<_> = expected
        .topics
        .iter()
        .flat_map(|topic| &topic.groups)
        .flat_map(|group| &group.settings)
        .filter(|setting| matches!(setting, broker_client::GroupSetting::DeadLetter(_)))
        .collect();
    assert_eq!(settings.len(), 2, "{expected:#?}");
    // A format that did not say which offsets were stored: every offset of every group counts
    // as stored, in the snapshot and in the log after it alike.
    for topic in &expected.topics {
        for group in &topic.groups {
            let stored = client
                .stored_offsets(&topic.name, &group.name)
                .await
                .unwrap();
            assert!(
                stored.iter().all(Option::is_some),
                "{} {}: {stored:?}",
                topic.name,
                group.name
            );
        }
    }
    check_fixture_records(
        &client,
        &["events", "orders", "receipts"],
        "expected-records-v4.jsonl",
        true,
    )
    .await;
}

/// A data directory of format version 5 (`tests/fixtures/data-v5`, made by
/// `tests/fixtures/make-data-v5.sh`: format 4's contents, plus groups that stored offsets on
/// some partitions of their topic and not on others, in the snapshot and in the log) opens with
/// the same description and records, and the same partitions without a stored offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_5_opens_unchanged() {
    open_fixture_with_stored_offsets("v5").await;
}

/// A data directory of format version 6 (`tests/fixtures/data-v6`, made by
/// `tests/fixtures/make-data-v6.sh`: format 5's contents, whose log's last entries hold only
/// where their records went, the records being in their segment files past the snapshot's
/// catalog) opens with the same description and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_6_opens_unchanged() {
    open_fixture_with_stored_offsets("v6").await;
}

/// A data directory of format version 7 (`tests/fixtures/data-v7`, made by
/// `tests/fixtures/make-data-v7.sh`: format 6's contents, its log's entries applied under the
/// core's revision 1) opens with the same description and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_7_opens_unchanged() {
    open_fixture_with_stored_offsets("v7").await;
}

/// Opens the fixture `data-<version>` (made by the make script of format 5 or a later one) and
/// checks its description, its groups' stored offsets and its records.
async fn open_fixture_with_stored_offsets(version: &str) {
    let (_dir, _server, client) = open_fixture(&format!("data-{version}")).await;
    let expected: broker_client::BrokerDescription =
        fixture_json(&format!("expected-{version}.json"));
    assert_eq!(client.describe().await.unwrap(), expected);
    assert_eq!(
        client.stored_offsets("ledger", "partial").await.unwrap(),
        [Some(1), Some(0), None]
    );
    assert_eq!(
        client.stored_offsets("ledger", "late").await.unwrap(),
        [None, None, Some(1)]
    );
    check_fixture_records(
        &client,
        &["events", "ledger", "orders", "receipts"],
        &format!("expected-records-{version}.jsonl"),
        true,
    )
    .await;
}

/// The data directory of a broker of three shards (`tests/fixtures/data-shards-v4`, made by
/// `tests/fixtures/make-data-shards-v4.sh`: topics in every shard, records in segment files and
/// in the logs, a group with a dead-letter topic) opens, without `--shards`, with its three
/// shards and the same description and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_three_shards_opens_unchanged() {
    let (dir, _server, client) = open_fixture("data-shards-v4").await;
    let expected: broker_client::BrokerDescription = fixture_json("expected-shards-v4.json");
    assert_eq!(client.describe().await.unwrap(), expected);
    check_fixture_records(
        &client,
        &["events", "orders", "payments"],
        "expected-records-shards-v4.jsonl",
        true,
    )
    .await;
    // Opened as the three shards it holds, no more.
    assert!(dir.path().join("shards/2").is_dir());
    assert!(!dir.path().join("shards/3").exists());
}

/// A cluster node's directory whose snapshot is of format 1 (`tests/fixtures/cluster-v1`, made
/// by `tests/fixtures/make-cluster-v1.sh` with a release whose snapshots held every record),
/// followed by entries of the replicated log, opens with the same description and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_directory_of_snapshot_format_1_opens_unchanged() {
    open_cluster_fixture("v1").await;
}

/// A cluster node's directory whose snapshot is of format 2 (`tests/fixtures/cluster-v2`, made
/// by `tests/fixtures/make-cluster-v2.sh` with a release from before the cluster's groups: the
/// state without its records, which are in record segments), followed by entries of the
/// replicated log, opens with the same description and records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_directory_of_snapshot_format_2_opens_unchanged() {
    open_cluster_fixture("v2").await;
}

/// A cluster node's directory whose snapshot is of format 5 (`tests/fixtures/cluster-v5`, made
/// by `tests/fixtures/make-cluster-v5.sh`: the state image of version 5, which says which
/// offsets each group stored), followed by entries of the replicated log, opens with the same
/// description and records, and the same offsets stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_directory_of_snapshot_format_5_opens_unchanged() {
    let (_dir, _server, client) = open_cluster_fixture("v5").await;
    // The fixture's group acknowledged records on every partition; the reading group of the
    // check fetched without committing.
    let described = client.describe_topic("orders").await.unwrap();
    let billing = described
        .groups
        .iter()
        .find(|g| g.name == "billing")
        .unwrap();
    let committed: Vec<_> = billing
        .partitions
        .iter()
        .map(|p| Some(p.committed))
        .collect();
    assert_eq!(
        client.stored_offsets("orders", "billing").await.unwrap(),
        committed
    );
    assert_eq!(
        client
            .stored_offsets("orders", "fixture-check")
            .await
            .unwrap(),
        [None, None, None]
    );
}

/// Starts node 1 of a one-node cluster on a copy of `tests/fixtures/cluster-<version>` and
/// checks its description and records against the fixture's expectations; the directory, the
/// server and its client.
async fn open_cluster_fixture(version: &str) -> (tempfile::TempDir, ServerProcess, Client) {
    let dir = fixture_copy(&format!("cluster-{version}"));
    // The node's addresses in its membership are the fixture's; a one-node cluster needs only
    // its own peer port, which it takes from this list (warning that it differs).
    let members = format!("1={}/127.0.0.1:19191", broker_testkit::cluster::free_addr());
    let server = ServerProcess::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--capacity",
        "50",
        "--node-id",
        "1",
        "--cluster-members",
        &members,
    ]);
    let client = connect(&server).await;
    let expected: broker_client::BrokerDescription =
        fixture_json(&format!("expected-cluster-{version}.json"));
    assert_eq!(client.describe().await.unwrap(), expected);
    check_fixture_records(
        &client,
        &["events", "orders"],
        &format!("expected-records-cluster-{version}.jsonl"),
        true,
    )
    .await;
    (dir, server, client)
}

/// A data directory of format version 3 (`tests/fixtures/data-v3`, made by
/// `tests/fixtures/make-data-v3.sh`: format 2's contents, plus two topics written by idempotent
/// producers, one before the last checkpoint and one after) opens with the same description and
/// records, and with each producer's sequences: a batch repeating a producer's last record on
/// each partition is answered with that record's offset, and only the new record after it is
/// stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_format_version_3_opens_unchanged() {
    let (_dir, _server, client) = open_fixture("data-v3").await;
    let expected: broker_client::BrokerDescription = fixture_json("expected-v3.json");
    assert_eq!(client.describe().await.unwrap(), expected);
    check_fixture_records(
        &client,
        &["events", "orders", "receipts", "refunds"],
        "expected-records-v3.jsonl",
        true,
    )
    .await;
    let producers: HashMap<String, String> = fixture_json("producers-v3.json");
    assert_eq!(producers.len(), 2);
    for (topic, producer) in producers {
        let producer = u64::from_str_radix(&producer, 16).unwrap();
        let described = expected.topics.iter().find(|t| t.name == topic).unwrap();
        // Only this producer wrote the topic, from sequence 0 at offset 0 of each partition
        // (its records are keyed: some partitions may have none).
        let written: Vec<_> = described
            .partitions
            .iter()
            .filter(|partition| partition.end_offset > 0)
            .collect();
        assert!(!written.is_empty(), "nothing in {topic}");
        for partition in written {
            let stored = partition.end_offset;
            let batch = PartitionBatch {
                partition: partition.partition,
                sequence: u64::try_from(stored - 1).unwrap(),
                records: vec![
                    PublishRecord::to_partition(partition.partition, "repeated"),
                    PublishRecord::to_partition(partition.partition, "new"),
                ],
            };
            let placed = client
                .publish_idempotent(&topic, producer, vec![batch])
                .await
                .unwrap();
            assert_eq!(
                placed,
                [
                    (partition.partition, stored - 1),
                    (partition.partition, stored)
                ],
                "{topic} partition {}",
                partition.partition
            );
        }
    }
}

/// What the retention workload was told: acknowledged operations only.
#[derive(Debug, Default)]
struct Acknowledged {
    /// Payload of every acknowledged publish to the limits topic, by offset (one partition).
    published: HashMap<i64, String>,
    /// The highest offset acknowledged to the publisher.
    max_offset: i64,
    /// The highest offset an acknowledged reset of group "replay" moved it to, or past.
    reset_to: i64,
    /// The earliest offset an acknowledged purge left.
    purged_to: i64,
    /// Topics whose creation was acknowledged and whose deletion was never asked for.
    created: Vec<String>,
    /// Topics whose deletion was acknowledged.
    deleted: Vec<String>,
}

const LIMITED: &str = "limited";
/// What the limits topic keeps at most per partition.
const KEPT: u64 = 300;

/// Publishes to the limits topic until the server goes away.
async fn limits_publisher(
    client: Client,
    model: Arc<Mutex<Acknowledged>>,
    progress: watch::Sender<u64>,
) {
    for i in 0u64.. {
        let payload = format!("record {i} {}", "x".repeat((i % 40) as usize));
        let Ok(offset) = client.publish(LIMITED, 0, payload.clone()).await else {
            return;
        };
        assert!(
            offset >= 0,
            "limits retention discards old records instead of refusing"
        );
        let mut model = model.lock().unwrap();
        model.published.insert(offset, payload);
        model.max_offset = model.max_offset.max(offset);
        drop(model);
        progress.send_modify(|n| *n += 1);
    }
}

/// Resets group "replay" forward (to ever larger offsets), purges below ever larger offsets,
/// and creates and deletes topics, until the server goes away.
async fn rewinder(client: Client, model: Arc<Mutex<Acknowledged>>, round: usize) {
    if client.join(LIMITED, "replay", "r").await.is_err() {
        return;
    }
    for i in 0u64.. {
        let target = model.lock().unwrap().max_offset.max(0);
        let reset = client
            .reset_group(
                LIMITED,
                "replay",
                None,
                broker_client::ResetTo::Offset(target),
            )
            .await;
        let Ok(rows) = reset else { return };
        {
            let mut model = model.lock().unwrap();
            model.reset_to = model.reset_to.max(rows[0].committed);
        }
        let before = target.saturating_sub(KEPT as i64 / 2);
        let Ok(earliest) = client.purge(LIMITED, 0, before).await else {
            return;
        };
        {
            let mut model = model.lock().unwrap();
            model.purged_to = model.purged_to.max(earliest);
        }
        let name = format!("temp-{round}-{i}");
        let Ok(created) = client.create(&name, 1).await else {
            return;
        };
        assert!(created);
        if client.publish(&name, 0, "temporary").await.is_err() {
            model.lock().unwrap().created.push(name);
            return;
        }
        if i % 3 == 0 {
            // Kept: it must be there after the crash.
            model.lock().unwrap().created.push(name);
            continue;
        }
        match client.delete_topic(&name).await {
            Ok(deleted) => {
                assert!(deleted);
                model.lock().unwrap().deleted.push(name);
            }
            Err(_) => return,
        }
        tokio::task::yield_now().await;
    }
}

/// Checks the restarted broker against what the retention workload was told.
async fn check_retention_after_restart(client: &Client, model: &Arc<Mutex<Acknowledged>>) {
    let (published, max_offset, reset_to, purged_to, created, deleted) = {
        let model = model.lock().unwrap();
        (
            model.published.clone(),
            model.max_offset,
            model.reset_to,
            model.purged_to,
            model.created.clone(),
            model.deleted.clone(),
        )
    };
    let topic = client.describe_topic(LIMITED).await.unwrap();
    let partition = topic.partitions[0];
    assert!(
        partition.end_offset > max_offset,
        "{partition:?}, {max_offset} acknowledged"
    );
    assert!(partition.records <= KEPT, "{partition:?}");
    assert!(
        partition.earliest_offset >= purged_to,
        "{partition:?}, purged to {purged_to}"
    );
    let replay = topic
        .groups
        .iter()
        .find(|group| group.name == "replay")
        .unwrap();
    assert!(
        replay.partitions[0].committed >= reset_to,
        "{replay:?}, reset to {reset_to}"
    );
    // Every record still retained reads back as it was published, from the segment files or
    // the log: a group that joins now starts at the earliest one.
    client.join(LIMITED, "reader", "x").await.unwrap();
    client
        .reset_group(LIMITED, "reader", None, broker_client::ResetTo::Earliest)
        .await
        .unwrap();
    let mut next = partition.earliest_offset;
    loop {
        let records = client.fetch(LIMITED, "reader", "x", 1000).await.unwrap();
        if records.is_empty() {
            break;
        }
        for record in records {
            assert_eq!(record.offset, next, "records read back out of order");
            if let Some(payload) = published.get(&record.offset) {
                assert_eq!(
                    record.payload,
                    payload.as_bytes(),
                    "offset {}",
                    record.offset
                );
            }
            next += 1;
        }
    }
    assert_eq!(next, partition.end_offset);
    client.leave(LIMITED, "reader", "x").await.unwrap();
    let names: Vec<String> = client
        .describe()
        .await
        .unwrap()
        .topics
        .into_iter()
        .map(|topic| topic.name)
        .collect();
    for name in &deleted {
        assert!(!names.contains(name), "{name} was deleted, and is back");
    }
    for name in &created {
        assert!(names.contains(name), "{name} was created, and is gone");
    }
}

/// `kill -9` while records move to segment files and segments roll (small checkpoints and
/// segments), while limits retention discards records and removes whole segments, and while a
/// group is reset, a partition purged and topics created and deleted: after every restart,
/// everything acknowledged holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_resets_purges_and_deletes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let model: Arc<Mutex<Acknowledged>> = Arc::default();
    for (round, (publishes, fsync)) in [
        (300, "always"),
        (700, "batch"),
        (50, "never"),
        (400, "always"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut server = ServerProcess::start(&[
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--fsync",
            fsync,
            "--snapshot-log-bytes",
            "8192",
            "--segment-bytes",
            "4096",
        ]);
        let client = connect(&server).await;
        if round == 0 {
            let settings = [
                broker_client::TopicSetting::Retention(broker_client::Retention::Limits),
                broker_client::TopicSetting::MaxRecords(KEPT),
            ];
            client
                .create_topic(LIMITED, 1, broker_client::KeyHash::Murmur2, &settings)
                .await
                .unwrap();
        } else {
            check_retention_after_restart(&client, &model).await;
        }
        let (progress, mut published) = watch::channel(0u64);
        let tasks = vec![
            tokio::spawn(limits_publisher(
                connect(&server).await,
                Arc::clone(&model),
                progress,
            )),
            tokio::spawn(rewinder(connect(&server).await, Arc::clone(&model), round)),
        ];
        tokio::time::timeout(PATIENCE, published.wait_for(|&n| n >= publishes))
            .await
            .expect("the workload made no progress")
            .expect("the publisher stopped");
        server.kill();
        for task in tasks {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("a worker did not notice the crash")
                .expect("a worker panicked");
        }
    }
    let server = ServerProcess::start(&["--data-dir", dir.path().to_str().unwrap()]);
    let client = connect(&server).await;
    check_retention_after_restart(&client, &model).await;
    assert!(
        model.lock().unwrap().deleted.len() > 10,
        "too few deletions to mean anything"
    );
}

/// Creates [`TOPIC`] with `partitions` partitions and limits retention (every record is kept);
/// returns the client that did.
async fn limits_topic(server: &ServerProcess, partitions: i32) -> Client {
    let admin = connect(server).await;
    let retention = [broker_client::TopicSetting::Retention(
        broker_client::Retention::Limits,
    )];
    admin
        .create_topic(
            TOPIC,
            partitions,
            broker_client::KeyHash::default(),
            &retention,
        )
        .await
        .unwrap();
    admin
}

/// Publishes to [`TOPIC`] as fast as `connections` connections can, each `batches` batches of
/// `per_batch` records of 1 KiB.
async fn publish_kib_records(
    server: &ServerProcess,
    connections: usize,
    batches: usize,
    per_batch: usize,
) {
    let publishers = (0..connections).map(|_| async {
        let client = connect(server).await;
        for _ in 0..batches {
            let records = (0..per_batch)
                .map(|_| PublishRecord::keyed(None, vec![b'x'; 1024]))
                .collect();
            client.publish_batch(TOPIC, records).await.unwrap();
        }
    });
    futures::future::join_all(publishers).await;
}

/// Memory the broker frees goes back to the system while the server is idle, within a few
/// seconds: the allocator's background thread returns freed pages (built in by the workspace's
/// `.cargo/config.toml`; without it an idle server kept them, 168 MiB of a 2-million-record
/// ingest here, until its next burst of work).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_the_broker_frees_goes_back_to_the_system_while_it_is_idle() {
    let server = ServerProcess::start(&["--capacity", "100000"]);
    let admin = limits_topic(&server, 2).await;
    let baseline = server.status_bytes("VmRSS");
    // 64 MiB of payloads: 2 connections x 64 batches of 512 records of 1 KiB.
    publish_kib_records(&server, 2, 64, 512).await;
    let full = server.status_bytes("VmRSS");
    assert!(
        full > baseline + (48 << 20),
        "the records took {} MiB",
        (full - baseline) >> 20
    );
    assert!(admin.delete_topic(TOPIC).await.unwrap());
    // Nothing else happens now: the server is idle.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = server.status_bytes("VmRSS");
        if now < baseline + (16 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "20 s after the topic's deletion the idle server still holds {} MiB more than \
             before its records ({} MiB with them)",
            (now - baseline) >> 20,
            (full - baseline) >> 20
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With a data directory, `--max-memory` bounds the records held in memory: publishing six
/// times the budget as fast as four connections can, the server's peak resident memory stays
/// near the budget (without the bound it grew by 123 MiB here), records leave memory once
/// written to their segments (publishes wait only for a disk that falls behind), and every
/// record is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_held_in_memory_stay_within_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget: u64 = 16 << 20;
    let server = ServerProcess::start(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--fsync",
        "batch",
        "--max-memory",
        &budget.to_string(),
    ]);
    let admin = limits_topic(&server, 8).await;
    let baseline = server.status_bytes("VmRSS");
    // 96 MiB of payloads: 4 connections x 96 batches of 256 records of 1 KiB.
    publish_kib_records(&server, 4, 96, 256).await;
    let grown = server.status_bytes("VmHWM").saturating_sub(baseline);
    let stored: i64 = admin
        .describe_topic(TOPIC)
        .await
        .unwrap()
        .partitions
        .iter()
        .map(|partition| partition.end_offset)
        .sum();
    assert_eq!(stored, 4 * 96 * 256);
    assert!(
        grown < 3 * budget,
        "the server grew by {} MiB for a budget of {} MiB",
        grown >> 20,
        budget >> 20
    );
}

/// Consumers behind the last checkpoint get their records from segment files, exactly and in
/// order, in both modes; the server reads them before it takes its lock
/// (`broker_records_read_ahead_total` counts them), so that other calls do not wait for the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_members_behind_the_last_checkpoint_read_their_records_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let start = |dir: &Path| {
        ServerProcess::start(&[
            "--data-dir",
            dir.to_str().unwrap(),
            "--fsync",
            "batch",
            "--segment-bytes",
            "4096",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
    };
    let mut server = start(dir.path());
    let admin = limits_topic(&server, PARTITIONS).await;
    let mut published: BTreeMap<(i32, i64), Vec<u8>> = BTreeMap::new();
    for batch in 0..20 {
        let records = (0..20)
            .map(|n| PublishRecord::keyed(None, format!("record {batch}-{n}").into_bytes()))
            .collect::<Vec<_>>();
        let payloads: Vec<Vec<u8>> = records.iter().map(|r| r.payload.to_vec()).collect();
        let placed = admin.publish_batch(TOPIC, records).await.unwrap();
        for ((partition, offset), payload) in placed.into_iter().zip(payloads) {
            published.insert((partition, offset), payload);
        }
    }
    drop(admin);
    // A graceful stop checkpoints: after the restart, every record is in a segment file.
    assert!(server.terminate(PATIENCE).success());
    let server = start(dir.path());
    let client = connect(&server).await;
    client.join(TOPIC, "fetches", "m").await.unwrap();
    client.join(TOPIC, "acks", "m").await.unwrap();
    let mut fetched = BTreeMap::new();
    while fetched.len() < published.len() {
        let records = client.fetch(TOPIC, "fetches", "m", 37).await.unwrap();
        assert!(
            !records.is_empty(),
            "{} of {} fetched",
            fetched.len(),
            published.len()
        );
        for record in records {
            let earlier =
                fetched.insert((record.partition, record.offset), record.payload.to_vec());
            assert_eq!(
                earlier, None,
                "{}/{} fetched twice",
                record.partition, record.offset
            );
        }
    }
    assert_eq!(fetched, published);
    let mut polled = BTreeMap::new();
    let mut acks = Vec::new();
    while polled.len() < published.len() {
        let (acked, records) = client
            .ack_and_poll(TOPIC, "acks", "m", &acks, 3)
            .await
            .unwrap();
        assert!(acked.iter().all(|&hit| hit));
        assert!(
            !records.is_empty(),
            "{} of {} polled",
            polled.len(),
            published.len()
        );
        acks = records.iter().map(|r| (r.partition, r.offset)).collect();
        for record in records {
            let earlier = polled.insert((record.partition, record.offset), record.payload.to_vec());
            assert_eq!(
                earlier, None,
                "{}/{} polled twice",
                record.partition, record.offset
            );
        }
    }
    assert_eq!(polled, published);
    // Every record delivered was on disk, and read ahead once for each group: no more.
    assert_eq!(
        records_read_ahead(&server),
        2.0 * published.len() as f64,
        "records read ahead for {} delivered twice",
        published.len()
    );
}

/// `broker_records_read_ahead_total` of `server` (started with `--metrics-listen`).
fn records_read_ahead(server: &ServerProcess) -> f64 {
    let (_, _, metrics) = broker_testkit::http::get(server.metrics_addr.unwrap(), "/metrics", "");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("broker_records_read_ahead_total "))
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A waiting fetch that records on disk become eligible for (a reset of its group to the
/// earliest record) reads them before it takes the lock, as a fetch arriving then would
/// (`broker_records_read_ahead_total` counts them), rather than under the lock every other
/// call of the topic waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_fetch_reads_ahead_the_records_on_disk_a_reset_makes_eligible() {
    let dir = tempfile::tempdir().unwrap();
    let start = |dir: &Path| {
        ServerProcess::start(&[
            "--data-dir",
            dir.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ])
    };
    let mut server = start(dir.path());
    let admin = limits_topic(&server, 1).await;
    let records = (0..30)
        .map(|n| PublishRecord::keyed(None, format!("record {n}").into_bytes()))
        .collect::<Vec<_>>();
    admin.publish_batch(TOPIC, records).await.unwrap();
    drop(admin);
    // A graceful stop checkpoints: after the restart, every record is in a segment file.
    assert!(server.terminate(PATIENCE).success());
    let server = start(dir.path());
    let client = connect(&server).await;
    client.join(TOPIC, "g", "m").await.unwrap();
    assert_eq!(client.fetch(TOPIC, "g", "m", 30).await.unwrap().len(), 30);
    assert_eq!(records_read_ahead(&server), 30.0);
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .fetch_wait(TOPIC, "g", "m", 30, Duration::from_secs(15))
                .await
        })
    };
    // Parked: it found nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    let admin = connect(&server).await;
    admin
        .reset_group(TOPIC, "g", None, broker_client::ResetTo::Earliest)
        .await
        .unwrap();
    let fetched = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiting fetch is answered once the reset made records eligible")
        .unwrap()
        .unwrap();
    assert_eq!(fetched.len(), 30);
    assert_eq!(
        records_read_ahead(&server),
        60.0,
        "the retry read its records ahead"
    );
}
