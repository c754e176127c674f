//! What the protocol says about a cluster of servers: its nodes, their roles and progress, and
//! which node serves each topic. The broker's state neither holds nor changes any of it: a
//! server answers the commands that ask for it about itself ([`crate::Scope::Cluster`]).

use serde::{Deserialize, Serialize};

/// A node's role in its cluster. Its JSON form is the role's name in lowercase (`"leader"`),
/// as `broker cluster status` prints it; the wire gives its index, as for every enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeRole {
    /// It takes every change and answers every broker call.
    Leader,
    /// It replicates the leader's log and votes in elections.
    Follower,
    /// It is asking the others to elect it.
    Candidate,
    /// It replicates the leader's log without voting: a node being added, until it has
    /// caught up.
    Learner,
    /// Its consensus engine stopped (the node is shutting down, or it failed).
    Stopped,
}

/// One member of a cluster as the node that describes it knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMember {
    /// The member's id.
    pub node_id: u64,
    /// The address the other members reach it on.
    pub peer_addr: String,
    /// The address clients reach it on.
    pub client_addr: String,
    /// Whether it votes (a learner does not).
    pub voter: bool,
    /// Described by the leader: the index of the last log entry the member is known to hold
    /// (the leader's own last entry for the leader); `None` when described by another node or
    /// not known yet.
    pub matched_index: Option<u64>,
    /// Whether the describing node's last exchange with the member succeeded (always `true`
    /// for itself).
    pub reachable: bool,
}

/// What one node of a cluster knows of it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// The id of the node that answered.
    pub node_id: u64,
    /// Its role: `Leader` only while it leads and has heard from a majority within its lease
    /// (a leader cut off, or handing its leadership over, is a `Follower` here).
    pub role: NodeRole,
    /// Its current term (each election starts a new one).
    pub term: u64,
    /// The leader it knows of; `None` while it knows none, and from a leader cut off or
    /// handing its leadership over.
    pub leader: Option<u64>,
    /// The index of the last entry in its log.
    pub last_log_index: Option<u64>,
    /// The index of the last entry it has applied.
    pub applied_index: Option<u64>,
    /// Every member of the cluster, by ascending id.
    pub members: Vec<ClusterMember>,
}

/// One Raft group of a cluster that spreads its topics over several groups, as one node
/// knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// The group's id: 1 for the first group (which every cluster has, and which keeps where
    /// each topic lives), 2 and up for the others.
    pub group: u32,
    /// The node's view of the group, as [`ClusterStatus`] gives the first group's: its role
    /// in the group, the group's term, leader, log and members.
    pub status: ClusterStatus,
    /// The topics the group holds, by name, as the node's copy of it has them.
    pub topics: Vec<String>,
}

/// Where clients find the broker's topics: the nodes of the cluster and the node that serves
/// each topic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerMetadata {
    /// Every node clients may connect to, by ascending id; empty from a server that runs
    /// alone.
    pub nodes: Vec<NodeAddress>,
    /// The topics asked for, by name.
    pub topics: Vec<TopicPlacement>,
}

/// A node's id and the address clients reach it on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddress {
    /// The node's id.
    pub node_id: u64,
    /// The address clients reach it on (`HOST:PORT`).
    pub client_addr: String,
}

/// Which node serves a topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPlacement {
    /// The topic.
    pub topic: String,
    /// Its partitions.
    pub partition_count: i32,
    /// The node that serves every call about it now; `None` from a server that runs alone
    /// (it serves every topic itself).
    pub leader: Option<u64>,
}
