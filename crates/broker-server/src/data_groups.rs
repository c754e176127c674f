//! A cluster node's further Raft groups (`--cluster-data-groups`): which group holds each
//! topic, hosting the groups the cluster's state lists, adding those the settings ask for,
//! routing each request to its topic's group, and balancing the groups' leaders over the
//! nodes.
//!
//! The first group (shard 0, in `raft/`) keeps the cluster's state: the further groups and
//! where each topic placed since groups exist lives (see [`broker_cluster::ClusterState`]).
//! Group `g` is held by shard `g - 1`, its files in `raft/group-<g>/`. A topic and its
//! consumer groups live in one group, so every call about one topic is one entry of that
//! group's log, as with one group; a call is applied by its group's leader, and any other node
//! answers `NotLeader` naming that leader. A create goes to the first group's leader, which
//! places the name (the group holding the fewest partitions, or the group of the topic it is a
//! companion of, `orders-dlq` with `orders`), then has the group's leader apply it. A
//! description of every topic, and the metadata, gather the groups: each group's part read
//! from this node's copy after a read index from its leader, so each topic's part is
//! linearizable, not the whole.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use broker_cluster::{
    Cluster, ClusterChange, ClusterNode, ClusterStatus, GroupConfig, GroupId, NodeId, Proposal,
    ProposeError, FIRST_GROUP,
};
use broker_core::{BrokerDescription, Command, Outcome};
use broker_proto::ErrorReply;
use futures::future::join_all;
use tracing::{debug, error, info, warn};

use crate::broker::wall_clock_ms;
use crate::config::{ClusterSettings, MAX_SHARDS};
use crate::replicated::{self, BrokerReplica, CLUSTER_DIR};
use crate::shards::dead_letter_of;
use crate::shared::Shared;

/// The directory of group `group` in a node's cluster directory.
fn group_dir(data_dir: &Path, group: GroupId) -> PathBuf {
    data_dir.join(CLUSTER_DIR).join(format!("group-{group}"))
}

/// How many groups a node serves (the first included): as many as `settings` ask for, or as
/// many as its directory holds, whichever is more.
pub(crate) fn count(settings: &ClusterSettings, data_dir: Option<&Path>) -> usize {
    let on_disk = data_dir
        .and_then(|dir| std::fs::read_dir(dir.join(CLUSTER_DIR)).ok())
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name();
            name.to_str()?.strip_prefix("group-")?.parse::<usize>().ok()
        })
        // (A directory a node would never have made is not taken for one.)
        .filter(|group| *group <= MAX_SHARDS)
        .max()
        .unwrap_or(1);
    if on_disk > settings.data_groups {
        tracing::warn!(
            given = settings.data_groups,
            on_disk,
            "--cluster-data-groups is {}, but this node's data directory holds {on_disk} groups: \
             groups are never removed, so this node serves all {on_disk}",
            settings.data_groups
        );
    }
    settings.data_groups.max(on_disk)
}

/// The shard of `group`.
pub(crate) fn shard_of_group(group: GroupId) -> usize {
    group.saturating_sub(1) as usize
}

/// The group of `shard`.
fn group_of_shard(shard: usize) -> GroupId {
    GroupId::try_from(shard + 1).unwrap_or(GroupId::MAX)
}

/// Starts, on a node of a cluster, the task that hosts each further group once the cluster's
/// state lists it and, with several groups, the tasks that add the groups the settings ask for
/// (on the first group's leader) and balance the groups' leaders.
pub(crate) fn start(shared: &Arc<Shared>, settings: &ClusterSettings, data_dir: &Path) {
    // Also with one group: a node given fewer groups than the cluster has says so.
    let log = GroupLog {
        snapshot_every: settings.snapshot_entries,
        cached_bytes: settings.log_cache_bytes,
    };
    shared
        .tracker
        .spawn(host_groups(Arc::clone(shared), log, data_dir.to_owned()));
    if !shared.groups.is_empty() {
        shared.tracker.spawn(add_groups(Arc::clone(shared)));
        shared.tracker.spawn(balance_leaders(Arc::clone(shared)));
        shared.tracker.spawn(follow_membership(Arc::clone(shared)));
    }
}

/// How often the leader of a further group compares its members with the first group's.
const MEMBERSHIP_EVERY: Duration = Duration::from_secs(1);

/// How long one membership change of a further group may take (a node catching up included)
/// before it is tried again at the next round.
const MEMBERSHIP_CHANGE_WITHIN: Duration = Duration::from_secs(20);

/// How long a group's leader leaves a node alone after failing to add it (a node that cannot
/// host the group, say) before it tries again: meanwhile the group's other changes go on.
const ADD_AGAIN_AFTER: Duration = Duration::from_secs(30);

/// Keeps the members of every further group this node leads those of the first group (which
/// `broker cluster add` and `remove` change), one change per group and round (see
/// [`membership_change`]); a node leaving the cluster leaves the groups it leads itself, since
/// no other node can remove a group's leader. Until the server shuts down. Decided from the
/// first group's committed membership, after a read index of the first group, so that a copy
/// of it that lags, or a change that may yet be dropped, never undoes another.
async fn follow_membership(shared: Arc<Shared>) {
    // The last change that failed in each group, so that its retries are not all logged.
    let mut reported: BTreeMap<GroupId, String> = BTreeMap::new();
    // While this node leaves: the voters of each group that did not take its leadership, so
    // that the next round tries another (or this node leaves the group itself).
    let mut refused_takers: BTreeMap<GroupId, BTreeSet<NodeId>> = BTreeMap::new();
    // When each group last failed to add each node.
    let mut failed_adds: BTreeMap<(GroupId, NodeId), tokio::time::Instant> = BTreeMap::new();
    let replicas = replicas_of(&shared);
    // Whether the other nodes were given the same --cluster-replicas, as they last told.
    let mut agreement = SettingsAgreement::default();
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            () = tokio::time::sleep(MEMBERSHIP_EVERY) => {}
        }
        let Some(first) = shared.cluster() else {
            return;
        };
        let led: Vec<Arc<Cluster>> = shared
            .further_groups()
            .into_iter()
            .filter(|group| group.is_leader())
            .collect();
        if led.is_empty() {
            continue;
        }
        let me = first.node_id();
        // A node that its own copy of the first group shows leaving acts on that copy at once,
        // without a read index (which a node being removed may not get): it only hands its
        // groups over or leaves them itself, and a copy that lagged would at worst take it
        // out of a group that the group's next leader then adds it to again. Every other
        // change is decided from a current copy.
        let wanted = match first.committed_members() {
            Some(wanted) if !wanted.is_empty() && !votes(&wanted, me) && !first.knows_removed() => {
                wanted
            }
            _ => {
                let current = first.read_barrier_anywhere().await.is_ok();
                match (current, first.committed_members()) {
                    (true, Some(wanted)) if !wanted.is_empty() => wanted,
                    // A removed node cannot ask the first group for a read index any more.
                    _ if first.knows_removed() => Vec::new(),
                    _ => continue,
                }
            }
        };
        let agreed = agreement.check(first).await;
        let leaving = !votes(&wanted, me);
        if !leaving {
            refused_takers.clear();
        }
        let unreachable = first.status().unreachable;
        failed_adds.retain(|_, at| at.elapsed() < ADD_AGAIN_AFTER);
        // The groups' changes at once: a node catching up with one group's log holds back no
        // other group's change.
        let changes: Vec<(&Cluster, MembershipChange)> = led
            .iter()
            .map(Arc::as_ref)
            .filter_map(|group| {
                let status = group.status();
                let change = match leaving {
                    false => {
                        let not_yet: BTreeSet<NodeId> = failed_adds
                            .keys()
                            .filter(|(failed_in, _)| *failed_in == group.group())
                            .map(|(_, node)| *node)
                            .collect();
                        membership_change(
                            group.group(),
                            agreed.then_some(replicas),
                            me,
                            &wanted,
                            &status.members,
                            &not_yet,
                        )
                    }
                    // This node is leaving the cluster (a learner of the first group, or out of
                    // it).
                    true => {
                        let mut excluded = unreachable.clone();
                        excluded.extend(refused_takers.get(&group.group()).into_iter().flatten());
                        Some(leaving_change(&wanted, &status, &excluded, me))
                    }
                };
                if change.is_none() {
                    reported.remove(&group.group());
                }
                Some((group, change?))
            })
            .collect();
        let done = join_all(changes.into_iter().map(|(group, change)| async move {
            let done = match &change {
                MembershipChange::Add(node, address) => {
                    group
                        .add_node(*node, address.clone(), MEMBERSHIP_CHANGE_WITHIN)
                        .await
                }
                MembershipChange::Remove(node) => {
                    group.remove_node(*node, MEMBERSHIP_CHANGE_WITHIN).await
                }
                MembershipChange::HandOver(to) => {
                    group.transfer_leadership(*to, HAND_OVER_WITHIN).await
                }
            };
            (group.group(), change, done)
        }))
        .await;
        for (id, change, done) in done {
            match (done, &change) {
                (Ok(()), MembershipChange::HandOver(_)) => {
                    reported.remove(&id);
                    refused_takers.remove(&id);
                    info!(group = id, "data group {id}: {change}");
                }
                (Ok(()), _) => {
                    reported.remove(&id);
                    info!(
                        group = id,
                        "data group {id}: {change}, following the cluster's nodes \
                         (--cluster-replicas {replicas})"
                    );
                }
                (Err(cause), MembershipChange::HandOver(to)) => {
                    warn!(
                        group = id,
                        to,
                        %cause,
                        "this node leaves data group {id} but could not hand its leadership \
                         to node {to}; trying again (leaving the cluster: another voter, or \
                         leaving the group itself)"
                    );
                    refused_takers.entry(id).or_default().insert(*to);
                }
                (Err(cause), change) => {
                    if let MembershipChange::Add(node, _) = change {
                        failed_adds.insert((id, *node), tokio::time::Instant::now());
                    }
                    // Said once per change, however the details of its refusal evolve.
                    let what = change.to_string();
                    if reported.get(&id) != Some(&what) {
                        warn!(
                            group = id,
                            %cause,
                            "data group {id} does not follow the first group's members yet \
                             ({what}); trying again every second"
                        );
                        reported.insert(id, what);
                    }
                }
            }
        }
    }
}

