//! The command line: every subcommand, flag and environment variable of `broker`.

use std::path::PathBuf;
use std::time::Duration;

use broker_client::{parse_duration, NameRules, TopicName};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::bench::BenchArgs;
use crate::retention::RetentionArg;

/// Talk to a broker-server from a shell: create, configure and delete topics, publish, consume
/// as a group member, replay and reset groups, inspect groups and lag, size disks, and
/// benchmark.
#[derive(Debug, Parser)]
#[command(name = "broker", version, after_help = EXAMPLES)]
pub struct Cli {
    /// Where the broker-server is: given here, before the command, it counts for the command
    /// (which may also take them itself).
    #[command(flatten)]
    pub connect: ConnectArgs,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How to reach the broker-server: its address, the auth token and TLS. Every command that
/// talks to a server takes them, after its name or before it (`broker --addr HOST describe`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Connection options")]
pub struct ConnectArgs {
    /// Address of the broker-server: HOST:PORT, [IPv6]:PORT, :PORT for this machine (as the
    /// server's --listen :PORT), or a HOST alone for port 9092. For a cluster, the nodes'
    /// addresses separated by commas: the leader is found and followed.
    #[arg(
        long,
        env = "BROKER_ADDR",
        default_value = "127.0.0.1:9092",
        value_parser = broker_net::connect_addresses
    )]
    pub addr: String,

    /// File holding the server's auth token (trailing line breaks are ignored). Or set
    /// BROKER_AUTH_TOKEN to the token itself; there is no flag for the token, so that it never
    /// shows in the process list.
    #[arg(long, env = "BROKER_AUTH_TOKEN_FILE", value_name = "PATH")]
    pub auth_token_file: Option<PathBuf>,

    /// Connect with TLS, trusting only the CA certificates in this PEM file.
    #[arg(long, env = "BROKER_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// With --tls-ca: the name the server's TLS certificate must carry; by default the host
    /// part of --addr.
    #[arg(long, env = "BROKER_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

impl ConnectArgs {
    /// The ids of its arguments, as clap knows them.
    pub const IDS: [&'static str; 4] = ["addr", "auth_token_file", "tls_ca", "tls_server_name"];

    /// The options a command runs with: each one given after the command's name, else each
    /// one given before it, else the environment variable or default the command saw.
    /// `before_wins(id)` tells whether the argument `id` was given before the command's name and
    /// not after it.
    pub fn merge(
        before: ConnectArgs,
        after: ConnectArgs,
        before_wins: impl Fn(&str) -> bool,
    ) -> ConnectArgs {
        let [addr, token, ca, name] = Self::IDS.map(before_wins);
        ConnectArgs {
            addr: if addr { before.addr } else { after.addr },
            auth_token_file: if token {
                before.auth_token_file
            } else {
                after.auth_token_file
            },
            tls_ca: if ca { before.tls_ca } else { after.tls_ca },
            tls_server_name: if name {
                before.tls_server_name
            } else {
                after.tls_server_name
            },
        }
    }
}

/// A command's own arguments and the connection options it takes after its name.
#[derive(Debug, Args)]
pub struct Connected<T: Args> {
    /// The command's own arguments.
    #[command(flatten)]
    pub args: T,
    /// How to reach the server.
    #[command(flatten)]
    pub connect: ConnectArgs,
}

const EXAMPLES: &str = "\
Examples:
  broker create orders --partitions 3
  broker create clicks --partitions 8 --retention limits --max-age 3d --max-bytes 10GiB
  broker create orders --partitions 6 --add-partitions
  broker configure clicks --max-age 1d --max-bytes 20GiB
  broker publish orders 'first order' 'second order' --key customer-42
  seq 1 100 | broker publish orders --partition 0
  broker consume orders --group billing --member billing-1
  broker consume orders --group analytics --member a1 --mode fetch --follow --json
  broker consume orders --group audit --member a1 --from-datetime 2026-12-01T09:00:00Z
  broker group reset orders --group billing --to-earliest
  broker describe orders
  broker lag orders --group billing
  broker delete orders
  broker size --message-bytes 1500 --rate 2000 --retention 3d --replication 3 --headroom 30
  broker bench mixed --producers 4 --consumers 4 --records 1000000
  BROKER_AUTH_TOKEN=s3cret broker --addr broker.internal:9092 --tls-ca ca.pem describe
  BROKER_ADDR=10.0.0.1:9092,10.0.0.2:9092,10.0.0.3:9092 broker cluster status

Exit status: 0 on success, 1 when the broker refuses a call or cannot be reached, 2 for bad
command-line arguments.";

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a topic with its retention (succeeds, saying so, if it already exists as asked;
    /// fails if it exists otherwise), or give an existing topic more partitions.
    Create(Connected<CreateArgs>),
    /// Change an existing topic's limits (--max-records, --max-bytes, --max-age) and what a
    /// partition at one does (--discard); settings not named stay as they are. Its retention
    /// and key hash cannot change.
    Configure(Connected<ConfigureTopicArgs>),
    /// Delete a topic with its records and groups; consumers waiting on it are answered at once.
    Delete(Connected<DeleteArgs>),
    /// Remove the records of a topic's partitions below an offset, consumed or not (Kafka's
    /// delete-records); groups that had not consumed them skip them.
    Purge(Connected<PurgeArgs>),
    /// Publish records: each PAYLOAD argument is one record; with none, each line of standard
    /// input is one record (or each part ending in --delimiter, or all of it with --binary).
    Publish(Connected<PublishArgs>),
    /// Consume records as a member of a consumer group, print them, and acknowledge or commit
    /// them.
    Consume(Connected<ConsumeArgs>),
    /// Join a consumer group and print the member's partitions. The server removes the member
    /// after its session timeout unless it keeps making calls.
    Join(Connected<JoinArgs>),
    /// Leave a consumer group; its partitions go to the remaining members.
    Leave(Connected<MemberArgs>),
    /// Show topics (partitions, earliest and end offsets, retained bytes) and their groups
    /// (assignor, members, partitions, committed, in flight, lag).
    Describe(Connected<DescribeArgs>),
    /// Show a group's lag on each partition of a topic.
    Lag(Connected<LagArgs>),
    /// Reset, configure or delete a consumer group.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Show, per partition, the first offset at or after a time: where a replay from then
    /// starts.
    Offsets(Connected<OffsetsArgs>),
    /// Show the idempotent producers each partition of a topic remembers: each one's id, the
    /// broker's number of its next record there (Kafka's producers number theirs modulo
    /// 2^31), the offset of the last record it stored there and when it last published to the
    /// topic. Producers of the Rust client and Kafka's idempotent producers are listed; a
    /// topic remembers its 10,000 most recent.
    Producers(Connected<ProducersArgs>),
    /// Disk sizing: message size × rate × retention × replication, plus headroom. Talks to no
    /// server.
    Size(SizeArgs),
    /// Check that the broker-server answers: connect (with the auth token and TLS, if set),
    /// exchange the hello, and print the server's name and version, the address that
    /// answered (of a cluster's nodes, the first that does), the round trip and its limits.
    /// Cheap enough for a health check.
    Ping(Connected<PingArgs>),
    /// A live view of the broker, refreshed every second: records published per second per
    /// topic, each group's consumption rate, lag and deliveries in flight, and (with
    /// --metrics) connections and requests per second. Ctrl-C leaves.
    Top(Connected<TopArgs>),
    /// Measure a broker-server: throughput and latency percentiles under a chosen workload.
    Bench(Connected<BenchArgs>),
    /// Show the nodes and groups of a cluster and where each topic is; add or remove a node,
    /// hand the leadership to another, move topics between groups and balance them.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

impl Command {
    /// The connection options given after the command's name; `None` for a command that talks
    /// to no server.
    pub fn connect_args(&self) -> Option<&ConnectArgs> {
        match self {
            Command::Size(_) => None,
            Command::Create(c) => Some(&c.connect),
            Command::Configure(c) => Some(&c.connect),
            Command::Delete(c) => Some(&c.connect),
            Command::Purge(c) => Some(&c.connect),
            Command::Publish(c) => Some(&c.connect),
            Command::Consume(c) => Some(&c.connect),
            Command::Join(c) => Some(&c.connect),
            Command::Leave(c) => Some(&c.connect),
            Command::Describe(c) => Some(&c.connect),
            Command::Lag(c) => Some(&c.connect),
            Command::Group(GroupCommand::Reset(c)) => Some(&c.connect),
            Command::Group(GroupCommand::Delete(c)) => Some(&c.connect),
            Command::Group(GroupCommand::Configure(c)) => Some(&c.connect),
            Command::Offsets(c) => Some(&c.connect),
            Command::Producers(c) => Some(&c.connect),
            Command::Ping(c) => Some(&c.connect),
            Command::Top(c) => Some(&c.connect),
            Command::Bench(c) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Status(c)) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Topics(c)) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Add(c)) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Remove(c)) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Transfer(c)) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Move(c)) => Some(&c.connect),
            Command::Cluster(ClusterCommand::Balance(c)) => Some(&c.connect),
        }
    }
}

