//! `broker-server`: parses flags, sets up logging, binds, starts, prints `listening on <address>`
//! once it serves, and serves until SIGINT or SIGTERM. Everything else lives in the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use broker_core::{Limits, NameRules};
use broker_server::{
    default_request_memory, parse_members, resolve_listen_addr, AuthToken, ClusterSettings, Config,
    ServerError, ServerTls,
};
use broker_server::{open_storage, Fsync};
use clap::{CommandFactory, FromArgMatches, Parser};
use logging::LogFormat;
use ownership::with_ownership_hint;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

mod logging;
mod ownership;

const EXAMPLES: &str = "\
Examples:
  broker-server --capacity 100 --listen :9092     every interface, port 9092
  broker-server --listen 127.0.0.1:0              an ephemeral port, printed when ready
  BROKER_LISTEN=[::1]:9092 broker-server          the same flags as environment variables
  RUST_LOG=broker_server=debug broker-server      one log line per connection
  BROKER_AUTH_TOKEN=s3cret broker-server --listen :9092
                                                  clients must present the token
  broker-server --tls-cert cert.pem --tls-key key.pem
                                                  serve TLS only

A cluster of three on one host (each node with its own --node-id, ports and directory):
  N1=1=127.0.0.1:9201/127.0.0.1:9101 N2=2=127.0.0.1:9202/127.0.0.1:9102
  N3=3=127.0.0.1:9203/127.0.0.1:9103
  export BROKER_CLUSTER_MEMBERS=$N1,$N2,$N3
  broker-server --node-id 1 --listen 127.0.0.1:9101 --data-dir /var/lib/broker-1
  broker-server --node-id 2 --listen 127.0.0.1:9102 --data-dir /var/lib/broker-2
  broker-server --node-id 3 --listen 127.0.0.1:9103 --data-dir /var/lib/broker-3
  export BROKER_ADDR=127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103
  broker publish t hello
  broker cluster status
Adding a fourth node to it, then removing node 3 (stop its process afterwards; its directory
serves no node again):
  broker-server --node-id 4 --listen 127.0.0.1:9104 --data-dir /var/lib/broker-4 \\
    --cluster-join --cluster-members \"$BROKER_CLUSTER_MEMBERS,4=127.0.0.1:9204/127.0.0.1:9104\"
  broker cluster add 4=127.0.0.1:9204/127.0.0.1:9104
  broker cluster remove 3

Values in BYTES are a plain number (16777216) or a whole number with a unit: 16MiB, 500MB
(kB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).

The auth token comes from --auth-token-file or the BROKER_AUTH_TOKEN environment variable,
never from a command-line value (which any user could read in the process list).";

