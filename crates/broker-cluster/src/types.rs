//! What the Raft log carries and what applying it gives back, the nodes of a cluster, and the
//! openraft type configuration that ties them together.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use broker_core::image::{v4, RecordImage, TopicImage};
use broker_core::{BrokerError, Command, NameRules, Outcome, Revision};
use serde::{Deserialize, Serialize};

use crate::snapshot_stream::SnapshotStream;

/// The id of a node in the cluster: unique, chosen by the operator, never reused for another
/// node.
pub type NodeId = u64;

/// The id of a Raft group a node hosts: each group has its own log, vote, snapshots and state
/// machine, and its own members among the cluster's nodes.
pub type GroupId = u32;

/// The group every node of a cluster hosts from its first start, whose files are in the
/// node's `raft/` directory: the one group of the releases before groups, whose peer requests
/// travel untagged.
pub const FIRST_GROUP: GroupId = 1;

/// One change to the replicated broker: what one entry of the Raft log carries. Every node
/// applies the same entries in the same order with the same times, so every node's state is the
/// same after each entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Proposal {
    /// Commands applied in order at `now_ms`, the leader's wall clock when it proposed them (in
    /// milliseconds since the Unix epoch): the requests one connection sent together.
    Commands {
        /// The time of every command of the entry.
        now_ms: i64,
        /// The commands, in request order.
        commands: Vec<Command>,
    },
    /// Time passes: records past their topic's age leave, deliveries past their group's
    /// acknowledgement timeout are released. Proposed by the leader, so that every node lets
    /// the same time pass at the same point of the log.
    Tick {
        /// The leader's wall clock, in milliseconds since the Unix epoch.
        now_ms: i64,
    },
    /// A change to the cluster's own state ([`ClusterState`]), kept by the first group's
    /// state machine beside the broker. Added with groups: a node of an earlier release stops
    /// at such an entry, so it is proposed only once every node runs this release.
    Cluster(ClusterChange),
    /// [`Proposal::Commands`] whose names of topics, groups and members are checked by
    /// `names`: a node proposes its commands so when it takes other names than the broker's
    /// own ([`NameRules::Broker`], under which every [`Proposal::Commands`] applies). The rules
    /// travel with the entry, so every node applies it alike whatever rules it was started
    /// with, and an entry of the log applies as it did when it was first applied. Added with
    /// name rules: a node of an earlier release stops at such an entry, so nodes take other
    /// names only once every node runs this release.
    NamedCommands {
        /// The time of every command of the entry.
        now_ms: i64,
        /// The rules names are checked by.
        names: NameRules,
        /// The commands, in request order.
        commands: Vec<Command>,
    },
    /// The group's memory budget becomes `bytes` (payload, key and header bytes retained in
    /// the group's broker; `None` for none): proposed by the group's leader when its share of
    /// `--max-memory` differs from the budget in force, so that every replica refuses the same
    /// publishes as full, whatever budget its last snapshot held. Added with budget changes: a
    /// node of an earlier release stops at such an entry, so it is proposed only once every
    /// member of the group says that it applies it.
    Budget {
        /// The budget in bytes, if any.
        bytes: Option<u64>,
    },
    /// `proposal` (commands or a tick) applied under `revision` of the core's rules: every
    /// other entry applies under [`Revision::Original`], as every release before revisions
    /// applied it. The revision travels with the entry, so every node applies it alike
    /// whatever its own release, and an entry of the log applies as it did when it was first
    /// applied. Added with revisions: a node of an earlier release stops at such an entry, so
    /// a leader proposes it only once every member of its group says that it applies the
    /// revision (see [`Proposal::revised`]).
    Revised {
        /// The rules the entry applies under.
        revision: Revision,
        /// What applies: a [`Proposal::Commands`], [`Proposal::NamedCommands`] or
        /// [`Proposal::Tick`] (decoding refuses anything else, so that a peer cannot nest
        /// entries deeper than the stack goes).
        #[serde(deserialize_with = "revisable")]
        proposal: Box<Proposal>,
    },
}