/// `broker ping`.
#[derive(Debug, Args)]
pub struct PingArgs {
    /// Print JSON instead of text: `addr` (as given), `answered_by`, `server`, `elapsed_ms` and
    /// `limits`, or `addr` and `error` when the server cannot be reached (exit status 1 then).
    #[arg(long)]
    pub json: bool,
}

/// A count of at least one.
fn parse_count(text: &str) -> Result<u64, String> {
    let count: i128 = text
        .parse()
        .map_err(|_| format!("expected a whole number of at least 1, not {text:?}"))?;
    u64::try_from(count)
        .ok()
        .filter(|&count| count >= 1)
        .ok_or_else(|| format!("must be at least 1, not {count}"))
}

/// A percentage of 0 or more, as `broker size --headroom` takes it.
fn parse_percent(text: &str) -> Result<u64, String> {
    match text.parse::<i128>() {
        Ok(negative) if negative < 0 => Err("a percentage cannot be negative".into()),
        Ok(percent) => u64::try_from(percent).map_err(|_| "too large".into()),
        Err(_) => Err(format!("expected a whole number of percent, not {text:?}")),
    }
}

/// A duration of more than zero, as `--interval` takes it.
fn parse_interval(text: &str) -> Result<Duration, String> {
    match parse_duration(text).map_err(|error| error.to_string())? {
        interval if interval.is_zero() => Err("the interval must be more than zero".into()),
        interval => Ok(interval),
    }
}

/// `broker top`.
#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  broker top                                   every topic and group, refreshed every second
  broker top --metrics 127.0.0.1:9100          also connections and requests (the server runs
                                               with --metrics-listen 127.0.0.1:9100)
  broker top --json                            one view as JSON, one interval after the start

While the server cannot be reached (it restarts, say), top says so once and tries again every
interval; views resume once it answers. --json and the first look fail at once instead.")]
pub struct TopArgs {
    /// Time between two views; rates are measured over it.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_interval, allow_hyphen_values = true)]
    pub interval: Duration,
    /// Stop after this many views (at least 1).
    #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true)]
    pub count: Option<u64>,
    /// Print one view as JSON (rates over one interval) and exit.
    #[arg(long, conflicts_with = "count")]
    pub json: bool,
    /// The address of the server's metrics endpoint (its --metrics-listen), for connections,
    /// requests and bytes per second.
    #[arg(long, env = "BROKER_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics: Option<String>,
}