/// Whether group `group`, whose members are `members`, is still to take node `node_id` as a
/// voter (a change its leader makes on its way adds it), as this node's copy of the first
/// group's members has it.
pub(crate) fn takes(
    shared: &Shared,
    group: GroupId,
    members: &[(NodeId, ClusterNode, bool)],
    node_id: NodeId,
) -> bool {
    let Some(wanted) = shared.cluster().and_then(Cluster::committed_members) else {
        return false;
    };
    if votes(members, node_id) {
        return false;
    }
    let order = replica_order(
        &wanted
            .iter()
            .filter(|(_, _, voter)| *voter)
            .map(|(id, _, _)| *id)
            .collect::<Vec<_>>(),
        group,
    );
    // Among the voters the group is to have (the first of its order).
    let replicas = replicas_of(shared).max(1);
    order.iter().take(replicas).any(|id| *id == node_id)
}

/// How often a node that leads a further group asks the others whether they were given the
/// same `--cluster-replicas`.
const AGREEMENT_EVERY: Duration = Duration::from_secs(10);

/// What the other nodes last told of the settings they must share with this one.
#[derive(Debug, Default)]
struct SettingsAgreement {
    asked: Option<tokio::time::Instant>,
    /// The settings some node was given otherwise: node, its value, this node's.
    apart: Vec<(NodeId, String, String)>,
}

impl SettingsAgreement {
    /// Whether every node that answers agrees with this one, asked again every
    /// [`AGREEMENT_EVERY`]; a disagreement is logged when it is found, and its end too.
    async fn check(&mut self, first: &Cluster) -> bool {
        if self
            .asked
            .is_none_or(|asked| asked.elapsed() >= AGREEMENT_EVERY)
        {
            self.asked = Some(tokio::time::Instant::now());
            let apart = first.settings_apart().await;
            if apart != self.apart {
                for (node, theirs, ours) in &apart {
                    error!(
                        node,
                        "node {node} was given {theirs}, this node {ours}: every node must be \
                         given the same; meanwhile the groups this node leads keep their voters \
                         (but for nodes that left the cluster)"
                    );
                }
                if apart.is_empty() {
                    info!("every node now has the same settings");
                }
                self.apart = apart;
            }
        }
        self.apart.is_empty()
    }
}

/// Whether `id` is a voter among `members` (id, addresses, whether it votes).
pub(crate) fn votes(members: &[(NodeId, ClusterNode, bool)], id: NodeId) -> bool {
    members
        .iter()
        .any(|(member, _, voter)| *member == id && *voter)
}

/// A change that brings a further group's members closer to the first group's.
#[derive(Debug, Clone, PartialEq, Eq)]
enum MembershipChange {
    /// Node `.0`, reached at `.1`, is to become a voter.
    Add(NodeId, ClusterNode),
    /// Node `.0` is to leave the group.
    Remove(NodeId),
    /// This node, leaving the group (or the cluster), hands the group's leadership to node
    /// `.0` first; the new leader then removes it.
    HandOver(NodeId),
}

impl std::fmt::Display for MembershipChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MembershipChange::Add(node, _) => write!(f, "node {node} added"),
            MembershipChange::Remove(node) => write!(f, "node {node} removed"),
            MembershipChange::HandOver(node) => {
                write!(
                    f,
                    "leadership handed to node {node}, since this node leaves the group"
                )
            }
        }
    }
}

/// The voters of the first group, `first_voters`, in the order group `group` takes its
/// replicas from: rotated by the group's id, so that group 2 starts with the lowest id, group 3
/// with the next, and so on, and every node holds as many groups as the others. A group's first
/// voters are the first `--cluster-replicas` of them; a group short of voters adds the first
/// it lacks, and one with too many gives up the last.
fn replica_order(first_voters: &[NodeId], group: GroupId) -> Vec<NodeId> {
    let mut order = first_voters.to_vec();
    order.sort_unstable();
    order.dedup();
    if !order.is_empty() {
        let shift = group.saturating_sub(2) as usize % order.len();
        order.rotate_left(shift);
    }
    order
}

/// The next change of group `group`, led by node `me`, whose members are `members` (id,
/// addresses, whether it votes) when the first group's are `wanted` and the group is to have
/// `replicas` voters (every voter of the first group while it has fewer; `None` while the
/// nodes do not agree on it, when only step 3's removal of a node gone from the first group
/// is made, so that nodes given different values never undo each other's changes):
/// 1. a member the first group has at other addresses is removed (to be added again at its
///    new ones);
/// 2. while the group has fewer voters than that, a voter of the first group is added, in the
///    group's [`replica_order`] (a learner of the group, catching up since an earlier round,
///    first), unless another member has its addresses (a node replaced under a new id: that
///    member leaves first);
/// 3. a member the first group no longer has is removed, and so is a learner of the group
///    (an addition that did not finish) that the group no longer needs;
/// 4. while the group has more voters than that, the last in its order is removed (when that
///    is `me`, the leadership is handed to the first of the others, which removes it).
///
/// At step 2 a group with as many voters as it is to have, but not the first ones of its
/// order (a node joined the cluster), adds the first it lacks too, so that step 4 then gives
/// up the last: a node added to the cluster takes its share of the groups, one copy at a time.
///
/// A learner of the first group, still catching up, is not taken until it votes there. Adding
/// before removing keeps as many voters as possible while a node is replaced; a node in
/// `not_yet` (whose addition failed a moment ago) is not added this time, so that a node that
/// cannot join holds back no other change.
fn membership_change(
    group: GroupId,
    replicas: Option<usize>,
    me: NodeId,
    wanted: &[(NodeId, ClusterNode, bool)],
    members: &[(NodeId, ClusterNode, bool)],
    not_yet: &BTreeSet<NodeId>,
) -> Option<MembershipChange> {
    let in_first = |id: NodeId| wanted.iter().find(|(member, _, _)| *member == id);
    let moved = members
        .iter()
        .filter(|(id, address, _)| in_first(*id).is_some_and(|(_, at, _)| at != address))
        .map(|(id, _, _)| *id)
        .min();
    if let Some(id) = moved {
        return Some(MembershipChange::Remove(id));
    }
    let first_voters: Vec<NodeId> = wanted
        .iter()
        .filter(|(_, _, voter)| *voter)
        .map(|(id, _, _)| *id)
        .collect();
    let order = replica_order(&first_voters, group);
    let rank = |id: NodeId| order.iter().position(|voter| *voter == id);
    let Some(replicas) = replicas else {
        // Not agreed on: only a member the first group no longer has leaves.
        return members
            .iter()
            .map(|(id, _, _)| *id)
            .filter(|id| in_first(*id).is_none())
            .min()
            .map(MembershipChange::Remove);
    };
    let target = replicas.clamp(1, order.len().max(1));
    // The group's voters that vote in the first group, the ones that count.
    let counted: Vec<NodeId> = members
        .iter()
        .filter(|(id, _, voter)| *voter && votes(wanted, *id))
        .map(|(id, _, _)| *id)
        .collect();
    // The voters the group is to have; while it has as many others, it adds these one by one
    // (and gives the others up at step 4), so that a node added to the cluster takes its share.
    let placed = |id: NodeId| rank(id).is_some_and(|rank| rank < target);
    let misplaced = counted.len() == target && !counted.iter().all(|id| placed(*id));
    if counted.len() < target || misplaced {
        let address_taken = |id: NodeId, address: &ClusterNode| {
            members
                .iter()
                .any(|(member, at, _)| *member != id && at == address)
        };
        let learning = |id: NodeId| members.iter().any(|(member, _, _)| *member == id);
        let missing = wanted
            .iter()
            .filter(|(id, address, voter)| {
                *voter
                    && !counted.contains(id)
                    && !address_taken(*id, address)
                    && !not_yet.contains(id)
                    && (counted.len() < target || placed(*id))
            })
            .min_by_key(|(id, _, _)| (!learning(*id), rank(*id)));
        if let Some((id, address, _)) = missing {
            return Some(MembershipChange::Add(*id, address.clone()));
        }
    }
    let gone = members
        .iter()
        .filter(|(id, _, voter)| {
            let unneeded = !*voter && votes(wanted, *id) && !placed(*id);
            in_first(*id).is_none() || (unneeded && counted.len() >= target && *id != me)
        })
        .map(|(id, _, _)| *id)
        .min();
    if let Some(id) = gone {
        return Some(MembershipChange::Remove(id));
    }
    if counted.len() > target {
        // The last in the group's order leaves; when that is this node, which leads, it hands
        // the leadership to the first of the others, whose leader then removes it.
        let last = counted.iter().copied().max_by_key(|id| rank(*id))?;
        if last != me {
            return Some(MembershipChange::Remove(last));
        }
        return counted
            .iter()
            .copied()
            .filter(|id| *id != me)
            .min_by_key(|id| rank(*id))
            .map(MembershipChange::HandOver);
    }
    None
}