thread_local! {
    /// Whether this thread is decoding the proposal of a [`Proposal::Revised`].
    static DECODING_REVISED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The proposal of a [`Proposal::Revised`], decoded: one that a revision applies to (commands
/// or a tick), refused before it is decoded further when it is revised again, so that the
/// depth of what a peer sends is bounded.
fn revisable<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Box<Proposal>, D::Error> {
    use serde::de::Error;
    if DECODING_REVISED.get() {
        return Err(D::Error::custom("a revised entry inside a revised entry"));
    }
    DECODING_REVISED.set(true);
    let decoded = Box::<Proposal>::deserialize(deserializer);
    DECODING_REVISED.set(false);
    match *decoded? {
        revisable @ (Proposal::Commands { .. }
        | Proposal::NamedCommands { .. }
        | Proposal::Tick { .. }) => Ok(Box::new(revisable)),
        _ => Err(D::Error::custom(
            "a revised entry holds commands or a tick, nothing else",
        )),
    }
}

impl Proposal {
    /// `self` applied under `revision`: a [`Proposal::Revised`] for commands and ticks under a
    /// later revision than [`Revision::Original`]; anything else as it is (the other entries
    /// do not depend on the core's rules, and original commands are proposed as every release
    /// proposed them).
    pub fn revised(self, revision: Revision) -> Proposal {
        match self {
            Proposal::Commands { .. } | Proposal::NamedCommands { .. } | Proposal::Tick { .. }
                if revision != Revision::Original =>
            {
                Proposal::Revised {
                    revision,
                    proposal: Box::new(self),
                }
            }
            Proposal::Revised { proposal, .. } => proposal.revised(revision),
            other => other,
        }
    }

    /// The proposal with the time of its commands and of its tick set to `now_ms`: a leader
    /// proposing what another node forwarded gives it its own clock, as for its own
    /// proposals, so that a node whose clock runs ahead never moves the group's time on.
    pub fn at(self, now_ms: i64) -> Proposal {
        match self {
            Proposal::Commands { commands, .. } => Proposal::Commands { now_ms, commands },
            Proposal::NamedCommands {
                names, commands, ..
            } => Proposal::NamedCommands {
                now_ms,
                names,
                commands,
            },
            Proposal::Tick { .. } => Proposal::Tick { now_ms },
            Proposal::Revised { revision, proposal } => Proposal::Revised {
                revision,
                proposal: Box::new(proposal.at(now_ms)),
            },
            timeless @ (Proposal::Cluster(_) | Proposal::Budget { .. }) => timeless,
        }
    }

    /// `commands` applied at `now_ms` with names checked by `names`: a
    /// [`Proposal::Commands`] under the broker's own rules (as every release proposed them),
    /// a [`Proposal::NamedCommands`] under others.
    pub fn commands(now_ms: i64, names: NameRules, commands: Vec<Command>) -> Proposal {
        match names {
            NameRules::Broker => Proposal::Commands { now_ms, commands },
            names => Proposal::NamedCommands {
                now_ms,
                names,
                commands,
            },
        }
    }

    /// The change it makes to the broker, or else to the cluster's state.
    pub fn into_change(self) -> Result<BrokerChange, ClusterChange> {
        self.into_change_under(Revision::Original)
    }

    /// [`Proposal::into_change`] of an entry applied under `revision` unless it says another.
    fn into_change_under(self, revision: Revision) -> Result<BrokerChange, ClusterChange> {
        match self {
            Proposal::Commands { now_ms, commands } => Ok(BrokerChange::Commands {
                now_ms,
                names: NameRules::Broker,
                revision,
                commands,
            }),
            Proposal::NamedCommands {
                now_ms,
                names,
                commands,
            } => Ok(BrokerChange::Commands {
                now_ms,
                names,
                revision,
                commands,
            }),
            Proposal::Tick { now_ms } => Ok(BrokerChange::Tick { now_ms, revision }),
            Proposal::Budget { bytes } => Ok(BrokerChange::Budget { bytes }),
            Proposal::Revised { revision, proposal } => proposal.into_change_under(revision),
            Proposal::Cluster(change) => Err(change),
        }
    }
}

impl BrokerChange {
    /// The revision of the core's rules it applies under, if it applies any.
    pub fn revision(&self) -> Option<Revision> {
        match self {
            BrokerChange::Commands { revision, .. } | BrokerChange::Tick { revision, .. } => {
                Some(*revision)
            }
            BrokerChange::Budget { .. } => None,
        }
    }
}

/// What a [`Proposal`] changes in the broker, as a replica applies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerChange {
    /// See [`Proposal::Commands`] and [`Proposal::NamedCommands`].
    Commands {
        /// The time of every command of the entry.
        now_ms: i64,
        /// The rules names are checked by while the commands apply.
        names: NameRules,
        /// The core's rules the commands apply under (see [`Proposal::Revised`]).
        revision: Revision,
        /// The commands, in request order.
        commands: Vec<Command>,
    },
    /// See [`Proposal::Tick`].
    Tick {
        /// The leader's wall clock, in milliseconds since the Unix epoch.
        now_ms: i64,
        /// The core's rules time passes under (see [`Proposal::Revised`]).
        revision: Revision,
    },
    /// See [`Proposal::Budget`].
    Budget {
        /// The budget in bytes, if any.
        bytes: Option<u64>,
    },
}

/// What a group holds besides its broker. The first group's holds the cluster's further data
/// groups and which group holds each topic; every group's holds the topics leaving it. Every
/// node that applied the same entries holds the same.
///
/// Encoded (in snapshots) as `groups` then `placement`, and `departures` and `arrivals` after
/// them only where a snapshot's format says so: written so only while a group has either, so
/// that every other snapshot reads in the releases before moves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// The data groups besides the first, each with the voters it was created with (later
    /// changes to its membership are in its own log).
    pub groups: BTreeMap<GroupId, BTreeSet<NodeId>>,
    /// Where each topic placed since groups exist lives. A topic not here is the first
    /// group's: every topic of a cluster from before groups, and a name not placed yet.
    pub placement: BTreeMap<String, GroupId>,
    /// The topics leaving this group, or gone from it to another (see
    /// [`ClusterChange::Depart`]): every call about them is refused with
    /// [`BrokerError::Moving`], so that the client asks again where the topic is.
    #[serde(skip)]
    pub departures: BTreeMap<String, Departure>,
    /// The records of the topics arriving in this group, as the group they leave sends them
    /// ([`ClusterChange::Stage`]), until they arrive ([`ClusterChange::Arrive`]).
    #[serde(skip)]
    pub arrivals: BTreeMap<String, Staging>,
}