/// `broker create`.
#[derive(Debug, Args)]
#[command(after_help = "\
Retention: with `interest` (the default) a record stays until every group of the topic has
consumed it, and a full partition (--max-records, else the server's --capacity) refuses
publishes. With `limits` records stay up to --max-records, --max-bytes and --max-age per
partition, consumed or not, and the oldest are discarded to make room (--discard new refuses
new records instead). --max-age works with either: older records leave.

If the topic exists, `create` succeeds (exit status 0) when it has what the command names: the
--partitions, --key-hash and retention settings given (retention settings are compared as a
whole). Otherwise it fails (exit status 1) and says what the topic has: `create` changes no
setting (`broker configure` changes the limits and --discard; the retention and key hash never
change), and --add-partitions gives an existing topic more partitions (never fewer). Keys then map to other partitions, as in Kafka: order per key holds only among records
published after the change.")]
pub struct CreateArgs {
    /// Topic name: 1 to 64 ASCII letters, digits, '_' or '-' (or, on a server started with
    /// --names kafka, also '.' and up to 249 characters).
    pub topic: String,
    /// Number of partitions, 1 to the server's --max-partitions (64 by default); with
    /// --add-partitions, the count an existing topic grows to. 1 for a new topic when not given.
    #[arg(long, short, allow_negative_numbers = true)]
    pub partitions: Option<i32>,
    /// If the topic exists with fewer partitions, add partitions up to --partitions.
    #[arg(long)]
    pub add_partitions: bool,
    /// How keyed publishes choose a partition: murmur2 (Kafka's, the default for a new topic) or
    /// fnv1a.
    #[arg(long, value_enum)]
    pub key_hash: Option<KeyHashArg>,
    /// What keeps a record: every group's interest in it (the default for a new topic), or
    /// limits alone.
    #[arg(long, value_enum)]
    pub retention: Option<RetentionArg>,
    /// The partitions' limits and what a partition at one does.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A topic's limits and what a partition at one does: what `broker create` sets and
/// `broker configure` changes.
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Records a partition keeps at most, 1 to 2147483647.
    #[arg(long, value_name = "N")]
    pub max_records: Option<u64>,
    /// Payload, key and header bytes a partition keeps at most: 500MB, 10GiB, 1048576.
    #[arg(long, value_name = "SIZE", value_parser = broker_args::parse_bytes)]
    pub max_bytes: Option<u64>,
    /// How long a record is kept at most: 3d, 12h, 90s, 500ms.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub max_age: Option<Duration>,
    /// At a limit of limits retention: discard the oldest records (old, the default) or refuse
    /// the new one (new). Interest retention always refuses the new one: new is accepted there,
    /// old refused.
    #[arg(long, value_enum)]
    pub discard: Option<DiscardArg>,
}

/// `broker configure`.
#[derive(Debug, Args)]
#[command(after_help = "\
What changes: the limits --max-records, --max-bytes and --max-age, and --discard; the settings
not named stay as they are. What cannot change: the retention (interest or limits) and the key
hash, fixed when the topic was created; nor can a limit be removed (raise it instead). The new
settings hold at once: with limits retention and --discard old, the oldest records leave until
a lowered limit holds (groups that had not consumed them skip them); records older than a
lowered --max-age leave. With interest retention or --discard new nothing is lost: a partition
past a lowered limit refuses new records until consumers catch up.

Examples:
  broker configure clicks --max-age 1d --max-bytes 20GiB
  broker configure orders --max-records 100000
  broker configure audit --discard new --json")]
pub struct ConfigureTopicArgs {
    /// The topic to change.
    pub topic: String,
    /// The limits to change and what a partition at one does.
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Print the topic's settings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--discard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiscardArg {
    /// Refuse a new record at a limit.
    New,
    /// Discard the oldest records to make room.
    Old,
}

/// `--delimiter`: one ASCII character, or an escape for a line break, a tab or NUL.
pub fn parse_delimiter(text: &str) -> Result<u8, String> {
    match text {
        "\\n" => Ok(b'\n'),
        "\\t" => Ok(b'\t'),
        "\\r" => Ok(b'\r'),
        "\\0" => Ok(0),
        _ => match text.as_bytes() {
            &[byte] if byte.is_ascii() => Ok(byte),
            _ => Err(format!(
                "expected one ASCII character or \\n, \\t, \\r, \\0, not {text:?}"
            )),
        },
    }
}

/// `broker delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Topic to delete.
    pub topic: String,
}

/// `broker purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Topic.
    pub topic: String,
    /// Purge this partition (repeat for several); every partition without it.
    #[arg(long, short, allow_negative_numbers = true)]
    pub partition: Vec<i32>,
    /// Remove the records below this offset (up to each partition's end).
    #[arg(long, value_name = "OFFSET", allow_negative_numbers = true)]
    pub before: i64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `broker group`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Move a group's committed offsets, on every partition or the ones named, all at once:
    /// its members' positions follow and their deliveries in flight there are cancelled.
    Reset(Connected<ResetArgs>),
    /// Delete a group that has no members, with its committed offsets; with interest retention
    /// the records only it held back leave. With --partition, only the group's offsets there:
    /// each goes back to where the group starts, as if it never committed there.
    Delete(Connected<GroupDeleteArgs>),
    /// Change an existing group's acknowledgement timeout, maximum of deliveries and
    /// dead-letter topic; settings not named stay as they are.
    Configure(Connected<ConfigureArgs>),
}

/// `broker cluster`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Show every node of the cluster: its role, term, last log entry and last applied entry,
    /// and how many entries of the leader's log it lacks (`?` while the leader has not heard
    /// from it or cannot reach it). Each node is asked about itself at its client address, so
    /// every node must be reachable from here for a full picture; all at once, each for at most
    /// 3 seconds. The table is of the first Raft group, which every cluster has; a cluster
    /// that spreads its topics over several groups (`broker-server --cluster-data-groups`)
    /// also gets a row per group: its leader, term and last log entry, how many entries each
    /// member lacks, and its topics.
    Status(Connected<ClusterStatusArgs>),
    /// Show which node serves each topic (its calls go there), with its partitions and, in a
    /// cluster that spreads its topics over several groups (`broker-server
    /// --cluster-data-groups`), the group that holds it; as the node asked knows it.
    Topics(Connected<ClusterTopicsArgs>),
    /// Add a node that runs and was started with `broker-server --cluster-join`: it catches up
    /// with the leader's log (a snapshot of the broker's state first), then votes.
    #[command(after_help = "Example (the new node 4 runs, started to join):
  broker cluster add 4=10.0.0.4:9093/10.0.0.4:9092

