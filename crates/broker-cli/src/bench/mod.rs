//! `broker bench`: load a broker-server with a chosen workload, measure throughput and latency,
//! and check that what was consumed is exactly what was published.
//!
//! Each record's payload carries its producer, its sequence number and the time it was sent,
//! so consumers can check exactly-once delivery per group and in-order offsets per partition,
//! and measure end-to-end latency.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use broker_client::{
    BrokerRecord, Client, ConsumeMode, KeyHash, ProducerError, PublishRecord, TopicSetting,
    MAX_POLL_RECORDS,
};
use clap::{Args, ValueEnum};
use futures::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressState, ProgressStyle};
use serde::Serialize;

use crate::connect::Server;
use crate::output::plural;
use crate::retention::RetentionArg;
use crate::size::with_thousands;

mod cpu;
mod load;
mod wire;

use cpu::CpuTime;
use load::{decode_header, encode_payload, new_histogram, Producer, Shared, HEADER_BYTES};

/// How long an idle consumer waits on the server for a record before asking again.
const CONSUMER_WAIT: Duration = Duration::from_millis(100);
/// How long a producer backs off when its partition is full before publishing again; doubled
/// on each refusal in a row, up to [`MAX_FULL_BACKOFF`], so that producers faster than the
/// consumers do not spend the server on refusals.
const FULL_BACKOFF: Duration = Duration::from_micros(200);
const MAX_FULL_BACKOFF: Duration = Duration::from_millis(20);

/// `broker bench` options.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  broker bench publish --producers 1 --depth 1            single-request latency
  broker bench publish --producers 8 --depth 64           pipelined publish
  broker bench ack --producers 4 --consumers 4            publish + poll/ack over 64 partitions
  broker bench fetch --batch 1000 --publish-batch 100     batches both ways
  broker bench mixed --duration 10s --json                both kinds of group at once
  broker bench ping --records 20000                       raw loopback round trips, no broker
  broker bench fetch --producers 4 --topics 4             four topics (a --shards server spreads them)