/// The records of a topic arriving in a group, staged until it arrives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    /// Which sending they belong to: a number that grows with the term of the leader of the
    /// group the topic leaves (and, within a term, with each sending of that leader), so that
    /// a later sending starts the staging over, and an earlier one's pieces are ignored.
    pub attempt: u64,
    /// The number of the next piece expected (pieces are numbered from 0, in order).
    pub next_piece: u64,
    /// The records staged for each partition, in order.
    pub partitions: Vec<Vec<RecordImage>>,
}

/// How [`ClusterState::stage`] took a piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staged {
    /// Staged, or staged already (a piece sent again): the next piece expected.
    Next(u64),
    /// Not staged: it belongs to an earlier sending than the one staged, or a piece before it
    /// is missing. The sender starts over (or stops, if a later sending is under way).
    Refused,
}

/// The most partitions a piece may name: as many as a topic may have.
const MOST_STAGED_PARTITIONS: u32 = 65_536;

/// A topic leaving a group for another, as the group it leaves keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Departure {
    /// The group it goes to.
    pub to: GroupId,
    /// Whether it has gone: the group no longer holds it. Until then the group holds it
    /// unchanged (frozen), every call about it refused.
    pub gone: bool,
}

impl ClusterState {
    /// Whether it holds no group and no placement: a cluster that never had groups (whose
    /// snapshots are written as before groups, so that nodes of earlier releases read them).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.placement.is_empty()
    }

    /// Stages a piece of the records of `topic`, arriving: see [`ClusterChange::Stage`].
    pub fn stage(
        &mut self,
        topic: &str,
        attempt: u64,
        piece: u64,
        partition: u32,
        records: Vec<RecordImage>,
    ) -> Staged {
        if partition >= MOST_STAGED_PARTITIONS {
            return Staged::Refused;
        }
        let staging = match self.arrivals.get_mut(topic) {
            Some(staging) if staging.attempt > attempt => return Staged::Refused,
            Some(staging) if staging.attempt == attempt => staging,
            // A first piece starts a sending over; any other is of one not staged.
            _ if piece == 0 => self
                .arrivals
                .entry(topic.to_owned())
                .and_modify(|staging| *staging = Staging::default())
                .or_default(),
            _ => return Staged::Refused,
        };
        if piece < staging.next_piece && staging.attempt == attempt {
            return Staged::Next(staging.next_piece);
        }
        if piece != staging.next_piece {
            return Staged::Refused;
        }
        staging.attempt = attempt;
        let partition = partition as usize;
        if staging.partitions.len() <= partition {
            staging.partitions.resize_with(partition + 1, Vec::new);
        }
        staging.partitions[partition].extend(records);
        staging.next_piece += 1;
        Staged::Next(staging.next_piece)
    }

    /// The group that holds `topic` (or would, were it created now).
    pub fn group_of(&self, topic: &str) -> GroupId {
        self.placement.get(topic).copied().unwrap_or(FIRST_GROUP)
    }

    /// Applies `change`, but for the changes to the group's broker ([`ClusterChange::Arrive`]
    /// and [`ClusterChange::Departed`]), which the state machine applies; `holds` says whether
    /// the group's broker holds a topic (at the same point of the log, so every node answers
    /// alike). Answers the group the change is about: for [`ClusterChange::Place`] and
    /// [`ClusterChange::Move`], where the topic lives after it; for
    /// [`ClusterChange::Depart`], where it goes (0 when the group does not hold it).
    pub fn apply(&mut self, change: ClusterChange, holds: impl Fn(&str) -> bool) -> GroupId {
        match change {
            ClusterChange::Depart { topic, to } => match self.departures.get(&topic) {
                Some(departure) if !departure.gone => departure.to,
                Some(_) => 0,
                None if holds(&topic) => {
                    self.departures.insert(topic, Departure { to, gone: false });
                    to
                }
                None => 0,
            },
            ClusterChange::Stay { topic } => {
                if self.departures.get(&topic).is_some_and(|left| !left.gone) {
                    self.departures.remove(&topic);
                }
                0
            }
            ClusterChange::Move { topic, from, to } => {
                let known = to == FIRST_GROUP || self.groups.contains_key(&to);
                if self.group_of(&topic) == from && known {
                    self.placement.insert(topic.clone(), to);
                }
                self.group_of(&topic)
            }
            ClusterChange::Arrive { .. }
            | ClusterChange::ArriveImage4 { .. }
            | ClusterChange::Departed { .. }
            | ClusterChange::Stage { .. } => 0,
            ClusterChange::AddGroup { group, voters } => {
                if group != FIRST_GROUP {
                    self.groups.entry(group).or_insert(voters);
                }
                group
            }
            ClusterChange::Place { topic, group } => {
                if let Some(placed) = self.placement.get(&topic) {
                    return *placed;
                }
                // A topic of the first group from before it was placed stays there; so does
                // one placed in a group that does not exist.
                if holds(&topic) || (group != FIRST_GROUP && !self.groups.contains_key(&group)) {
                    return FIRST_GROUP;
                }
                self.placement.insert(topic, group);
                group
            }
            ClusterChange::Unplace { topic } => {
                self.placement.remove(&topic).unwrap_or(FIRST_GROUP)
            }
        }
    }
}