/// A message broker: partitioned topics, consumer groups, acks and Kafka-style fetch and commit,
/// served over TCP.
#[derive(Debug, Parser)]
#[command(version, about, after_help = EXAMPLES)]
struct Args {
    /// Records each partition of an interest-retention topic (the default) retains at most,
    /// 1 to 2147483647, unless the topic sets its own --max-records (see `broker create
    /// --help`); a full partition refuses publishes until every group consumed its oldest
    /// record. Limits-retention topics keep what their own limits say.
    #[arg(
        long,
        env = "BROKER_CAPACITY",
        default_value_t = 100,
        allow_negative_numbers = true
    )]
    capacity: i32,
    /// Address to listen on: HOST:PORT, [IPv6]:PORT, or :PORT for every IPv4 interface; [::]:PORT
    /// listens on every IPv6 interface and, where the system maps IPv4 onto IPv6 (Linux's
    /// default), every IPv4 one too. Port 0 picks a free port.
    #[arg(long, env = "BROKER_LISTEN", default_value = "127.0.0.1:9092")]
    listen: String,
    /// Serve metrics at http://ADDR/metrics in Prometheus's text format, or in OpenMetrics to a
    /// scraper that asks for it (HOST:PORT, [IPv6]:PORT or :PORT, as --listen; port 0 picks a
    /// free port, printed as `metrics on ...` after
    /// `listening on ...`). Off by default: without it nothing is counted. The endpoint has no
    /// authentication: bind it where only the monitoring system reaches it.
    #[arg(long, env = "BROKER_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Also speak Kafka's wire protocol on ADDR (HOST:PORT, [IPv6]:PORT or :PORT, as --listen;
    /// port 0 picks a free port, printed as `kafka on ...`), so that Kafka clients and tools
    /// (librdkafka, kafka-python, the Java client, kcat) produce to and consume the same topics.
    /// Off by default. With --auth-token-file, Kafka's clients authenticate with SASL/PLAIN, the
    /// token as the password (any user name); with --tls-cert, they speak TLS (SSL, or
    /// SASL_SSL with a token) with the same certificate. In a cluster, give every node one:
    /// each lists every node's Kafka address and sends clients to the leader.
    #[arg(long, env = "BROKER_KAFKA_LISTEN", value_name = "ADDR")]
    kafka_listen: Option<String>,
    /// Serve a read-only web console at http://ADDR/ (https:// with --tls-cert): topics with
    /// their partitions, retention and sizes, consumer groups with members, committed offsets,
    /// deliveries in flight and lag (charted over the last 10 minutes, with each topic's
    /// throughput), dead-letter topics, the cluster's nodes and Raft groups, and each
    /// partition's latest records (payloads as text or hex, with headers). HOST:PORT,
    /// [IPv6]:PORT or :PORT, as --listen; port 0 picks a free port, printed as `console on
    /// ...`. Off by default. With --auth-token-file the console asks for the token (or takes it
    /// as `Authorization: Bearer TOKEN`); without one, anyone who reaches the address reads
    /// every record, and only requests addressed to an IP address or localhost are answered.
    /// In a cluster, each node's console shows every topic of every group.
    #[arg(long, env = "BROKER_CONSOLE_LISTEN", value_name = "ADDR")]
    console_listen: Option<String>,
    /// The HOST:PORT Kafka clients are told to reach the Kafka listener on (its Metadata
    /// answer): needed when they reach it through a port mapping (Docker) or a proxy. By
    /// default each client is told the address its connection came in on; in a cluster, the
    /// host of this node's client address (in --cluster-members) with the Kafka port, as the
    /// other nodes tell their clients too.
    #[arg(
        long,
        env = "BROKER_KAFKA_ADVERTISE",
        value_name = "HOST:PORT",
        requires = "kafka_listen"
    )]
    kafka_advertise: Option<String>,
    /// Create a topic a Kafka client asks for by name when it does not exist, as Kafka's
    /// auto.create.topics.enable does (the client's Metadata request must allow it, as
    /// producers do by default): with --kafka-auto-create-partitions partitions and Kafka's
    /// retention (limits retention, records kept 7 days). Off by default: a produce to a topic
    /// that does not exist then fails with UNKNOWN_TOPIC_OR_PARTITION once the client gives up
    /// waiting for it (librdkafka after topic.metadata.propagation.max.ms, 30 s by default).
    #[arg(
        long,
        env = "BROKER_KAFKA_AUTO_CREATE_TOPICS",
        requires = "kafka_listen"
    )]
    kafka_auto_create_topics: bool,
    /// The partitions of a topic --kafka-auto-create-topics creates (Kafka's num.partitions):
    /// 1 to --max-partitions.
    #[arg(
        long,
        env = "BROKER_KAFKA_AUTO_CREATE_PARTITIONS",
        default_value_t = 1,
        allow_negative_numbers = true,
        requires = "kafka_auto_create_topics",
        value_name = "COUNT"
    )]
    kafka_auto_create_partitions: i32,
    /// Largest frame accepted or sent, in bytes; at least max payload + 2 MiB, at most 64 MiB.
    #[arg(long, env = "BROKER_MAX_FRAME_BYTES", value_name = "BYTES", default_value_t = 8 * 1024 * 1024, value_parser = broker_args::parse_bytes_usize)]
    max_frame_bytes: usize,
    /// Largest payload, key and headers of one published record, in bytes.
    #[arg(long, env = "BROKER_MAX_PAYLOAD_BYTES", value_name = "BYTES", default_value_t = 1024 * 1024, value_parser = broker_args::parse_bytes_usize)]
    max_payload_bytes: usize,
    /// Most client connections served at once, on the broker's port and the Kafka listener
    /// together; more wait to be accepted. While every slot is taken, a new connection takes
    /// the slot of the oldest one that has not said who it is yet (no hello on the broker's
    /// port; on the Kafka listener, no request past ApiVersions and authentication), which is
    /// closed: clients that connect and say nothing no longer keep new ones waiting (for as
    /// long as 10 s each). A client that says hello (or, without an auth token, sends a
    /// request) holds its slot until it is idle for --idle-timeout-ms.
    #[arg(long, env = "BROKER_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Most requests of one connection worked on at once (waiting ones included); the server
    /// stops reading a connection that has this many outstanding.
    #[arg(long, env = "BROKER_MAX_IN_FLIGHT", default_value_t = 1024)]
    max_in_flight: usize,
    /// Without --data-dir, and on a cluster node: bytes the broker retains at most, across
    /// every topic, counting each record's payload, key and header bytes and 80 bytes for the
    /// record itself; past it publish answers -1 (full), as for a
    /// partition at capacity. At least max payload bytes and 80 (for each shard or data
    /// group). A cluster node counts the records in
    /// memory and in its segment files alike, and every node must have the same value. A
    /// single broker with --data-dir keeps records on disk: there it bounds the records held
    /// in memory (with --fsync batch or never, records already in their segment files leave
    /// memory as it fills, and publishes wait only while the disk is behind; with always,
    /// records leave at checkpoints, and past it publishes wait for the running one).
    #[arg(long, env = "BROKER_MAX_MEMORY", value_name = "BYTES", default_value_t = 1024 * 1024 * 1024, value_parser = broker_args::parse_bytes)]
    max_memory: u64,
    /// Bytes of requests larger than 64 KiB read and not yet answered, across every connection
    /// of both listeners together: once the length of such a frame has arrived (smaller ones
    /// take no room: each arrives within the 64 KiB chunk a connection reads at a time) the
    /// server reads no more of it until it has room, so
    /// that many clients sending large requests at once make the server wait (their sends wait
    /// on TCP) instead of its memory growing with them. A request's room is given back when it
    /// is answered. Answers that carry records (reads, polls, fetches) on the broker's port
    /// take room too, before they are built: as much as they may take, or what is free once
    /// there is room for one record of --max-payload-bytes beside the overhead of the records
    /// asked for (the answer then carries fewer records), waiting for that much. One connection
    /// of the broker's port holds at most a quarter of this (at least --max-frame-bytes): a
    /// client that pipelines reads without reading the answers waits for its own room to be
    /// given back, while the others find theirs. Answers that
    /// list the whole state (describe, metadata, lag, reset, stored offsets, producers, cluster
    /// and group status) are built one at a time per connection: the next such request waits
    /// until the last answer is written. Less than --max-frame-bytes refuses to start. Default: a quarter of
    /// --max-memory (256 MiB with the defaults), raised to --max-frame-bytes if less, so that
    /// one number sizes the process: it needs about --max-memory plus this plus a few tens of
    /// MiB.
    #[arg(long, env = "BROKER_MAX_REQUEST_MEMORY", value_name = "BYTES", value_parser = broker_args::parse_bytes)]
    max_request_memory: Option<u64>,
    /// Which names of topics, groups and members the broker takes, on every listener. `broker`:
    /// 1 to 64 ASCII letters, digits, `_` and `-`. `kafka`: also `.`, and up to 249
    /// characters, as Kafka allows its topics (`orders.v1`), though neither `.` nor `..`; names
    /// differing only by `.` against `_` are two topics (Kafka refuses the second, whose metric
    /// names cannot tell them apart; the broker's metrics label each topic by its exact name).
    /// Give every node of a cluster, and every restart, the same rules: a server started with
    /// `broker` keeps the topics named otherwise, but refuses calls that name them.
    #[arg(long, env = "BROKER_NAMES", value_enum, default_value_t = NamesArg::Broker)]
    names: NamesArg,
    /// Most topics the broker holds; creating one more is refused.
    #[arg(long, env = "BROKER_MAX_TOPICS", default_value_t = Limits::default().max_topics)]
    max_topics: usize,
    /// Most partitions of one topic, 1 to 65536; creating or growing a topic past it is
    /// refused.
    #[arg(
        long,
        env = "BROKER_MAX_PARTITIONS",
        default_value_t = Limits::default().max_partitions
    )]
    max_partitions: usize,
    /// Most consumer groups of one topic; joining a new group past it is refused.
    #[arg(
        long,
        env = "BROKER_MAX_GROUPS_PER_TOPIC",
        default_value_t = Limits::default().max_groups_per_topic
    )]
    max_groups_per_topic: usize,
    /// Most members of one group; a new member past it is refused.
    #[arg(
        long,
        env = "BROKER_MAX_MEMBERS_PER_GROUP",
        default_value_t = Limits::default().max_members_per_group
    )]
    max_members_per_group: usize,
    /// A connection that sends nothing for this many milliseconds while it has no request
    /// outstanding is closed.
    #[arg(long, env = "BROKER_IDLE_TIMEOUT_MS", default_value_t = 600_000)]
    idle_timeout_ms: u64,
    /// A frame (or Kafka request) that has started arriving must be complete within this many
    /// milliseconds (one that starts while the connection waits: within twice that), counted
    /// from when it has room in --max-request-memory, or the connection is closed.
    #[arg(long, env = "BROKER_READ_TIMEOUT_MS", default_value_t = 30_000)]
    read_timeout_ms: u64,
    /// A connection whose client takes none of its responses for this many milliseconds (it
    /// does not read) is closed.
    #[arg(long, env = "BROKER_WRITE_TIMEOUT_MS", default_value_t = 30_000)]
    write_timeout_ms: u64,
    /// Longest a waiting poll, fetch or ack-and-poll may wait, in milliseconds.
    #[arg(long, env = "BROKER_MAX_WAIT_MS", default_value_t = 60_000)]
    max_wait_ms: u64,
    /// A consumer-group member is removed (and its partitions rebalanced) after this many
    /// milliseconds without a request naming it.
    #[arg(long, env = "BROKER_SESSION_TIMEOUT_MS", default_value_t = 30_000)]
    session_timeout_ms: u64,
    /// Also remove members as soon as the connection they joined through closes (the
    /// environment variable takes true/false, 1/0, yes/no, on/off).
    #[arg(
        long,
        env = "BROKER_LEAVE_ON_DISCONNECT",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    leave_on_disconnect: bool,
    /// Threads serving connections (the runtime's workers), 1 to 1024; by default one per CPU
    /// core. On a host shared with busy clients, fewer threads mean fewer wake-ups between
    /// them: on two cores shared with the load generator, one thread served acknowledged and
    /// fetched records fastest in BENCHMARKS.md's runs (pipelined publishes gained from two).
    #[arg(
        long,
        env = "BROKER_WORKER_THREADS",
        value_name = "N",
        value_parser = clap::value_parser!(u64).range(1..=1024)
    )]
    worker_threads: Option<u64>,
    /// Log filter: a level (off, error, warn, info, debug, trace) or TARGET=LEVEL directives
    /// separated by commas, such as info,broker_server=debug; RUST_LOG, when set, replaces it
    /// (checked as strictly). Info shows topics created and deleted, members joining and
    /// leaving with each group's new assignment, expired sessions and storage events; debug
    /// adds one line per connection that sent requests. In a cluster, the consensus engine's
    /// own lines (target openraft) are off unless named (info,openraft=info); the server logs
    /// each change of leader and each peer that becomes unreachable (a warning; at info for a
    /// peer that never answered since the start, as the nodes of a new cluster start one after
    /// the other) or answers again.
    #[arg(
        long,
        env = "BROKER_LOG_LEVEL",
        default_value = "info",
        value_parser = logging::check_filter
    )]
    log_level: String,
    /// How log lines are written on standard error: text, or one JSON object per line.
    #[arg(long, env = "BROKER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Directory for the write-ahead log, snapshots and records: every change is logged before
    /// it is answered; with --fsync batch or never, each record is written once, to its
    /// partition's segment files, as it is logged (with always, the log holds it until a
    /// checkpoint writes it there); memory holds the records since the last checkpoint; the
    /// broker is rebuilt from it on start.
    /// Without it the broker is purely in memory. One server per directory. A cluster node
    /// keeps its replicated log, snapshots and record segments in DIR/raft/ instead (see
    /// --cluster-snapshot-entries).
    #[arg(long, env = "BROKER_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// With --data-dir: always = a response is sent only after its change is fsynced (group
    /// commit; survives power loss); batch = written before the response, fsynced every
    /// --fsync-interval-ms (survives kill -9, a power loss loses at most that interval); never
    /// = written before the response, the OS decides when to sync (survives kill -9 only).
    #[arg(
        long,
        env = "BROKER_FSYNC",
        value_enum,
        default_value_t = FsyncArg::Always,
        requires = "data_dir"
    )]
    fsync: FsyncArg,
    /// With --fsync batch, the longest a written change waits for its fsync, in milliseconds.
    #[arg(long, env = "BROKER_FSYNC_INTERVAL_MS", default_value_t = 50)]
    fsync_interval_ms: u64,
    /// With --data-dir, a checkpoint is taken (in the background) after this many bytes of
    /// log and records written (or every twelfth of --max-memory, when that is less): a
    /// snapshot is written, the log it covers removed and the records it covers (in their
    /// segment files) leave memory. Bounds recovery time, and what a restart replays into
    /// memory. (A cluster node goes by --cluster-snapshot-entries instead.)
    #[arg(long, env = "BROKER_SNAPSHOT_LOG_BYTES", value_name = "BYTES", default_value_t = 64 * 1024 * 1024, value_parser = broker_args::parse_bytes)]
    snapshot_log_bytes: u64,
    /// With --data-dir (a single broker or a cluster node), a partition's segment file is
    /// closed and a new one started after this many bytes (at least 4096); records leave the
    /// disk a whole segment at a time.
    #[arg(long, env = "BROKER_SEGMENT_BYTES", value_name = "BYTES", default_value_t = 64 * 1024 * 1024, value_parser = broker_args::parse_bytes)]
    segment_bytes: u64,
    /// A single broker's topics spread over this many shards (1 to 64), each with a lock of
    /// its own (and, with --data-dir, a log of its own in DIR/shards/<n>/), so that calls about
    /// topics of different shards run on different cores. Every call about one topic keeps its
    /// meaning; a listing of every topic gathers the shards one after another; --max-memory is
    /// shared out equally. A group's dead-letter topic goes to (and
    /// must be in) its topic's shard; a topic named after another plus -dlq, _retry and the
    /// like (see docs/shards.md) goes with it; others to the shard with the fewest partitions. Shards
    /// are never merged: a directory must be started with at least as many as it holds.
    /// Default: as many as --data-dir holds, or 1.
    #[arg(long, env = "BROKER_SHARDS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    shards: Option<u16>,
    /// File holding the shared secret every client must present in its hello (trailing line
    /// breaks are ignored). Or set BROKER_AUTH_TOKEN to the secret itself. Without either,
    /// anyone who reaches the port gets in.
    #[arg(long, env = "BROKER_AUTH_TOKEN_FILE", value_name = "PATH")]
    auth_token_file: Option<PathBuf>,
    /// PEM certificate chain (server certificate first): serve TLS only. Needs --tls-key.
    #[arg(
        long,
        env = "BROKER_TLS_CERT",
        value_name = "PEM",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "BROKER_TLS_KEY",
        value_name = "PEM",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Run as node ID of a replicated cluster (a whole number, unique in the cluster, never
    /// reused): every change is answered only once a majority of the nodes has it. Needs
    /// --cluster-members and --data-dir. Without it the server is a single broker.
    #[arg(
        long,
        env = "BROKER_NODE_ID",
        value_name = "ID",
        requires_all = ["cluster_members", "data_dir"]
    )]
    node_id: Option<u64>,
    /// Every node of the cluster, this one included: ID=PEER_ADDR/CLIENT_ADDR, separated by
    /// commas, where PEER_ADDR is the address the other nodes reach the node's peer port at and
    /// CLIENT_ADDR the address clients reach its broker port at (a client that asks a node
    /// which does not lead is told the leader's). Every node gets the same list. Read when the
    /// cluster is first formed; after that the membership lives in the replicated log.
    #[arg(
        long,
        env = "BROKER_CLUSTER_MEMBERS",
        value_name = "LIST",
        requires = "node_id"
    )]
    cluster_members: Option<String>,
    /// Where to listen for the other nodes (HOST:PORT, [IPv6]:PORT or :PORT); by default this
    /// node's PEER_ADDR in --cluster-members. With an auth token, the nodes present it to each
    /// other.
    #[arg(
        long,
        env = "BROKER_CLUSTER_LISTEN",
        value_name = "ADDR",
        requires = "node_id"
    )]
    cluster_listen: Option<String>,
    /// Join a cluster that already runs instead of forming a new one: the node starts empty
    /// and waits until `broker cluster add ID=PEER_ADDR/CLIENT_ADDR` (sent to any node) adds
    /// it; --cluster-members lists the running cluster's nodes and this one. Counts only at
    /// the node's first start (afterwards its membership is in its log). The environment
    /// variable takes true/false, 1/0, yes/no, on/off.
    #[arg(
        long,
        env = "BROKER_CLUSTER_JOIN",
        value_parser = clap::builder::BoolishValueParser::new(),
        requires = "node_id"
    )]
    cluster_join: bool,
    /// A cluster node takes a snapshot after this many entries of the replicated log since
    /// the last one: the records applied since then move to their segment files, and the log
    /// before it is removed (a node that falls further behind catches up from the snapshot,
    /// segment files included). Bounds the records held in memory and a restart's replay.
    #[arg(
        long,
        env = "BROKER_CLUSTER_SNAPSHOT_ENTRIES",
        value_name = "N",
        default_value_t = 20_000,
        value_parser = clap::value_parser!(u64).range(10..),
        requires = "node_id"
    )]
    cluster_snapshot_entries: u64,
    /// A cluster node keeps the newest entries of each group's replicated log in memory, up to
    /// this many bytes (the newest entry always, whatever its size): the leader sends them to
    /// its followers from there. A follower that falls further behind is sent older entries
    /// read back from the log's files. Between snapshots the log holds every record published
    /// since the last one (--cluster-snapshot-entries), so this bounds what the log adds to
    /// the node's memory; 0 keeps only the newest entry.
    #[arg(
        long,
        env = "BROKER_CLUSTER_LOG_CACHE_BYTES",
        value_name = "BYTES",
        value_parser = broker_args::parse_bytes,
        default_value_t = broker_cluster::CACHED_ENTRY_BYTES,
        requires = "node_id"
    )]
    cluster_log_cache_bytes: u64,
    /// Spread the cluster's topics over this many Raft groups (1 to 64), each with a leader of
    /// its own, so that the nodes share the leaders' work: each group past the first has
    /// --cluster-replicas voters, the groups' leaders are balanced over the nodes, and a new
    /// topic goes to the group holding the fewest partitions (a topic named after another
    /// with -dlq, -retry and such goes with it). Every call about one topic keeps its
    /// meaning; a listing of every topic gathers the groups. Every node gets the same value;
    /// 1 (the default) is a cluster of one group. Groups are added, never removed: raising it
    /// on every node adds groups (once every node runs a release that has them); a node keeps
    /// every group its directory holds. With --kafka-listen, Kafka's clients are sent to each
    /// topic's group leader, and the first group's leader coordinates every Kafka group.
    #[arg(
        long,
        env = "BROKER_CLUSTER_DATA_GROUPS",
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=64),
        requires = "node_id"
    )]
    cluster_data_groups: u16,
    /// How many nodes hold a copy of each group past the first (with --cluster-data-groups):
    /// its voters, chosen round robin so that every node holds as many groups as the others.
    /// A cluster with fewer nodes gives every node a copy of every group. Each group's leader
    /// keeps it at this many: a node added to the cluster takes the copies round robin now
    /// gives it (each added before the node it replaces gives its copy up), a node removed is
    /// replaced in each group it held, and a group with more voters (after this was lowered)
    /// gives the last ones up. Any node serves any topic: a node
    /// without a copy of a topic's group sends its clients to that group's leader. The first
    /// group (the cluster's membership and where each topic lives) keeps every node a voter.
    /// 3 keeps a group serving through the loss of one of its nodes, 5 of two; 1 or 2 loses
    /// a group's service (not its data on disk) with one of its nodes. Every node gets the
    /// same value: while one has another, the others' logs name it and the groups keep their
    /// voters but for nodes that left the cluster.
    #[arg(
        long,
        env = "BROKER_CLUSTER_REPLICAS",
        value_name = "N",
        default_value_t = 3,
        value_parser = clap::value_parser!(u16).range(1..=64),
        requires = "node_id"
    )]
    cluster_replicas: u16,
    /// Encrypt the peer port too: with --tls-cert and --tls-key, the node presents that
    /// certificate to the other nodes and checks theirs against the CA certificates in this
    /// PEM file (each node's certificate must carry the host of its PEER_ADDR). Every node of
    /// a cluster must agree.
    #[arg(
        long,
        env = "BROKER_CLUSTER_TLS_CA",
        value_name = "PEM",
        requires_all = ["node_id", "tls_cert"]
    )]
    cluster_tls_ca: Option<PathBuf>,
}