If node 4 has not caught up within 20 seconds, the command stops saying so, with exit status 3
(pending); the node stays a learner (it receives the log but does not vote) and keeps catching
up: run the command again to make it a voter.

In a cluster that spreads its topics over several groups (broker-server --cluster-data-groups
and --cluster-replicas, which the new node must be started with too), each group that is to
hold a copy on the new node (every group while the cluster has no more nodes than replicas)
then adds it the same way, and the command waits for them: past 20 seconds in all it stops,
naming the groups that have not added it yet, with exit status 3 (they still do; `broker
cluster status` shows it, and the same command again waits for them).")]
    Add(Connected<AddNodeArgs>),
    /// Remove a node from the cluster: it no longer votes nor receives the log. Stop its
    /// process afterwards. Removing the leader makes the others elect a new one. A voter that
    /// is not the leader first stops voting: the leader waits up to 5 seconds for it to hear
    /// so (the whole wait when it is down). Removing a node that is no member changes nothing.
    /// With several groups (`broker-server --cluster-data-groups`), every group then removes
    /// it too (each replacing it with another node, to keep `--cluster-replicas` copies), and
    /// the command waits for them (20 seconds in all, then it names those that still have it
    /// and exits with status 3; the same command again waits for them).
    Remove(Connected<RemoveNodeArgs>),
    /// Make a voter the leader, before taking the leader's host down for maintenance, say. With
    /// several groups (`broker-server --cluster-data-groups`), this is the first group's
    /// leadership; the other groups' leaders are balanced over the nodes by themselves.
    #[command(after_help = "Example (node 2 is a voter):
  broker cluster transfer 2

The leader checks that node 2 answers, stops taking changes, waits until node 2 holds its whole
log and the other voters may elect another leader (twice the election timeout, and a 200 ms
margin: changes pause about 1.2 seconds with the default timeouts), then has node 2 elected. Calls made meanwhile wait
for the new leader, as after a failover. Naming the node that leads changes nothing; a learner
(a node still catching up after `broker cluster add`) cannot lead. If node 2 does not answer,
or does not catch up within 20 seconds, the command fails saying so and the old leader leads
on; if node 2 does not win, the command says which node leads.")]
    Transfer(Connected<TransferArgs>),
    /// Move a topic, with its records, consumer groups, committed offsets and deliveries in
    /// flight, to another Raft group of a cluster that spreads its topics over several
    /// (`broker-server --cluster-data-groups`): to balance the groups' load, or to take it off
    /// a group's nodes. Its clients go on: their calls pause while it moves, then reach it in
    /// its new group.
    #[command(
        after_help = "Example (the cluster has groups 1 to 3; `broker cluster topics` shows where each topic is):
  broker cluster move orders --to 3

The group holding orders stops taking calls about it (they wait, as during an election), sends
it whole to group 3 (every record it keeps, in memory or on disk, its groups' offsets and
deliveries in flight, its idempotent producers' sequences), then drops it; from then on group
3's leader serves it. Nothing acknowledged is lost or stored twice, and offsets do not change.
Its records travel in pieces of at most 256 KiB, each an entry of group 3's log. A topic holding
more than 256 MiB of records is refused (the nodes hold it in memory while it moves), as is one
tied to another by a dead-letter topic (records move to a dead-letter topic in one step, so both
live in one group: configure the group without it, move both, configure it again). If the
move has not ended within 20 seconds, the command stops saying so, with exit status 3
(pending); the move goes on by itself."
    )]
    Move(Connected<MoveArgs>),
    /// Spread the topics over the Raft groups of a cluster that has several (`broker-server
    /// --cluster-data-groups`), one move at a time, until no move brings the groups' partition
    /// counts (or, with --by bytes, retained bytes) closer together: after groups or nodes were
    /// added, or topics created in one group. New topics spread by themselves; this moves
    /// existing ones. The groups' leaders spread over the nodes by themselves.
    #[command(after_help = "Example:
  broker cluster balance --dry-run     # the moves it would make
  broker cluster balance
  broker cluster balance --by bytes    # even out the records the groups retain instead

Each move is `broker cluster move`: the topic's calls pause while it moves (a few tens of
milliseconds for a small topic), nothing is lost, offsets stay. Each step is the move that
narrows the gaps between the groups' loads most (a topic from a fuller group to an emptier
one, the largest first among equals) or, when no single move narrows them, two topics of
different sizes swapping groups. A topic's dead-letter and retry topics by name (orders-dlq,
orders_retry: placed with it when created) move with it, as one. A topic that cannot move
(more than 256 MiB of records, or tied to another because a group of either names the other
as its dead-letter topic) is left where it is with the topics that go with it, saying why,
and the others are balanced around it. It counts partitions, or with --by bytes the records
retained (a snapshot of now: a topic that grows or shrinks later is not followed), never
traffic: move a busy topic by hand with `broker cluster move`.")]
    Balance(Connected<BalanceArgs>),
}

/// `broker cluster balance`.
#[derive(Debug, Args)]
pub struct BalanceArgs {
    /// Print the moves it would make, and make none.
    #[arg(long)]
    pub dry_run: bool,
    /// What to even out between the groups: their partitions, or the bytes of records they
    /// retain (a topic's payload, key and header bytes, as `broker describe` shows them).
    #[arg(long, value_enum, default_value_t = BalanceBy::Partitions)]
    pub by: BalanceBy,
}