/// A change to the [`ClusterState`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterChange {
    /// Data group `group` exists from now on, started with `voters` (nothing changes if it
    /// exists already, or is the first group).
    AddGroup {
        /// The new group's id.
        group: GroupId,
        /// Its voters when new.
        voters: BTreeSet<NodeId>,
    },
    /// `topic` lives in `group` from now on, unless it lives somewhere already (it stays
    /// there: the answer says where), or `group` does not exist (it stays with the first
    /// group). Decided before the topic is created, so that no two groups create one name.
    Place {
        /// The topic.
        topic: String,
        /// The group it is meant for.
        group: GroupId,
    },
    /// `topic`, deleted from its group, is placed nowhere any more (a new topic of that name
    /// is placed afresh).
    Unplace {
        /// The topic.
        topic: String,
    },
    /// In the group holding `topic`: it leaves for group `to`. From this entry on the group
    /// refuses every call about it ([`BrokerError::Moving`]) and so holds it unchanged until
    /// it has arrived (nothing changes if the group does not hold it, or it leaves already).
    /// Proposed only once every node's release can apply moves.
    Depart {
        /// The topic.
        topic: String,
        /// The group it goes to.
        to: GroupId,
    },
    /// In the group `topic` was leaving: it stays after all (the group it was going to did
    /// not take it), and takes calls again (nothing changes once it has gone).
    Stay {
        /// The topic.
        topic: String,
    },
    /// In the group `topic` goes to: a piece of its records, staged until it arrives. Pieces
    /// are numbered from 0 in the order they are sent; piece 0 of a sending starts it over
    /// (dropping what an earlier one staged). A piece sent again is staged once; one of an
    /// earlier sending than the one staged, or after a missing piece, is refused. Each piece is
    /// a few hundred kilobytes at most, so that the group's log replicates it like any entry.
    Stage {
        /// The topic.
        topic: String,
        /// The sending: the term of the leader of the group the topic leaves.
        attempt: u64,
        /// The piece's number in the sending.
        piece: u64,
        /// The partition its records belong to.
        partition: u32,
        /// Records of the partition, following those staged before.
        records: Vec<RecordImage>,
    },
    /// [`ClusterChange::Arrive`] as releases before state images of version 5 propose it:
    /// applied as that change with its image made current (every offset its groups hold
    /// counts as stored), so that the logs they wrote still apply.
    ArriveImage4 {
        /// The topic.
        topic: String,
        /// The sending whose staged pieces hold its records.
        attempt: u64,
        /// Everything it holds, but its records, in version 4.
        image: Box<v4::TopicImage>,
    },
    /// In the group `topic` leaves, once it has arrived where it goes: the group drops it and
    /// keeps refusing calls about it, so that a client that asks here asks again.
    Departed {
        /// The topic.
        topic: String,
    },
    /// In the first group: `topic`, placed in group `from`, is placed in `to` from now on
    /// (nothing changes if it is placed elsewhere, or `to` does not exist). Committed once it
    /// has arrived in `to` and gone from `from`.
    Move {
        /// The topic.
        topic: String,
        /// The group it leaves.
        from: GroupId,
        /// The group it goes to.
        to: GroupId,
    },
    /// In the group `topic` goes to: it arrives, holding what `image` holds (made by the
    /// group it leaves, after its departure) with the records staged by `attempt`'s pieces,
    /// and no longer counts as gone if it once left this group. Nothing changes if the group
    /// holds it already (it arrived before). Added with state images of version 5: proposed
    /// only once every node's release applies it.
    Arrive {
        /// The topic.
        topic: String,
        /// The sending whose staged pieces hold its records.
        attempt: u64,
        /// Everything it holds, but its records (boxed: it is large beside the other changes).
        image: Box<TopicImage>,
    },
}