/// The change of a group this node leads while it leaves the cluster (`wanted`, the first
/// group's members, no longer has it as a voter), from the group's `status`: the group's
/// leadership handed to another of its voters that votes in the first group and is not
/// `excluded` (unreachable, or one that did not take it before), the most caught up first (the
/// lowest id among equals), whose leader then removes this node once the first group no
/// longer has it, so that the group's calls never wait for an election; without such a voter,
/// this node leaves the group itself (the others elect).
fn leaving_change(
    wanted: &[(NodeId, ClusterNode, bool)],
    status: &ClusterStatus,
    excluded: &BTreeSet<NodeId>,
    me: NodeId,
) -> MembershipChange {
    status
        .members
        .iter()
        .filter(|(id, _, voter)| {
            *id != me && *voter && votes(wanted, *id) && !excluded.contains(id)
        })
        .map(|(id, _, _)| {
            let matched = status.replication.get(id).copied().flatten();
            (std::cmp::Reverse(matched), *id)
        })
        .min()
        .map_or(MembershipChange::Remove(me), |(_, id)| {
            MembershipChange::HandOver(id)
        })
}

/// How often a node looks again at the groups it hosts: for a copy a group gave up, and, after
/// a failure, to host a group again.
const LOOK_AGAIN_EVERY: Duration = Duration::from_secs(5);

/// The file a node leaves in the directory of a group whose copy it dropped (see
/// [`drop_given_up_copy`]): hosted again from that empty directory, the node waits to be added
/// to the group, even if it was one of the group's first voters, instead of starting the group
/// anew. (It stays once the group takes the node again: no group is ever started anew.)
const GIVEN_UP_MARK: &str = "given-up";

/// The file that says a group's directory is being emptied (see [`empty_group_dir`]): a node
/// that finds it, after a failure or a crash, empties the directory before it hosts the group.
const DROPPING_MARK: &str = "dropping";

/// How a node keeps the log of each group it hosts: as its first group's (the settings'
/// `--cluster-snapshot-entries` and `--cluster-log-cache-bytes`).
#[derive(Debug, Clone, Copy)]
struct GroupLog {
    /// A snapshot after this many entries since the last one.
    snapshot_every: u64,
    /// The newest entries' bytes kept in memory.
    cached_bytes: u64,
}

/// Hosts each further group the cluster's state lists (of those this node has a shard for)
/// as it appears there, and drops each copy a group gave up (see [`drop_given_up_copy`]),
/// until the server shuts down.
async fn host_groups(shared: Arc<Shared>, log: GroupLog, data_dir: PathBuf) {
    let Some(first) = shared.cluster() else {
        return;
    };
    let mut state = first.cluster_state();
    let mut beyond_reported = false;
    // The last failure logged for each group, so that a retry that fails alike is not.
    let mut reported: BTreeMap<GroupId, String> = BTreeMap::new();
    loop {
        let listed: Vec<(GroupId, BTreeSet<NodeId>)> = state
            .borrow_and_update()
            .groups
            .iter()
            .map(|(group, voters)| (*group, voters.clone()))
            .collect();
        let most = listed.iter().map(|(group, _)| *group).max().unwrap_or(1);
        for (group, voters) in listed {
            let shard = shard_of_group(group);
            if shard > shared.groups.len() {
                if !std::mem::replace(&mut beyond_reported, true) {
                    error!(
                        group,
                        "the cluster has {most} groups, more than this node serves ({}): \
                         restart it with --cluster-data-groups {most} (every node the same); \
                         meanwhile it serves none of the topics of groups {group} to {most}",
                        shared.groups.len() + 1
                    );
                }
                continue;
            }
            let dir = group_dir(&data_dir, group);
            let hosting = match shared.group(shard) {
                None => host_group(&shared, first, group, &voters, log, &dir).await,
                Some(hosted) if hosted.holds_given_up_copy().await => {
                    match drop_given_up_copy(&shared, shard, hosted, &dir).await {
                        Ok(()) => host_group(&shared, first, group, &voters, log, &dir).await,
                        Err(cause) => Err(format!(
                            "its copy of the group, which the group gave up, could not be \
                             dropped: {cause}"
                        )),
                    }
                }
                Some(_) => Ok(()),
            };
            match hosting {
                Ok(()) => {
                    reported.remove(&group);
                }
                Err(cause) if reported.get(&group) != Some(&cause) => {
                    error!(group, %cause, "this node cannot host data group {group}; trying again every 5 s");
                    reported.insert(group, cause);
                }
                Err(_) => {}
            }
            if shared.shutdown.is_cancelled() {
                return;
            }
        }
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            changed = state.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(LOOK_AGAIN_EVERY) => {}
        }
    }
}

/// Hosts group `group` (listed in the cluster's state with the first voters `voters`) on this
/// node from its files in `dir`, on the shard that holds its topics.
///
/// # Errors
/// Why the group could not be hosted (its files, or the other nodes' answers at start).
async fn host_group(
    shared: &Arc<Shared>,
    first: &Cluster,
    group: GroupId,
    voters: &BTreeSet<NodeId>,
    log: GroupLog,
    dir: &Path,
) -> Result<(), String> {
    let shard = shard_of_group(group);
    if dir.join(DROPPING_MARK).exists() {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || empty_group_dir(&dir))
            .await
            .map_err(|stopped| stopped.to_string())?
            .map_err(|cause| {
                format!(
                    "its copy of the group, which the group gave up, could not be dropped: {cause}"
                )
            })?;
    }
    // A node among the group's first voters may start it with them; one added to the
    // cluster since, or one that dropped its copy, waits for the group's leader to add it (see
    // `follow_membership`): it is given the other members only (to ask whether it held the
    // group's log before), never itself, so that it never starts the group on its own.
    let me = first.node_id();
    let first_voter = voters.contains(&me) && !dir.join(GIVEN_UP_MARK).exists();
    let addresses: BTreeMap<NodeId, ClusterNode> = first
        .status()
        .members
        .into_iter()
        .filter(|(id, _, _)| match first_voter {
            true => voters.contains(id),
            false => *id != me,
        })
        .map(|(id, node, _)| (id, node))
        .collect();
    let mut config = GroupConfig::new(dir.to_owned(), addresses);
    config.sync = replicated::log_sync(&shared.config);
    config.snapshot_every = log.snapshot_every;
    config.cached_log_bytes = log.cached_bytes;
    config.segment_bytes = shared.config.segment_bytes;
    let broker = Arc::clone(shared.shards.get(shard));
    // Until it leads the group, the node logs none of the changes it applies.
    broker.set_audited(false);
    let replica = Arc::new(BrokerReplica::new(broker, Arc::clone(&shared.signals)));
    let hosted = first
        .host_group(group, config, replica)
        .await
        .map_err(|cause| cause.to_string())?;
    // The server stopped meanwhile: its groups were stopped already.
    if shared.shutdown.is_cancelled() {
        hosted.shutdown().await;
        return Ok(());
    }
    // (Its copy's membership as its files have it, once restarted.)
    let member = hosted.is_member();
    let started_empty = hosted.started_empty();
    // Only this task sets the slots.
    shared.set_group(shard, Some(Arc::new(hosted)));
    // (A node restarted from its files may not have loaded its copy's membership yet: it says
    // where it started from instead.)
    // (A new group's first voters are not members until it has formed.)
    match (member || first_voter, started_empty) {
        (true, _) => info!(group, "this node hosts data group {group}"),
        (false, false) => info!(
            group,
            "this node hosts data group {group} again, from its files"
        ),
        (false, true) => info!(
            group,
            "this node hosts data group {group}, without a copy until the group's leader adds \
             it (with fewer replicas than nodes, some groups never do): it sends that group's \
             clients to its leader"
        ),
    }
    shared
        .tracker
        .spawn(replicated::follow_leadership(Arc::clone(shared), shard));
    Ok(())
}