/// What `broker cluster balance` evens out between the groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BalanceBy {
    /// The groups' partition counts.
    Partitions,
    /// The bytes of records the groups' topics retain.
    Bytes,
}

/// `broker cluster move`.
#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The topic to move.
    #[arg(value_name = "TOPIC")]
    pub topic: String,
    /// The group it is to live in (1 is the first group; `broker cluster status` lists them).
    #[arg(long, value_name = "GROUP")]
    pub to: u32,
}

/// `broker cluster transfer`.
#[derive(Debug, Args)]
pub struct TransferArgs {
    /// The id of the voter that is to lead.
    #[arg(value_name = "ID")]
    pub node_id: u64,
}

/// `broker cluster topics`.
#[derive(Debug, Args)]
pub struct ClusterTopicsArgs {
    /// Only this topic.
    #[arg(value_name = "TOPIC")]
    pub topic: Option<String>,
    /// Print JSON: `nodes` (each `node_id` and `client_addr`) and `topics`, each with `topic`,
    /// `partitions`, `leader` (a node id, `null` while its group elects) and `group` (`null`
    /// in a cluster of one group).
    #[arg(long)]
    pub json: bool,
}

/// `broker cluster status`.
#[derive(Debug, Args)]
pub struct ClusterStatusArgs {
    /// Print JSON: `leader`, `term` and `nodes`, each with its addresses, `voter`, `behind`
    /// (`null` when not known), and its own `status` or the `error` that kept it from
    /// answering; and `groups`: every group the nodes host (the first one alone in a cluster
    /// of one group; none from nodes of a release before groups), each with `group`, `leader`,
    /// `term`, `last_log_index`, `behind` (each member's `node_id` and `behind`), `voters`
    /// (the members that vote in it) and `topics`.
    #[arg(long)]
    pub json: bool,
}

/// `broker cluster add`.
#[derive(Debug, Args)]
pub struct AddNodeArgs {
    /// The node: ID=PEER_ADDR/CLIENT_ADDR, as in the servers' --cluster-members (its id, the
    /// address the other nodes reach its peer port at, the address clients reach it at).
    #[arg(value_name = "ID=PEER_ADDR/CLIENT_ADDR", value_parser = parse_new_node)]
    pub node: NewNode,
}

/// A node to add, as `ID=PEER_ADDR/CLIENT_ADDR`.
#[derive(Debug, Clone)]
pub struct NewNode {
    /// Its id.
    pub node_id: u64,
    /// The address the other nodes reach it on.
    pub peer_addr: String,
    /// The address clients reach it on.
    pub client_addr: String,
}

/// Parses `ID=PEER_ADDR/CLIENT_ADDR` (the server checks the addresses).
fn parse_new_node(text: &str) -> Result<NewNode, String> {
    let expected = || {
        format!(
            "{text:?} is not ID=PEER_ADDR/CLIENT_ADDR (for example \
             4=10.0.0.4:9093/10.0.0.4:9092)"
        )
    };
    let (id, addresses) = text.split_once('=').ok_or_else(expected)?;
    let (peer_addr, client_addr) = addresses.split_once('/').ok_or_else(expected)?;
    let node_id = match id.trim().parse() {
        Ok(0) | Err(_) => return Err(format!("{id:?}: a node id is a whole number from 1")),
        Ok(id) => id,
    };
    for address in [peer_addr.trim(), client_addr.trim()] {
        let host_and_port = address.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|port| port != 0)
        });
        if !host_and_port {
            return Err(format!(
                "{address:?} is not HOST:PORT (an address the other nodes, or clients, reach \
                 the node at)"
            ));
        }
    }
    Ok(NewNode {
        node_id,
        peer_addr: peer_addr.trim().to_owned(),
        client_addr: client_addr.trim().to_owned(),
    })
}

/// `broker cluster remove`.
#[derive(Debug, Args)]
pub struct RemoveNodeArgs {
    /// The id of the node to remove.
    #[arg(value_name = "ID")]
    pub node_id: u64,
}

/// A group's maximum of deliveries and dead-letter topic, given together.
#[derive(Debug, Args)]
pub struct DeadLetterArgs {
    /// Ack mode: a record delivered this many times and released again unacknowledged
    /// (retried, timed out, or its partition changed owner) goes to --dead-letter, and its
    /// partition moves on.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..),
        allow_negative_numbers = true
    )]
    pub max_deliveries: Option<u32>,
    /// The topic records past --max-deliveries go to (created with one partition and limits
    /// retention if it does not exist), with headers saying where each came from.
    #[arg(long, value_name = "TOPIC", value_parser = parse_topic_name)]
    pub dead_letter: Option<TopicName>,
}

impl DeadLetterArgs {
    /// The maximum and the topic, when given (clap makes sure they come together).
    pub fn given(&self) -> Option<(u32, TopicName)> {
        self.max_deliveries.zip(self.dead_letter)
    }
}

/// An acknowledgement timeout: whole milliseconds, at least one, as the broker takes it.
fn parse_ack_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text).map_err(|error| error.to_string())?;
    if timeout < Duration::from_millis(1) {
        return Err("the acknowledgement timeout must be at least 1ms".into());
    }
    Ok(timeout)
}

/// A topic name some broker may take (Kafka's names are the widest rules): the server it goes
/// to checks it by its own.
fn parse_topic_name(text: &str) -> Result<TopicName, String> {
    TopicName::with_rules(text, NameRules::Kafka).map_err(|error| error.to_string())
}

/// `broker group configure`.
#[derive(Debug, Args)]
#[command(
    group(
        clap::ArgGroup::new("change")
            .required(true)
            .multiple(true)
            .args(["ack_timeout", "no_ack_timeout", "max_deliveries", "dead_letter", "no_dead_letter"])
    ),
    after_help = "\
Settings not named stay as they are. A group without a dead-letter topic needs --max-deliveries
and --dead-letter together; one that has one can change either alone. `broker describe TOPIC`
shows a group's settings.