Every run uses a new topic (bench-<time>; with --topics N, bench-<time>-0 to -<N-1>), deleted
at the end, also after a failure or an interruption (--keep-topic keeps it), so runs do not
disturb each other. Partitions are bounded
by the server's --capacity: a `publish` run stops being stored once every partition is
full and reports how often publish answered -1; the end-to-end workloads (ack, fetch, mixed)
retry a refused record after a back-off that doubles while it stays refused (0.2 ms up to
20 ms), and are the honest throughput measure.")]
pub struct BenchArgs {
    /// What to run.
    #[arg(value_enum)]
    pub workload: Workload,
    /// Producer tasks, each with a connection of its own (with --shared-producer, they share
    /// one).
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Consumer connections per group (end-to-end workloads).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Records to publish in all.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Stop publishing after this long even if --records are not all published ("10s", "1m").
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Payload bytes per record (at least 20: producer, sequence and send time).
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Requests each producer keeps in flight on its connection (1 = no pipelining).
    #[arg(long, default_value_t = 64)]
    pub depth: usize,
    /// Records per publish request: 1 publishes one record per request (`publish`); more sends
    /// `publish_batch` requests of this many records.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub publish_batch: u64,
    /// Partitions of the benchmark topic.
    #[arg(long, default_value_t = 64)]
    pub partitions: i32,
    /// Benchmark topics, 1 to --producers: producer i publishes to topic i mod N (each of
    /// --partitions partitions), and every group consumes every topic with --consumers
    /// connections each. A broker with --shards places different topics on different shards.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub topics: u64,
    /// Most records per fetch (fetch and mixed workloads; polls take at most 64).
    #[arg(long, default_value_t = 1_000)]
    pub batch: i32,
    /// Threads of this load generator (its runtime's workers), 1 to 1024; by default one per
    /// CPU core.
    /// With the server on the same small machine, one thread each wakes the other least
    /// (bench/compare.sh gives both one, as Redis and redis-benchmark have).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub threads: Option<u64>,
    /// Publish workload only: write publish requests to the socket as frames, with no typed
    /// client in between, to measure the server alone (as redis-benchmark measures Redis).
    /// Plain TCP only.
    #[arg(long)]
    pub wire: bool,
    /// Publish through the `Producer` handle and consume through the `Consumer` handle, as a
    /// service does, instead of the low-level calls: each producer task has a `Producer` (its
    /// own connection; see --shared-producer) with --depth sends in flight, batching by itself;
    /// consumers acknowledge with
    /// their next poll (ack mode) or commit each round (fetch mode). A "request" is then one
    /// send.
    #[arg(long)]
    pub handles: bool,
    /// With --handles: the producer tasks share one `Producer` (one connection, one batch per
    /// partition for all of them), as a service's tasks share clones of one, instead of one
    /// each.
    #[arg(long, requires = "handles")]
    pub shared_producer: bool,
    /// Retention of the benchmark topic: interest (the default; with no group, partitions fill
    /// up to the server's --capacity and publishes are refused) or limits (the oldest records
    /// leave, so every publish is stored, as Redis's XADD stores every entry).
    #[arg(long, value_enum, default_value_t = RetentionArg::Interest)]
    pub retention: RetentionArg,
    /// Keep the benchmark topic when done (it is deleted by default, also after a failure).
    #[arg(long)]
    pub keep_topic: bool,
    /// Print the report as JSON. Beside throughput and latency it has `cpu_user_s` and
    /// `cpu_system_s`: the CPU seconds this load generator (every thread of it) spent in user
    /// space and in the kernel while the workload ran (the `elapsed_secs` interval), from
    /// /proc/self/stat; null where /proc cannot tell.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// Checks what clap's types cannot: the arguments that contradict each other or are too
    /// small. `broker` exits 2 with the message, as for any bad argument.
    ///
    /// # Errors
    /// What is wrong, in one line.
    pub fn check(&self) -> Result<(), String> {
        if self.producers == 0 || self.depth == 0 || self.consumers == 0 {
            return Err("--producers, --consumers and --depth must be at least 1".to_owned());
        }
        if self.size < HEADER_BYTES {
            return Err(format!(
                "--size must be at least {HEADER_BYTES} bytes (producer, sequence and send time)"
            ));
        }
        if self.wire && self.workload != Workload::Publish {
            return Err("--wire measures the publish workload only".to_owned());
        }
        if self.wire && self.publish_batch != 1 {
            return Err("--wire cannot be combined with --publish-batch".to_owned());
        }
        if self.topics > self.producers as u64 {
            return Err(format!(
                "--topics {} needs at least as many --producers (each topic has its own)",
                self.topics
            ));
        }
        if self.handles && (self.wire || self.publish_batch != 1) {
            return Err(
                "--handles batches by itself: it cannot be combined with --wire or --publish-batch"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// The workloads `broker bench` can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Producers only; each publish is timed; full partitions are counted, not retried.
    Publish,
    /// Producers, and a group consuming with poll + ack, one record in flight per partition
    /// (`ack_and_poll` rounds).
    Ack,
    /// Producers, and a group consuming with fetch + commit in batches (Kafka style).
    Fetch,
    /// Producers, an ack-mode group and a fetch-mode group on the same topic.
    Mixed,
    /// No broker at all: 64-byte round trips over a loopback TCP connection to an echo thread
    /// in this process, one at a time. The floor any single-request latency is measured against.
    Ping,
}

/// What the producer tasks publish through, as the report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum PublishedThrough {
    /// The client's low-level calls (`publish`, `publish_batch`).
    Calls,
    /// Frames written to the socket (`--wire`).
    Wire,
    /// A `Producer` per task (`--handles`).
    Producers,
    /// One `Producer` shared by the tasks (`--handles --shared-producer`).
    SharedProducer,
}

impl PublishedThrough {
    fn of(args: &BenchArgs) -> Self {
        match (args.wire, args.handles, args.shared_producer) {
            (true, _, _) => PublishedThrough::Wire,
            (false, true, true) => PublishedThrough::SharedProducer,
            (false, true, false) => PublishedThrough::Producers,
            (false, false, _) => PublishedThrough::Calls,
        }
    }

    /// How the text report says it.
    fn text(self) -> &'static str {
        match self {
            PublishedThrough::Calls => "through the client's calls",
            PublishedThrough::Wire => "as frames on the wire",
            PublishedThrough::Producers => "through a Producer per task",
            PublishedThrough::SharedProducer => "through one Producer shared by the tasks",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupMode {
    Ack,
    Fetch,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Serialize)]
struct Percentiles {
    samples: u64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    p999_us: f64,
    max_us: f64,
}

impl Percentiles {
    fn of(histogram: &Histogram<u64>) -> Self {
        let us = |nanos: u64| nanos as f64 / 1_000.0;
        Percentiles {
            samples: histogram.len(),
            p50_us: us(histogram.value_at_quantile(0.50)),
            p90_us: us(histogram.value_at_quantile(0.90)),
            p99_us: us(histogram.value_at_quantile(0.99)),
            p999_us: us(histogram.value_at_quantile(0.999)),
            max_us: us(histogram.max()),
        }
    }

    fn text(&self) -> String {
        format!(
            "p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs ({} samples)",
            self.p50_us, self.p90_us, self.p99_us, self.p999_us, self.max_us, self.samples
        )
    }
}

/// What one consumer group saw.
#[derive(Debug, Serialize)]
struct GroupReport {
    group: String,
    mode: &'static str,
    consumed: u64,
    /// Poll or fetch requests the group's consumers made: `consumed / consume_requests`
    /// records came per round trip.
    consume_requests: u64,
    /// Records stored twice (the same record at two offsets): a failure.
    duplicates: u64,
    /// Deliveries of a record already delivered, at the same offset: the at-least-once
    /// redelivery of records whose acknowledgement or commit was lost with a connection (a
    /// server restart, a cluster's failover). Not a failure.
    redelivered: u64,
    out_of_order: u64,
    missing: u64,
    end_to_end_latency: Option<Percentiles>,
}

/// The whole report, printed as text or JSON.
#[derive(Debug, Serialize)]
struct BenchReport {
    workload: Workload,
    /// The benchmark topic, or with several the first of them.
    topic: String,
    /// How many benchmark topics the producers spread over (`--topics`).
    topics: usize,
    producers: usize,
    /// What the producers publish through.
    published_through: PublishedThrough,
    consumers_per_group: usize,
    partitions: i32,
    /// The benchmark topic's retention.
    retention: RetentionArg,
    record_bytes: usize,
    depth: usize,
    /// Records per publish request (`--publish-batch`); a `Producer` batches by itself.
    publish_batch: u64,
    published: u64,
    publish_refused_full: u64,
    /// Publish requests answered, stored or refused as full (a batch is one request).
    publish_requests: u64,
    elapsed_secs: f64,
    /// Publish requests answered per second.
    requests_per_sec: f64,
    records_per_sec: f64,
    megabytes_per_sec: f64,
    publish_latency: Percentiles,
    /// CPU seconds this process spent in user space while the workload ran (`elapsed_secs`),
    /// every thread together; `None` where /proc/self/stat cannot be read.
    cpu_user_s: Option<f64>,
    /// The same in the kernel (system time).
    cpu_system_s: Option<f64>,
    groups: Vec<GroupReport>,
    check_passed: bool,
}

/// Exactly-once and ordering checks for one group.
struct GroupCheck {
    next_offset: Vec<i64>,
    /// Where each producer's records were first delivered from, by sequence.
    seen: Vec<Vec<Option<(i32, i64)>>>,
    consumed: u64,
    /// Poll or fetch requests answered.
    rounds: u64,
    duplicates: u64,
    redelivered: u64,
    out_of_order: u64,
    latency: Histogram<u64>,
}

impl GroupCheck {
    fn new(partitions: usize, shares: &[u64]) -> Self {
        GroupCheck {
            next_offset: vec![0; partitions],
            seen: shares.iter().map(|&n| vec![None; n as usize]).collect(),
            consumed: 0,
            rounds: 0,
            duplicates: 0,
            redelivered: 0,
            out_of_order: 0,
            latency: new_histogram(),
        }
    }

    /// Notes a delivery of `record`, whose partition 0 is at `first_place` among the check's
    /// partitions.
    fn observe(&mut self, first_place: usize, record: &BrokerRecord, now_nanos: u64) {
        self.consumed += 1;
        let place = (record.partition, record.offset);
        let redelivery = match decode_header(&record.payload) {
            Some((producer, sequence, sent_nanos)) => {
                let slot = self
                    .seen
                    .get_mut(producer as usize)
                    .and_then(|seen| seen.get_mut(sequence as usize));
                let redelivery = match slot {
                    Some(seen @ None) => {
                        *seen = Some(place);
                        false
                    }
                    Some(Some(first)) if *first == place => true,
                    _ => {
                        self.duplicates += 1;
                        false
                    }
                };
                let _ = self
                    .latency
                    .record(now_nanos.saturating_sub(sent_nanos).max(1));
                redelivery
            }
            None => {
                self.duplicates += 1;
                false
            }
        };
        // A redelivery goes back in its partition: order is checked from the next record on.
        let partition = first_place + record.partition as usize;
        if redelivery {
            self.redelivered += 1;
        } else if self.next_offset.get(partition) != Some(&record.offset) {
            self.out_of_order += 1;
        }
        if let Some(next) = self.next_offset.get_mut(partition) {
            *next = record.offset + 1;
        }
    }

    fn missing(&self) -> u64 {
        self.seen
            .iter()
            .flatten()
            .filter(|seen| seen.is_none())
            .count() as u64
    }

    /// Records consumed, each counted once however often it was delivered.
    fn unique(&self) -> u64 {
        self.consumed - self.redelivered - self.duplicates
    }
}

/// How many records each producer publishes: `records` split as evenly as possible.
fn shares(records: u64, producers: usize) -> Vec<u64> {
    let producers_u64 = producers as u64;
    (0..producers_u64)
        .map(|i| records / producers_u64 + u64::from(i < records % producers_u64))
        .collect()
}

fn elapsed_nanos(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Runs a benchmark against `server` (every connection with its token and TLS settings) and
/// prints its report.
pub async fn run(server: &Server, args: BenchArgs) -> anyhow::Result<()> {
    args.check().map_err(anyhow::Error::msg)?;
    if args.wire && server.tls_ca.is_some() {
        bail!("--wire speaks plain TCP only; measure a TLS server without it");
    }
    if args.wire && server.addr.contains(',') {
        bail!(
            "--wire talks to one server: give --addr a single address (a cluster's leader's), \
             not the list {}",
            server.addr
        );
    }
    if args.workload == Workload::Ping {
        let latency = tokio::task::spawn_blocking(move || ping(args.records))
            .await
            .context("the ping task failed")??;
        return print_ping(&latency, args.json);
    }
    let admin = server.connect().await?;
    let name = format!(
        "bench-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    );
    let topics: Vec<String> = match args.topics {
        1 => vec![name],
        count => (0..count).map(|index| format!("{name}-{index}")).collect(),
    };
    let retention = [TopicSetting::Retention(args.retention.into())];
    let mut created = Vec::new();
    let mut creating = Ok(());
    for topic in &topics {
        match admin
            .create_topic(topic, args.partitions, KeyHash::default(), &retention)
            .await
        {
            Ok(_) => created.push(topic),
            Err(error) => {
                creating =
                    Err(anyhow::Error::new(error).context("cannot create a benchmark topic"));
                break;
            }
        }
    }
    // Interrupted (Ctrl-C, SIGTERM), the run stops and the topics are deleted all the same.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot handle SIGTERM")?;
    let measured = match creating {
        Ok(()) => tokio::select! {
            measured = measure(server, &args, &topics) => measured,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
            _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
        },
        Err(error) => Err(error),
    };
    if !args.keep_topic {
        // Whatever happened, leave no benchmark topic behind.
        for topic in created {
            if let Err(error) = admin.delete_topic(topic).await {
                eprintln!("warning: the benchmark topic {topic} was not deleted: {error}");
            }
        }
    }
    let report = measured?;
    print_report(&report, args.json)?;
    if !report.check_passed {
        bail!("the consumed records do not match the published ones (see the report above)");
    }
    Ok(())
}

/// Runs the workload on `topics` (created, empty) and reports what it measured.
async fn measure(
    server: &Server,
    args: &BenchArgs,
    topics: &[String],
) -> anyhow::Result<BenchReport> {
    let modes: &[GroupMode] = match args.workload {
        Workload::Publish | Workload::Ping => &[],
        Workload::Ack => &[GroupMode::Ack],
        Workload::Fetch => &[GroupMode::Fetch],
        Workload::Mixed => &[GroupMode::Ack, GroupMode::Fetch],
    };
    let shares = shares(args.records, args.producers);
    let shared = Arc::new(Shared {
        start: Instant::now(),
        published: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        requests: AtomicU64::new(0),
        producers_done: AtomicBool::new(false),
    });

    // Every consumer joins before anything is published: no rebalance during the run, so any
    // redelivery would be a broker bug, not a rebalance.
    let mut consumers = Vec::new();
    let mut checks = Vec::new();
    for &mode in modes {
        let group = match mode {
            GroupMode::Ack => "bench-ack",
            GroupMode::Fetch => "bench-fetch",
        };
        // Each topic's partitions have places of their own in the check.
        let check = Arc::new(Mutex::new(GroupCheck::new(
            args.partitions as usize * topics.len(),
            &shares,
        )));
        checks.push((group, mode, Arc::clone(&check)));
        for (index, topic) in (0..args.consumers)
            .flat_map(|index| topics.iter().enumerate().map(move |topic| (index, topic)))
        {
            let (topic_index, topic) = topic;
            let client = server.connect().await?;
            let member = format!("consumer-{index:03}");
            client.join(topic, group, &member).await?;
            let consumer = Consumer {
                topic: topic.clone(),
                first_place: topic_index * args.partitions as usize,
                group,
                member,
                mode,
                batch: args.batch,
                check: Arc::clone(&check),
                shared: Arc::clone(&shared),
            };
            consumers.push(if args.handles {
                tokio::spawn(consume_with_handle(client, consumer))
            } else {
                tokio::spawn(consume(client, consumer))
            });
        }
    }

    let progress = progress_bar(args);
    let deadline = args.duration.map(|d| Instant::now() + d);
    let cpu_at_start = CpuTime::of_this_process();
    let start = Instant::now();
    let mut producers = Vec::new();
    // The publish workload counts full partitions rather than retrying them.
    let retry_full = args.workload != Workload::Publish;
    let producer_handle = |client: Client| {
        broker_client::Producer::builder()
            // Without retrying, a full partition fails the send at once, counted as refused.
            .delivery_timeout(if retry_full {
                Duration::from_secs(120)
            } else {
                Duration::ZERO
            })
            .build(client)
    };
    let shared_handle = match args.shared_producer {
        true => Some(producer_handle(server.connect().await?)),
        false => None,
    };
    for (index, &share) in shares.iter().enumerate() {
        let producer = Producer {
            topic: topics[index % topics.len()].clone(),
            index: index as u32,
            share,
            partitions: args.partitions,
            size: args.size,
            depth: args.depth,
            // At most 10,000 (checked by clap).
            batch: args.publish_batch as usize,
            retry_full,
            deadline,
            shared: Arc::clone(&shared),
        };
        producers.push(if args.wire {
            let (addr, token) = (server.addr.clone(), server.auth_token.clone());
            tokio::spawn(async move { wire::produce(&addr, token, producer).await })
        } else if args.handles {
            let handle = match &shared_handle {
                Some(shared) => shared.clone(),
                None => producer_handle(server.connect().await?),
            };
            tokio::spawn(produce_with_handle(handle, producer))
        } else {
            tokio::spawn(produce(server.connect().await?, producer))
        });
    }
    // The tasks hold its clones: it closes with the last of them, not with this run.
    drop(shared_handle);
    let ticker = spawn_ticker(progress.clone(), Arc::clone(&shared), checks_for(&checks));

    let mut publish_latency = new_histogram();
    for producer in producers {
        let histogram = producer.await.context("a producer task failed")??;
        publish_latency
            .add(&histogram)
            .context("cannot merge latency histograms")?;
    }
    shared.producers_done.store(true, Ordering::SeqCst);
    for consumer in consumers {
        consumer.await.context("a consumer task failed")??;
    }
    let elapsed = start.elapsed();
    let cpu = CpuTime::of_this_process()
        .zip(cpu_at_start)
        .map(|(now, then)| now.since(then));
    ticker.abort();
    progress.finish_and_clear();

    let published = shared.published.load(Ordering::SeqCst);
    let groups: Vec<GroupReport> = checks
        .iter()
        .map(|(group, mode, check)| {
            let check = check.lock().unwrap_or_else(PoisonError::into_inner);
            // Records a deadline kept from being published are not missing.
            let unpublished = args.records - published;
            GroupReport {
                group: (*group).to_owned(),
                mode: match mode {
                    GroupMode::Ack => "poll+ack",
                    GroupMode::Fetch => "fetch+commit",
                },
                consumed: check.consumed,
                consume_requests: check.rounds,
                duplicates: check.duplicates,
                redelivered: check.redelivered,
                out_of_order: check.out_of_order,
                missing: check.missing() - unpublished,
                end_to_end_latency: Some(Percentiles::of(&check.latency)),
            }
        })
        .collect();
    let check_passed = groups
        .iter()
        .all(|g| g.duplicates == 0 && g.out_of_order == 0 && g.missing == 0);
    let seconds = elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
    let report = BenchReport {
        workload: args.workload,
        topic: topics[0].clone(),
        topics: topics.len(),
        producers: args.producers,
        published_through: PublishedThrough::of(args),
        consumers_per_group: if modes.is_empty() { 0 } else { args.consumers },
        partitions: args.partitions,
        retention: args.retention,
        record_bytes: args.size,
        depth: args.depth,
        publish_batch: args.publish_batch,
        published,
        publish_refused_full: shared.refused.load(Ordering::SeqCst),
        elapsed_secs: seconds,
        publish_requests: shared.requests.load(Ordering::SeqCst),
        requests_per_sec: shared.requests.load(Ordering::SeqCst) as f64 / seconds,
        records_per_sec: published as f64 / seconds,
        megabytes_per_sec: (published as f64 * args.size as f64) / seconds / 1e6,
        publish_latency: Percentiles::of(&publish_latency),
        cpu_user_s: cpu.map(|cpu| cpu.user_s),
        cpu_system_s: cpu.map(|cpu| cpu.system_s),
        groups,
        check_passed,
    };
    Ok(report)
}

fn checks_for(
    checks: &[(&'static str, GroupMode, Arc<Mutex<GroupCheck>>)],
) -> Vec<Arc<Mutex<GroupCheck>>> {
    checks
        .iter()
        .map(|(_, _, check)| Arc::clone(check))
        .collect()
}

fn progress_bar(args: &BenchArgs) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(args.records);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {elapsed_precise} [{bar:40}] {pos}/{len} records {rate} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        // Whole records per second with separators (`58,262/s`), not indicatif's `58261.8055/s`.
        .with_key(
            "rate",
            |state: &ProgressState, out: &mut dyn std::fmt::Write| {
                let _ = write!(out, "{}/s", with_thousands(state.per_sec().round() as u64));
            },
        )
        .progress_chars("=> "),
    );
    bar
}

/// Updates the progress bar ten times a second: records published, or for end-to-end
/// workloads, records consumed by the slowest group.
fn spawn_ticker(
    bar: ProgressBar,
    shared: Arc<Shared>,
    checks: Vec<Arc<Mutex<GroupCheck>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(100));
        loop {
            interval.tick().await;
            let published = shared.published.load(Ordering::Relaxed);
            let position = checks
                .iter()
                .map(|c| c.lock().unwrap_or_else(PoisonError::into_inner).consumed)
                .min()
                .unwrap_or(published);
            bar.set_position(position);
            bar.set_message(format!(
                "(published {}, full {})",
                published,
                shared.refused.load(Ordering::Relaxed)
            ));
        }
    })
}

/// Publishes the producer's share with `depth` requests in flight; returns the latency of every
/// publish request.
async fn produce(client: Client, producer: Producer) -> anyhow::Result<Histogram<u64>> {
    let latency = Mutex::new(new_histogram());
    let p = &producer;
    let client = &client;
    let latency_ref = &latency;
    let batches = (0..p.share)
        .step_by(p.batch)
        .map(|first| first..(first + p.batch as u64).min(p.share));
    stream::iter(batches)
        .take_while(|_| std::future::ready(p.deadline.is_none_or(|d| Instant::now() < d)))
        // Boxed: a request's future (with its back-off timer) is large, and `buffer_unordered`
        // moves each one into place.
        .map(|sequences| {
            Box::pin(async move {
                let mut unstored: Vec<u64> = sequences.collect();
                let mut backoff = FULL_BACKOFF;
                loop {
                    let sent = Instant::now();
                    let refused = publish_once(client, p, &unstored, sent).await?;
                    let nanos = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    let _ = latency_ref
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record(nanos.max(1));
                    p.shared
                        .published
                        .fetch_add((unstored.len() - refused.len()) as u64, Ordering::Relaxed);
                    p.shared
                        .refused
                        .fetch_add(refused.len() as u64, Ordering::Relaxed);
                    p.shared.requests.fetch_add(1, Ordering::Relaxed);
                    if refused.is_empty() || !p.retry_full {
                        return anyhow::Ok(());
                    }
                    unstored = refused;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_FULL_BACKOFF);
                }
            })
        })
        .buffer_unordered(p.depth)
        .try_collect::<()>()
        .await?;
    Ok(latency.into_inner().unwrap_or_else(PoisonError::into_inner))
}

/// Publishes the producer's share through `handle` (its own, or shared), `depth` sends in
/// flight; returns the latency of every send, from the call to its answer.
async fn produce_with_handle(
    handle: broker_client::Producer,
    p: Producer,
) -> anyhow::Result<Histogram<u64>> {
    let latency = Mutex::new(new_histogram());
    let (p, handle, latency_ref) = (&p, &handle, &latency);
    stream::iter(0..p.share)
        .take_while(|_| std::future::ready(p.deadline.is_none_or(|d| Instant::now() < d)))
        .map(|sequence| {
            let sent = Instant::now();
            let stamp = u64::try_from(sent.saturating_duration_since(p.shared.start).as_nanos())
                .unwrap_or(u64::MAX);
            let partition = ((u64::from(p.index) + sequence) % p.partitions as u64) as i32;
            let record = PublishRecord::to_partition(
                partition,
                encode_payload(p.size, p.index, sequence, stamp),
            );
            let send = handle.send(&p.topic, record);
            async move {
                let outcome = send.await;
                let nanos = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                let _ = latency_ref
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .record(nanos.max(1));
                p.shared.requests.fetch_add(1, Ordering::Relaxed);
                let counter = match outcome {
                    Ok(_) => &p.shared.published,
                    Err(ProducerError::Full { .. }) => &p.shared.refused,
                    Err(error) => return Err(anyhow::Error::from(error)),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        })
        .buffer_unordered(p.depth)
        .try_collect::<()>()
        .await?;
    Ok(latency.into_inner().unwrap_or_else(PoisonError::into_inner))
}

/// Publishes the records `sequences`, stamped as sent at `sent`, in one request (a single
/// publish, or a batch) and returns the sequences whose partition was full.
async fn publish_once(
    client: &Client,
    p: &Producer,
    sequences: &[u64],
    sent: Instant,
) -> anyhow::Result<Vec<u64>> {
    let partition_of =
        |sequence: u64| ((u64::from(p.index) + sequence) % p.partitions as u64) as i32;
    // The records of one request are sent at the same moment: one clock reading for them all.
    let sent = u64::try_from(sent.saturating_duration_since(p.shared.start).as_nanos())
        .unwrap_or(u64::MAX);
    let payload_of = |sequence: u64| encode_payload(p.size, p.index, sequence, sent);
    if let [sequence] = sequences {
        let offset = client
            .publish(&p.topic, partition_of(*sequence), payload_of(*sequence))
            .await?;
        return Ok(if offset < 0 {
            vec![*sequence]
        } else {
            Vec::new()
        });
    }
    let records = sequences
        .iter()
        .map(|&sequence| PublishRecord::to_partition(partition_of(sequence), payload_of(sequence)))
        .collect();
    let placed = client.publish_batch(&p.topic, records).await?;
    Ok(sequences
        .iter()
        .zip(placed)
        .filter(|(_, (_, offset))| *offset < 0)
        .map(|(&sequence, _)| sequence)
        .collect())
}

struct Consumer {
    topic: String,
    /// The place of the topic's partition 0 in the group's check.
    first_place: usize,
    group: &'static str,
    member: String,
    mode: GroupMode,
    batch: i32,
    check: Arc<Mutex<GroupCheck>>,
    shared: Arc<Shared>,
}

/// Consumes until the group has consumed everything the producers published.
async fn consume(client: Client, consumer: Consumer) -> anyhow::Result<()> {
    let Consumer {
        topic,
        first_place,
        group,
        member,
        mode,
        batch,
        check,
        shared,
    } = consumer;
    // The deliveries of the previous round, acknowledged (ack mode: in the same request as the
    // next poll) or committed (fetch mode: in the same write as the next fetch, which the
    // server applies after the commit).
    let mut unsettled: Vec<(i32, i64)> = Vec::new();
    loop {
        if consumed_everything(&shared, &check) {
            settle(&client, &topic, group, &member, mode, &unsettled).await?;
            // Leave, so the benchmark topic keeps no member that will never call again.
            client.leave(&topic, group, &member).await?;
            return Ok(());
        }
        let records = match mode {
            GroupMode::Ack => {
                let (acked, records) = client
                    .ack_and_poll_wait(
                        &topic,
                        group,
                        &member,
                        &unsettled,
                        batch.min(MAX_POLL_RECORDS),
                        CONSUMER_WAIT,
                    )
                    .await?;
                check_acked(&acked)?;
                records
            }
            GroupMode::Fetch => {
                let commit = settle(&client, &topic, group, &member, mode, &unsettled);
                let fetch = client.fetch_wait(&topic, group, &member, batch, CONSUMER_WAIT);
                let (committed, records) = tokio::join!(commit, fetch);
                committed?;
                records?
            }
        };
        unsettled.clear();
        let now = elapsed_nanos(shared.start);
        let mut observed = check.lock().unwrap_or_else(PoisonError::into_inner);
        observed.rounds += 1;
        for record in &records {
            observed.observe(first_place, record, now);
            unsettled.push((record.partition, record.offset));
        }
    }
}

/// Consumes through a `Consumer` handle until the group has consumed everything the producers
/// published: ack mode acknowledges each record with the next poll, fetch mode commits every
/// round (in the same write as the next fetch).
async fn consume_with_handle(client: Client, consumer: Consumer) -> anyhow::Result<()> {
    let Consumer {
        topic,
        first_place,
        group,
        member,
        mode,
        batch,
        check,
        shared,
    } = consumer;
    let (mode, batch) = match mode {
        GroupMode::Ack => (ConsumeMode::Ack, batch.min(MAX_POLL_RECORDS)),
        GroupMode::Fetch => (ConsumeMode::Fetch, batch),
    };
    let mut handle = broker_client::Consumer::builder(topic, group)
        .member(member)
        .mode(mode)
        .max_records(batch)
        .max_wait(CONSUMER_WAIT)
        .auto_commit(Some(Duration::ZERO))
        .start(client)
        .await?;
    loop {
        if consumed_everything(&shared, &check) {
            handle.close().await?;
            return Ok(());
        }
        let deliveries = handle.next_batch().await?;
        let now = elapsed_nanos(shared.start);
        let mut observed = check.lock().unwrap_or_else(PoisonError::into_inner);
        observed.rounds += 1;
        for delivery in &deliveries {
            observed.observe(first_place, delivery, now);
            delivery.ack_later();
        }
    }
}

/// Whether the producers are done and the group consumed everything they published.
fn consumed_everything(shared: &Shared, check: &Mutex<GroupCheck>) -> bool {
    shared.producers_done.load(Ordering::SeqCst)
        && check
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unique()
            >= shared.published.load(Ordering::SeqCst)
}

/// Fails unless every acknowledgement matched its delivery.
fn check_acked(acked: &[bool]) -> anyhow::Result<()> {
    if acked.contains(&false) {
        bail!("the broker refused an acknowledgement of a record it delivered");
    }
    Ok(())
}

/// Acknowledges (ack mode) or commits (fetch mode) what a consumer took in its last round.
async fn settle(
    client: &Client,
    topic: &str,
    group: &str,
    member: &str,
    mode: GroupMode,
    taken: &[(i32, i64)],
) -> anyhow::Result<()> {
    if taken.is_empty() {
        return Ok(());
    }
    match mode {
        GroupMode::Ack => {
            let acks = taken
                .iter()
                .map(|&(partition, offset)| client.ack(topic, group, member, partition, offset));
            check_acked(&futures::future::try_join_all(acks).await?)?;
        }
        GroupMode::Fetch => client.commit(topic, group, member, None).await?,
    }
    Ok(())
}

/// Bytes of one ping and of its echo.
const PING_BYTES: usize = 64;

/// `round_trips` 64-byte round trips over loopback TCP to an echo thread, one at a time (with
/// TCP_NODELAY, as the broker's connections): the latency floor of one request.
fn ping(round_trips: u64) -> anyhow::Result<Histogram<u64>> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind the echo socket")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut buf = [0u8; PING_BYTES];
        loop {
            match stream.read_exact(&mut buf) {
                Ok(()) => stream.write_all(&buf)?,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    });
    let mut stream = TcpStream::connect(addr).context("cannot connect to the echo socket")?;
    stream.set_nodelay(true)?;
    let mut latency = new_histogram();
    let mut buf = [7u8; PING_BYTES];
    for _ in 0..round_trips {
        let sent = Instant::now();
        stream.write_all(&buf)?;
        stream.read_exact(&mut buf)?;
        let nanos = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let _ = latency.record(nanos.max(1));
    }
    drop(stream);
    echo.join()
        .map_err(|_| anyhow::anyhow!("the echo thread panicked"))?
        .context("the echo thread failed")?;
    Ok(latency)
}

fn print_ping(latency: &Histogram<u64>, json: bool) -> anyhow::Result<()> {
    let percentiles = Percentiles::of(latency);
    if json {
        let report = serde_json::json!({
            "workload": Workload::Ping,
            "message_bytes": PING_BYTES,
            "round_trip": percentiles,
        });
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        outln!(
            "loopback TCP ping-pong, {PING_BYTES} B, one at a time: {}",
            percentiles.text()
        )?;
    }
    Ok(())
}

fn print_report(report: &BenchReport, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(report)?)?;
        return Ok(());
    }
    outln!(
        "workload {} on {}: {} producer{} x depth {} {}{}, {} consumer{} per group, {} partition{}, {} retention, {}-byte records",
        format!("{:?}", report.workload).to_lowercase(),
        match report.topics {
            1 => format!("topic {}", report.topic),
            count => format!("{count} topics ({} and the next)", report.topic),
        },
        report.producers,
        plural(report.producers),
        report.depth,
        report.published_through.text(),
        match report.publish_batch {
            1 => String::new(),
            records => format!(" in requests of {records} records"),
        },
        report.consumers_per_group,
        plural(report.consumers_per_group),
        report.partitions,
        plural(report.partitions),
        format!("{:?}", report.retention).to_lowercase(),
        report.record_bytes
    )?;
    outln!(
        "published {} records in {:.3} s: {} records/s, {:.1} MB/s{}",
        with_thousands(report.published),
        report.elapsed_secs,
        with_thousands(report.records_per_sec as u64),
        report.megabytes_per_sec,
        if report.groups.is_empty() {
            ""
        } else {
            " (published and consumed by every group)"
        }
    )?;
    outln!(
        "publish answered -1 (partition full) {} times; {} publish requests/s answered",
        with_thousands(report.publish_refused_full),
        with_thousands(report.requests_per_sec as u64)
    )?;
    outln!("publish latency: {}", report.publish_latency.text())?;
    if let (Some(user), Some(system)) = (report.cpu_user_s, report.cpu_system_s) {
        outln!(
            "CPU of this load generator while it ran: user {user:.2} s, system {system:.2} s{}",
            match report.published {
                0 => String::new(),
                records => format!(
                    " ({:.2} µs per record published)",
                    (user + system) * 1e6 / records as f64
                ),
            }
        )?;
    }
    for group in &report.groups {
        outln!(
            "group {} ({}): consumed {} in {} requests, duplicates {}, redelivered {}, out of \
             order {}, missing {}",
            group.group,
            group.mode,
            with_thousands(group.consumed),
            with_thousands(group.consume_requests),
            group.duplicates,
            group.redelivered,
            group.out_of_order,
            group.missing
        )?;
        if let Some(latency) = &group.end_to_end_latency {
            outln!("  end-to-end latency: {}", latency.text())?;
        }
    }
    if !report.groups.is_empty() {
        outln!(
            "check: {}",
            if report.check_passed {
                "every record consumed exactly once per group, in offset order per partition"
            } else {
                "FAILED"
            }
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn shares_split_records_evenly() {
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(2, 4), vec![1, 1, 0, 0]);
        assert_eq!(shares(0, 1), vec![0]);
    }

    #[test]
    fn payload_header_round_trips() {
        let payload = encode_payload(100, 3, 77, 123_456);
        assert_eq!(payload.len(), 100);
        assert_eq!(decode_header(&payload), Some((3, 77, 123_456)));
        assert_eq!(decode_header(&payload[..19]), None);
    }

    fn record(partition: i32, offset: i64, producer: u32, sequence: u64) -> BrokerRecord {
        BrokerRecord {
            topic: "t".into(),
            partition,
            offset,
            key: None,
            payload: encode_payload(20, producer, sequence, 0),
            timestamp_ms: 0,
            headers: Vec::new(),
            delivery_count: 0,
        }
    }

    #[test]
    fn the_check_counts_duplicates_gaps_and_missing_records() {
        let mut check = GroupCheck::new(2, &[2, 1]);
        check.observe(0, &record(0, 0, 0, 0), 10);
        check.observe(0, &record(1, 0, 1, 0), 10);
        assert_eq!(
            (check.duplicates, check.out_of_order, check.missing()),
            (0, 0, 1)
        );
        check.observe(0, &record(0, 2, 0, 0), 10); // skipped offset 1, and a duplicate
        assert_eq!((check.duplicates, check.out_of_order), (1, 1));
    }

    #[test]
    fn each_topic_has_its_own_places_in_the_check() {
        // Two topics of one partition: producer 0 publishes to the first, producer 1 to the
        // second; both start at offset 0 without either being out of order.
        let mut check = GroupCheck::new(2, &[1, 1]);
        check.observe(0, &record(0, 0, 0, 0), 10);
        check.observe(1, &record(0, 0, 1, 0), 10);
        assert_eq!(
            (check.duplicates, check.out_of_order, check.missing()),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_redelivery_at_the_same_offset_is_no_duplicate() {
        let mut check = GroupCheck::new(1, &[3]);
        for sequence in 0..2 {
            check.observe(0, &record(0, sequence as i64, 0, sequence), 10);
        }
        // Both delivered again (their acknowledgement was lost), then the next one.
        for sequence in 0..3 {
            check.observe(0, &record(0, sequence as i64, 0, sequence), 10);
        }
        assert_eq!(
            (
                check.duplicates,
                check.redelivered,
                check.out_of_order,
                check.missing()
            ),
            (0, 2, 0, 0)
        );
        assert_eq!((check.consumed, check.unique()), (5, 3));
    }
}
