//! The commands a server answers about the cluster it is a node of ([`Scope::Cluster`]): what
//! a node knows of the cluster, adding and removing nodes, handing the leadership over, and
//! where clients find each topic; and the one it answers about its Kafka listener's groups
//! ([`Scope::Server`]).
//! They never reach the broker's state. Each is answered when done (adding a node waits for it
//! to catch up with the log), possibly after answers to later requests of its connection.

use std::sync::Arc;
use std::time::Duration;

use crate::reply::RequestPermit;
use broker_cluster::{Cluster, ClusterNode, NodeId, ServerState};
use broker_core::{
    BrokerDescription, BrokerMetadata, ClusterMember, ClusterStatus, Command, GroupStatus,
    NodeAddress, NodeRole, Outcome, Scope, TopicPlacement,
};
use broker_proto::ErrorReply;
use futures::future::join_all;

use crate::replicated::refusal;
use crate::reply::ReplyTo;
use crate::shared::Shared;

/// How long a membership change may take (a new node catching up included) before its request
/// is answered with an error: less than a client's default request timeout (30 s), so that the
/// client hears why.
const MEMBERSHIP_WAIT: Duration = Duration::from_secs(20);

/// A request whose command the server answers about its cluster.
#[derive(Debug)]
pub(crate) struct ClusterRequest {
    pub(crate) correlation_id: u64,
    /// A command of [`Scope::Cluster`] or [`Scope::Server`].
    pub(crate) command: Command,
    pub(crate) permit: RequestPermit,
}

/// Answers `request` on its connection once it is done (nothing, if the connection closes
/// first).
pub(crate) async fn answer(shared: Arc<Shared>, reply_to: ReplyTo, request: ClusterRequest) {
    let ClusterRequest {
        correlation_id,
        command,
        permit,
    } = request;
    let kind = command.kind();
    // A membership change can take its whole wait: a connection that closes (the server shuts
    // down) does not wait for it. Its client gets no answer, as for a request never read: the
    // change may or may not complete.
    let result = tokio::select! {
        result = execute(&shared, command) => result,
        () = reply_to.closing.cancelled() => return,
    };
    reply_to
        .answer_one(
            shared.metrics.as_deref(),
            kind,
            correlation_id,
            result,
            permit,
        )
        .await;
}

async fn execute(shared: &Shared, command: Command) -> Result<Outcome, ErrorReply> {
    let cluster = shared.cluster();
    match command {
        Command::ClusterStatus => Ok(Outcome::ClusterStatus(status(in_cluster(cluster)?))),
        Command::GroupsStatus => {
            in_cluster(cluster)?;
            Ok(Outcome::GroupsStatus(groups_status(shared)))
        }
        Command::KafkaGroups => kafka_groups(shared, cluster),
        Command::AddNode {
            node_id,
            peer_addr,
            client_addr,
        } => {
            let cluster = in_cluster(cluster)?;
            let node = ClusterNode::new(&peer_addr, &client_addr).map_err(|why| {
                ErrorReply::InvalidArgument(format!("node {node_id}'s address: {why}"))
            })?;
            let deadline = tokio::time::Instant::now() + MEMBERSHIP_WAIT;
            cluster
                .add_node(node_id, node, MEMBERSHIP_WAIT)
                .await
                .map_err(refusal)?;
            groups_follow(shared, node_id, true, deadline).await?;
            Ok(Outcome::Members(status(cluster).members))
        }
        Command::RemoveNode { node_id } => {
            let cluster = in_cluster(cluster)?;
            let deadline = tokio::time::Instant::now() + MEMBERSHIP_WAIT;
            // A node the first group has removed already (an earlier remove that timed out
            // while further groups still listed it) is waited for in those groups only.
            let left_the_first_group = cluster.is_leader()
                && !is_member(cluster, node_id)
                && further_groups(shared).any(|group| is_member(&group, node_id));
            if !left_the_first_group {
                cluster
                    .remove_node(node_id, MEMBERSHIP_WAIT)
                    .await
                    .map_err(refusal)?;
            }
            groups_follow(shared, node_id, false, deadline).await?;
            Ok(Outcome::Members(status(cluster).members))
        }
        Command::TransferLeadership { node_id } => {
            let cluster = in_cluster(cluster)?;
            cluster
                .transfer_leadership(node_id, MEMBERSHIP_WAIT)
                .await
                .map_err(refusal)?;
            Ok(Outcome::ClusterStatus(status(cluster)))
        }
        Command::Metadata { topic } => metadata(shared, cluster, topic.as_deref()).await,
        Command::MoveTopic { topic, group } => {
            let first = in_cluster(cluster)?;
            crate::moves::move_topic(shared, first, &topic, group).await?;
            metadata(shared, Some(first), Some(&topic)).await
        }
        // Admitted here only when its scope is the cluster's.
        broker => Err(ErrorReply::InvalidArgument(format!(
            "{} is not a command about the cluster",
            broker.kind().name()
        ))),
    }
}

