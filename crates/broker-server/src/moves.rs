//! Moving a topic from one Raft group of a cluster to another (`MoveTopic`, `broker cluster
//! move`) while its clients go on using it.
//!
//! A move is a sequence of entries, each in the log of the group it changes, so that a leader
//! that fails at any step leaves the move where its successor finds it and carries on:
//!
//! 1. The group holding the topic commits `Depart { topic, to }`. From that entry on, its state
//!    machine refuses every call about the topic (`Moving`: clients get `NotLeader` and ask
//!    again, as during an election), so the topic holds still.
//! 2. That group's leader exports the topic (with the records it keeps on disk), has the
//!    target group's leader commit its records in pieces (`Stage`), then `Arrive { topic,
//!    image }`. A target that refuses it (it holds its most topics) makes the source commit
//!    `Stay`: the topic takes calls where it was.
//! 3. The source commits `Departed`: it drops the topic, and still refuses calls about it.
//! 4. The first group commits `Move { topic, from, to }`: every node sends the topic's calls
//!    to the target from then on.
//!
//! Every read stays linearizable: no call reaches the target before step 4, and from step 1
//! the source answers only from the state the target receives. Nothing acknowledged is lost
//! or stored twice: the image is taken after the departure, and holds the groups' offsets and
//! the idempotent producers' sequences, so a publish retried across the move is recognised.
//!
//! The records travel in pieces of at most [`PIECE_BYTES`], each an entry of the target
//! group's log (`Stage`), then the rest of the topic (`Arrive`), so that each replicates like a
//! batch of publishes; the nodes hold the topic in memory while it moves, so a topic holding
//! more than [`MAX_MOVE_BYTES`] of records is not moved.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use broker_cluster::{Cluster, ClusterChange, Departure, GroupId, Proposal, FIRST_GROUP};
use broker_core::image::{RecordImage, TopicImage};
use broker_core::{BrokerError, Outcome, MAX_MOVE_BYTES};
use broker_proto::ErrorReply;
use tracing::{info, warn};

use crate::data_groups::{describe_group, shard_of_group, spread};
use crate::replicated::refusal;
use crate::shared::Shared;

/// How long a move may take before its request is answered `Pending` (the move goes on):
/// less than a client's default request timeout (30 s), so that the client hears why.
const MOVE_WAIT: Duration = Duration::from_secs(20);

/// The most bytes of records one piece of a moving topic carries (a record larger than this
/// goes alone): small beside what one entry of a group's log may take, so that a piece
/// replicates like a batch of publishes.
const PIECE_BYTES: u64 = 256 * 1024;

/// How often a group's leader looks for moves to carry on.
const DRIVE_EVERY: Duration = Duration::from_millis(100);

/// Carries `MoveTopic` out, on any node (`first`, its first group): starts the move of `topic`
/// to group `to` (step 1), then waits until the first group places it there (the source
/// group's leader carries the move out: see [`drive`]). `Ok` once this node's copy of the
/// first group places it there (at once when it is there already).
pub(crate) async fn move_topic(
    shared: &Shared,
    first: &Cluster,
    topic: &str,
    to: GroupId,
) -> Result<(), ErrorReply> {
    if !spread(shared) {
        return Err(ErrorReply::InvalidArgument(
            "this cluster keeps every topic in one Raft group: start its nodes with \
             --cluster-data-groups N (every node the same) to spread topics over N groups, \
             which topics can then move between"
                .to_owned(),
        ));
    }
    first.read_barrier_anywhere().await.map_err(refusal)?;
    let (from, groups) = {
        let state = first.cluster_state();
        let state = state.borrow();
        let groups: Vec<GroupId> = std::iter::once(FIRST_GROUP)
            .chain(state.groups.keys().copied())
            .collect();
        (state.group_of(topic), groups)
    };
    if !groups.contains(&to) {
        let listed: Vec<String> = groups.iter().map(ToString::to_string).collect();
        return Err(ErrorReply::InvalidArgument(format!(
            "the cluster has no group {to}; its groups are {}",
            listed.join(", ")
        )));
    }
    let description = describe_group(shared, shard_of_group(from), Some(topic)).await?;
    let Some(held) = description.topics.first() else {
        return Err(ErrorReply::InvalidArgument(format!(
            "unknown topic {topic:?}"
        )));
    };
    if from == to {
        return Ok(());
    }
    if held.retained_bytes > MAX_MOVE_BYTES {
        return Err(ErrorReply::InvalidArgument(format!(
            "topic {topic:?} holds {} MiB of records, and a move holds the topic in memory, so \
             at most {} MiB: purge it (`broker purge`) or let its retention bring it under that \
             first",
            held.retained_bytes.div_ceil(1024 * 1024),
            MAX_MOVE_BYTES / (1024 * 1024)
        )));
    }
    first
        .check_moves()
        .await
        .map_err(|refused| ErrorReply::InvalidArgument(refused.to_string()))?;
    let source = shared
        .group(shard_of_group(from))
        .ok_or(ErrorReply::NotLeader { leader: None })?;
    let depart = ClusterChange::Depart {
        topic: topic.to_owned(),
        to,
    };
    let applied = source
        .propose_via_leader(Proposal::Cluster(depart))
        .await
        .map_err(refusal)?;
    if let Some(Err(refused)) = applied.results.into_iter().next() {
        return Err(ErrorReply::from(refused));
    }
    match applied.group {
        Some(going) if going == to => {}
        Some(0) | None => {
            return Err(ErrorReply::InvalidArgument(format!(
                "unknown topic {topic:?} (in group {from}, where it lived a moment ago)"
            )))
        }
        Some(going) => {
            return Err(ErrorReply::InvalidArgument(format!(
                "topic {topic:?} is moving to group {going} already; once it has, move it again"
            )))
        }
    }
    info!(%topic, from, to, "topic moving");
    if source.is_member() {
        // This node's copy then holds the departure, so that a move given up shows.
        source.read_barrier_anywhere().await.map_err(refusal)?;
    }
    wait_until_placed(shared, first, &source, topic, from, to).await
}

