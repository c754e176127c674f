//! What the listener runs the broker's commands through.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use broker_core::{Command, EventBroker, Outcome, TopicDescription};
use broker_proto::ErrorReply;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::ResponseError;

/// Where a cluster serves the broker, as Metadata and FindCoordinator tell Kafka's clients:
/// every group is coordinated by the node that leads, which also serves every partition but
/// those of the topics whose group has a leader of its own (`topic_leaders`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Every node clients may be sent to: its broker id and the host and port of its Kafka
    /// listener.
    pub brokers: Vec<(i32, String, u16)>,
    /// The node that leads now, if one is known: the controller, the coordinator of every
    /// group, and the leader of every partition not listed in `topic_leaders`.
    pub leader: Option<i32>,
    /// The nodes that hold a copy of every partition (the voting members).
    pub replicas: Vec<i32>,
    /// In a cluster that spreads its topics over several groups: the topics held by a group
    /// other than the leader's, each with its group's leader, if one is known. Every
    /// partition of such a topic is served by that node.
    pub topic_leaders: BTreeMap<String, Option<i32>>,
    /// The nodes that hold a copy of each topic of `topic_leaders` (its group's voters), where
    /// they are not every node of `replicas`.
    pub topic_replicas: BTreeMap<String, Vec<i32>>,
    /// The fewest copies a topic created now gets (the voters of the group it goes to): the
    /// largest replication factor a creation may ask for.
    pub new_topic_copies: usize,
}

/// Runs the broker's commands for one Kafka connection: the server implements it with the same
/// path a native connection's requests take (validation, the log, waits, the cluster).
pub trait Backend: Send + Sync {
    /// Applies `command` and answers as the server answers a native request of it: a read
    /// that finds no record waits up to `max_wait` (bounded by the server's limit) for one.
    fn call(
        &self,
        command: Command,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Outcome, ErrorReply>> + Send;

    /// Applies `command` for a request that Kafka's clients send to the controller or a
    /// group's coordinator rather than to a partition's leader (offset commits and fetches,
    /// group deletions, changes to topics): where the node serving the command's topic is
    /// another node of the cluster, the command is applied there, through the cluster, and
    /// answered here. A read does not wait for records. By default, as `call` does.
    fn call_anywhere(
        &self,
        command: Command,
    ) -> impl Future<Output = Result<Outcome, ErrorReply>> + Send {
        self.call(command, Duration::ZERO)
    }

    /// Whether every node that applies the broker's commands takes those of protocol version
    /// `version`: a cluster in the middle of an upgrade may have nodes of an earlier release,
    /// which would stop at an entry of a command they do not know. The listener then answers
    /// as the releases before it did. A server alone always does (the default).
    fn speaks(&self, _version: u16) -> impl Future<Output = bool> + Send {
        std::future::ready(true)
    }

    /// The topics as this server knows them, for Metadata. A server that runs alone, or
    /// leads its cluster, answers as a `Describe` command does; a follower answers from its
    /// own copy, which may lag the leader's by the changes it has not applied yet (Kafka's
    /// metadata is not up to date either: clients ask again when a partition refuses them).
    fn topics(&self) -> impl Future<Output = Result<Vec<TopicDescription>, ErrorReply>> + Send;

    /// Where the cluster this server is a node of serves the broker; `None` for a server that
    /// runs alone.
    fn cluster(&self) -> Option<ClusterView>;

    /// Whether this server coordinates Kafka's groups now: a server that runs alone does, a
    /// node of a cluster while it leads (the leader coordinates every group). Asked before
    /// every group request, so it must be cheap.
    fn coordinates_groups(&self) -> bool;

    /// Whether a connection must authenticate (SASL/PLAIN) before anything but the API
    /// versions.
    fn requires_authentication(&self) -> bool;

    /// Whether `password` authenticates a connection (compared in constant time).
    fn authenticate(&self, password: &str) -> bool;

    /// Told of each request answered (or refused): its API (`None` when the request did not
    /// say one the listener knows) and `errors`, which gives every error its answer carries:
    /// its own, its topics', partitions', groups' and members' (called only by a backend that
    /// counts them, so that others pay nothing). For the server's metrics; does nothing by
    /// default.
    fn answered(&self, _api: Option<ApiKey>, _errors: impl FnOnce() -> Vec<ResponseError>) {}
}

/// The broker in memory, in this process, as a backend: each command applied at once (a read
/// that finds nothing answers at once), with no authentication. For tests and tools that serve
/// Kafka's clients without a server.
impl Backend for EventBroker {
    async fn call(&self, command: Command, _max_wait: Duration) -> Result<Outcome, ErrorReply> {
        self.apply(command).map_err(ErrorReply::from)
    }

    async fn topics(&self) -> Result<Vec<TopicDescription>, ErrorReply> {
        Ok(EventBroker::describe(self).topics)
    }

    fn cluster(&self) -> Option<ClusterView> {
        None
    }

    fn coordinates_groups(&self) -> bool {
        true
    }

    fn requires_authentication(&self) -> bool {
        false
    }

    fn authenticate(&self, _password: &str) -> bool {
        true
    }
}