/// `--fsync`: when a change counts as durable (see `Fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum FsyncArg {
    /// A response is sent only after its change is fsynced.
    Always,
    /// Written before the response, fsynced every --fsync-interval-ms.
    Batch,
    /// Written before the response; the operating system decides when to sync.
    Never,
}

impl From<FsyncArg> for Fsync {
    fn from(arg: FsyncArg) -> Fsync {
        match arg {
            FsyncArg::Always => Fsync::Always,
            FsyncArg::Batch => Fsync::Batch,
            FsyncArg::Never => Fsync::Never,
        }
    }
}

/// `--names`: which names the broker takes (see `NameRules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum NamesArg {
    /// 1 to 64 ASCII letters, digits, `_` and `-`.
    Broker,
    /// Kafka's: also `.`, up to 249 characters.
    Kafka,
}

impl From<NamesArg> for NameRules {
    fn from(arg: NamesArg) -> NameRules {
        match arg {
            NamesArg::Broker => NameRules::Broker,
            NamesArg::Kafka => NameRules::Kafka,
        }
    }
}

impl Args {
    /// The configuration, with the auth token and the TLS identity loaded.
    fn config(&self) -> Result<Config, ServerError> {
        Ok(Config {
            capacity: self.capacity,
            max_frame_bytes: self.max_frame_bytes,
            max_payload_bytes: self.max_payload_bytes,
            max_connections: self.max_connections,
            max_in_flight: self.max_in_flight,
            max_memory: self.max_memory,
            max_request_memory: self
                .max_request_memory
                .unwrap_or_else(|| default_request_memory(self.max_memory, self.max_frame_bytes)),
            limits: Limits {
                max_topics: self.max_topics,
                max_partitions: self.max_partitions,
                max_groups_per_topic: self.max_groups_per_topic,
                max_members_per_group: self.max_members_per_group,
            },
            names: self.names.into(),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            read_timeout: Duration::from_millis(self.read_timeout_ms),
            write_timeout: Duration::from_millis(self.write_timeout_ms),
            max_wait: Duration::from_millis(self.max_wait_ms),
            session_timeout: Duration::from_millis(self.session_timeout_ms),
            leave_on_disconnect: self.leave_on_disconnect,
            data_dir: self.data_dir.clone(),
            fsync: self.fsync.into(),
            fsync_interval: Duration::from_millis(self.fsync_interval_ms),
            snapshot_log_bytes: self.snapshot_log_bytes,
            segment_bytes: self.segment_bytes,
            auth_token: AuthToken::load(self.auth_token_file.as_deref())?,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(ServerTls::from_pem_files(cert, key)?),
                _ => None,
            },
            cluster: match (self.node_id, &self.cluster_members) {
                (Some(node_id), Some(members)) => Some(ClusterSettings {
                    node_id,
                    members: parse_members(members).map_err(|why| {
                        ServerError::InvalidConfig(format!("--cluster-members: {why}"))
                    })?,
                    listen: self.cluster_listen.clone(),
                    join: self.cluster_join,
                    tls_ca: self.cluster_tls_ca.clone(),
                    snapshot_entries: self.cluster_snapshot_entries,
                    log_cache_bytes: self.cluster_log_cache_bytes,
                    data_groups: usize::from(self.cluster_data_groups),
                    replicas: usize::from(self.cluster_replicas),
                }),
                _ => None,
            },
            kafka_advertise: self
                .kafka_advertise
                .as_deref()
                .map(host_and_port)
                .transpose()?,
            kafka_auto_create_partitions: self
                .kafka_auto_create_topics
                .then_some(self.kafka_auto_create_partitions),
            shards: self.shards.map(usize::from),
            ..Config::default()
        })
    }
}