/// Waits until this node's copy of the first group places `topic` in `to`: `Ok` then, an
/// error when the move was given up (`source` took the topic back: seen in this node's copy
/// of it, which must have applied the departure, or asked of its leader) or still goes on
/// past [`MOVE_WAIT`].
async fn wait_until_placed(
    shared: &Shared,
    first: &Cluster,
    source: &Cluster,
    topic: &str,
    from: GroupId,
    to: GroupId,
) -> Result<(), ErrorReply> {
    let deadline = tokio::time::Instant::now() + MOVE_WAIT;
    let mut round: u64 = 0;
    loop {
        round += 1;
        if first.cluster_state().borrow().group_of(topic) == to {
            return Ok(());
        }
        let taken_back = match source.is_member() {
            true => !source
                .cluster_state()
                .borrow()
                .departures
                .contains_key(topic),
            // Asked of the group's leader now and then (an entry of its log): a topic leaving
            // is answered `NotLeader`, one that stayed is described.
            false if round % 10 == 9 => describe_group(shared, shard_of_group(from), Some(topic))
                .await
                .is_ok(),
            false => false,
        };
        if taken_back && first.cluster_state().borrow().group_of(topic) == from {
            return Err(ErrorReply::InvalidArgument(format!(
                "group {to} did not take topic {topic:?}, which stays in group {from} (the \
                 log of group {from}'s leader says why)"
            )));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ErrorReply::Pending(format!(
                "topic {topic:?} is moving from group {from} to group {to}, and has not \
                 arrived yet: meanwhile its calls are answered NotLeader (clients ask again). \
                 `broker cluster topics` shows where it is; the move goes on by itself"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// On every node, until the server shuts down: carries on the moves of the topics leaving
/// each group this node leads (steps 2 to 4 of the module's documentation), and places the
/// topics gone from them in the group they went to.
pub(crate) async fn drive(shared: Arc<Shared>) {
    // The last failure logged for each topic, so that a step failing alike is logged once.
    let mut reported: BTreeMap<String, String> = BTreeMap::new();
    // Numbers this node's sendings within a term (see `attempt`).
    let mut sendings: u32 = 0;
    loop {
        tokio::select! {
            () = shared.shutdown.cancelled() => return,
            () = tokio::time::sleep(DRIVE_EVERY) => {}
        }
        for shard in 0..shared.shards.all().len() {
            let Some(source) = shared.group(shard).filter(|group| group.is_leader()) else {
                continue;
            };
            let departures: Vec<(String, Departure)> = source
                .cluster_state()
                .borrow()
                .departures
                .iter()
                .map(|(topic, departure)| (topic.clone(), *departure))
                .collect();
            for (topic, departure) in departures {
                sendings = sendings.wrapping_add(1);
                let attempt = attempt(source.status().term, sendings);
                match carry_on(&shared, shard, &source, &topic, departure, attempt).await {
                    Ok(()) => {
                        reported.remove(&topic);
                    }
                    Err(why) => {
                        if reported.get(&topic) != Some(&why) {
                            warn!(%topic, from = source.group(), to = departure.to, cause = %why, "a move did not go on; trying again");
                            reported.insert(topic, why);
                        }
                    }
                }
            }
        }
    }
}

/// Sends `image` of `topic` to `target`, as sending `attempt` (see [`attempt`]): its records
/// in pieces of at most [`PIECE_BYTES`] (at least
/// one record each), each an entry of the target's log, then the rest of the image. `Ok(Ok)`
/// once it arrived; `Ok(Err)` when the target refused it (the topic stays where it was); an
/// error when a step is to be tried again (by a new sending, from its first piece: the topic
/// is read again then).
async fn send(
    target: &Cluster,
    topic: &str,
    attempt: u64,
    mut image: TopicImage,
) -> Result<Result<(), String>, String> {
    let to = target.group();
    let mut piece = 0;
    // Piece 0 opens the sending, even for a topic without records.
    let mut pieces: Vec<(u32, Vec<RecordImage>)> = vec![(0, Vec::new())];
    for (partition, held) in image.partitions.iter_mut().enumerate() {
        let partition = u32::try_from(partition).map_err(|_| "too many partitions")?;
        let mut current: Vec<RecordImage> = Vec::new();
        let mut bytes = 0;
        for record in std::mem::take(&mut held.records) {
            if !current.is_empty() && bytes + record.size() > PIECE_BYTES {
                pieces.push((partition, std::mem::take(&mut current)));
                bytes = 0;
            }
            bytes += record.size();
            current.push(record);
        }
        if !current.is_empty() {
            pieces.push((partition, current));
        }
    }
    for (partition, records) in pieces {
        let stage = ClusterChange::Stage {
            topic: topic.to_owned(),
            attempt,
            piece,
            partition,
            records,
        };
        let applied = target
            .propose_via_leader(Proposal::Cluster(stage))
            .await
            .map_err(|error| format!("group {to} did not answer: {error}"))?;
        match applied.results.into_iter().next() {
            // The target expects the piece after this one: a sending's first piece finds a
            // staging of its own, unless an earlier sending of the same attempt (this leader
            // before a restart in the same term, whose count of sendings started again) staged
            // pieces there, which this read may cut elsewhere: sent anew, under a later one.
            Some(Ok(Outcome::Offset(next))) if next != i64::try_from(piece + 1).unwrap_or(-1) => {
                return Err(format!(
                    "group {to} holds pieces of an earlier sending under the same attempt; \
                     sending anew"
                ))
            }
            Some(Ok(_)) => piece += 1,
            // A later sending is under way (another leader took the move over), or a piece
            // was lost: started over at the next round.
            Some(Err(_)) | None => {
                return Err(format!(
                    "group {to} did not stage piece {piece}; starting over"
                ))
            }
        }
    }
    let arrive = ClusterChange::Arrive {
        topic: topic.to_owned(),
        attempt,
        image: Box::new(image),
    };
    let applied = target
        .propose_via_leader(Proposal::Cluster(arrive))
        .await
        .map_err(|error| format!("group {to} did not answer: {error}"))?;
    match applied.results.into_iter().next() {
        Some(Ok(_)) => Ok(Ok(())),
        Some(Err(BrokerError::Moving { .. })) | None => Err(format!(
            "group {to} did not hold every piece; starting over"
        )),
        Some(Err(refused)) => Ok(Err(refused.to_string())),
    }
}

/// What a sending of a topic's records is known by in the target group (`Stage`, `Arrive`):
/// the source leader's `term` in the high half, so that a later leader's sending replaces an
/// earlier one's, and this node's count of sendings in the low half, so that two sendings of
/// one leader (the topic read again after a step failed) are never taken for one. The pieces
/// of two exports must not mix: the second may cut them elsewhere, or hold fewer records
/// (expired meanwhile).
fn attempt(term: u64, sendings: u32) -> u64 {
    (term << 32) | u64::from(sendings)
}

/// Carries the move of `topic` out of the group of `shard` (`source`, which this node leads)
/// one step further, or to its end, sending its records as `attempt`; an error (a step to try
/// again) saying why not.
async fn carry_on(
    shared: &Shared,
    shard: usize,
    source: &Cluster,
    topic: &str,
    departure: Departure,
    attempt: u64,
) -> Result<(), String> {
    let first = shared.cluster().ok_or("this node is shutting down")?;
    let (from, to) = (source.group(), departure.to);
    if !departure.gone {
        // The group's other topics are served meanwhile: its records on disk (up to
        // MAX_MOVE_BYTES) are read without the shard's lock, and off the runtime's threads.
        let export = shared.shards.get(shard).lock().begin_export(topic);
        let image = tokio::task::spawn_blocking(move || export?.read())
            .await
            .map_err(|error| format!("reading the topic stopped: {error}"))?
            .map_err(|error| format!("the topic cannot be read: {error}"))?;
        let bytes: u64 = image
            .partitions
            .iter()
            .map(|partition| partition.retained_bytes)
            .sum();
        let target = shared
            .group(shard_of_group(to))
            .ok_or_else(|| format!("this node does not host group {to} yet"))?;
        let taken = match bytes > MAX_MOVE_BYTES {
            true => Err(format!(
                "it holds {bytes} bytes of records, more than a move takes ({MAX_MOVE_BYTES})"
            )),
            false => {
                // The arrival carries this release's state image: not proposed while a node
                // runs an earlier release, which could not read it (a move that such a release
                // began, or that one upgraded meanwhile, waits for the upgrade to finish).
                first
                    .check_moves()
                    .await
                    .map_err(|refusal| format!("group {to} cannot take it yet: {refusal}"))?;
                send(&target, topic, attempt, image).await?
            }
        };
        let next = match taken {
            Ok(()) => ClusterChange::Departed {
                topic: topic.to_owned(),
            },
            Err(why) => {
                warn!(%topic, from, to, cause = %why, "group {to} did not take topic {topic:?}, which stays in group {from}");
                ClusterChange::Stay {
                    topic: topic.to_owned(),
                }
            }
        };
        let stays = matches!(next, ClusterChange::Stay { .. });
        source
            .propose(Proposal::Cluster(next))
            .await
            .map_err(|error| format!("group {from} did not commit the step: {error}"))?;
        if stays {
            return Ok(());
        }
    }
    if first.cluster_state().borrow().group_of(topic) != from {
        return Ok(());
    }
    let placed = ClusterChange::Move {
        topic: topic.to_owned(),
        from,
        to,
    };
    first
        .propose_via_leader(Proposal::Cluster(placed))
        .await
        .map_err(|error| format!("the first group did not place it: {error}"))?;
    info!(%topic, from, to, "topic moved from group {from} to group {to}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use broker_cluster::ClusterState;
    use broker_core::image::RecordImage;

    use super::attempt;

    fn record(payload: &'static str) -> RecordImage {
        RecordImage {
            key: None,
            payload: payload.into(),
            headers: Vec::new(),
            timestamp_ms: 1,
        }
    }

    /// A leader that reads a topic again after a failed step sends it as a new sending, which
    /// the target stages from its first piece on, never beside pieces of the earlier read (cut
    /// elsewhere, or holding records expired since); a later leader's sending replaces both.
    #[test]
    fn every_sending_stages_alone() {
        let mut state = ClusterState::default();
        let staged = |state: &ClusterState| state.arrivals["t"].partitions.clone();
        let (first, second, later) = (attempt(5, 1), attempt(5, 2), attempt(6, 0));
        state.stage("t", first, 0, 0, Vec::new());
        state.stage("t", first, 1, 0, vec![record("old 0"), record("old 1")]);
        // The second sending cuts its pieces elsewhere: none of the first's stays.
        state.stage("t", second, 0, 0, Vec::new());
        state.stage("t", second, 1, 0, vec![record("old 1")]);
        assert_eq!(staged(&state), vec![vec![record("old 1")]]);
        // A piece of the first sending, late, is refused.
        state.stage("t", first, 2, 0, vec![record("late")]);
        assert_eq!(staged(&state), vec![vec![record("old 1")]]);
        state.stage("t", later, 0, 0, Vec::new());
        state.stage("t", later, 1, 0, vec![record("new")]);
        state.stage("t", second, 2, 0, vec![record("deposed")]);
        assert_eq!(staged(&state), vec![vec![record("new")]]);
        assert_eq!(state.arrivals["t"].attempt, later);
    }
}
