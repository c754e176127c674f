//! Where clients find things: Metadata (the brokers, topics and partition leaders) and
//! FindCoordinator (the node that coordinates a group).

use std::collections::BTreeMap;

use broker_core::{Command, KeyHash, Outcome, TopicDescription};
use broker_proto::ErrorReply;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, MetadataRequest, MetadataResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::configs;
use crate::errors::{code, kafka_error};
use crate::Backend;

use super::{kafka_topic, message, topic_name, Endpoint, Handler};

/// The `key_type` of FindCoordinator that asks for a group's coordinator (1 asks for a
/// transaction's).
const GROUP_KEY: i8 = 0;

/// The `endpoint_type` of DescribeCluster that asks for the brokers (2 asks for KRaft
/// controllers, which the broker has none of).
const BROKERS: i8 = 1;

/// Which nodes clients are sent to, as Metadata and FindCoordinator answer.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placement {
    /// Every node with its listener's address.
    brokers: Vec<(BrokerId, Endpoint)>,
    /// The node that coordinates every group and serves every partition but those of
    /// `topic_leaders`, if one is known.
    leader: Option<BrokerId>,
    /// The nodes that hold a copy of every partition.
    replicas: Vec<BrokerId>,
    /// The topics served by a node of their own (see [`crate::ClusterView::topic_leaders`]), each
    /// with that node, if one is known.
    topic_leaders: BTreeMap<String, Option<BrokerId>>,
    /// The nodes that hold a copy of the topics not held by every node of `replicas` (see
    /// [`crate::ClusterView::topic_replicas`]).
    topic_replicas: BTreeMap<String, Vec<BrokerId>>,
}

impl Placement {
    /// The node serving the partitions of `topic`, if one is known.
    fn leader_of(&self, topic: &str) -> Option<BrokerId> {
        self.topic_leaders
            .get(topic)
            .copied()
            .unwrap_or(self.leader)
    }

    /// The nodes that hold a copy of the partitions of `topic`.
    fn replicas_of(&self, topic: &str) -> &[BrokerId] {
        self.topic_replicas
            .get(topic)
            .map_or(&self.replicas, |replicas| replicas)
    }
}