/// Drops this node's copy of the group of `shard`, `hosted`, whose files are in `dir`, which
/// the group gave up ([`Cluster::holds_given_up_copy`]): stops the node's part in the group
/// and, once that stopped instance still shows a copy given up (a group that took the node
/// again meanwhile finds it stopped, and it is hosted again from its files), empties the
/// shard's state (its records, consumer groups and sessions: requests waiting on them are
/// woken, and sent to the group's leader) and the group's directory ([`empty_group_dir`]). The
/// group is then hosted again from nothing, as on a node that never held a copy: a group that
/// takes the node again sends it everything anew.
///
/// # Errors
/// The files could not be removed: the node hosts the group again once they are (each try
/// empties the directory first).
async fn drop_given_up_copy(
    shared: &Shared,
    shard: usize,
    hosted: Arc<Cluster>,
    dir: &Path,
) -> std::io::Result<()> {
    let group = hosted.group();
    shared.set_group(shard, None);
    hosted.shutdown().await;
    // Stopped, it takes no entry and no vote any more: asked again, the group's leader tells
    // whether it took the node again before it stopped.
    if !hosted.holds_given_up_copy().await {
        info!(
            group,
            "data group {group} takes this node again: it keeps its copy"
        );
        return Ok(());
    }
    // The engine's tasks (an entry being applied, a snapshot being built) end after it stopped:
    // the state and the files are theirs until then.
    while !hosted.released() {
        tokio::select! {
            () = shared.shutdown.cancelled() => return Ok(()),
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    shared.shards.get(shard).lock().forget_everything();
    shared.signals.wake_all();
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || empty_group_dir(&dir))
        .await
        .map_err(std::io::Error::other)??;
    info!(
        group,
        "this node dropped its copy of data group {group}, which the group gave up \
         (--cluster-replicas): its records, consumer groups and files; it hosts the group \
         again without a copy, until the group takes it again"
    );
    Ok(())
}

/// Empties `dir`, a group's directory, leaving [`GIVEN_UP_MARK`] alone in it, so that a crash
/// at any point leaves either the directory as it was or one that is emptied before the group
/// is hosted again ([`DROPPING_MARK`] is written first and removed last).
///
/// # Errors
/// A file could not be written or removed.
fn empty_group_dir(dir: &Path) -> std::io::Result<()> {
    let write_mark = |name: &str, text: &str| -> std::io::Result<()> {
        let mut file = std::fs::File::create(dir.join(name))?;
        std::io::Write::write_all(&mut file, text.as_bytes())?;
        file.sync_all()?;
        std::fs::File::open(dir)?.sync_all()
    };
    write_mark(
        DROPPING_MARK,
        "This node's copy of this group was given up and is being removed.\n",
    )?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == DROPPING_MARK || entry.file_name() == GIVEN_UP_MARK {
            continue;
        }
        match entry.file_type()?.is_dir() {
            true => std::fs::remove_dir_all(entry.path())?,
            false => std::fs::remove_file(entry.path())?,
        }
    }
    write_mark(
        GIVEN_UP_MARK,
        "This node's copy of this group was given up and removed: the node waits to be added \
         to the group again, and never starts it anew.\n",
    )?;
    std::fs::remove_file(dir.join(DROPPING_MARK))?;
    std::fs::File::open(dir)?.sync_all()
}

/// `Ok` once every other node tells that it serves `group` (it was given `--cluster-data-groups`
/// of at least that); why the group must wait otherwise. A node of an earlier release tells
/// nothing of it: the release check of adding a group answers for it.
async fn served_everywhere(first: &Cluster, group: GroupId) -> Result<(), String> {
    for (node, told) in first.told_by_members().await {
        let told = told.map_err(|cause| {
            format!(
                "node {node} did not answer ({cause}), so whether it serves the group is not known"
            )
        })?;
        let serves = told.iter().find_map(|setting| {
            setting
                .strip_prefix(crate::replicated::SERVES_GROUPS)?
                .strip_prefix('=')?
                .parse::<u64>()
                .ok()
        });
        if let Some(serves) = serves.filter(|&serves| serves < u64::from(group)) {
            return Err(format!(
                "node {node} serves {serves} groups: start it with --cluster-data-groups {group} \
                 or more (every node is given the same)"
            ));
        }
    }
    Ok(())
}

/// How often a node that leads the first group looks for groups the settings ask for that the
/// cluster's state lacks.
const ADD_GROUPS_EVERY: Duration = Duration::from_secs(1);

/// While this node leads the first group (and its copy of the cluster's state is current):
/// adds the groups the settings ask for that the cluster's state lacks, every voter of the
/// first group a voter of each, trying again every few seconds while some node cannot take
/// them yet; until the server shuts down.
async fn add_groups(shared: Arc<Shared>) {
    let wanted = shared.shards.all().len();
    let mut reported = None;
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            () = tokio::time::sleep(ADD_GROUPS_EVERY) => {}
        }
        let Some(first) = shared.cluster() else {
            return;
        };
        if !first.is_leader() || !shared.first_group_current.load(Ordering::SeqCst) {
            continue;
        }
        let missing = {
            let state = first.cluster_state();
            let state = state.borrow();
            (2..=group_of_shard(wanted - 1)).find(|group| !state.groups.contains_key(group))
        };
        let Some(group) = missing else {
            continue;
        };
        let voters = replica_order(&voters(first, false), group)
            .into_iter()
            .take(replicas_of(&shared))
            .collect();
        let added = match served_everywhere(first, group).await {
            // A group some node does not serve would have no majority there.
            Err(why) => Err(ProposeError::Refused(why)),
            Ok(()) => {
                first
                    .change_cluster(ClusterChange::AddGroup { group, voters })
                    .await
            }
        };
        match added {
            Ok(_) => info!(group, "data group {group} added to the cluster"),
            Err(ProposeError::NotLeader { .. }) => {}
            Err(refused) => {
                let why = refused.to_string();
                if reported.as_ref() != Some(&why) {
                    warn!(group, cause = %why, "data group {group} cannot be added yet; trying again");
                    reported = Some(why);
                }
                tokio::select! {
                    () = shared.shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    }
}

/// How many voters each group past the first is to have (`--cluster-replicas`).
pub(crate) fn replicas_of(shared: &Shared) -> usize {
    shared
        .config
        .cluster
        .as_ref()
        .map_or(1, |settings| settings.replicas)
}

/// The voters of the first group, as this node knows them; with `reachable`, only those whose
/// last exchange with it succeeded.
fn voters(first: &Cluster, reachable: bool) -> Vec<NodeId> {
    let status = first.status();
    status
        .members
        .into_iter()
        .filter(|(id, _, votes)| *votes && !(reachable && status.unreachable.contains(id)))
        .map(|(id, _, _)| id)
        .collect()
}

/// How often a node looks at the groups' leaders to balance them.
const BALANCE_EVERY: Duration = Duration::from_secs(3);

/// How long a hand-over of a group's leadership may take.
const HAND_OVER_WITHIN: Duration = Duration::from_secs(5);

/// Balances the groups' leaders over the nodes: every few seconds, a node that leads more
/// groups than its share (the groups over the voters, rounded up) hands one of them over to
/// the voter leading the fewest, while every group has a leader. Each node decides for the
/// groups it leads, so that they converge on a spread without a coordinator.
async fn balance_leaders(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            () = tokio::time::sleep(BALANCE_EVERY) => {}
        }
        let Some(first) = shared.cluster() else {
            return;
        };
        let hosted: Vec<Arc<Cluster>> = (0..shared.shards.all().len())
            .filter_map(|shard| shared.group(shard))
            .collect();
        // The leaders of the groups this node holds no copy of, as their members name them.
        join_all(hosted.iter().map(|group| group.find_leader())).await;
        // A voter this node cannot reach (down, say) is given nothing.
        let voters = voters(first, true);
        // Each group's leader and the nodes that vote in it (a node added to the cluster votes
        // in a group once that group's leader added it; this node knows the voters of the
        // groups it holds a copy of, which are those it may hand over).
        let groups: Option<Vec<(NodeId, Vec<NodeId>)>> = hosted
            .iter()
            .map(|group| {
                let status = group.status();
                let voting = status.members.iter().filter(|(_, _, votes)| *votes);
                Some((status.leader?, voting.map(|(id, _, _)| *id).collect()))
            })
            .collect();
        let Some(groups) = groups else {
            continue;
        };
        let Some((group, to)) = hand_over(first.node_id(), &voters, &groups) else {
            continue;
        };
        let Some(cluster) = hosted.get(group) else {
            continue;
        };
        let id = cluster.group();
        match cluster.transfer_leadership(to, HAND_OVER_WITHIN).await {
            Ok(()) => info!(
                group = id,
                to, "handed the leadership of group {id} to node {to}, to balance the leaders"
            ),
            Err(cause) => {
                warn!(group = id, to, %cause, "balancing the leaders: the hand-over of group {id} failed")
            }
        }
    }
}

