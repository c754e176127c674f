//! What each Kafka request does: the broker's commands it runs through the [`Backend`], and the
//! Kafka response built from their outcomes. [`Handler::handle`] sends each API to its family's
//! file: `metadata` (Metadata, FindCoordinator), `produce` (Produce, InitProducerId), `fetch`
//! (Fetch, ListOffsets), `groups` (JoinGroup, SyncGroup, LeaveGroup, DescribeGroups,
//! ListGroups), `offsets` (OffsetCommit, OffsetFetch), `admin` (CreateTopics, DeleteTopics,
//! DeleteRecords) and `alter` (AlterConfigs, IncrementalAlterConfigs); what they share is here.

use std::collections::HashSet;
use std::time::Duration;

use broker_core::{Command, Outcome, TopicDescription};
use broker_proto::ErrorReply;
use kafka_protocol::messages::{RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::apis::api_versions;
use crate::configs;
use crate::elsewhere::refuse_group_request;
use crate::errors::kafka_error;
use crate::{Backend, KafkaSettings, KafkaState};
use produce::init_producer_id;

mod admin;
mod alter;
mod fetch;
mod groups;
mod metadata;
mod offsets;
mod produce;
#[cfg(test)]
mod tests;

/// Where clients reach this listener: the host and port Metadata answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Host name or address.
    pub(crate) host: String,
    /// Port.
    pub(crate) port: i32,
}

/// What a request is answered with.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Its response (boxed: some responses are large).
    Response(Box<ResponseKind>),
    /// Nothing: a produce with `acks=0`.
    Nothing,
    /// Nothing, and the connection closes: a produce with `acks=0` that was refused, as
    /// Kafka's brokers do, since the closing is the client's only sign that it should ask for
    /// metadata again (a partition's leader moved, say).
    Close,
    /// Its correlation id and this error alone: a request of an API the listener does not
    /// handle.
    Refused(ResponseError),
}

/// Answers the requests of one connection.
pub(crate) struct Handler<'a, B> {
    pub(crate) backend: &'a B,
    pub(crate) settings: &'a KafkaSettings,
    /// What the server's Kafka connections share.
    pub(crate) state: &'a KafkaState,
    /// Where the connection's client is told the listener is.
    pub(crate) endpoint: Endpoint,
    /// Where the connection comes from, as DescribeGroups shows a member's host.
    pub(crate) client_host: String,
}

impl<B: Backend> Handler<'_, B> {
    /// Whether `group` names a group the broker can keep: a name its rules take, as every
    /// name of the broker (topic names included).
    pub(super) fn is_group_id(&self, group: &str) -> bool {
        self.settings.names.allows(group)
    }

    /// Answers one request of `version`, from the client that `client_id` names.
    pub(crate) async fn handle(
        &self,
        version: i16,
        client_id: &str,
        request: RequestKind,
    ) -> Answer {
        if !self.backend.coordinates_groups() {
            if let Some(refused) = refuse_group_request(&request, ResponseError::NotCoordinator) {
                return Answer::Response(Box::new(refused));
            }
        }
        Answer::Response(Box::new(match request {
            RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions(0)),
            RequestKind::Metadata(request) => {
                ResponseKind::Metadata(self.metadata(request, version).await)
            }
            RequestKind::Produce(request) => {
                let acks = request.acks;
                let response = self.produce(request).await;
                if acks == 0 {
                    let refused = response
                        .responses
                        .iter()
                        .flat_map(|topic| &topic.partition_responses)
                        .any(|partition| partition.error_code != 0);
                    return if refused {
                        Answer::Close
                    } else {
                        Answer::Nothing
                    };
                }
                ResponseKind::Produce(response)
            }
            RequestKind::Fetch(request) => ResponseKind::Fetch(self.fetch(request).await),
            RequestKind::ListOffsets(request) => {
                ResponseKind::ListOffsets(self.list_offsets(request).await)
            }
            RequestKind::CreateTopics(request) => {
                ResponseKind::CreateTopics(self.create_topics(request).await)
            }
            RequestKind::DeleteTopics(request) => {
                ResponseKind::DeleteTopics(self.delete_topics(request).await)
            }
            RequestKind::InitProducerId(request) => {
                ResponseKind::InitProducerId(init_producer_id(&request))
            }
            RequestKind::DescribeProducers(request) => {
                ResponseKind::DescribeProducers(self.describe_producers(request).await)
            }
            RequestKind::FindCoordinator(request) => {
                ResponseKind::FindCoordinator(self.find_coordinator(&request))
            }
            RequestKind::JoinGroup(request) => {
                ResponseKind::JoinGroup(self.join_group(request, client_id).await)
            }
            RequestKind::SyncGroup(request) => {
                ResponseKind::SyncGroup(self.sync_group(request).await)
            }
            RequestKind::Heartbeat(request) => {
                ResponseKind::Heartbeat(self.heartbeat(&request).await)
            }
            RequestKind::LeaveGroup(request) => {
                ResponseKind::LeaveGroup(self.leave_group(&request))
            }
            RequestKind::OffsetCommit(request) => {
                ResponseKind::OffsetCommit(self.offset_commit(request).await)
            }
            RequestKind::OffsetFetch(request) => {
                ResponseKind::OffsetFetch(self.offset_fetch(request).await)
            }
            RequestKind::DescribeGroups(request) => {
                ResponseKind::DescribeGroups(self.describe_groups(&request).await)
            }
            RequestKind::ListGroups(request) => {
                ResponseKind::ListGroups(self.list_groups(&request).await)
            }
            RequestKind::CreatePartitions(request) => {
                ResponseKind::CreatePartitions(self.create_partitions(request).await)
            }
            RequestKind::DeleteGroups(request) => {
                ResponseKind::DeleteGroups(self.delete_groups(request).await)
            }
            RequestKind::OffsetDelete(request) => {
                ResponseKind::OffsetDelete(self.offset_delete(request).await)
            }
            RequestKind::DescribeLogDirs(request) => {
                ResponseKind::DescribeLogDirs(self.describe_log_dirs(request).await)
            }
            RequestKind::DescribeCluster(request) => {
                ResponseKind::DescribeCluster(self.describe_cluster(&request))
            }
            RequestKind::DeleteRecords(request) => {
                ResponseKind::DeleteRecords(self.delete_records(request).await)
            }
            RequestKind::DescribeConfigs(request) => {
                let topics = self
                    .backend
                    .topics()
                    .await
                    .map_err(|refusal| refused(&refusal));
                ResponseKind::DescribeConfigs(configs::describe_configs(&request, &topics))
            }
            RequestKind::AlterConfigs(request) => {
                ResponseKind::AlterConfigs(self.alter_configs(request).await)
            }
            RequestKind::IncrementalAlterConfigs(request) => {
                ResponseKind::IncrementalAlterConfigs(self.incremental_alter_configs(request).await)
            }
            // `frame::parse` lets through only the APIs `apis::supported_apis` lists, each
            // handled above.
            _ => return Answer::Refused(ResponseError::UnsupportedVersion),
        }))
    }
}