Examples:
  broker group configure orders -g billing --max-deliveries 5 --dead-letter orders-dlq
  broker group configure orders -g billing --max-deliveries 10
  broker group configure orders -g billing --ack-timeout 30s
  broker group configure orders -g billing --no-dead-letter --no-ack-timeout"
)]
pub struct ConfigureArgs {
    /// The topic and group.
    #[command(flatten)]
    pub group: GroupArgs,
    /// Release a record not acknowledged within this long for redelivery.
    #[arg(long, value_name = "DURATION", value_parser = parse_ack_timeout, allow_hyphen_values = true, conflicts_with = "no_ack_timeout")]
    pub ack_timeout: Option<Duration>,
    /// Keep a delivery until it is acknowledged or retried.
    #[arg(long)]
    pub no_ack_timeout: bool,
    /// Where records that keep failing go.
    #[command(flatten)]
    pub dead_letters: DeadLetterArgs,
    /// Deliver records again for ever, with no dead-letter topic.
    #[arg(long, conflicts_with_all = ["max_deliveries", "dead_letter"])]
    pub no_dead_letter: bool,
    /// Print the group's settings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A topic and one of its groups.
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// Topic of the group.
    pub topic: String,
    /// Consumer group.
    #[arg(long, short)]
    pub group: String,
}

/// `broker group delete`.
#[derive(Debug, Args)]
pub struct GroupDeleteArgs {
    /// The topic and group.
    #[command(flatten)]
    pub group: GroupArgs,
    /// Delete only the group's offsets on this partition (repeat for several), not the group.
    #[arg(long, short, allow_negative_numbers = true)]
    pub partition: Vec<i32>,
}