/// Which of the groups `node` leads to hand over and to whom, given each group's leader and
/// voters (by position) and the `voters` of the cluster: when `node` leads more than its share
/// (the groups over the voters, rounded up), one of its groups to the voter leading the fewest
/// that leads fewer than its share (the lowest id among equals), the last such group that
/// voter votes in; else to the next voter leading fewer than its share.
fn hand_over(
    node: NodeId,
    voters: &[NodeId],
    groups: &[(NodeId, Vec<NodeId>)],
) -> Option<(usize, NodeId)> {
    if voters.is_empty() {
        return None;
    }
    let share = groups.len().div_ceil(voters.len());
    let led = |id: NodeId| groups.iter().filter(|(leader, _)| *leader == id).count();
    if led(node) <= share {
        return None;
    }
    let mut takers: Vec<(usize, NodeId)> = voters
        .iter()
        .filter(|id| **id != node)
        .map(|id| (led(*id), *id))
        .filter(|(count, _)| *count < share)
        .collect();
    takers.sort_unstable();
    takers.into_iter().find_map(|(_, to)| {
        let group = groups
            .iter()
            .rposition(|(leader, voting)| *leader == node && voting.contains(&to))?;
        Some((group, to))
    })
}

/// Where a request goes in a cluster of several groups.
#[derive(Debug)]
pub(crate) enum GroupRoute {
    /// To the group of this shard.
    One(usize),
    /// Alone, through [`apply_alone`]: a create (placed by the first group's leader), a join
    /// naming a dead-letter topic not placed yet, or a description of every topic.
    Alone,
    /// Refused before anything is applied.
    Refused(ErrorReply),
}

/// Whether requests go through [`route`]: this node serves several groups, or the cluster has
/// some (a node given fewer than the cluster has serves none of the others' topics).
pub(crate) fn spread(shared: &Shared) -> bool {
    !shared.groups.is_empty()
        || shared
            .cluster()
            .is_some_and(|first| !first.cluster_state().borrow().groups.is_empty())
}

/// Whether this node's copy of where each topic lives may route requests to the first group:
/// it does not lead the first group (it forwards nothing there but `NotLeader`), or it leads it
/// and has applied every entry committed before its term.
pub(crate) fn routes_current(shared: &Shared) -> bool {
    shared.first_group_current.load(Ordering::SeqCst)
        || !shared.cluster().is_some_and(Cluster::is_leader)
}

/// Where `command` goes.
pub(crate) fn route(shared: &Shared, command: &Command) -> GroupRoute {
    let Some(first) = shared.cluster() else {
        return GroupRoute::One(0);
    };
    let state = first.cluster_state();
    let state = state.borrow();
    match command {
        Command::Create { .. } | Command::Describe { topic: None } => GroupRoute::Alone,
        Command::Join {
            topic, settings, ..
        }
        | Command::ConfigureGroup {
            topic, settings, ..
        } if dead_letter_of(settings).is_some() => {
            let dead_letter = dead_letter_of(settings).unwrap_or_default();
            let (group, elsewhere) = (state.group_of(topic), state.group_of(dead_letter));
            let placed = state.placement.contains_key(dead_letter);
            if placed && group == elsewhere {
                return GroupRoute::One(shard_of_group(group));
            }
            if !placed {
                // Not placed yet: placed in the topic's group first, by that group's leader.
                return GroupRoute::Alone;
            }
            GroupRoute::Refused(ErrorReply::InvalidArgument(format!(
                "with --cluster-data-groups, a group's dead-letter topic must be in its topic's \
                 group (a record moves to it in one step): topic {topic:?} is in group {group} \
                 and {dead_letter:?} in group {elsewhere}. Move it there first (`broker cluster \
                 move {dead_letter} --to {group}`; if it is not created yet, create it first), \
                 or name a dead-letter topic that no topic or group has taken yet (it is then \
                 placed in the topic's group)"
            )))
        }
        other => match other.topic() {
            Some(topic) => GroupRoute::One(shard_of_group(state.group_of(topic))),
            None => GroupRoute::One(0),
        },
    }
}

/// The further group holding the topic of `command`, when another node leads it: the command
/// is applied there, not here. Only a topic placed in a further group is sent on: a placement
/// never changes, so this node's copy of it is never wrong, while a topic it does not know
/// placed (the first group's, or one placed a moment ago) is left to the first group's
/// leader, whose copy is current. (A group this node does not host is not known here either:
/// the command is answered `NotLeader`, as any other.)
pub(crate) fn leader_elsewhere(shared: &Shared, command: &Command) -> Option<Arc<Cluster>> {
    if !spread(shared) {
        return None;
    }
    match route(shared, command) {
        GroupRoute::One(shard) if shard > 0 => {
            shared.group(shard).filter(|group| !group.is_leader())
        }
        GroupRoute::One(_) | GroupRoute::Alone | GroupRoute::Refused(_) => None,
    }
}

/// For a call about `topic` that the group of `shard` refused because the topic moved away
/// (each command the state machine refuses so is answered `NotLeader` alone): the client
/// address of the leader of the group this node's copy of the first group places it in now,
/// when that is another group and its leader is known. The client goes straight there.
pub(crate) fn moved_to(shared: &Shared, shard: usize, topic: &str) -> Option<String> {
    let placed = shared.cluster()?.cluster_state().borrow().group_of(topic);
    let now = shard_of_group(placed);
    if now == shard {
        return None;
    }
    let (_, leader) = shared.group(now)?.leader()?;
    Some(leader.client_addr)
}

/// The group holding `topic` as this node's copy of the first group places it (the first
/// group for a topic it does not know), when this node hosts that group; `None` for a server
/// that runs alone.
pub(crate) fn serving_group(shared: &Shared, topic: &str) -> Option<Arc<Cluster>> {
    let placed = shared.cluster()?.cluster_state().borrow().group_of(topic);
    shared.group(shard_of_group(placed))
}

/// Applies `command` at the leader of `group`, through the peer links (see
/// [`Cluster::propose_via_leader`]), and answers what applying it gave there.
pub(crate) async fn apply_at_leader(
    group: &Cluster,
    command: Command,
) -> Result<Outcome, ErrorReply> {
    let proposal = group.commands(wall_clock_ms(), vec![command]);
    match group.propose_via_leader(proposal).await {
        Ok(applied) => applied.results.into_iter().next().map_or_else(
            || {
                Err(ErrorReply::Storage(
                    "the change was not answered".to_owned(),
                ))
            },
            |result| result.map_err(ErrorReply::from),
        ),
        Err(refusal) => Err(replicated::refusal(refusal)),
    }
}

