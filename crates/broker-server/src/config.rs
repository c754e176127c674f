//! The server's limits and timeouts, with safe defaults and one validation.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use broker_cluster::{ClusterNode, NodeId};
use broker_core::{Limits, NameRules, MAX_PARTITIONS_LIMIT, MAX_PRODUCT_CAPACITY};
use broker_proto::{ServerLimits, MAX_FRAME_CEILING};
use tokio::sync::Semaphore;

use crate::security::{AuthToken, ServerTls};
use broker_storage::JournalSettings;

use crate::{Fsync, ServerError};

/// The name and version the server announces in its welcome, `broker-server/<version>`.
pub const SERVER_NAME: &str = concat!("broker-server/", env!("CARGO_PKG_VERSION"));

/// How much bigger than the largest payload a frame must be allowed to be: room for the
/// request around a maximal publish and for the records of a full poll or fetch response.
const FRAME_HEADROOM: usize = 2 * 1024 * 1024;

/// Everything [`crate::run`] can be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Records each partition of an interest-retention topic retains at most (unless the topic
    /// sets its own), 1 to 2,147,483,647.
    pub capacity: i32,
    /// Largest frame body read or written, in bytes. At least `max_payload_bytes` plus 2 MiB, at
    /// most [`MAX_FRAME_CEILING`].
    pub max_frame_bytes: usize,
    /// Largest payload, key and headers of one published record, in bytes.
    pub max_payload_bytes: usize,
    /// Most connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Most requests of one connection being worked on at once (waiting ones included); the
    /// server stops reading a connection that has this many outstanding.
    pub max_in_flight: usize,
    /// Without a data directory: bytes the broker retains at most, across every partition
    /// (each record's payload, key and header bytes and [`broker_core::RECORD_OVERHEAD_BYTES`]
    /// for the record); past it a publish answers "full" (`-1`), as for a partition at
    /// capacity. With one, records live on disk and this bounds what memory holds.
    pub max_memory: u64,
    /// Bytes of requests read and not yet answered, across every connection of both listeners
    /// (each frame larger than `broker_net::SMALL_FRAME` counted from its length prefix,
    /// rounded up to 64 bytes): a connection reads no more of such a frame until it has room, so that many clients sending at once make
    /// the server wait, not grow. At least `max_frame_bytes`.
    pub max_request_memory: u64,
    /// Most topics, partitions per topic, groups per topic and members per group: metadata the
    /// memory budget does not count, bounded so that no client can grow it without end.
    pub limits: Limits,
    /// Which names of topics, groups and members every listener takes.
    pub names: NameRules,
    /// A connection that sends nothing for this long while it has no request outstanding is
    /// closed.
    pub idle_timeout: Duration,
    /// A frame whose first bytes have arrived must be complete within this long after it has
    /// room in the request memory (one to two times it, see `broker_net::FrameReader::next`),
    /// or the connection is closed: a client sending a byte now and then cannot hold a
    /// connection, or the room of its frame, for ever.
    pub read_timeout: Duration,
    /// A connection whose peer takes none of its response bytes for this long (it does not
    /// read) is closed.
    pub write_timeout: Duration,
    /// Longest a waiting poll, fetch or ack-and-poll may wait, whatever it asks for.
    pub max_wait: Duration,
    /// A member joined over a connection is removed (a normal leave) after this long without a
    /// request naming it.
    pub session_timeout: Duration,
    /// Whether members joined over a connection leave as soon as it closes.
    pub leave_on_disconnect: bool,
    /// How long a graceful shutdown may take before unfinished connections are abandoned.
    pub shutdown_grace: Duration,
    /// Where the write-ahead log, snapshots and record segments live; `None` keeps the broker
    /// purely in memory.
    pub data_dir: Option<PathBuf>,
    /// When a state change counts as durable (and its response may be sent).
    pub fsync: Fsync,
    /// With [`Fsync::Batch`], the longest written entries wait for an fsync.
    pub fsync_interval: Duration,
    /// Log bytes written since the last checkpoint that trigger the next one; bounds recovery
    /// time and the records held in memory between checkpoints.
    pub snapshot_log_bytes: u64,
    /// Bytes after which a partition's record segment is closed and a new one started.
    pub segment_bytes: u64,
    /// The shared secret every hello must carry; `None` lets any client in.
    pub auth_token: Option<AuthToken>,
    /// The TLS identity connections are served with; `None` serves plain TCP.
    pub tls: Option<ServerTls>,
    /// With a cluster: this node's place in it. `None` runs a single broker.
    pub cluster: Option<ClusterSettings>,
    /// The host and port Kafka clients are told to reach the Kafka listener on (behind a port
    /// mapping or a proxy); `None` tells each client the address its connection came in on.
    pub kafka_advertise: Option<(String, u16)>,
    /// With `--kafka-auto-create-topics`: the partitions of a topic a Kafka client's Metadata
    /// request creates; `None` (the default) creates none.
    pub kafka_auto_create_partitions: Option<i32>,
    /// A single broker's shards (1 to [`MAX_SHARDS`]): its topics spread over this many states,
    /// each behind a lock of its own (and, with a data directory, with a log of its own), so
    /// that calls about topics of different shards are applied on different cores. Every call
    /// about one topic keeps its meaning; a description of every topic gathers the shards one
    /// after another. `None`: as many as the data directory holds, or 1. Not for a cluster node.
    pub shards: Option<usize>,
}