/// What applying one [`Proposal`] gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// One result per command of the proposal, in order (empty for a tick).
    pub results: Vec<Result<Outcome, BrokerError>>,
    /// Topics where records may have become eligible for waiting requests.
    pub changed: Vec<String>,
    /// For a [`Proposal::Cluster`], the group it answered (see [`ClusterState::apply`]).
    pub group: Option<GroupId>,
}

/// How a node is reached: by its peers (the Raft port) and by clients (the broker port).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    /// The address the node's peers connect to (`--cluster-listen`, or the address it
    /// advertises there).
    pub raft_addr: String,
    /// The address clients connect to, given to a client that asked a node which is not the
    /// leader.
    pub client_addr: String,
}

impl ClusterNode {
    /// A node reached by its peers at `raft_addr` and by clients at `client_addr` (surrounding
    /// spaces removed).
    ///
    /// # Errors
    /// Which address is not `HOST:PORT` (a name, an IPv4 address or an `[IPv6]` address, and a
    /// port from 1 to 65535).
    pub fn new(raft_addr: &str, client_addr: &str) -> Result<ClusterNode, String> {
        for address in [raft_addr, client_addr] {
            if !is_host_and_port(address.trim()) {
                return Err(format!(
                    "{address:?} is not HOST:PORT (a name, an IPv4 address or an [IPv6] \
                     address, and a port from 1 to 65535)"
                ));
            }
        }
        Ok(ClusterNode {
            raft_addr: raft_addr.trim().to_owned(),
            client_addr: client_addr.trim().to_owned(),
        })
    }
}

impl fmt::Display for ClusterNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (clients: {})", self.raft_addr, self.client_addr)
    }
}