/// `broker group reset`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).multiple(false)))]
pub struct ResetArgs {
    /// The topic and group.
    #[command(flatten)]
    pub group: GroupArgs,
    /// To the oldest record retained.
    #[arg(long, group = "target")]
    pub to_earliest: bool,
    /// To the end: the group skips everything retained.
    #[arg(long, group = "target")]
    pub to_latest: bool,
    /// To this offset (clamped to the records retained).
    #[arg(
        long,
        group = "target",
        value_name = "OFFSET",
        allow_negative_numbers = true
    )]
    pub to_offset: Option<i64>,
    /// To the first record at or after this time: 2026-12-01T09:00:00Z (RFC 3339; without a
    /// zone, UTC).
    #[arg(long, group = "target", value_name = "RFC3339", value_parser = parse_datetime)]
    pub to_datetime: Option<i64>,
    /// To the first record at or after this long ago: 1h, 30m, 2d.
    #[arg(long, group = "target", value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub by_duration: Option<Duration>,
    /// By this many records from the committed offset (negative: back).
    #[arg(
        long,
        group = "target",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub shift_by: Option<i64>,
    /// Reset only this partition (repeat for several); every partition without it.
    #[arg(long, short, allow_negative_numbers = true)]
    pub partition: Vec<i32>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A time in RFC 3339 (`2026-12-01T09:00:00Z`, `2026-12-01T10:00:00+01:00`, or without a zone
/// for UTC) as milliseconds since the Unix epoch.
pub fn parse_datetime(text: &str) -> Result<i64, String> {
    let trimmed = text.trim();
    // humantime reads UTC times only: a numeric offset (`+01:00`) is taken off first.
    let split = trimmed
        .len()
        .checked_sub(6)
        .filter(|&at| trimmed.is_char_boundary(at))
        .map(|at| trimmed.split_at(at));
    let (local, offset_minutes) = match split
        .and_then(|(local, zone)| Some((local, parse_offset(zone)?)))
    {
        Some((local, minutes)) if local.contains('T') || local.contains(' ') => (local, minutes),
        _ => (trimmed, 0),
    };
    let time = humantime::parse_rfc3339_weak(local).map_err(|error| {
        format!(
            "{text:?} is not a time such as 2026-12-01T09:00:00Z or 2026-12-01T10:00:00+01:00: \
             {error}"
        )
    })?;
    let since = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?;
    let ms = i64::try_from(since.as_millis()).map_err(|_| format!("{text:?} is too far away"))?;
    Ok(ms - offset_minutes * 60_000)
}

/// A numeric zone offset, `+HH:MM` or `-HH:MM`, in minutes east of UTC.
fn parse_offset(zone: &str) -> Option<i64> {
    let sign = match zone.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let (hours, minutes) = zone[1..].split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let (hours, minutes): (i64, i64) = (hours.parse().ok()?, minutes.parse().ok()?);
    (hours < 24 && minutes < 60).then_some(sign * (hours * 60 + minutes))
}

/// `--header NAME=VALUE` (or `NAME` alone, for a header without a value).
pub fn parse_header(text: &str) -> Result<broker_client::Header, String> {
    match text.split_once('=') {
        Some(("", _)) => Err(format!("{text:?} has no name before '='")),
        Some((name, value)) => Ok(broker_client::Header::new(
            name,
            bytes::Bytes::copy_from_slice(value.as_bytes()),
        )),
        None if text.is_empty() => Err("a header needs a name: NAME=VALUE or NAME".to_owned()),
        None => Ok(broker_client::Header {
            name: text.to_owned(),
            value: None,
        }),
    }
}

/// `broker offsets`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).multiple(false)))]
pub struct OffsetsArgs {
    /// Topic.
    pub topic: String,
    /// The time: 2026-12-01T09:00:00Z.
    #[arg(long, group = "when", value_name = "RFC3339", value_parser = parse_datetime)]
    pub at: Option<i64>,
    /// The time this long ago: 1h, 30m, 2d.
    #[arg(long, group = "when", value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ago: Option<Duration>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `broker producers`.
#[derive(Debug, Args)]
pub struct ProducersArgs {
    /// Topic.
    pub topic: String,
    /// Only this partition (every partition when not given).
    #[arg(long, short, allow_negative_numbers = true)]
    pub partition: Option<i32>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The key hash of a new topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeyHashArg {
    /// Kafka's default partitioner: the same partition as Kafka's Java client.
    Murmur2,
    /// 32-bit FNV-1a.
    Fnv1a,
}

/// `broker publish`.
#[derive(Debug, Args)]
#[command(after_help = "\
Standard input is read as bytes, not text: any payload, UTF-8 or not, is published as it is.
Each line is one record, without its line break (\\n, or \\r\\n); an empty line is a record with
an empty payload, and a last line without a line break is a record too. --delimiter splits at
another byte instead (\\0 for `find -print0`), with nothing removed but that byte; --binary
publishes all of standard input as one record.

Records are published in the order given; each is printed with where it was stored, or, with
--json, as one object per record: {\"record\": N, \"topic\", \"partition\", \"offset\"}, with
\"offset\": null and an \"error\" for one that was refused (N counts the records given, from 1).
A refused record does not stop the others; the exit status is then 1.")]
pub struct PublishArgs {
    /// Topic to publish to.
    pub topic: String,
    /// Records to publish; read from standard input when none is given.
    pub payloads: Vec<String>,
    /// The byte that ends each record read from standard input: a single ASCII character, or
    /// \n, \t, \r or \0 (newline by default).
    #[arg(long, value_name = "CHAR", value_parser = parse_delimiter, conflicts_with_all = ["binary", "payloads"])]
    pub delimiter: Option<u8>,
    /// Publish all of standard input as one record.
    #[arg(long, conflicts_with = "payloads")]
    pub binary: bool,
    /// Publish to this partition.
    #[arg(long, conflicts_with = "key", allow_negative_numbers = true)]
    pub partition: Option<i32>,
    /// Publish with this key: records with one key go to one partition. Without --key or
    /// --partition, records go round-robin over the partitions.
    #[arg(long)]
    pub key: Option<String>,
    /// A header of every record: NAME=VALUE, or NAME alone for one without a value. Repeat for
    /// several.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub headers: Vec<broker_client::Header>,
    /// Print one JSON object per record instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print one line at the end, how many records were stored, instead of a line per record
    /// (records not stored are counted in the final error).
    #[arg(long, short, conflicts_with = "json")]
    pub quiet: bool,
}

/// Which consumption protocol `broker consume` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsumeMode {
    /// Ack mode: poll reserves one record per partition, each is acknowledged after printing.
    Ack,
    /// Kafka style: fetch batches from the member's position, commit after printing them. A
    /// record written into a pipe counts as printed: a reader that stops early (`| head -3`)
    /// leaves the rest of its batch committed unread; --count stops exactly.
    Fetch,
}

/// A group member: topic, group and member id.
#[derive(Debug, Args)]
pub struct MemberArgs {
    /// Topic of the group.
    pub topic: String,
    /// Consumer group.
    #[arg(long, short)]
    pub group: String,
    /// Member id within the group.
    #[arg(long, short)]
    pub member: String,
}

/// `broker join`.
#[derive(Debug, Args)]
pub struct JoinArgs {
    /// Who joins where.
    #[command(flatten)]
    pub member: MemberArgs,
    /// Assignor of a new group (an existing group keeps its own; naming another is an error).
    #[arg(long, value_enum)]
    pub assignor: Option<AssignorArg>,
}

/// `--start-at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StartAtArg {
    /// At the earliest record retained.
    Earliest,
    /// At the end: only records published after the group was created.
    Latest,
}

/// How a group divides partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AssignorArg {
    /// Partition p goes to member p mod n (members sorted by id).
    RoundRobin,
    /// Kafka's range assignor: consecutive runs of partitions per member.
    Range,
}

/// `broker consume`.
#[derive(Debug, Args)]
#[command(
    mut_arg("max_deliveries", |arg| arg.requires("dead_letter")),
    mut_arg("dead_letter", |arg| arg.requires("max_deliveries"))
)]
pub struct ConsumeArgs {
    /// Who consumes, and from where.
    #[command(flatten)]
    pub member: MemberArgs,
    /// Acknowledge each record (ack) or commit each batch (fetch).
    #[arg(long, value_enum, default_value_t = ConsumeMode::Ack)]
    pub mode: ConsumeMode,
    /// Assignor if this creates the group.
    #[arg(long, value_enum)]
    pub assignor: Option<AssignorArg>,
    /// Where a group this creates starts: at the earliest record retained (everything kept),
    /// or at the end (only what is published from now on).
    #[arg(long, value_enum)]
    pub start_at: Option<StartAtArg>,
    /// Ack mode, for a group this creates: a record not acknowledged within this long is
    /// released for redelivery (10s, 500ms); without it a delivery stays until acked or
    /// retried.
    #[arg(long, value_name = "DURATION", value_parser = parse_ack_timeout, allow_hyphen_values = true)]
    pub ack_timeout: Option<Duration>,
    /// Ack mode, for a group this creates: where records that keep failing go.
    #[command(flatten)]
    pub dead_letters: DeadLetterArgs,
    /// Ack mode: retry each record printed instead of acknowledging it, to be delivered again
    /// no earlier than this (0s: at once); shows --max-deliveries and dead letters at work.
    /// Needs --count or --follow, since retried records come back; with a delay, only --follow
    /// waits for them (without it, consuming stops when nothing is deliverable).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub retry_after: Option<Duration>,
    /// Before consuming, reset the group to the earliest record retained: replay everything
    /// kept. The reset applies to the whole group.
    #[arg(long, conflicts_with_all = ["from_latest", "from_datetime"])]
    pub from_beginning: bool,
    /// Before consuming, reset the group to the end: skip everything retained.
    #[arg(long, conflicts_with = "from_datetime")]
    pub from_latest: bool,
    /// Before consuming, reset the group to the first record at or after this time:
    /// 2026-12-01T09:00:00Z (RFC 3339; without a zone, UTC).
    #[arg(long, value_name = "RFC3339", value_parser = parse_datetime)]
    pub from_datetime: Option<i64>,
    /// Keep waiting for new records until interrupted (Ctrl-C exits with 130 after saying how
    /// many records were consumed), instead of stopping when none is left. A lost server (or
    /// one whose storage failed) is waited for: the consumer reconnects, joins again and goes
    /// on. Without --follow, a server lost for 5 seconds ends the command with an error.
    #[arg(long, short)]
    pub follow: bool,
    /// Stop after this many records (at least 1).
    #[arg(long, short = 'n', value_parser = parse_count, allow_negative_numbers = true)]
    pub count: Option<u64>,
    /// Records per request (ack mode: 1 to 64; fetch mode: 1 to 10000).
    #[arg(
        long,
        default_value_t = 64,
        value_parser = clap::value_parser!(i32).range(1..=10_000),
        allow_negative_numbers = true
    )]
    pub batch: i32,
    /// Print one JSON object per record instead of text (key, payload and header values as
    /// UTF-8, invalid bytes replaced: --raw prints payloads exactly).
    #[arg(long, conflicts_with = "raw")]
    pub json: bool,
    /// Print each record's payload alone, its bytes exactly as stored (UTF-8 or not), followed by
    /// --delimiter: what `broker publish --delimiter` reads back.
    #[arg(long)]
    pub raw: bool,
    /// With --raw, the byte written after each payload: a single ASCII character, or \n, \t,
    /// \r or \0 (newline by default; \0 for payloads that may hold line breaks).
    #[arg(long, value_name = "CHAR", value_parser = parse_delimiter, requires = "raw")]
    pub delimiter: Option<u8>,
    /// Stay in the group when done instead of leaving it (the server then removes the member
    /// after its session timeout).
    #[arg(long)]
    pub stay: bool,
}

