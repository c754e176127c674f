//! The command line: every subcommand, flag and environment variable of `broker`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::bench::BenchArgs;

/// Talk to a broker-server from a shell: create topics, publish, consume as a group member,
/// inspect groups and lag, size disks, and benchmark.
#[derive(Debug, Parser)]
#[command(name = "broker", version, after_help = EXAMPLES)]
pub struct Cli {
    /// Address of the broker-server: HOST:PORT, [IPv6]:PORT, :PORT for this machine (as the
    /// server's --listen :PORT), or a HOST alone for port 9092.
    #[arg(
        long,
        global = true,
        env = "BROKER_ADDR",
        default_value = "127.0.0.1:9092",
        value_parser = broker_net::connect_address
    )]
    pub addr: String,

    /// File holding the server's auth token (trailing line breaks are ignored). Or set
    /// BROKER_AUTH_TOKEN to the token itself; there is no flag for the token, so that it never
    /// shows in the process list.
    #[arg(
        long,
        global = true,
        env = "BROKER_AUTH_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub auth_token_file: Option<PathBuf>,

    /// Connect with TLS, trusting only the CA certificates in this PEM file.
    #[arg(long, global = true, env = "BROKER_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// With --tls-ca: the name the server's TLS certificate must carry; by default the host
    /// part of --addr.
    #[arg(
        long,
        global = true,
        env = "BROKER_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

const EXAMPLES: &str = "\
Examples:
  broker create orders --partitions 3
  broker publish orders 'first order' 'second order' --key customer-42
  seq 1 100 | broker publish orders --partition 0
  broker consume orders --group billing --member billing-1
  broker consume orders --group analytics --member a1 --mode fetch --follow --json
  broker describe orders
  broker lag orders --group billing
  broker size --message-bytes 1500 --rate 2000 --retention 3d --replication 3 --headroom 30
  broker bench mixed --producers 4 --consumers 4 --records 1000000
  BROKER_AUTH_TOKEN=s3cret broker --addr broker.internal:9092 --tls-ca ca.pem describe

Exit status: 0 on success, 1 when the broker refuses a call or cannot be reached, 2 for bad
command-line arguments.";

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a topic (succeeds, saying so, if it already exists).
    Create(CreateArgs),
    /// Publish records: each PAYLOAD argument is one record; with none, each line of standard
    /// input is one record.
    Publish(PublishArgs),
    /// Consume records as a member of a consumer group, print them, and acknowledge or commit
    /// them.
    Consume(ConsumeArgs),
    /// Join a consumer group and print the member's partitions. The server removes the member
    /// after its session timeout unless it keeps making calls.
    Join(JoinArgs),
    /// Leave a consumer group; its partitions go to the remaining members.
    Leave(MemberArgs),
    /// Show topics (partitions, earliest and end offsets, retained bytes) and their groups
    /// (assignor, members, partitions, committed, in flight, lag).
    Describe(DescribeArgs),
    /// Show a group's lag on each partition of a topic.
    Lag(LagArgs),
    /// Disk sizing: message size × rate × retention × replication, plus headroom.
    Size(SizeArgs),
    /// Measure a broker-server: throughput and latency percentiles under a chosen workload.
    Bench(BenchArgs),
}

/// `broker create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Topic name: 1 to 64 ASCII letters, digits, '_' or '-'.
    pub topic: String,
    /// Number of partitions, 1 to 64.
    #[arg(long, short, default_value_t = 1)]
    pub partitions: i32,
    /// How keyed publishes choose a partition.
    #[arg(long, value_enum, default_value_t = KeyHashArg::Murmur2)]
    pub key_hash: KeyHashArg,
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
pub struct PublishArgs {
    /// Topic to publish to.
    pub topic: String,
    /// Records to publish; read from standard input, one per line, when none is given.
    pub payloads: Vec<String>,
    /// Publish to this partition.
    #[arg(long, conflicts_with = "key")]
    pub partition: Option<i32>,
    /// Publish with this key: records with one key go to one partition. Without --key or
    /// --partition, records go round-robin over the partitions.
    #[arg(long)]
    pub key: Option<String>,
    /// Print one JSON object per record instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Which consumption protocol `broker consume` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsumeMode {
    /// Ack mode: poll reserves one record per partition, each is acknowledged after printing.
    Ack,
    /// Kafka style: fetch batches from the member's position, commit after printing them.
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
    /// Keep waiting for new records until interrupted (Ctrl-C), instead of stopping when none
    /// is left.
    #[arg(long, short)]
    pub follow: bool,
    /// Stop after this many records.
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    /// Records per request (ack mode: 1 to 64; fetch mode: 1 to 10000).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub batch: i32,
    /// Print one JSON object per record instead of text.
    #[arg(long)]
    pub json: bool,
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
    /// Consumer group (a group that does not exist shows the full retained log as lag).
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
    /// Average message size in bytes.
    #[arg(long)]
    pub message_bytes: u64,
    /// Messages per second.
    #[arg(long)]
    pub rate: u64,
    /// How long messages are kept: "3d", "72h", "259200s", "1w 2d".
    #[arg(long, value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// Copies of each message.
    #[arg(long, default_value_t = 1)]
    pub replication: u64,
    /// Extra room on top, in percent (30 to 50 is common).
    #[arg(long, default_value_t = 0)]
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
            assert_eq!(cli.addr, meant, "{given}");
        }
        assert!(Cli::try_parse_from(["broker", "--addr", "", "describe"]).is_err());
    }
}