/// The request memory a server has unless told ([`Config::max_request_memory`]): a quarter of
/// its memory budget for records, so that one number sizes the process, but room for at least
/// one frame of the largest size.
pub fn default_request_memory(max_memory: u64, max_frame_bytes: usize) -> u64 {
    (max_memory / 4).max(max_frame_bytes as u64)
}

/// The most shards a single broker runs ([`Config::shards`]).
pub const MAX_SHARDS: usize = 64;

/// How a server takes part in a replicated cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This node's id, unique in the cluster and never reused.
    pub node_id: NodeId,
    /// Every member of the cluster with the addresses peers and clients reach it on, this node
    /// included. Used when the cluster is first formed; after that the membership is in the
    /// replicated log.
    pub members: BTreeMap<NodeId, ClusterNode>,
    /// The address to listen on for peers; by default this node's peer address in `members`.
    pub listen: Option<String>,
    /// The node joins a cluster that already runs (it waits to be added) instead of forming
    /// a new one with `members`.
    pub join: bool,
    /// With the server's TLS identity ([`Config::tls`]): the peer port speaks TLS too, and the
    /// certificates of the other nodes are checked against the CA certificates in this PEM
    /// file.
    pub tls_ca: Option<PathBuf>,
    /// A snapshot is taken after this many entries of the replicated log since the last one.
    pub snapshot_entries: u64,
    /// The bytes of the newest entries of each group's replicated log a node keeps in memory
    /// (the newest entry always); older entries are read back from the log's files when a
    /// follower that fell behind needs them.
    pub log_cache_bytes: u64,
    /// How many Raft groups the cluster spreads its topics over (1 to [`MAX_SHARDS`]), the
    /// first group included, each with a leader of its own, so that topics of different
    /// groups are served by different leaders and cores. 1 (the default) is the cluster of
    /// one group. Every node must be given the same.
    pub data_groups: usize,
    /// How many voters each group past the first has (at least 1; every node while the
    /// cluster has fewer): see `data_groups::replica_order`. The first group has every node.
    /// Every node must be given the same.
    pub replicas: usize,
}

