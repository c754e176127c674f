//! Where clients find things: Metadata (the brokers, topics and partition leaders) and
//! FindCoordinator (the node that coordinates a group).

use std::collections::BTreeMap;

use broker_core::TopicDescription;
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
    /// The node that serves every partition and coordinates every group, if one is known.
    leader: Option<BrokerId>,
    /// The nodes that hold a copy of every partition.
    replicas: Vec<BrokerId>,
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
            },
            Some(view) => Placement {
                // A leader whose address this node has not learned yet (it started a moment
                // ago) is no leader to clients, who would not know where to go: they ask again.
                leader: view
                    .leader
                    .filter(|leader| view.brokers.iter().any(|(id, _, _)| id == leader))
                    .map(BrokerId),
                brokers: view
                    .brokers
                    .into_iter()
                    .map(|(id, host, port)| {
                        let port = i32::from(port);
                        (BrokerId(id), Endpoint { host, port })
                    })
                    .collect(),
                replicas: view.replicas.into_iter().map(BrokerId).collect(),
            },
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

    pub(super) async fn metadata(
        &self,
        request: MetadataRequest,
        version: i16,
    ) -> MetadataResponse {
        let wanted: Option<Vec<String>> = request.topics.map(|topics| {
            topics
                .iter()
                .filter_map(|topic| topic.name.as_ref().map(topic_name))
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
        let described: BTreeMap<&str, &TopicDescription> = described
            .iter()
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
                Some(topic) => MetadataResponseTopic::default()
                    .with_name(Some(kafka_topic(name)))
                    .with_partitions(
                        (0..topic.partitions.len() as i32)
                            .map(|partition| {
                                MetadataResponsePartition::default()
                                    .with_partition_index(partition)
                                    .with_error_code(code(
                                        placement
                                            .leader
                                            .is_none()
                                            .then_some(ResponseError::LeaderNotAvailable),
                                    ))
                                    .with_leader_id(placement.leader.unwrap_or(BrokerId(-1)))
                                    .with_leader_epoch(0)
                                    .with_replica_nodes(placement.replicas.clone())
                                    .with_isr_nodes(placement.replicas.clone())
                            })
                            .collect(),
                    ),
                None => MetadataResponseTopic::default()
                    .with_name(Some(kafka_topic(name)))
                    .with_error_code(ResponseError::UnknownTopicOrPartition.code()),
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