/// Where a topic held by a group other than the first is served from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicGroup {
    /// The group's leader as this node knows it (none while the group elects).
    pub(crate) leader: Option<NodeId>,
    /// The group's voters: as this node's copy of the group has them or, for a group it holds
    /// no copy of, those the group is to have (see [`replica_order`]).
    pub(crate) voters: Vec<NodeId>,
}

/// The topics held by a group other than the first, each with its group's leader and voters:
/// read from this node's copy of each group it holds one of, as the topics' descriptions
/// are, and for the other groups from the cluster's state (where each topic is placed).
pub(crate) fn topic_groups(shared: &Shared) -> BTreeMap<String, TopicGroup> {
    let Some(first) = shared.cluster() else {
        return BTreeMap::new();
    };
    let first_voters = voters(first, false);
    let replicas = replicas_of(shared);
    let of_group = |cluster: &Cluster| {
        let status = cluster.status();
        let voters = match cluster.is_member() {
            true => status
                .members
                .iter()
                .filter(|(_, _, votes)| *votes)
                .map(|(id, _, _)| *id)
                .collect(),
            false => {
                let mut voters: Vec<NodeId> = replica_order(&first_voters, cluster.group())
                    .into_iter()
                    .take(replicas)
                    .collect();
                voters.sort_unstable();
                voters
            }
        };
        TopicGroup {
            leader: status.leader,
            voters,
        }
    };
    let mut topics = BTreeMap::new();
    // The groups this node holds no copy of, whose topics are read from the placement.
    let mut elsewhere = BTreeMap::new();
    for shard in 1..shared.shards.all().len() {
        let Some(cluster) = shared.group(shard) else {
            continue;
        };
        let group = of_group(&cluster);
        match cluster.is_member() {
            true => {
                let names = shared.shards.get(shard).lock().topic_names();
                // A topic arriving by a move is named by the group it leaves until it is
                // placed here.
                let placed_here = |name: &String| {
                    first.cluster_state().borrow().group_of(name) == cluster.group()
                };
                topics.extend(
                    names
                        .into_iter()
                        .filter(placed_here)
                        .map(|name| (name, group.clone())),
                );
            }
            false => {
                elsewhere.insert(cluster.group(), group);
            }
        }
    }
    if !elsewhere.is_empty() {
        // (A deleted topic stays placed: listed here, it is looked up for the topics that
        // exist only.)
        let state = first.cluster_state();
        for (topic, placed) in &state.borrow().placement {
            if let Some(group) = elsewhere.get(placed) {
                topics.insert(topic.clone(), group.clone());
            }
        }
    }
    topics
}

/// The topics of the group of `shard` (every one, or `topic` alone), as of a moment within the
/// call: read from this node's copy after a read index from the group's leader when this node
/// holds a copy of the group, asked of the group's leader (through the peer links, one entry
/// of the group's log) when it does not.
pub(crate) async fn describe_group(
    shared: &Shared,
    shard: usize,
    topic: Option<&str>,
) -> Result<BrokerDescription, ErrorReply> {
    let Some(group) = shared.group(shard) else {
        // A group listed that this node does not host yet: as during an election.
        return Err(ErrorReply::NotLeader { leader: None });
    };
    if shard == 0 || group.is_member() {
        group
            .read_barrier_anywhere()
            .await
            .map_err(replicated::refusal)?;
        let moving = topic.is_some_and(|topic| {
            group
                .cluster_state()
                .borrow()
                .departures
                .contains_key(topic)
        });
        if moving {
            // As its state machine answers every other call about it: ask again.
            return Err(ErrorReply::NotLeader { leader: None });
        }
        return shared
            .shards
            .get(shard)
            .lock()
            .describe_topics(topic)
            .map_err(ErrorReply::from);
    }
    let describe = Command::Describe {
        topic: topic.map(str::to_owned),
    };
    match apply_at_leader(&group, describe).await? {
        Outcome::Description(description) => Ok(description),
        other => Err(ErrorReply::Storage(format!(
            "group {}'s leader answered a description with {other:?}",
            group.group()
        ))),
    }
}

/// Applies a request of [`GroupRoute::Alone`]; answers with the shard whose sessions it
/// concerns.
pub(crate) async fn apply_alone(
    shared: &Shared,
    command: Command,
) -> (usize, Result<Outcome, ErrorReply>) {
    match command {
        Command::Describe { topic: None } => {
            (0, describe_all(shared).await.map(Outcome::Description))
        }
        Command::Create { ref topic, .. } => {
            let topic = topic.clone();
            create(shared, &topic, command).await
        }
        join => place_dead_letter_then_join(shared, join).await,
    }
}

/// A description of every topic of every group, each group's part read after a read index
/// from its leader. A group the cluster's state (read after the first group's read index)
/// does not list holds no topic and is skipped; one listed that this node does not host yet
/// answers `NotLeader` without a leader, as during an election (the client asks again).
pub(crate) async fn describe_all(shared: &Shared) -> Result<BrokerDescription, ErrorReply> {
    let mut listed = BTreeSet::new();
    let mut all: Option<BrokerDescription> = None;
    for shard in 0..shared.shards.all().len() {
        if shard > 0 && !listed.contains(&group_of_shard(shard)) {
            continue;
        }
        let description = describe_group(shared, shard, None).await?;
        if let (0, Some(first)) = (shard, shared.cluster()) {
            listed = first
                .cluster_state()
                .borrow()
                .groups
                .keys()
                .copied()
                .collect();
        }
        match &mut all {
            Some(all) => all.topics.extend(description.topics),
            None => all = Some(description),
        }
    }
    let mut all = all.unwrap_or_default();
    all.topics.sort_by(|a, b| a.name.cmp(&b.name));
    // A topic moving is held by two groups for a moment, alike: listed once.
    all.topics.dedup_by(|a, b| a.name == b.name);
    Ok(all)
}

/// On the first group's leader: places `topic` (see the module's documentation), then has its
/// group's leader apply `create`.
async fn create(
    shared: &Shared,
    topic: &str,
    create: Command,
) -> (usize, Result<Outcome, ErrorReply>) {
    let Some(first) = shared.cluster() else {
        return (0, Err(ErrorReply::NotLeader { leader: None }));
    };
    let target = match target_group(shared, topic).await {
        Ok(target) => target,
        Err(refusal) => return (0, Err(refusal)),
    };
    if first.cluster_state().borrow().groups.is_empty() {
        // No other group yet: created in the first group, as in a cluster of one group (and so
        // without a first change to the cluster's state, which waits for every node).
        let results = replicated::execute(first, vec![create]).await;
        return (0, first_result(results, "create"));
    }
    let placed = match first
        .change_cluster(ClusterChange::Place {
            topic: topic.to_owned(),
            group: target,
        })
        .await
    {
        Ok(placed) => placed,
        Err(refusal) => return (0, Err(replicated::refusal(refusal))),
    };
    let shard = shard_of_group(placed);
    let Some(group) = shared.group(shard) else {
        return (shard, Err(ErrorReply::NotLeader { leader: None }));
    };
    let result = apply_at_leader(&group, create).await;
    if matches!(result, Ok(Outcome::Created(true))) {
        info!(%topic, group = placed, "topic placed");
        // This node's copy of the group takes the topic before the next placement is decided
        // from it (the group's leader may be another node).
        if let Err(cause) = group.read_barrier_anywhere().await {
            debug!(%topic, %cause, "the new topic's group did not confirm its copy here");
        }
    }
    (shard, result)
}