/// `HOST:PORT` (or `[IPv6]:PORT`) as a host and a port.
fn host_and_port(address: &str) -> Result<(String, u16), ServerError> {
    let invalid = |why: &str| {
        ServerError::InvalidConfig(format!(
            "--kafka-advertise: expected HOST:PORT (a host name or address Kafka's clients \
             reach, and a port from 1 to 65535), got {address:?}: {why}"
        ))
    };
    let (host, port) = address.rsplit_once(':').ok_or_else(|| invalid("no port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid("no host"));
    }
    if host.contains(['/', ' ']) {
        return Err(invalid("a host has no scheme, path or spaces"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid("the port must be 1 to 65535")),
        Ok(port) => Ok((host.to_owned(), port)),
    }
}

fn main() -> ExitCode {
    let matches = broker_args::get_matches(Args::command());
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let config = args.config().and_then(|config| {
        config.validate()?;
        broker_net::listen_address(&args.listen)?;
        check_listeners_apart(&args)?;
        if let Some(metrics) = &args.metrics_listen {
            broker_net::listen_address(metrics).map_err(|error| {
                ServerError::InvalidConfig(format!("--metrics-listen: {error}"))
            })?;
        }
        if let Some(console) = &args.console_listen {
            broker_net::listen_address(console).map_err(|error| {
                ServerError::InvalidConfig(format!("--console-listen: {error}"))
            })?;
        }
        if let Some(kafka) = &args.kafka_listen {
            broker_net::listen_address(kafka)
                .map_err(|error| ServerError::InvalidConfig(format!("--kafka-listen: {error}")))?;
            config.check_kafka()?;
        }
        Ok(config)
    });
    let config = match config {
        Ok(config) => config,
        Err(error) => {
            report(&format!("error: {error}"));
            return ExitCode::from(2);
        }
    };
    // Kept to the end of `main`: dropping it writes the log lines still queued.
    let _log_writer = match logging::filter(&args.log_level) {
        Ok(filter) => logging::init(filter, args.log_format),
        Err(error) => {
            report(&format!("error: {error}"));
            return ExitCode::from(2);
        }
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.worker_threads {
        // At most 1,024 (checked by clap).
        runtime.worker_threads(threads as usize);
    }
    let served = runtime
        .enable_all()
        .build()
        .context("cannot start the runtime")
        .and_then(|runtime| runtime.block_on(serve(&args, config)));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            report(&format!("error: {error:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Refuses two listeners given the same address (a port 0 is a fresh port each, never the
/// same): the second would fail to bind, after the first had started.
fn check_listeners_apart(args: &Args) -> Result<(), ServerError> {
    let given = [
        ("--listen", Some(&args.listen)),
        ("--kafka-listen", args.kafka_listen.as_ref()),
        ("--metrics-listen", args.metrics_listen.as_ref()),
        ("--console-listen", args.console_listen.as_ref()),
        ("--cluster-listen", args.cluster_listen.as_ref()),
    ];
    let mut seen: Vec<(&str, String)> = Vec::new();
    for (flag, address) in given {
        let Some(address) = address.and_then(|address| broker_net::listen_address(address).ok())
        else {
            continue;
        };
        if address.ends_with(":0") {
            continue;
        }
        if let Some((other, _)) = seen.iter().find(|(_, taken)| *taken == address) {
            return Err(ServerError::InvalidConfig(format!(
                "{flag} and {other} are both {address}: each listener needs a port of its own"
            )));
        }
        seen.push((flag, address));
    }
    Ok(())
}

/// The allocator: jemalloc, faster than the system's under this workload (BENCHMARKS.md).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Writes `message` to standard error, ignoring failure: there is nowhere else to say it.
fn report(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

/// Binds `--listen` (and `--metrics-listen`, `--kafka-listen` and `--console-listen`, if given), starts, prints the
/// addresses once it serves, and serves until SIGINT or SIGTERM.
async fn serve(args: &Args, config: Config) -> anyhow::Result<()> {
    let (listen, metrics) = (args.listen.as_str(), args.metrics_listen.as_deref());
    // A file-size limit (`ulimit -f`) would kill the process with SIGXFSZ on the first write
    // past it; with the signal handled, that write fails with EFBIG instead, and the log treats
    // it as a full disk: changes are refused until writes succeed again. (The handler stays
    // installed for the life of the process; the signals themselves need no action.)
    let _file_size_limit =
        signal(SignalKind::from_raw(libc::SIGXFSZ)).context("cannot handle SIGXFSZ")?;
    // A port taken (by another process, or by two of the listeners: `0.0.0.0:P` and
    // `127.0.0.1:P`) fails the start before the data directory is opened (and, when new,
    // made): every port is tried at once, then let go.
    let mut tried = Vec::new();
    for (address, flag) in [
        (Some(listen), "--listen"),
        (metrics, "--metrics-listen"),
        (args.kafka_listen.as_deref(), "--kafka-listen"),
        (args.console_listen.as_deref(), "--console-listen"),
    ] {
        if let Some(address) = address {
            tried.push(bind(address, flag).await?);
        }
    }
    drop(tried);
    // Recover before announcing the address: a locked or damaged data directory stops here.
    let storage = open_storage(&config).map_err(|error| with_ownership_hint(error, &config))?;
    let listener = bind(listen, "--listen").await?;
    // A cluster node binds its peer port as it starts serving, after the address is announced:
    // trying it first fails the start before that when the port is taken. (It is free again at
    // once: nothing was accepted on it.)
    if let Some(cluster) = &config.cluster {
        drop(broker_server::bind_peer_port(cluster).await?);
    }
    let metrics_listener = match metrics {
        Some(metrics) => Some(bind(metrics, "--metrics-listen").await?),
        None => None,
    };
    let kafka_listener = match &args.kafka_listen {
        Some(kafka) => Some(bind(kafka, "--kafka-listen").await?),
        None => None,
    };
    let console_listener = match &args.console_listen {
        Some(console) => Some(bind(console, "--console-listen").await?),
        None => None,
    };
    let address = |listener: &Option<TcpListener>| {
        listener
            .as_ref()
            .and_then(|listener| listener.local_addr().ok())
    };
    let listen = listener.local_addr()?;
    let metrics_addr = address(&metrics_listener);
    let kafka_addr = address(&kafka_listener);
    let console_addr = address(&console_listener);
    let console_scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let off = || "off".to_owned();
    let kafka_advertised = kafka_addr.map_or_else(off, |kafka| {
        config
            .kafka_advertised(kafka)
            .unwrap_or_else(|| "the address each connection came in on".to_owned())
    });
    let cluster_node = config
        .cluster
        .as_ref()
        .map(|cluster| cluster.node_id.to_string())
        .unwrap_or_else(|| "none (a single broker)".to_owned());
    let data_dir = config
        .data_dir
        .as_ref()
        .map(|dir| dir.display().to_string())
        .unwrap_or_else(|| "none (in memory)".to_owned());
    let shards = storage
        .as_ref()
        .map_or(config.shards.unwrap_or(1), |stores| stores.shards().len());
    let names = config.names.to_string();
    // Said once the server serves: a cluster node may still refuse to start before that.
    let announce = move || {
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            %listen,
            metrics = metrics_addr.map_or_else(off, |addr| addr.to_string()),
            kafka = kafka_addr.map_or_else(off, |addr| addr.to_string()),
            console = console_addr.map_or_else(off, |addr| addr.to_string()),
            kafka_advertised,
            cluster_node,
            data_dir,
            shards,
            names,
            "broker-server started"
        );
        let print = || {
            let mut stdout = std::io::stdout();
            writeln!(stdout, "listening on {listen}")?;
            if let Some(metrics) = metrics_addr {
                writeln!(stdout, "metrics on http://{metrics}/metrics")?;
            }
            if let Some(kafka) = kafka_addr {
                writeln!(stdout, "kafka on {kafka}")?;
            }
            if let Some(console) = console_addr {
                writeln!(stdout, "console on {console_scheme}://{console}/")?;
            }
            stdout.flush()
        };
        // Nobody reads standard output (closed, or a pipe whose reader is gone): the
        // addresses are in the log line above, and the server serves all the same.
        if let Err(error) = print() {
            tracing::warn!(%error, "cannot print the listening addresses on standard output");
        }
        Ok(())
    };
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
        }
    };
    let listeners = broker_server::Listeners {
        broker: listener,
        metrics: metrics_listener,
        kafka: kafka_listener,
        console: console_listener,
    };
    broker_server::run_announced(listeners, config, storage, shutdown, announce).await?;
    tracing::info!("broker-server stopped");
    Ok(())
}

/// A listener on `address` (any form `--listen` takes), given as `flag`.
async fn bind(address: &str, flag: &str) -> anyhow::Result<TcpListener> {
    let addresses = resolve_listen_addr(address)
        .await
        .with_context(|| format!("{flag} {address}"))?;
    TcpListener::bind(addresses.as_slice())
        .await
        .with_context(|| format!("cannot listen on {address} ({flag})"))
}