impl ClusterSettings {
    /// This node's entry in `members`.
    pub fn this_node(&self) -> Option<&ClusterNode> {
        self.members.get(&self.node_id)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            capacity: 100,
            max_frame_bytes: 8 * 1024 * 1024,
            max_payload_bytes: 1024 * 1024,
            max_connections: 1024,
            max_in_flight: 1024,
            max_memory: 1024 * 1024 * 1024,
            max_request_memory: default_request_memory(1024 * 1024 * 1024, 8 * 1024 * 1024),
            limits: Limits::default(),
            names: NameRules::default(),
            idle_timeout: Duration::from_secs(600),
            read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_wait: Duration::from_secs(60),
            session_timeout: Duration::from_secs(30),
            leave_on_disconnect: false,
            shutdown_grace: Duration::from_secs(5),
            data_dir: None,
            fsync: Fsync::Always,
            fsync_interval: Duration::from_millis(50),
            snapshot_log_bytes: 64 * 1024 * 1024,
            segment_bytes: 64 * 1024 * 1024,
            auth_token: None,
            tls: None,
            cluster: None,
            kafka_advertise: None,
            kafka_auto_create_partitions: None,
            shards: None,
        }
    }
}

impl Config {
    /// The most of `--max-request-memory` one connection of the broker's port holds at once:
    /// a quarter of it, but at least a frame (and at most all of it), so that a client that
    /// pipelines requests without reading the answers holds up its own connection, not every
    /// other client's.
    pub fn connection_request_memory(&self) -> u64 {
        (self.max_request_memory / 4)
            .max(self.max_frame_bytes as u64)
            .min(self.max_request_memory)
    }

    /// Each shard's (or cluster group's) part of `--max-memory` among `count`: the memory
    /// budget of each (see `max_memory`).
    pub fn memory_share(&self, count: usize) -> u64 {
        self.max_memory / count.max(1) as u64
    }

    /// The `HOST:PORT` Kafka's clients are told to reach this server's Kafka listener on, which
    /// listens on `listening`: `--kafka-advertise` if given; in a cluster, else the host of this
    /// node's client address with the listener's port (its peers tell clients that too); `None`
    /// for a single server without `--kafka-advertise`, which answers each connection with the
    /// address it came in on.
    pub fn kafka_advertised(&self, listening: SocketAddr) -> Option<String> {
        if let Some((host, port)) = &self.kafka_advertise {
            return Some(format!("{host}:{port}"));
        }
        let client_addr = &self.cluster.as_ref()?.this_node()?.client_addr;
        let host = client_addr
            .rsplit_once(':')
            .map_or(client_addr.as_str(), |(host, _)| host);
        // As `--kafka-advertise` is kept: an IPv6 address without its brackets.
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(format!("{host}:{}", listening.port()))
    }

    /// Checks that a Kafka listener can serve with these settings: every node id of a cluster
    /// one Kafka's clients take as a broker id (0 to 2,147,483,647).
    ///
    /// # Errors
    /// [`ServerError::InvalidConfig`] naming the first node id out of range.
    pub fn check_kafka(&self) -> Result<(), ServerError> {
        if let Some(partitions) = self.kafka_auto_create_partitions {
            let max = self.limits.max_partitions;
            if !usize::try_from(partitions).is_ok_and(|count| (1..=max).contains(&count)) {
                return Err(ServerError::InvalidConfig(format!(
                    "--kafka-auto-create-partitions must be 1 to {max} (--max-partitions), got \
                     {partitions}"
                )));
            }
        }
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let ids = std::iter::once(&cluster.node_id).chain(cluster.members.keys());
        match ids.copied().find(|id| i32::try_from(*id).is_err()) {
            None => Ok(()),
            Some(id) => Err(ServerError::InvalidConfig(format!(
                "node id {id} is too large for the Kafka listener (--kafka-listen): Kafka's \
                 clients take node ids as broker ids, from 0 to {}",
                i32::MAX
            ))),
        }
    }