/// The group a new topic named `topic` goes to: where it is placed already or held, the group
/// whose consumer groups name it as their dead-letter topic, the group of the topic it is a
/// companion of, or else the group holding the fewest partitions (the lowest id among equals)
/// of those this node hosts; refused past the broker's maximum of topics. Read from this
/// node's copies (the first group's leader's, current for the first group), which is enough to
/// balance, and from the leaders of the groups it holds no copy of (a group whose leader does
/// not answer now takes no new topic).
async fn target_group(shared: &Shared, topic: &str) -> Result<GroupId, ErrorReply> {
    let (placement, listed) = match shared.cluster() {
        Some(first) => {
            let state = first.cluster_state();
            let state = state.borrow();
            let listed: BTreeSet<GroupId> = state.groups.keys().copied().collect();
            (state.placement.clone(), listed)
        }
        None => Default::default(),
    };
    if let Some(group) = placement.get(topic) {
        return Ok(*group);
    }
    let mut descriptions: Vec<BrokerDescription> = Vec::new();
    let mut unanswered = BTreeSet::new();
    for (shard, broker) in shared.shards.all().iter().enumerate() {
        let description = match shared.group(shard) {
            Some(group) if shard > 0 && !group.is_member() => describe_group(shared, shard, None)
                .await
                .unwrap_or_else(|refusal| {
                    debug!(%refusal, group = group.group(), "no description of the group now");
                    unanswered.insert(shard);
                    BrokerDescription::default()
                }),
            _ => broker.lock().describe(),
        };
        descriptions.push(description);
    }
    // Where a topic named `name` lives: placed, or held by the first group from before.
    let home_of = |name: &str| {
        placement.get(name).copied().or_else(|| {
            descriptions
                .first()
                .filter(|first| first.topics.iter().any(|held| held.name == name))
                .map(|_| FIRST_GROUP)
        })
    };
    let named_as_dead_letter = descriptions.iter().position(|description| {
        description.topics.iter().any(|held| {
            held.groups
                .iter()
                .any(|group| dead_letter_of(&group.settings) == Some(topic))
        })
    });
    let together = home_of(topic)
        .or_else(|| named_as_dead_letter.map(group_of_shard))
        .or_else(|| broker_core::companions_of(topic).find_map(home_of));
    if let Some(group) = together {
        return Ok(group);
    }
    let topics: usize = descriptions
        .iter()
        .map(|description| description.topics.len())
        .sum();
    let max = shared.config.limits.max_topics;
    if topics >= max {
        return Err(ErrorReply::InvalidArgument(format!(
            "the broker already holds its maximum of {max} topics"
        )));
    }
    // Of the groups that exist and that this node hosts.
    let serving = |shard: usize| {
        shard == 0
            || (shared.group(shard).is_some()
                && listed.contains(&group_of_shard(shard))
                && !unanswered.contains(&shard))
    };
    let least = descriptions
        .iter()
        .enumerate()
        .filter(|(shard, _)| serving(*shard))
        .map(|(shard, description)| {
            let partitions: usize = description
                .topics
                .iter()
                .map(|held| held.partitions.len())
                .sum();
            (partitions, shard)
        })
        .min();
    Ok(least.map_or(FIRST_GROUP, |(_, shard)| group_of_shard(shard)))
}

/// On the leader of the group of the topic `join` is about: places the dead-letter topic it
/// names in that group (through the first group's leader), then applies `join` there; answers
/// with the shard whose sessions it concerns. Another node answers `NotLeader`, naming that
/// group's leader.
async fn place_dead_letter_then_join(
    shared: &Shared,
    join: Command,
) -> (usize, Result<Outcome, ErrorReply>) {
    let Some(first) = shared.cluster() else {
        return (0, Err(ErrorReply::NotLeader { leader: None }));
    };
    let (Command::Join {
        settings, topic, ..
    }
    | Command::ConfigureGroup {
        settings, topic, ..
    }) = &join
    else {
        return (0, Err(ErrorReply::Storage("not a join".to_owned())));
    };
    let home = first.cluster_state().borrow().group_of(topic);
    let shard = shard_of_group(home);
    let Some(group) = shared.group(shard).filter(|group| group.is_leader()) else {
        let leader = match shared.group(shard) {
            Some(group) => group.find_leader().await,
            None => None,
        };
        return (
            shard,
            Err(replicated::refusal(ProposeError::NotLeader { leader })),
        );
    };
    let dead_letter = dead_letter_of(settings).unwrap_or_default().to_owned();
    // A join that fails for its topic reserves no name (the leader's copy is current).
    if !shared.shards.get(shard).lock().holds_topic(topic) {
        return (
            shard,
            first_result(replicated::execute(&group, vec![join]).await, "join"),
        );
    }
    let place = ClusterChange::Place {
        topic: dead_letter.clone(),
        group: home,
    };
    let placed = match home {
        // (The first change to the cluster's state checks every node's release first.)
        FIRST_GROUP => first.change_cluster(place).await,
        _ => match first.propose_via_leader(Proposal::Cluster(place)).await {
            Ok(applied) => applied.group.ok_or_else(|| {
                ProposeError::Unavailable("the placement went unanswered".to_owned())
            }),
            Err(refusal) => Err(refusal),
        },
    };
    let placed = match placed {
        Ok(placed) => placed,
        Err(refusal) => return (shard, Err(replicated::refusal(refusal))),
    };
    if placed != home {
        return (
            shard,
            Err(ErrorReply::InvalidArgument(format!(
                "with --cluster-data-groups, a group's dead-letter topic must be in its \
                 topic's group (a record moves to it in one step), and topic {topic:?} is in \
                 group {home} while {dead_letter:?} is in group {placed}: name another"
            ))),
        );
    }
    (
        shard,
        first_result(replicated::execute(&group, vec![join]).await, "join"),
    )
}