/// A list of members as [`parse_members`] reads it: `ID=PEER_ADDR/CLIENT_ADDR` separated by
/// commas.
pub fn members_list(members: &BTreeMap<NodeId, ClusterNode>) -> String {
    members
        .iter()
        .map(|(node, addresses)| {
            format!("{node}={}/{}", addresses.raft_addr, addresses.client_addr)
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a list of members, `ID=PEER_ADDR/CLIENT_ADDR` separated by commas (for example
/// `1=10.0.0.1:9093/10.0.0.1:9092,2=10.0.0.2:9093/10.0.0.2:9092`): each node's id, the address
/// its peers reach it on and the address clients reach it on.
///
/// # Errors
/// A description of the first entry that is not of that form, or of an id given twice.
pub fn parse_members(text: &str) -> Result<BTreeMap<NodeId, ClusterNode>, String> {
    let mut members = BTreeMap::new();
    for entry in text
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
    {
        let expected = || {
            format!("{entry:?} is not ID=PEER_ADDR/CLIENT_ADDR (for example 1=10.0.0.1:9093/10.0.0.1:9092)")
        };
        let (id, addresses) = entry.split_once('=').ok_or_else(expected)?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| format!("{entry:?}: the node id must be a whole number"))?;
        let (raft_addr, client_addr) = addresses.split_once('/').ok_or_else(expected)?;
        let node = ClusterNode::new(raft_addr, client_addr)
            .map_err(|why| format!("{entry:?}: {why}; entries are separated by commas"))?;
        if let Some((other, _)) = shared_address(&members, &node) {
            return Err(format!(
                "{entry:?}: node {other} has one of these addresses already (each node needs \
                 addresses of its own)"
            ));
        }
        if members.insert(id, node).is_some() {
            return Err(format!("node id {id} is given twice"));
        }
    }
    if members.is_empty() {
        return Err("no members given".to_owned());
    }
    Ok(members)
}

/// The member of `members` that has one of `node`'s addresses (peer or client), if any.
pub fn shared_address<'a>(
    members: impl IntoIterator<Item = (&'a NodeId, &'a ClusterNode)>,
    node: &ClusterNode,
) -> Option<(NodeId, &'a ClusterNode)> {
    members
        .into_iter()
        .find(|(_, member)| {
            member.raft_addr == node.raft_addr || member.client_addr == node.client_addr
        })
        .map(|(id, member)| (*id, member))
}

/// Whether `address` is `HOST:PORT`: a host name or IPv4 address (letters, digits, `.`, `-`,
/// `_`) or a bracketed IPv6 address, and a port from 1 to 65535.
fn is_host_and_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host
        .strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
    {
        Some(ipv6) => ipv6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        }
    };
    host_ok && matches!(port.parse::<u16>(), Ok(port) if port != 0)
}

openraft::declare_raft_types!(
    /// The broker's Raft types: entries carry [`Proposal`]s, applying one gives [`Applied`],
    /// nodes are [`ClusterNode`]s and snapshots are [`SnapshotStream`]s.
    pub TypeConfig:
        D = Proposal,
        R = Applied,
        NodeId = NodeId,
        Node = ClusterNode,
        SnapshotData = SnapshotStream,
);

/// A Raft log entry of the broker.
pub type Entry = openraft::Entry<TypeConfig>;

/// The id of a Raft log entry: its term, its leader and its index.
pub type LogId = openraft::LogId<NodeId>;

