//! How the listener serves its connections.

use std::time::Duration;

use broker_core::NameRules;

/// How the listener serves its connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    /// The broker id Metadata gives this server.
    pub node_id: i32,
    /// The cluster id Metadata answers.
    pub cluster_id: String,
    /// The host and port clients are told to reach the listener on (Metadata's brokers); `None`
    /// tells each client the address its connection came in on.
    pub advertise: Option<(String, u16)>,
    /// Largest request accepted, in bytes; a larger one closes the connection.
    pub max_frame_bytes: usize,
    /// Largest record accepted (value, key and headers), in bytes: the server's payload limit.
    /// A partition's batch holding a larger record is refused with `MESSAGE_TOO_LARGE` before
    /// anything is stored; the request's other partitions are stored as usual.
    pub max_record_bytes: u64,
    /// The most partitions a topic may have on this broker (`--max-partitions`): CreateTopics
    /// and CreatePartitions past it are refused with `INVALID_PARTITIONS`, also when they only
    /// validate.
    pub max_partitions: i32,
    /// Where the broker keeps its records, as DescribeLogDirs names the one log directory: the
    /// data directory, or a name saying they are in memory.
    pub log_dir: String,
    /// Topics Kafka's clients ask for by name and the broker does not have are created, with
    /// this many partitions and Kafka's retention, when their Metadata request allows it (as
    /// Kafka's `auto.create.topics.enable`); `None` creates none.
    pub auto_create_partitions: Option<i32>,
    /// Which names of topics and groups the broker takes: requests naming others are refused
    /// as Kafka refuses invalid names.
    pub names: NameRules,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: Duration,
    /// A connection whose request has started arriving but is not whole within this long is
    /// closed.
    pub read_timeout: Duration,
    /// A connection whose client takes none of an answer for this long (it does not read) is
    /// closed.
    pub write_timeout: Duration,
}
