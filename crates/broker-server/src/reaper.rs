//! Removing members whose consumer is gone: those silent for the session timeout, and (with
//! `--leave-on-disconnect`) those whose connection closed. A removal is a normal core `leave`,
//! logged like any other, so the member's partitions rebalance to the others and the waiters of
//! the topic are woken.

use std::sync::Arc;

use broker_cluster::Cluster;
use broker_proto::ErrorReply;
use tokio::time::{self, Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::replicated;
use crate::sessions::{MemberKey, Sessions};
use crate::shared::Shared;

/// Removes members silent for the session timeout, every quarter of it, until shutdown.
pub(crate) async fn reap(shared: Arc<Shared>) {
    let period = (shared.config.session_timeout / 4).max(time::Duration::from_millis(1));
    let mut ticks = time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let now = Instant::now();
        let timeout = shared.config.session_timeout;
        match shared.cluster() {
            Some(_) => {
                // The groups at once: one that cannot commit does not hold back the others.
                let removals = (0..shared.shards.all().len()).filter_map(|shard| {
                    let group = shared.group(shard)?;
                    let gone = shared
                        .shards
                        .get(shard)
                        .lock()
                        .sessions()
                        .expired(now, timeout);
                    let shared = &shared;
                    Some(async move {
                        remove_replicated(shared, (shard, &group), gone, Removal::Expired).await;
                    })
                });
                futures::future::join_all(removals).await;
            }
            None => remove(&shared, Removal::Expired, |sessions| {
                sessions.expired(now, timeout)
            }),
        }
    }
}

/// Removes the members joined through `connection` (with `--leave-on-disconnect`). In a
/// cluster their leaves are proposed by the next session check (within a quarter of the
/// session timeout).
pub(crate) fn disconnect(shared: &Shared, connection: u64) {
    if shared.cluster().is_some() {
        for broker in shared.shards.all() {
            let mut broker = broker.lock();
            for key in broker.sessions().joined_through(connection) {
                broker.sessions().mark_disconnected(&key);
            }
        }
        return;
    }
    remove(shared, Removal::Disconnected, |sessions| {
        sessions.joined_through(connection)
    });
}

/// Why members are being removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Removal {
    /// Their session timed out (or an earlier disconnect's leave failed).
    Expired,
    /// Their connection closed, with `--leave-on-disconnect`.
    Disconnected,
}

/// Leaves, in the core, every member `select` names among each shard's sessions, then wakes the
/// waiters of their topics: a rebalance can make records eligible for the remaining members. A
/// session is forgotten only once its leave was applied: a leave the log refuses (a full disk)
/// keeps the session, with its last-seen time, so that the next tick tries again.
fn remove(shared: &Shared, why: Removal, select: impl Fn(&Sessions) -> Vec<MemberKey>) {
    for broker in shared.shards.all() {
        let mut broker = broker.lock();
        let gone = select(broker.sessions());
        if gone.is_empty() {
            continue;
        }
        let mut topics: Vec<String> = Vec::new();
        let mut removed = 0;
        // While the log refuses entries every leave would fail: skip straight to retrying.
        if broker.is_writable() {
            for key in &gone {
                match broker.apply(key.leave(), &mut topics).result {
                    Err(ErrorReply::Storage(cause)) => {
                        // The log stopped taking entries, and then refuses every one.
                        warn!(
                            topic = %key.topic,
                            group = %key.group,
                            member = %key.member,
                            cause = %cause,
                            "removing a member failed; trying again at the next session check"
                        );
                        break;
                    }
                    result => report_removal(shared, key, why, result.err()),
                }
                broker.sessions().forget(key);
                removed += 1;
                if !topics.contains(&key.topic) {
                    topics.push(key.topic.clone());
                }
            }
        }
        // The members not removed keep their sessions, so the next tick tries again; those of
        // a closed connection are tried again at the next tick, timed out or not.
        if why == Removal::Disconnected {
            for key in &gone[removed..] {
                broker.sessions().mark_disconnected(key);
            }
        }
        drop(broker);
        shared.signals.wake(&topics);
    }
}

/// Logs the removal of `key` (and counts an expiry), or, with `refusal`, that the broker
/// refused it (its topic is gone, say): the member is gone with it, so its session goes too.
fn report_removal(shared: &Shared, key: &MemberKey, why: Removal, refusal: Option<ErrorReply>) {
    match refusal {
        None => {
            info!(
                topic = %key.topic,
                group = %key.group,
                member = %key.member,
                reason = match why {
                    Removal::Expired => "session timed out",
                    Removal::Disconnected => "connection closed",
                },
                "member removed by the server"
            );
            if let (Removal::Expired, Some(metrics)) = (why, &shared.metrics) {
                metrics.sessions_expired(1);
            }
        }
        Some(cause) => warn!(
            topic = %key.topic,
            group = %key.group,
            member = %key.member,
            cause = %cause,
            "the broker refused to remove a member; forgetting its session"
        ),
    }
}

/// In a cluster, on the leader of the group of `shard`: removes the members in `gone` (their
/// session expired, or their connection closed with `--leave-on-disconnect`) with one proposal
/// of their leaves. Their sessions are forgotten once their leaves are applied (or refused by
/// the broker); when nothing was applied they stay, and the next check tries again.
async fn remove_replicated(
    shared: &Shared,
    (shard, cluster): (usize, &Cluster),
    gone: Vec<MemberKey>,
    why: Removal,
) {
    if gone.is_empty() || !cluster.is_leader() {
        return;
    }
    let leaves = gone.iter().map(MemberKey::leave).collect();
    match replicated::execute(cluster, leaves).await {
        Ok(results) => {
            let mut broker = shared.shards.get(shard).lock();
            for (key, result) in gone.iter().zip(results) {
                report_removal(shared, key, why, result.err());
                broker.sessions().forget(key);
            }
        }
        Err(refusal) => {
            debug!(%refusal, "removing members was not replicated; trying again at the next check");
        }
    }
}