/// A topic name as the broker sees it.
/// The names `names` gives more than once. Kafka answers every entry of such a resource in a
/// request that changes resources with `INVALID_REQUEST` (two changes of one resource in one
/// request would race), and so does the listener: none of them is looked up or changed.
fn named_more_than_once<'a>(names: impl IntoIterator<Item = &'a str>) -> HashSet<&'a str> {
    let mut seen = HashSet::new();
    names
        .into_iter()
        .filter(|name| !seen.insert(*name))
        .collect()
}

fn topic_name(name: &TopicName) -> String {
    name.as_str().to_owned()
}

fn kafka_topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

fn message(text: String) -> Option<StrBytes> {
    Some(StrBytes::from_string(text))
}

impl<B: Backend> Handler<'_, B> {
    /// Applies `command` of a request sent to the controller or a coordinator, wherever its
    /// topic is served (see [`Backend::call_anywhere`]).
    async fn call(&self, command: Command) -> Result<Outcome, ErrorReply> {
        self.backend.call_anywhere(command).await
    }

    /// Applies `command` of a request sent to a partition's leader, on this node: another node
    /// serving the topic is answered `NotLeader`, so that the client asks for the metadata again
    /// and goes there.
    async fn call_here(&self, command: Command) -> Result<Outcome, ErrorReply> {
        self.backend.call(command, Duration::ZERO).await
    }

    async fn describe(&self, topic: Option<String>) -> Result<Vec<TopicDescription>, ErrorReply> {
        match self.call(Command::Describe { topic }).await? {
            Outcome::Description(description) => Ok(description.topics),
            other => Err(unexpected(&other)),
        }
    }
}

/// How many of the calls a request names run at once ([`in_turns`]).
const AT_ONCE: usize = 32;

/// Awaits `calls` (one per item a request names: topics, partitions) [`AT_ONCE`] at a time and
/// gives their outputs in order. A request of a few megabytes can name a million partitions;
/// creating every call before awaiting any would hold a million futures at once.
///
/// The calls are taken through a boxed iterator: held across an await, the iterator's own type
/// (a closure borrowing the request) is one the compiler cannot prove `Send` for every lifetime.
async fn in_turns<'a, F: std::future::Future>(
    calls: impl IntoIterator<Item = F, IntoIter: Send + 'a>,
) -> Vec<F::Output> {
    let mut calls: Box<dyn Iterator<Item = F> + Send + 'a> = Box::new(calls.into_iter());
    let mut outputs = Vec::new();
    loop {
        let turn: Vec<F> = calls.by_ref().take(AT_ONCE).collect();
        if turn.is_empty() {
            return outputs;
        }
        outputs.extend(futures::future::join_all(turn).await);
    }
}

/// A refusal of the broker as a Kafka error and its message.
fn refused(refusal: &ErrorReply) -> (ResponseError, String) {
    (kafka_error(refusal), refusal.to_string())
}

/// An outcome no command of the listener can have had: a bug, answered as the server's error.
#[cold]
fn unexpected(outcome: &Outcome) -> ErrorReply {
    ErrorReply::Storage(format!("unexpected outcome {}", outcome.name()))
}