/// A storage failure as openraft reports it.
pub type StorageError = openraft::StorageError<NodeId>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_topic_is_placed_once_and_never_where_another_group_holds_it() {
        let mut state = ClusterState::default();
        assert!(state.is_empty());
        let none = |_: &str| false;
        let voters = BTreeSet::from([1, 2, 3]);
        let add = |group| ClusterChange::AddGroup {
            group,
            voters: voters.clone(),
        };
        let place = |topic: &str, group| ClusterChange::Place {
            topic: topic.to_owned(),
            group,
        };
        assert_eq!(state.apply(add(2), none), 2);
        assert_eq!(state.apply(add(FIRST_GROUP), none), FIRST_GROUP);
        assert_eq!(state.groups.keys().collect::<Vec<_>>(), [&2]);
        // Placed where asked, then where it is.
        assert_eq!(state.apply(place("a", 2), none), 2);
        assert_eq!(state.apply(place("a", FIRST_GROUP), none), 2);
        assert_eq!(state.group_of("a"), 2);
        // A topic the first group holds from before stays there, placed or not.
        assert_eq!(
            state.apply(place("old", 2), |topic| topic == "old"),
            FIRST_GROUP
        );
        assert_eq!(state.group_of("old"), FIRST_GROUP);
        // A group that does not exist takes nothing.
        assert_eq!(state.apply(place("b", 9), none), FIRST_GROUP);
        assert!(!state.placement.contains_key("b"));
        // Unplaced, a name is placed afresh.
        let unplace = ClusterChange::Unplace {
            topic: "a".to_owned(),
        };
        assert_eq!(state.apply(unplace, none), 2);
        assert_eq!(state.group_of("a"), FIRST_GROUP);
        assert_eq!(state.apply(place("a", FIRST_GROUP), none), FIRST_GROUP);
        assert_eq!(state.group_of("a"), FIRST_GROUP);
        assert!(!state.is_empty());
    }

    #[test]
    fn a_topic_moves_only_from_where_it_is_placed_to_a_group_that_exists() {
        let mut state = ClusterState::default();
        let none = |_: &str| false;
        for group in [2, 3] {
            state.apply(
                ClusterChange::AddGroup {
                    group,
                    voters: BTreeSet::from([1]),
                },
                none,
            );
        }
        let move_to = |topic: &str, from, to| ClusterChange::Move {
            topic: topic.to_owned(),
            from,
            to,
        };
        // A topic of the first group never placed, then moved back to it.
        assert_eq!(state.apply(move_to("old", FIRST_GROUP, 2), none), 2);
        assert_eq!(state.apply(move_to("old", 2, 3), none), 3);
        assert_eq!(
            state.apply(move_to("old", 2, FIRST_GROUP), none),
            3,
            "not from 2"
        );
        assert_eq!(state.apply(move_to("old", 3, 9), none), 3, "no group 9");
        assert_eq!(
            state.apply(move_to("old", 3, FIRST_GROUP), none),
            FIRST_GROUP
        );
        assert_eq!(state.group_of("old"), FIRST_GROUP);
        // A departure: only of a topic held, once, to the group first named.
        let depart = |to| ClusterChange::Depart {
            topic: "t".to_owned(),
            to,
        };
        assert_eq!(state.apply(depart(2), none), 0);
        let held = |topic: &str| topic == "t";
        assert_eq!(state.apply(depart(2), held), 2);
        assert_eq!(state.apply(depart(3), held), 2);
        let stay = ClusterChange::Stay {
            topic: "t".to_owned(),
        };
        assert_eq!(state.apply(stay, held), 0);
        assert!(state.departures.is_empty());
        assert!(!state.is_empty(), "groups and placements");
    }

    #[test]
    fn a_forwarded_proposal_takes_the_time_of_the_leader_that_proposes_it() {
        let commands = Proposal::Commands {
            now_ms: 5,
            commands: Vec::new(),
        };
        assert_eq!(
            commands.at(9),
            Proposal::Commands {
                now_ms: 9,
                commands: Vec::new()
            }
        );
        assert_eq!(
            Proposal::Tick { now_ms: 5 }.at(9),
            Proposal::Tick { now_ms: 9 }
        );
        let place = Proposal::Cluster(ClusterChange::Unplace {
            topic: "t".to_owned(),
        });
        assert_eq!(place.clone().at(9), place);
    }

    #[test]
    fn commands_under_other_names_carry_their_rules_and_the_broker_rules_encode_as_before() {
        let create = Command::Create {
            topic: "orders.v1".to_owned(),
            partition_count: 1,
            key_hash: broker_core::KeyHash::default(),
            settings: Vec::new(),
        };
        let plain = Proposal::commands(5, NameRules::Broker, vec![create.clone()]);
        assert_eq!(
            plain,
            Proposal::Commands {
                now_ms: 5,
                commands: vec![create.clone()]
            }
        );
        // Every release wrote these entries so: variant 0, the time, the commands.
        let bytes = crate::codec::encode(&plain).unwrap();
        assert_eq!(bytes[..4], 0u32.to_le_bytes());
        assert_eq!(bytes[4..12], 5i64.to_le_bytes());
        let named = Proposal::commands(5, NameRules::Kafka, vec![create.clone()]);
        // Variant 3 after the time, the rules (1: Kafka's).
        let bytes = crate::codec::encode(&named).unwrap();
        assert_eq!(bytes[..4], 3u32.to_le_bytes());
        assert_eq!(bytes[12..16], 1u32.to_le_bytes());
        assert_eq!(crate::codec::decode::<Proposal>(&bytes).unwrap(), named);
        // Forwarded, the entry keeps its rules and takes the leader's time.
        assert_eq!(
            named.at(9).into_change(),
            Ok(BrokerChange::Commands {
                now_ms: 9,
                names: NameRules::Kafka,
                revision: Revision::Original,
                commands: vec![create.clone()]
            })
        );
        assert_eq!(
            plain.into_change(),
            Ok(BrokerChange::Commands {
                now_ms: 5,
                names: NameRules::Broker,
                revision: Revision::Original,
                commands: vec![create]
            })
        );
    }

    #[test]
    fn a_revised_entry_is_variant_5_carries_its_revision_and_keeps_it_when_forwarded() {
        let commands = Proposal::commands(5, NameRules::Kafka, Vec::new());
        assert_eq!(commands.clone().revised(Revision::Original), commands);
        let revised = commands.clone().revised(Revision::Bounded);
        // Variant 5, the revision's number, then the proposal as it is encoded alone.
        let bytes = crate::codec::encode(&revised).unwrap();
        assert_eq!(bytes[..4], 5u32.to_le_bytes());
        assert_eq!(bytes[4..8], 1u32.to_le_bytes());
        assert_eq!(bytes[8..], crate::codec::encode(&commands).unwrap()[..]);
        assert_eq!(crate::codec::decode::<Proposal>(&bytes).unwrap(), revised);
        // Nested (no release proposes so; a peer could, to overflow the stack), or revising
        // what a revision does not apply to, it is refused.
        let nested = Proposal::Revised {
            revision: Revision::Bounded,
            proposal: Box::new(revised.clone()),
        };
        let refused = crate::codec::decode::<Proposal>(&crate::codec::encode(&nested).unwrap());
        assert!(refused
            .unwrap_err()
            .to_string()
            .contains("inside a revised"));
        let mut deep = [5, 0, 0, 0, 1, 0, 0, 0].repeat(100_000);
        deep.extend(crate::codec::encode(&commands).unwrap());
        assert!(crate::codec::decode::<Proposal>(&deep).is_err());
        let budget = Proposal::Revised {
            revision: Revision::Bounded,
            proposal: Box::new(Proposal::Budget { bytes: None }),
        };
        let refused = crate::codec::decode::<Proposal>(&crate::codec::encode(&budget).unwrap());
        assert!(refused.unwrap_err().to_string().contains("nothing else"));
        // Revised again, it is not nested; forwarded, it takes the leader's time.
        assert_eq!(revised.clone().revised(Revision::Bounded), revised);
        assert_eq!(
            revised.at(9).into_change(),
            Ok(BrokerChange::Commands {
                now_ms: 9,
                names: NameRules::Kafka,
                revision: Revision::Bounded,
                commands: Vec::new(),
            })
        );
        assert_eq!(
            Proposal::Tick { now_ms: 3 }
                .revised(Revision::Bounded)
                .into_change(),
            Ok(BrokerChange::Tick {
                now_ms: 3,
                revision: Revision::Bounded
            })
        );
        // Entries that do not depend on the core's rules stay as they are.
        let budget = Proposal::Budget { bytes: None };
        assert_eq!(budget.clone().revised(Revision::Bounded), budget);
    }

    #[test]
    fn a_budget_change_is_variant_4_keeps_its_value_when_forwarded_and_reads_back() {
        let budget = Proposal::Budget {
            bytes: Some(1 << 20),
        };
        assert_eq!(budget.clone().at(9), budget);
        // Variant 4, then the option (1: some) and the bytes.
        let bytes = crate::codec::encode(&budget).unwrap();
        assert_eq!(bytes[..4], 4u32.to_le_bytes());
        assert_eq!(bytes[4], 1);
        assert_eq!(bytes[5..13], (1u64 << 20).to_le_bytes());
        assert_eq!(crate::codec::decode::<Proposal>(&bytes).unwrap(), budget);
        assert_eq!(
            budget.into_change(),
            Ok(BrokerChange::Budget {
                bytes: Some(1 << 20)
            })
        );
    }

    #[test]
    fn members_parse_and_bad_lists_are_explained() {
        let members = parse_members("1=a:1/b:2, 2=[::1]:3/[::1]:4").unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(members[&2].raft_addr, "[::1]:3");
        assert_eq!(members[&2].client_addr, "[::1]:4");
        for (bad, why) in [
            ("", "no members"),
            ("1=a:1", "not ID=PEER_ADDR/CLIENT_ADDR"),
            ("x=a:1/b:2", "whole number"),
            ("1=a:1/b", "HOST:PORT"),
            ("1=a:0/b:2", "HOST:PORT"),
            ("1=a:1/b:2,1=c:1/d:2", "twice"),
            ("1=a:1/b:2,2=a:1/d:2", "node 1 has one of these addresses"),
            ("1=a:1/b:2,2=c:1/b:2", "node 1 has one of these addresses"),
            // A separator other than a comma runs two entries into one.
            ("1=a:1/b:2;2=c:1/d:2", "separated by commas"),
            ("1=a:1/b:2 2=c:1/d:2", "separated by commas"),
            ("1=[::1:1/b:2", "HOST:PORT"),
        ] {
            let error = parse_members(bad).unwrap_err();
            assert!(error.contains(why), "{bad:?}: {error}");
        }
    }
}