impl<B: Backend> Handler<'_, B> {
    fn node_id(&self) -> BrokerId {
        BrokerId(self.settings.node_id)
    }

    /// Where clients are sent: this listener alone for a server that runs alone (at the
    /// address the connection came in on, or the advertised one), every node of a cluster with
    /// the leader serving every partition and group.
    fn placement(&self) -> Placement {
        match self.backend.cluster() {
            None => Placement {
                brokers: vec![(self.node_id(), self.endpoint.clone())],
                leader: Some(self.node_id()),
                replicas: vec![self.node_id()],
                topic_leaders: BTreeMap::new(),
                topic_replicas: BTreeMap::new(),
            },
            Some(view) => {
                // A leader whose address this node has not learned yet (it started a moment
                // ago) is no leader to clients, who would not know where to go: they ask again.
                let known = |leader: Option<i32>| {
                    leader
                        .filter(|leader| view.brokers.iter().any(|(id, _, _)| id == leader))
                        .map(BrokerId)
                };
                Placement {
                    leader: known(view.leader),
                    topic_leaders: view
                        .topic_leaders
                        .iter()
                        .map(|(topic, leader)| (topic.clone(), known(*leader)))
                        .collect(),
                    brokers: view
                        .brokers
                        .into_iter()
                        .map(|(id, host, port)| {
                            let port = i32::from(port);
                            (BrokerId(id), Endpoint { host, port })
                        })
                        .collect(),
                    replicas: view.replicas.into_iter().map(BrokerId).collect(),
                    topic_replicas: view
                        .topic_replicas
                        .into_iter()
                        .map(|(topic, nodes)| (topic, nodes.into_iter().map(BrokerId).collect()))
                        .collect(),
                }
            }
        }
    }

    /// The cluster as admin clients see it: every node with its Kafka listener, the leader as
    /// the controller (it makes every change), and the cluster id.
    pub(super) fn describe_cluster(
        &self,
        request: &DescribeClusterRequest,
    ) -> DescribeClusterResponse {
        let response = DescribeClusterResponse::default()
            .with_endpoint_type(request.endpoint_type)
            .with_cluster_id(StrBytes::from_string(self.settings.cluster_id.clone()));
        if request.endpoint_type != BROKERS {
            return response
                .with_error_code(ResponseError::UnsupportedEndpointType.code())
                .with_error_message(message(format!(
                    "this broker serves brokers (endpoint type {BROKERS}), not endpoint type {}",
                    request.endpoint_type
                )));
        }
        let placement = self.placement();
        response
            .with_controller_id(placement.leader.unwrap_or(BrokerId(-1)))
            .with_brokers(
                placement
                    .brokers
                    .into_iter()
                    .map(|(id, endpoint)| {
                        DescribeClusterBroker::default()
                            .with_broker_id(id)
                            .with_host(StrBytes::from_string(endpoint.host))
                            .with_port(endpoint.port)
                    })
                    .collect(),
            )
    }

    /// Creates those of `names` the broker does not have, with `partitions` partitions and
    /// Kafka's retention; the error each topic that could not be created is answered with
    /// (`INVALID_TOPIC_EXCEPTION` for a name the broker refuses, `POLICY_VIOLATION` past the
    /// broker's limits, `LEADER_NOT_AVAILABLE` while no node can create it, so that the client
    /// asks again).
    async fn create_missing(
        &self,
        names: &[String],
        partitions: i32,
    ) -> BTreeMap<String, ResponseError> {
        let mut refused = BTreeMap::new();
        let existing: Vec<String> = match self.backend.topics().await {
            Ok(topics) => topics.into_iter().map(|topic| topic.name).collect(),
            Err(_) => return refused,
        };
        for name in names.iter().filter(|name| !existing.contains(name)) {
            if !self.settings.names.allows(name) {
                refused.insert(name.clone(), ResponseError::InvalidTopicException);
                continue;
            }
            let settings = configs::topic_settings(&[]).unwrap_or_default();
            let command = Command::Create {
                topic: name.clone(),
                partition_count: partitions,
                key_hash: KeyHash::Murmur2,
                settings,
            };
            let error = match self.call(command).await {
                Ok(Outcome::Created(_)) => continue,
                // The broker's limits (topics, partitions): a refusal the client reports.
                Err(ErrorReply::InvalidArgument(text)) => {
                    tracing::warn!(topic = %name, cause = %text, "cannot create a topic a Kafka client asked for");
                    ResponseError::PolicyViolation
                }
                Ok(_) | Err(_) => ResponseError::LeaderNotAvailable,
            };
            refused.insert(name.clone(), error);
        }
        refused
    }

    pub(super) async fn metadata(
        &self,
        request: MetadataRequest,
        version: i16,
    ) -> MetadataResponse {
        // Version 4 on says whether the client wants topics created; earlier ones always did.
        let may_create = version < 4 || request.allow_auto_topic_creation;
        // Each name once, as Kafka's brokers answer: a request repeating a name must not make
        // an answer as many times larger.
        let wanted: Option<Vec<String>> = request.topics.map(|topics| {
            let mut seen = std::collections::HashSet::new();
            topics
                .iter()
                .filter_map(|topic| topic.name.as_ref().map(topic_name))
                .filter(|name| seen.insert(name.clone()))
                .collect()
        });
        let placement = self.placement();
        let mut response = MetadataResponse::default()
            .with_brokers(
                placement
                    .brokers
                    .iter()
                    .map(|(id, endpoint)| {
                        MetadataResponseBroker::default()
                            .with_node_id(*id)
                            .with_host(StrBytes::from_string(endpoint.host.clone()))
                            .with_port(endpoint.port)
                    })
                    .collect(),
            )
            .with_cluster_id(Some(StrBytes::from_string(
                self.settings.cluster_id.clone(),
            )))
            .with_controller_id(placement.leader.unwrap_or(BrokerId(-1)));
        let mut creating = BTreeMap::new();
        if let (Some(partitions), Some(names), true) =
            (self.settings.auto_create_partitions, &wanted, may_create)
        {
            creating = self.create_missing(names, partitions).await;
        }
        let described = match self.backend.topics().await {
            Ok(topics) => topics,
            Err(refusal) => {
                let error = kafka_error(&refusal);
                response.topics = wanted
                    .unwrap_or_default()
                    .iter()
                    .map(|name| {
                        MetadataResponseTopic::default()
                            .with_name(Some(kafka_topic(name)))
                            .with_error_code(error.code())
                    })
                    .collect();
                return response;
            }
        };
        // A topic named under wider rules than this server takes (it ran with Kafka's names
        // before) is refused by every call: it is not listed, and invalid when asked for, so
        // that a client fails at once rather than retrying its produce until it times out.
        let described: BTreeMap<&str, &TopicDescription> = described
            .iter()
            .filter(|topic| self.settings.names.allows(&topic.name))
            .map(|topic| (topic.name.as_str(), topic))
            .collect();
        let names: Vec<String> = match wanted {
            // Version 0 asks for every topic with an empty list, later versions with none (an
            // empty list there asks for no topic).
            Some(names) if !(names.is_empty() && version == 0) => names,
            _ => described.keys().map(|name| (*name).to_owned()).collect(),
        };
        response.topics = names
            .iter()
            .map(|name| match described.get(name.as_str()) {
                Some(topic) => {
                    let leader = placement.leader_of(name);
                    let replicas = placement.replicas_of(name);
                    MetadataResponseTopic::default()
                        .with_name(Some(kafka_topic(name)))
                        .with_partitions(
                            (0..topic.partitions.len() as i32)
                                .map(|partition| {
                                    MetadataResponsePartition::default()
                                        .with_partition_index(partition)
                                        .with_error_code(code(
                                            leader
                                                .is_none()
                                                .then_some(ResponseError::LeaderNotAvailable),
                                        ))
                                        .with_leader_id(leader.unwrap_or(BrokerId(-1)))
                                        .with_leader_epoch(0)
                                        .with_replica_nodes(replicas.to_vec())
                                        .with_isr_nodes(replicas.to_vec())
                                })
                                .collect(),
                        )
                }
                None => MetadataResponseTopic::default()
                    .with_name(Some(kafka_topic(name)))
                    .with_error_code(
                        creating
                            .get(name.as_str())
                            .copied()
                            .unwrap_or(if self.settings.names.allows(name) {
                                ResponseError::UnknownTopicOrPartition
                            } else {
                                ResponseError::InvalidTopicException
                            })
                            .code(),
                    ),
            })
            .collect();
        response
    }

    pub(super) fn find_coordinator(
        &self,
        request: &FindCoordinatorRequest,
    ) -> FindCoordinatorResponse {
        let response = FindCoordinatorResponse::default();
        if request.key_type != GROUP_KEY {
            // Not `COORDINATOR_NOT_AVAILABLE`, which the clients retry until their timeout: a
            // transactional producer gives up at once on this one.
            return response
                .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
                .with_node_id(BrokerId(-1))
                .with_port(-1)
                .with_error_message(message(
                    "transactions are not supported by this broker".to_owned(),
                ));
        }
        let placement = self.placement();
        let coordinator = placement
            .leader
            .and_then(|leader| placement.brokers.into_iter().find(|(id, _)| *id == leader));
        match coordinator {
            Some((id, endpoint)) => response
                .with_node_id(id)
                .with_host(StrBytes::from_string(endpoint.host))
                .with_port(endpoint.port),
            // An election under way, or the leader's Kafka address not heard yet: the client
            // asks again.
            None => response
                .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                .with_node_id(BrokerId(-1))
                .with_port(-1),
        }
    }
}