    /// Checks every value is in range.
    ///
    /// # Errors
    /// [`ServerError::InvalidConfig`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), ServerError> {
        let invalid = |message: String| Err(ServerError::InvalidConfig(message));
        if !(1..=MAX_PRODUCT_CAPACITY).contains(&self.capacity) {
            return invalid(format!(
                "--capacity must be 1 to {MAX_PRODUCT_CAPACITY}, got {}",
                self.capacity
            ));
        }
        if self.max_payload_bytes == 0 {
            return invalid("--max-payload-bytes must be at least 1, got 0".into());
        }
        let Limits {
            max_topics,
            max_partitions,
            max_groups_per_topic,
            max_members_per_group,
        } = self.limits;
        for (flag, value) in [
            ("--max-topics", max_topics),
            ("--max-groups-per-topic", max_groups_per_topic),
            ("--max-members-per-group", max_members_per_group),
        ] {
            if value == 0 {
                return invalid(format!("{flag} must be at least 1, got 0"));
            }
        }
        if !(1..=MAX_PARTITIONS_LIMIT as usize).contains(&max_partitions) {
            return invalid(format!(
                "--max-partitions must be 1 to {MAX_PARTITIONS_LIMIT}, got {max_partitions}"
            ));
        }
        if let Some(cluster) = &self.cluster {
            let groups = cluster.data_groups;
            if !(1..=MAX_SHARDS).contains(&groups) {
                return invalid(format!(
                    "--cluster-data-groups must be 1 to {MAX_SHARDS}, got {groups}"
                ));
            }
            if cluster.replicas == 0 {
                return invalid("--cluster-replicas must be at least 1".into());
            }
        }
        if let Some(shards) = self.shards {
            if !(1..=MAX_SHARDS).contains(&shards) {
                return invalid(format!("--shards must be 1 to {MAX_SHARDS}, got {shards}"));
            }
            if self.cluster.is_some() && shards > 1 {
                return invalid(
                    "--shards is for a single broker: a cluster node spreads its topics over \
                     Raft groups (--cluster-data-groups)"
                        .into(),
                );
            }
        }
        // Without a data directory, the shards share the memory budget out; in a cluster, the
        // groups do.
        let (shards, parts) = match (&self.cluster, &self.data_dir) {
            (Some(cluster), _) => (cluster.data_groups as u64, "groups"),
            (None, None) => (self.shards.unwrap_or(1) as u64, "shards"),
            (None, Some(_)) => (1, "shards"),
        };
        // Each part holds at least one largest record, with what the budget counts for it.
        let largest = self.max_payload_bytes as u64 + broker_core::RECORD_OVERHEAD_BYTES;
        if self.max_memory / shards < largest {
            let least = largest * shards;
            return invalid(match shards {
                1 => format!(
                    "--max-memory {} is less than one record of --max-payload-bytes {} and the \
                     {} bytes counted for the record: raise --max-memory to at least {least}, \
                     or lower --max-payload-bytes",
                    self.max_memory,
                    self.max_payload_bytes,
                    broker_core::RECORD_OVERHEAD_BYTES
                ),
                _ => format!(
                    "--max-memory {} shared by {shards} {parts} leaves each less than one record \
                     of --max-payload-bytes {} and the {} bytes counted for the record: raise \
                     --max-memory to at least {least}, or lower --max-payload-bytes or the \
                     number of {parts}",
                    self.max_memory,
                    self.max_payload_bytes,
                    broker_core::RECORD_OVERHEAD_BYTES
                ),
            });
        }
        self.check_frame().map_err(ServerError::InvalidConfig)?;
        if self.max_request_memory < self.max_frame_bytes as u64 {
            return invalid(format!(
                "--max-request-memory {} is less than --max-frame-bytes {}: raise \
                 --max-request-memory to at least {}, or lower --max-frame-bytes",
                self.max_request_memory, self.max_frame_bytes, self.max_frame_bytes
            ));
        }
        for (flag, value) in [
            ("--max-connections", self.max_connections),
            ("--max-in-flight", self.max_in_flight),
        ] {
            if value == 0 {
                return invalid(format!("{flag} must be at least 1, got 0"));
            }
            if value > Semaphore::MAX_PERMITS {
                return invalid(format!(
                    "{flag} must be at most {}, got {value}",
                    Semaphore::MAX_PERMITS
                ));
            }
        }
        for (flag, value) in [
            ("--max-wait-ms", self.max_wait),
            ("--session-timeout-ms", self.session_timeout),
            ("--idle-timeout-ms", self.idle_timeout),
            ("--read-timeout-ms", self.read_timeout),
            ("--write-timeout-ms", self.write_timeout),
            ("--fsync-interval-ms", self.fsync_interval),
        ] {
            if value.is_zero() || value.as_millis() > u128::from(u32::MAX) {
                return invalid(format!(
                    "{flag} must be 1 to {}, got {}",
                    u32::MAX,
                    value.as_millis()
                ));
            }
        }
        if self.snapshot_log_bytes == 0 {
            return invalid("snapshot log bytes must be at least 1".into());
        }
        if let Some(cluster) = &self.cluster {
            if self.data_dir.is_none() {
                return invalid(
                    "a cluster node needs a data directory (--data-dir) for its replicated log"
                        .into(),
                );
            }
            if cluster.members.contains_key(&0) {
                return invalid("node ids start at 1 (0 stands for no node)".into());
            }
            if cluster.this_node().is_none() {
                return invalid(format!(
                    "node id {} is not among the cluster members ({})",
                    cluster.node_id,
                    cluster
                        .members
                        .keys()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
        if self.segment_bytes < 4096 {
            return invalid(format!(
                "segment bytes must be at least 4096, got {}",
                self.segment_bytes
            ));
        }
        Ok(())
    }

    /// Checks that a frame has room for the largest payload and the request around it, and
    /// fits the protocol's ceiling; the refusal names both flags and the value that would do.
    fn check_frame(&self) -> Result<(), String> {
        let (frame, payload) = (self.max_frame_bytes, self.max_payload_bytes);
        let largest_payload = MAX_FRAME_CEILING - FRAME_HEADROOM;
        if payload > largest_payload {
            return Err(format!(
                "--max-payload-bytes {payload} leaves no room in a frame: a frame takes at most \
                 {MAX_FRAME_CEILING} bytes (--max-frame-bytes), the payload plus 2 MiB for the \
                 request around it; lower --max-payload-bytes to at most {largest_payload}"
            ));
        }
        if frame > MAX_FRAME_CEILING {
            return Err(format!(
                "--max-frame-bytes must be at most {MAX_FRAME_CEILING}, got {frame}"
            ));
        }
        let min_frame = payload + FRAME_HEADROOM;
        if frame < min_frame {
            return Err(format!(
                "--max-frame-bytes {frame} has no room for --max-payload-bytes {payload}: a \
                 frame takes the payload plus 2 MiB for the request around it; raise \
                 --max-frame-bytes to at least {min_frame}{}",
                frame
                    .checked_sub(FRAME_HEADROOM)
                    .filter(|&room| room > 0)
                    .map(|room| format!(" or lower --max-payload-bytes to at most {room}"))
                    .unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// How the journal writes, with a data directory.
    pub fn journal(&self) -> JournalSettings {
        JournalSettings {
            fsync: self.fsync,
            fsync_interval: self.fsync_interval,
            snapshot_log_bytes: self.snapshot_log_bytes,
            segment_bytes: self.segment_bytes,
            held_log_bytes: None,
        }
    }

    /// The limits announced to clients in the welcome.
    pub fn limits(&self) -> ServerLimits {
        let clamp = |value: u128| u32::try_from(value).unwrap_or(u32::MAX);
        ServerLimits {
            max_frame_bytes: clamp(self.max_frame_bytes as u128),
            max_payload_bytes: clamp(self.max_payload_bytes as u128),
            max_in_flight: clamp(self.max_in_flight as u128),
            max_wait_ms: clamp(self.max_wait.as_millis()),
            session_timeout_ms: clamp(self.session_timeout.as_millis()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_created_kafka_topics_must_fit_the_partition_limit() {
        let config = |partitions| Config {
            kafka_auto_create_partitions: Some(partitions),
            ..Config::default()
        };
        assert!(config(64).check_kafka().is_ok());
        for partitions in [0, -1, 65] {
            let refused = config(partitions).check_kafka().unwrap_err().to_string();
            assert!(
                refused.contains(&format!(
                    "--kafka-auto-create-partitions must be 1 to 64 (--max-partitions), got {partitions}"
                )),
                "{refused}"
            );
        }
    }

    #[test]
    fn shards_are_checked() {
        let config = |shards, max_memory| Config {
            shards: Some(shards),
            max_memory,
            ..Config::default()
        };
        assert!(config(64, 64 * ((1 << 20) + 80)).validate().is_ok());
        assert!(config(64, 64 << 20).validate().is_err());
        for (shards, why) in [
            (0, "--shards must be 1 to 64"),
            (65, "--shards must be 1 to 64"),
        ] {
            let refused = config(shards, 1 << 30).validate().unwrap_err().to_string();
            assert!(refused.contains(why), "{refused}");
        }
        // Each shard's part of the memory budget must hold the largest record (with a data
        // directory, records live on disk and there is no budget to share).
        let refused = config(4, 3 << 20).validate().unwrap_err().to_string();
        assert!(
            refused.contains("shared by 4 shards") && refused.contains("at least 4194624"),
            "{refused}"
        );
        let on_disk = Config {
            data_dir: Some("d".into()),
            ..config(4, 3 << 20)
        };
        assert!(on_disk.validate().is_ok());
        // A cluster node, with `data_groups` groups.
        let groups = |data_groups, max_memory| Config {
            data_dir: Some("d".into()),
            max_memory,
            cluster: Some(ClusterSettings {
                node_id: 1,
                members: broker_cluster::parse_members("1=a:1/b:2").unwrap(),
                listen: None,
                join: false,
                tls_ca: None,
                snapshot_entries: 10,
                log_cache_bytes: broker_cluster::CACHED_ENTRY_BYTES,
                data_groups,
                replicas: 3,
            }),
            ..Config::default()
        };
        let cluster = Config {
            shards: Some(2),
            ..groups(1, 1 << 30)
        };
        let refused = cluster.validate().unwrap_err().to_string();
        assert!(
            refused.contains("--shards is for a single broker"),
            "{refused}"
        );
        // A cluster's groups share the budget out, as shards do; their number is checked.
        assert!(groups(3, 3 * ((1 << 20) + 80)).validate().is_ok());
        let refused = groups(4, 3 << 20).validate().unwrap_err().to_string();
        assert!(refused.contains("shared by 4 groups"), "{refused}");
        let refused = groups(65, 1 << 30).validate().unwrap_err().to_string();
        assert!(
            refused.contains("--cluster-data-groups must be 1 to 64"),
            "{refused}"
        );
    }

    #[test]
    fn default_is_valid() {
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn capacity_out_of_range_is_refused() {
        for capacity in [0, -1, i32::MIN] {
            let config = Config {
                capacity,
                ..Config::default()
            };
            assert!(matches!(
                config.validate(),
                Err(ServerError::InvalidConfig(_))
            ));
        }
    }

    #[test]
    fn capacity_and_partitions_reach_the_product_limits() {
        let config = Config {
            capacity: i32::MAX,
            limits: Limits {
                max_partitions: MAX_PARTITIONS_LIMIT as usize,
                ..Limits::default()
            },
            ..Config::default()
        };
        assert!(config.validate().is_ok());
        for max_partitions in [0, MAX_PARTITIONS_LIMIT as usize + 1] {
            let config = Config {
                limits: Limits {
                    max_partitions,
                    ..Limits::default()
                },
                ..Config::default()
            };
            assert!(
                matches!(config.validate(), Err(ServerError::InvalidConfig(_))),
                "{max_partitions}"
            );
        }
    }

    fn refusal(config: Config) -> String {
        match config.validate() {
            Err(ServerError::InvalidConfig(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn frame_must_leave_room_for_payload() {
        let refused = refusal(Config {
            max_frame_bytes: 2 * 1024 * 1024,
            max_payload_bytes: 1,
            ..Config::default()
        });
        assert_eq!(
            refused,
            "--max-frame-bytes 2097152 has no room for --max-payload-bytes 1: a frame takes the \
             payload plus 2 MiB for the request around it; raise --max-frame-bytes to at least \
             2097153"
        );
        let config = Config {
            max_frame_bytes: MAX_FRAME_CEILING + 1,
            ..Config::default()
        };
        assert!(refusal(config).starts_with("--max-frame-bytes must be at most 67108864"));
    }

    #[test]
    fn a_payload_limit_the_frame_cannot_carry_names_both_flags_and_what_would_do() {
        let refused = refusal(Config {
            max_payload_bytes: 10_000_000,
            ..Config::default()
        });
        assert_eq!(
            refused,
            "--max-frame-bytes 8388608 has no room for --max-payload-bytes 10000000: a frame \
             takes the payload plus 2 MiB for the request around it; raise --max-frame-bytes to \
             at least 12097152 or lower --max-payload-bytes to at most 6291456"
        );
        let raised = Config {
            max_payload_bytes: 10_000_000,
            max_frame_bytes: 12_097_152,
            ..Config::default()
        };
        assert!(raised.validate().is_ok());
        // Past what any frame carries, only a smaller payload limit helps.
        let refused = refusal(Config {
            max_payload_bytes: MAX_FRAME_CEILING,
            max_frame_bytes: MAX_FRAME_CEILING,
            ..Config::default()
        });
        assert!(
            refused.ends_with("lower --max-payload-bytes to at most 65011712"),
            "{refused}"
        );
        assert!(!refused.contains("raise"), "{refused}");
    }

    #[test]
    fn a_memory_budget_below_the_payload_limit_names_both_flags() {
        let refused = refusal(Config {
            max_memory: 10,
            ..Config::default()
        });
        assert_eq!(
            refused,
            "--max-memory 10 is less than one record of --max-payload-bytes 1048576 and the 80 \
             bytes counted for the record: raise --max-memory to at least 1048656, or lower \
             --max-payload-bytes"
        );
    }

    #[test]
    fn the_request_memory_holds_a_largest_frame_and_defaults_to_a_quarter_of_the_budget() {
        let refused = refusal(Config {
            max_request_memory: 8 * 1024 * 1024 - 1,
            ..Config::default()
        });
        assert_eq!(
            refused,
            "--max-request-memory 8388607 is less than --max-frame-bytes 8388608: raise \
             --max-request-memory to at least 8388608, or lower --max-frame-bytes"
        );
        assert_eq!(Config::default().max_request_memory, 256 * 1024 * 1024);
        assert_eq!(
            default_request_memory(128 * 1024 * 1024, 8 * 1024 * 1024),
            32 * 1024 * 1024
        );
        assert_eq!(
            default_request_memory(16 * 1024 * 1024, 8 * 1024 * 1024),
            8 * 1024 * 1024,
            "room for a largest frame"
        );
    }

    #[test]
    fn timeouts_and_the_memory_budget_are_checked() {
        let refused = [
            Config {
                idle_timeout: Duration::ZERO,
                ..Config::default()
            },
            Config {
                read_timeout: Duration::ZERO,
                ..Config::default()
            },
            Config {
                write_timeout: Duration::from_millis(u64::from(u32::MAX) + 1),
                ..Config::default()
            },
            Config {
                max_memory: 1024 * 1024 + 79,
                ..Config::default()
            },
        ];
        for config in refused {
            assert!(config.validate().is_err(), "{config:?}");
        }
        let smallest = Config {
            max_memory: 1024 * 1024 + 80,
            ..Config::default()
        };
        assert!(smallest.validate().is_ok());
    }

    #[test]
    fn zero_limits_are_refused() {
        let zeroed = [
            Config {
                max_connections: 0,
                ..Config::default()
            },
            Config {
                max_in_flight: 0,
                ..Config::default()
            },
            Config {
                max_payload_bytes: 0,
                ..Config::default()
            },
            Config {
                session_timeout: Duration::ZERO,
                ..Config::default()
            },
            Config {
                max_wait: Duration::ZERO,
                ..Config::default()
            },
        ];
        for config in zeroed {
            assert!(config.validate().is_err(), "{config:?}");
        }
    }
}