/// The result of the one command of an execution (`what` it was, for a missing answer).
fn first_result(
    results: Result<Vec<Result<Outcome, ErrorReply>>, ErrorReply>,
    what: &str,
) -> Result<Outcome, ErrorReply> {
    results?
        .into_iter()
        .next()
        .unwrap_or_else(|| Err(ErrorReply::Storage(format!("the {what} was not answered"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More replicas than nodes: every voter of the first group a voter of each group.
    const ALL: usize = 64;

    #[test]
    fn a_group_adds_the_first_groups_voters_then_drops_those_it_no_longer_has() {
        let node = |id: u64| ClusterNode::new(&format!("127.0.0.1:{id}"), "127.0.0.1:9").unwrap();
        let member = |id: u64, votes: bool| (id, node(id), votes);
        let first = [
            member(1, true),
            member(2, true),
            member(4, true),
            member(5, false),
        ];
        // Node 4 votes in the first group: added; node 5, still a learner there, not yet.
        let group = [member(1, true), member(2, true), member(3, true)];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            Some(MembershipChange::Add(4, node(4)))
        );
        // A learner of the group is made a voter the same way.
        let group = [member(1, true), member(2, true), member(4, false)];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            Some(MembershipChange::Add(4, node(4)))
        );
        // Node 3 left the first group: removed, once every voter is in.
        let group = [
            member(1, true),
            member(2, true),
            member(3, true),
            member(4, true),
        ];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            Some(MembershipChange::Remove(3))
        );
        // Node 5 is a learner of both: nothing to do.
        let group = [
            member(1, true),
            member(2, true),
            member(4, true),
            member(5, false),
        ];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            None
        );
        // Node 2 moved to other addresses: removed, to be added again at the new ones.
        let moved = ClusterNode::new("127.0.0.1:22", "127.0.0.1:9").unwrap();
        let first = [member(1, true), (2, moved.clone(), true), member(4, true)];
        let group = [member(1, true), member(2, true), member(4, true)];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            Some(MembershipChange::Remove(2))
        );
        let group = [member(1, true), member(4, true)];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            Some(MembershipChange::Add(2, moved))
        );
        // Node 4 could not be added a moment ago (it cannot host the group): node 3, gone from
        // the first group, is removed meanwhile.
        let first4 = [member(1, true), member(2, true), member(4, true)];
        let group = [member(1, true), member(2, true), member(3, true)];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first4, &group, &BTreeSet::from([4])),
            Some(MembershipChange::Remove(3))
        );
        // Node 3 replaced by node 6 at its addresses: node 3 leaves first.
        let first = [member(1, true), member(2, true), (6, node(3), true)];
        let group = [member(1, true), member(2, true), member(3, true)];
        assert_eq!(
            membership_change(2, Some(ALL), 9, &first, &group, &BTreeSet::new()),
            Some(MembershipChange::Remove(3))
        );
    }

    #[test]
    fn groups_take_their_replicas_round_robin() {
        assert_eq!(replica_order(&[3, 1, 2], 2), [1, 2, 3]);
        assert_eq!(replica_order(&[3, 1, 2], 3), [2, 3, 1]);
        assert_eq!(replica_order(&[3, 1, 2], 4), [3, 1, 2]);
        assert_eq!(replica_order(&[1, 2, 3, 4, 5], 6), [5, 1, 2, 3, 4]);
        assert_eq!(replica_order(&[], 6), Vec::<NodeId>::new());
        // Three replicas of four groups over five nodes: every node holds two or three.
        let mut held = BTreeMap::<NodeId, usize>::new();
        for group in 2..=5 {
            for node in replica_order(&[1, 2, 3, 4, 5], group).into_iter().take(3) {
                *held.entry(node).or_default() += 1;
            }
        }
        assert!(
            held.values().all(|count| (2..=3).contains(count)),
            "{held:?}"
        );
    }

    #[test]
    fn a_group_keeps_its_number_of_replicas_as_nodes_come_and_go() {
        let node = |id: u64| ClusterNode::new(&format!("127.0.0.1:{id}"), "127.0.0.1:9").unwrap();
        let member = |id: u64, votes: bool| (id, node(id), votes);
        let voters = |ids: &[u64]| ids.iter().map(|id| member(*id, true)).collect::<Vec<_>>();
        let none = BTreeSet::new();
        // Group 3 of a cluster of four (its order: 2, 3, 4, 1), three replicas, led by node 2.
        let first = voters(&[1, 2, 3, 4]);
        // Made when the cluster had three nodes: node 4 takes node 1's copy, added first...
        assert_eq!(
            membership_change(3, Some(3), 2, &first, &voters(&[1, 2, 3]), &none),
            Some(MembershipChange::Add(4, node(4)))
        );
        // ...then node 1 leaves the group.
        assert_eq!(
            membership_change(3, Some(3), 2, &first, &voters(&[1, 2, 3, 4]), &none),
            Some(MembershipChange::Remove(1))
        );
        // When node 1 leads, it hands the group over first.
        assert_eq!(
            membership_change(3, Some(3), 1, &first, &voters(&[1, 2, 3, 4]), &none),
            Some(MembershipChange::HandOver(2))
        );
        assert_eq!(
            membership_change(3, Some(3), 2, &first, &voters(&[2, 3, 4]), &none),
            None
        );
        // Node 4 cannot be added now: the group keeps the three it has meanwhile.
        assert_eq!(
            membership_change(
                3,
                Some(3),
                2,
                &first,
                &voters(&[1, 2, 3]),
                &BTreeSet::from([4])
            ),
            None
        );
        // Node 3 removed from the cluster: node 1 replaces it, then it leaves.
        let first = voters(&[1, 2, 4]);
        assert_eq!(
            membership_change(3, Some(3), 2, &first, &voters(&[2, 3, 4]), &none),
            Some(MembershipChange::Add(1, node(1)))
        );
        assert_eq!(
            membership_change(3, Some(3), 2, &first, &voters(&[1, 2, 3, 4]), &none),
            Some(MembershipChange::Remove(3))
        );
        // A learner left by an addition that did not finish is made a voter first...
        let first = voters(&[1, 2, 3, 4, 5]);
        let group = [member(1, true), member(2, true), member(5, false)];
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &group, &none),
            Some(MembershipChange::Add(5, node(5)))
        );
        // ...and given up once the group has its voters.
        let group = [
            member(1, true),
            member(2, true),
            member(3, true),
            member(5, false),
        ];
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &group, &none),
            Some(MembershipChange::Remove(5))
        );
        // Fewer replicas asked for: the last in the group's order leave, one at a time.
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &voters(&[1, 2, 3, 4, 5]), &none),
            Some(MembershipChange::Remove(5))
        );
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &voters(&[1, 2, 3, 4]), &none),
            Some(MembershipChange::Remove(4))
        );
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &voters(&[1, 2, 3]), &none),
            None
        );
        // While the nodes disagree on the number of replicas: no node is added nor given up,
        // but one gone from the cluster leaves.
        assert_eq!(
            membership_change(2, None, 1, &first, &voters(&[1, 2, 3, 4, 5]), &none),
            None
        );
        assert_eq!(
            membership_change(2, None, 1, &first, &voters(&[1, 2]), &none),
            None
        );
        assert_eq!(
            membership_change(2, None, 1, &first, &voters(&[1, 2, 6]), &none),
            Some(MembershipChange::Remove(6))
        );
        // Fewer nodes than replicas: every node.
        let first = voters(&[1, 2]);
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &voters(&[1]), &none),
            Some(MembershipChange::Add(2, node(2)))
        );
        assert_eq!(
            membership_change(2, Some(3), 1, &first, &voters(&[1, 2]), &none),
            None
        );
    }

    #[test]
    fn a_leaving_leader_hands_its_group_to_a_reachable_voter_before_it_leaves() {
        let node = |id: u64| ClusterNode::new(&format!("127.0.0.1:{id}"), "127.0.0.1:9").unwrap();
        let member = |id: u64, votes: bool| (id, node(id), votes);
        // Node 1 leaves: a learner of the first group, node 4 still catching up there.
        let first = [
            member(1, false),
            member(2, true),
            member(3, true),
            member(4, false),
        ];
        // The group as its leader, node 1, sees it: node 3 is further along than node 2.
        let status = ClusterStatus {
            node_id: 1,
            role: broker_cluster::ServerState::Leader,
            term: 1,
            leader: Some(1),
            last_log_index: Some(9),
            applied_index: Some(9),
            members: vec![
                member(1, true),
                member(2, true),
                member(3, true),
                member(4, true),
            ],
            replication: BTreeMap::from([(2, Some(7)), (3, Some(9)), (4, Some(9))]),
            unreachable: BTreeSet::new(),
        };
        let none = BTreeSet::new();
        assert_eq!(
            leaving_change(&first, &status, &none, 1),
            MembershipChange::HandOver(3)
        );
        // Node 3 cannot be reached, or did not take it before: node 2 is next.
        assert_eq!(
            leaving_change(&first, &status, &BTreeSet::from([3]), 1),
            MembershipChange::HandOver(2)
        );
        // Equally far along: the lowest id.
        let even = ClusterStatus {
            replication: BTreeMap::from([(2, Some(9)), (3, Some(9))]),
            ..status.clone()
        };
        assert_eq!(
            leaving_change(&first, &even, &none, 1),
            MembershipChange::HandOver(2)
        );
        // No voter left to take it (or the first group already forgot this node): it leaves
        // the group itself.
        assert_eq!(
            leaving_change(&first, &status, &BTreeSet::from([2, 3]), 1),
            MembershipChange::Remove(1)
        );
        assert_eq!(
            leaving_change(&[], &status, &none, 1),
            MembershipChange::Remove(1)
        );
    }

    #[test]
    fn a_node_leading_more_than_its_share_hands_one_over_to_the_least_busy() {
        // Each group's leader, every node of `voting` a voter of each.
        let led = |leaders: &[NodeId], voting: &[NodeId]| -> Vec<(NodeId, Vec<NodeId>)> {
            leaders
                .iter()
                .map(|leader| (*leader, voting.to_vec()))
                .collect()
        };
        let all = [1, 2, 3];
        // Three groups, all led by node 1: it hands its last one to node 2.
        assert_eq!(hand_over(1, &all, &led(&[1, 1, 1], &all)), Some((2, 2)));
        // Nodes 2 and 3 have nothing to hand over.
        assert_eq!(hand_over(2, &all, &led(&[1, 1, 1], &all)), None);
        // Spread already.
        assert_eq!(hand_over(1, &all, &led(&[1, 2, 3], &all)), None);
        // Four groups over three nodes: two each at most, and only to one leading fewer.
        assert_eq!(hand_over(1, &all, &led(&[1, 1, 2, 3], &all)), None);
        assert_eq!(hand_over(1, &all, &led(&[1, 1, 1, 3], &all)), Some((2, 2)));
        // More nodes than groups: a node leading two hands one to a node leading none.
        let four = [1, 2, 3, 4];
        assert_eq!(hand_over(3, &four, &led(&[3, 3], &four)), Some((1, 1)));
        assert_eq!(hand_over(3, &[], &led(&[3, 3], &four)), None);
        // Node 4, just added, votes only in the first group yet: the group node 1 leads where
        // node 4 votes goes to it; while it votes in none of them, nothing is handed over.
        let groups = vec![
            (1, vec![1, 2, 3, 4]),
            (1, vec![1, 2, 3]),
            (2, vec![1, 2, 3]),
            (3, vec![1, 2, 3]),
        ];
        assert_eq!(hand_over(1, &four, &groups), Some((0, 4)));
        let mut not_yet = groups.clone();
        not_yet[0].1.pop();
        assert_eq!(hand_over(1, &four, &not_yet), None);
        // Among several that lead fewer, the first that votes in one of its groups.
        let groups = vec![(1, vec![1, 2, 3]), (1, vec![1, 2, 4]), (1, vec![1, 2, 4])];
        assert_eq!(hand_over(1, &[1, 3, 4], &groups), Some((0, 3)));
        let groups = vec![(1, vec![1, 2]), (1, vec![1, 2, 4]), (1, vec![1, 2, 4])];
        assert_eq!(hand_over(1, &[1, 3, 4], &groups), Some((2, 4)));
    }
}