/// Whether `group` (this node's copy of it) lists node `node_id` as a member.
fn is_member(group: &Cluster, node_id: NodeId) -> bool {
    group
        .status()
        .members
        .iter()
        .any(|(id, _, _)| *id == node_id)
}

/// The further groups (past the first) this node holds a copy of: those whose members it
/// knows.
fn further_groups(shared: &Shared) -> impl Iterator<Item = Arc<Cluster>> {
    shared
        .further_groups()
        .into_iter()
        .filter(|group| group.is_member())
}

/// Waits until every further group of the cluster has taken node `node_id` as a voter where it
/// is to hold a copy (`added`; see `data_groups::takes`), or no longer has it as a member, as
/// the first group has it now: each group's leader follows the first group's members by itself
/// (`data_groups::follow_membership`). Each group's members are asked of its leader, so that
/// the groups this node holds no copy of are waited for too. Answered [`ErrorReply::Pending`],
/// saying which groups lag, past `deadline`; they still follow, later.
async fn groups_follow(
    shared: &Shared,
    node_id: NodeId,
    added: bool,
    deadline: tokio::time::Instant,
) -> Result<(), ErrorReply> {
    let groups = shared.further_groups();
    loop {
        let lagging: Vec<String> = join_all(groups.iter().map(|group| async move {
            let lags = match group.members_at_leader().await {
                // Not known now (an election, say): waited for.
                None => true,
                Some(members) => match added {
                    true => crate::data_groups::takes(shared, group.group(), &members, node_id),
                    false => members.iter().any(|(id, _, _)| *id == node_id),
                },
            };
            lags.then(|| group.group().to_string())
        }))
        .await
        .into_iter()
        .flatten()
        .collect();
        if lagging.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let (done, pending, never) = match added {
                true => (
                    "is a voter of the first group",
                    "added it",
                    "; a node started with a smaller --cluster-data-groups than the others \
                     never will, and its log says so: restart it with the same value",
                ),
                false => ("left the first group", "removed it", ""),
            };
            let groups = match lagging.as_slice() {
                [one] => format!("data group {one} has"),
                many => format!("data groups {} have", many.join(", ")),
            };
            return Err(ErrorReply::Pending(format!(
                "node {node_id} {done}, but {groups} not {pending} yet (each group's leader \
                 follows the first group's members by itself, a new node catching up with \
                 the group's log first{never}): `broker cluster status` shows when they have, \
                 and the same command again waits for them"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cluster, or the refusal of a server that runs alone.
/// The groups of Kafka's clients, as this server's Kafka listener coordinates them: in a
/// cluster only the first group's leader coordinates them (another node names it).
fn kafka_groups(shared: &Shared, cluster: Option<&Cluster>) -> Result<Outcome, ErrorReply> {
    match cluster {
        Some(cluster) if !cluster.is_leader() => Err(ErrorReply::NotLeader {
            // (A leader that lost its lease names itself: it is not to be asked again.)
            leader: cluster
                .leader()
                .filter(|(node_id, _)| *node_id != cluster.node_id())
                .map(|(_, node)| node.client_addr),
        }),
        _ => Ok(Outcome::KafkaGroups(shared.kafka.groups.groups())),
    }
}

fn in_cluster(cluster: Option<&Cluster>) -> Result<&Cluster, ErrorReply> {
    cluster.ok_or_else(|| {
        ErrorReply::InvalidArgument(
            "this server runs alone, not as a node of a cluster (a cluster's nodes are \
             started with --node-id and --cluster-members)"
                .to_owned(),
        )
    })
}

/// What `cluster`'s node knows of it, as the protocol says it.
pub(crate) fn status(cluster: &Cluster) -> ClusterStatus {
    let status = cluster.status();
    let role = match status.role {
        ServerState::Leader => NodeRole::Leader,
        ServerState::Follower => NodeRole::Follower,
        ServerState::Candidate => NodeRole::Candidate,
        ServerState::Learner => NodeRole::Learner,
        ServerState::Shutdown => NodeRole::Stopped,
    };
    let members = status
        .members
        .iter()
        .map(|(id, node, voter)| ClusterMember {
            node_id: *id,
            peer_addr: node.raft_addr.clone(),
            client_addr: node.client_addr.clone(),
            voter: *voter,
            matched_index: match (*id == status.node_id, role) {
                (true, NodeRole::Leader) => status.last_log_index,
                _ => status.replication.get(id).copied().flatten(),
            },
            reachable: *id == status.node_id || !status.unreachable.contains(id),
        })
        .collect();
    ClusterStatus {
        node_id: status.node_id,
        role,
        term: status.term,
        leader: status.leader,
        last_log_index: status.last_log_index,
        applied_index: status.applied_index,
        members,
    }
}

/// What this node knows of each group it holds a copy of (the first group always), by
/// ascending id, with the topics its copy of each holds.
pub(crate) fn groups_status(shared: &Shared) -> Vec<GroupStatus> {
    (0..shared.shards.all().len())
        .filter_map(|shard| {
            let cluster = shared
                .group(shard)
                .filter(|group| shard == 0 || group.is_member())?;
            // Names only: a description of every topic would be built under the lock.
            let mut topics = shared.shards.get(shard).lock().topic_names();
            topics.sort_unstable();
            Some(GroupStatus {
                group: cluster.group(),
                status: status(&cluster),
                topics,
            })
        })
        .collect()
}

/// The nodes and the node that serves each topic (in a cluster, the leader serves every topic;
/// asked of another node, the request is refused with the leader's address). The topics are
/// read after the leader confirmed it still leads, so that the answer is not stale.
async fn metadata(
    shared: &Shared,
    cluster: Option<&Cluster>,
    topic: Option<&str>,
) -> Result<Outcome, ErrorReply> {
    if let (Some(cluster), true) = (cluster, crate::data_groups::spread(shared)) {
        return metadata_of_groups(shared, cluster, topic).await;
    }
    let (nodes, leader) = match cluster {
        Some(cluster) => {
            cluster.read_barrier().await.map_err(refusal)?;
            (node_addresses(cluster), Some(cluster.node_id()))
        }
        None => (Vec::new(), None),
    };
    let description = shared
        .shards
        .describe_topics(topic)
        .map_err(ErrorReply::from)?;
    let topics = placements(description, leader).collect();
    Ok(Outcome::Metadata(BrokerMetadata { nodes, topics }))
}

/// Where clients reach each member of `cluster`.
fn node_addresses(cluster: &Cluster) -> Vec<NodeAddress> {
    cluster
        .status()
        .members
        .into_iter()
        .map(|(node_id, node, _)| NodeAddress {
            node_id,
            client_addr: node.client_addr,
        })
        .collect()
}

/// The topics of `description`, each served by `leader`.
fn placements(
    description: BrokerDescription,
    leader: Option<NodeId>,
) -> impl Iterator<Item = TopicPlacement> {
    description
        .topics
        .into_iter()
        .map(move |topic| TopicPlacement {
            partition_count: i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX),
            topic: topic.name,
            leader,
        })
}

/// [`metadata`] of a cluster of several groups, answered by any node: each topic with its
/// group's leader, each group's part read as `data_groups::describe_group` reads it.
async fn metadata_of_groups(
    shared: &Shared,
    first: &Cluster,
    topic: Option<&str>,
) -> Result<Outcome, ErrorReply> {
    let nodes = node_addresses(first);
    // Where the topic lives, as of now.
    first.read_barrier_anywhere().await.map_err(refusal)?;
    let only = topic.map(|topic| first.cluster_state().borrow().group_of(topic));
    let shards: Vec<usize> = (0..shared.shards.all().len())
        .filter(|shard| {
            let group_id = broker_cluster::GroupId::try_from(shard + 1).unwrap_or(u32::MAX);
            only.is_none_or(|only| only == group_id)
        })
        .collect();
    // Each group's leader, asked of its members (at once, for every group) when this node
    // holds no copy of it, so that the answer names one whenever one leads.
    let leaders = join_all(shards.iter().map(|shard| async move {
        let group = shared.group(*shard)?;
        group.find_leader().await.map(|(id, _)| id)
    }))
    .await;
    let mut topics = Vec::new();
    for (shard, leader) in shards.into_iter().zip(leaders) {
        let description = crate::data_groups::describe_group(shared, shard, topic).await?;
        topics.extend(placements(description, leader));
    }
    topics.sort_by(|a, b| a.topic.cmp(&b.topic));
    // A topic moving is held by two groups for a moment, alike: listed once.
    topics.dedup_by(|a, b| a.topic == b.topic);
    Ok(Outcome::Metadata(BrokerMetadata { nodes, topics }))
}

/// Whether `command` is one the server answers itself: about its cluster, or about its Kafka
/// listener's groups.
pub(crate) fn is_about_the_cluster(command: &Command) -> bool {
    command.kind().scope() != Scope::Broker
}