/// `broker describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// Only this topic.
    pub topic: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// `broker lag`.
#[derive(Debug, Args)]
pub struct LagArgs {
    /// Topic.
    pub topic: String,
    /// Consumer group (one that does not exist on the topic is an error: exit status 1).
    #[arg(long, short)]
    pub group: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `broker size`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example: 1,500-byte messages at 2,000/s kept 3 days with 3 \
replicas need 2,332,800,000,000 bytes before headroom:\n  broker size --message-bytes 1500 \
--rate 2000 --retention 3d --replication 3"
)]
pub struct SizeArgs {
    /// Average message size in bytes: payload plus key. The last lines add what the broker's
    /// segment files store per record besides.
    #[arg(long)]
    pub message_bytes: u64,
    /// Messages per second.
    #[arg(long)]
    pub rate: u64,
    /// How long messages are kept: "3d", "72h", "259200s", "1w 2d".
    #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
    pub retention: Duration,
    /// Copies of each message (at least 1).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub replication: u64,
    /// Extra room on top, in percent (30 to 50 is common).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true, value_parser = parse_percent)]
    pub headroom: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn counts_are_whole_numbers_of_at_least_one() {
        assert_eq!(parse_count("1"), Ok(1));
        assert_eq!(parse_count("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(
            parse_count("0"),
            Err("must be at least 1, not 0".to_owned())
        );
        assert_eq!(
            parse_count("-3"),
            Err("must be at least 1, not -3".to_owned())
        );
        assert!(parse_count("ten").unwrap_err().contains("whole number"));
    }

    #[test]
    fn percents_are_whole_and_not_negative() {
        assert_eq!(parse_percent("30"), Ok(30));
        assert!(parse_percent("-10")
            .unwrap_err()
            .contains("cannot be negative"));
        assert!(parse_percent("--json")
            .unwrap_err()
            .contains("whole number"));
    }

    #[test]
    fn a_negative_duration_reaches_its_parser_instead_of_being_read_as_a_flag() {
        let parsed = Cli::try_parse_from(["broker", "top", "--interval", "-1s"]);
        assert!(parsed
            .unwrap_err()
            .to_string()
            .contains("cannot be negative"));
    }

    #[test]
    fn times_are_rfc3339_in_milliseconds_since_the_epoch() {
        assert_eq!(parse_datetime("1970-01-01T00:00:01Z"), Ok(1_000));
        assert_eq!(
            parse_datetime("2026-12-01T10:30:00+01:30"),
            Ok(1_796_115_600_000)
        );
        assert_eq!(
            parse_datetime("2026-12-01T05:00:00-04:00"),
            Ok(1_796_115_600_000)
        );
        assert!(parse_datetime("2026-12-01T05:00:00-25:00").is_err());
        assert_eq!(
            parse_datetime("2026-12-01T09:00:00Z"),
            Ok(1_796_115_600_000)
        );
        assert_eq!(parse_datetime("2026-12-01 09:00:00"), Ok(1_796_115_600_000));
        assert!(parse_datetime("yesterday").is_err());
    }

    #[test]
    fn server_addresses_are_completed_like_the_servers_listen_addresses() {
        for (given, meant) in [
            ("127.0.0.1:9092", "127.0.0.1:9092"),
            (":9093", "127.0.0.1:9093"),
            ("localhost", "localhost:9092"),
            ("broker.internal:1234", "broker.internal:1234"),
            ("[::1]:9094", "[::1]:9094"),
            ("[::1]", "[::1]:9092"),
            ("::1", "[::1]:9092"),
        ] {
            let cli = Cli::try_parse_from(["broker", "--addr", given, "describe"]).unwrap();
            assert_eq!(cli.connect.addr, meant, "{given}");
        }
        assert!(Cli::try_parse_from(["broker", "--addr", "", "describe"]).is_err());
    }
}
