//! Consumer liveness (seed 001, "a consumer crashes"): which members joined through which
//! connection and when a request last named them. A reaper removes members silent for the
//! session timeout with a normal core `leave`, so their partitions rebalance to the others.
//!
//! Lock order: the sessions mutex is only ever taken inside the broker's lock
//! (`EventBroker::with_state`), so a session and the membership it mirrors change together.

use std::hash::RandomState;
use std::sync::Arc;

use broker_core::{BrokerDescription, Command};
use hashbrown::hash_map::Entry;
use hashbrown::{Equivalent, HashMap};
use tokio::time::{self, Instant, MissedTickBehavior};
use tracing::{info, warn};

use crate::durability::apply_logged;
use crate::server::Shared;

/// Identifies a member: the topic, the group and the member id.
///
/// Its hash is [`MemberRef`]'s (both derive `Hash` over the same three strings, in order), so
/// a session is found by a `MemberRef` borrowed from a request, without copying the names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MemberKey {
    topic: String,
    group: String,
    member: String,
}

impl MemberKey {
    /// The key, borrowed.
    pub(crate) fn as_ref(&self) -> MemberRef<'_> {
        MemberRef {
            topic: &self.topic,
            group: &self.group,
            member: &self.member,
        }
    }
}

/// A member as a request names it, borrowed from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct MemberRef<'a> {
    topic: &'a str,
    group: &'a str,
    member: &'a str,
}

impl<'a> MemberRef<'a> {
    /// The member a command names, if it names one.
    pub(crate) fn of(command: &'a Command) -> Option<MemberRef<'a>> {
        let (topic, group, member) = match command {
            Command::Join {
                topic,
                group,
                member,
                ..
            }
            | Command::Leave {
                topic,
                group,
                member,
            }
            | Command::Poll {
                topic,
                group,
                member,
                ..
            }
            | Command::Ack {
                topic,
                group,
                member,
                ..
            }
            | Command::AckAndPoll {
                topic,
                group,
                member,
                ..
            }
            | Command::Redeliver {
                topic,
                group,
                member,
                ..
            }
            | Command::Retry {
                topic,
                group,
                member,
                ..
            }
            | Command::Fetch {
                topic,
                group,
                member,
                ..
            }
            | Command::Commit {
                topic,
                group,
                member,
                ..
            }
            | Command::Assignment {
                topic,
                group,
                member,
            } => (topic, group, member),
            _ => return None,
        };
        Some(MemberRef {
            topic,
            group,
            member,
        })
    }

    /// An owned key for the same member.
    pub(crate) fn to_key(self) -> MemberKey {
        MemberKey {
            topic: self.topic.to_owned(),
            group: self.group.to_owned(),
            member: self.member.to_owned(),
        }
    }
}

impl Equivalent<MemberKey> for MemberRef<'_> {
    fn equivalent(&self, key: &MemberKey) -> bool {
        *self == key.as_ref()
    }
}

#[derive(Debug)]
struct Session {
    /// Tells this session apart from an earlier or later one of the same member (which left
    /// and joined again): a parked request only ever counts for the session that parked it.
    generation: u64,
    /// The connection the member last joined through.
    connection: u64,
    /// When a request last named the member.
    last_seen: Instant,
    /// Waiting requests of this session now parked; a member with one is never expired.
    parked: usize,
    /// Its connection closed with `--leave-on-disconnect`, but the leave could not be applied
    /// yet (the log refused it): the reaper removes it at its next tick, timeout or not.
    disconnected: bool,
}

/// A parked request's claim on the session of the member it names: released exactly once, and
/// only on that session.
#[derive(Debug)]
pub(crate) struct ParkedIn {
    key: MemberKey,
    generation: u64,
}

/// Every member joined over a connection and not yet gone.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    // hashbrown's map for lookups by `MemberRef`; std's `RandomState` (SipHash with random
    // keys), as std's map, because clients choose the names.
    members: HashMap<MemberKey, Session, RandomState>,
    /// The generation of the newest session.
    next_generation: u64,
}

impl Sessions {
    /// `key` joined (or joined again) through `connection`.
    pub(crate) fn joined(&mut self, key: MemberKey, connection: u64, now: Instant) {
        let session = match self.members.entry(key) {
            Entry::Occupied(existing) => existing.into_mut(),
            Entry::Vacant(vacant) => {
                self.next_generation += 1;
                vacant.insert(Session {
                    generation: self.next_generation,
                    connection,
                    last_seen: now,
                    parked: 0,
                    disconnected: false,
                })
            }
        };
        session.connection = connection;
        session.last_seen = now;
        session.disconnected = false;
    }

    /// `key` left by itself.
    pub(crate) fn left(&mut self, key: MemberRef<'_>) {
        self.members.remove(&key);
    }

    /// A request named `key`.
    pub(crate) fn touch(&mut self, key: MemberRef<'_>, now: Instant) {
        if let Some(session) = self.members.get_mut(&key) {
            session.last_seen = now;
        }
    }

    /// A waiting request of `key` was parked: while it waits, the member is never expired.
    /// `None` when `key` has no session (the request protects nothing).
    pub(crate) fn park(&mut self, key: MemberRef<'_>) -> Option<ParkedIn> {
        let session = self.members.get_mut(&key)?;
        session.parked += 1;
        Some(ParkedIn {
            key: key.to_key(),
            generation: session.generation,
        })
    }

    /// The waiting request that `parked` was taken for finished waiting. Counts only if the
    /// session is still the one it parked in: a member that left and joined again while it
    /// waited has a new session, which that request never protected.
    pub(crate) fn unpark(&mut self, parked: ParkedIn, now: Instant) {
        if let Some(session) = self.members.get_mut(&parked.key.as_ref()) {
            if session.generation == parked.generation {
                session.parked = session.parked.saturating_sub(1);
                session.last_seen = now;
            }
        }
    }

    /// The members silent for `timeout` with nothing parked, and those whose connection closed
    /// with `--leave-on-disconnect` before their leave could be applied.
    fn expired(&self, now: Instant, timeout: time::Duration) -> Vec<MemberKey> {
        self.keys_where(|session| {
            session.disconnected
                || (session.parked == 0 && now.duration_since(session.last_seen) >= timeout)
        })
    }

    /// The members last joined through `connection`.
    fn joined_through(&self, connection: u64) -> Vec<MemberKey> {
        self.keys_where(|session| session.connection == connection)
    }

    fn keys_where(&self, mut gone: impl FnMut(&Session) -> bool) -> Vec<MemberKey> {
        self.members
            .iter()
            .filter(|(_, session)| gone(session))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Forgets `key`'s session: its leave was applied.
    fn forget(&mut self, key: &MemberKey) {
        self.members.remove(key);
    }

    /// `key`'s connection closed but its leave could not be applied: the reaper tries again.
    fn mark_disconnected(&mut self, key: &MemberKey) {
        if let Some(session) = self.members.get_mut(key) {
            session.disconnected = true;
        }
    }
}

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
        remove(&shared, Removal::Expired, |sessions| {
            sessions.expired(now, timeout)
        });
    }
}

/// Removes the members joined through `connection` (with `leave_on_disconnect`).
pub(crate) fn disconnect(shared: &Shared, connection: u64) {
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

/// Leaves, in the core, every member `select` names, then wakes the waiters of their topics: a
/// rebalance can make records eligible for the remaining members. A session is forgotten only
/// once its leave was applied: a leave the log refuses (a full disk) keeps the session, with
/// its last-seen time, so that the next tick tries again.
fn remove(shared: &Shared, why: Removal, select: impl FnOnce(&Sessions) -> Vec<MemberKey>) {
    let topics = shared.broker.with_state(|state| {
        let journal = shared.journal.as_ref();
        let mut sessions = shared.lock_sessions();
        let gone = select(&sessions);
        let mut topics: Vec<String> = Vec::new();
        let mut removed = 0;
        // While the log refuses entries every leave would fail: skip straight to retrying.
        if journal.is_none_or(|journal| journal.check_writable().is_ok()) {
            for key in &gone {
                let leave = Command::Leave {
                    topic: key.topic.clone(),
                    group: key.group.clone(),
                    member: key.member.clone(),
                };
                if let Err(cause) = apply_logged(state, journal, leave).0 {
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
                info!(
                    topic = %key.topic,
                    group = %key.group,
                    member = %key.member,
                    reason = match why {
                        Removal::Expired => "session timed out",
                        Removal::Disconnected => "connection closed",
                    },
                    "member removed"
                );
                sessions.forget(key);
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
                sessions.mark_disconnected(key);
            }
        }
        topics
    });
    shared.signals.wake(&topics);
}

/// Gives every member of a recovered broker a fresh session, as if it had just joined (through
/// no connection): a member whose consumer is gone is removed a session timeout after the start.
pub(crate) fn restore(shared: &Shared, description: &BrokerDescription) {
    shared.broker.with_state(|_| {
        let mut sessions = shared.lock_sessions();
        let now = Instant::now();
        for topic in &description.topics {
            for group in &topic.groups {
                for member in &group.members {
                    let key = MemberKey {
                        topic: topic.name.clone(),
                        group: group.name.clone(),
                        member: member.member.clone(),
                    };
                    // Connection ids start at 1, so no connection's close removes these.
                    sessions.joined(key, 0, now);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key_of(command: &Command) -> Option<MemberKey> {
        MemberRef::of(command).map(MemberRef::to_key)
    }

    fn poll(topic: &str, group: &str, member: &str) -> Command {
        Command::Poll {
            topic: topic.to_owned(),
            group: group.to_owned(),
            member: member.to_owned(),
            max_records: 1,
            max_bytes: None,
        }
    }

    #[test]
    fn a_session_is_found_by_the_names_a_request_borrows() {
        let start = Instant::now();
        let mut sessions = Sessions::default();
        let joined = poll("t", "g", "m");
        sessions.joined(key_of(&joined).unwrap(), 7, start);
        let later = start + Duration::from_secs(5);
        let request = poll("t", "g", "m");
        let named = MemberRef::of(&request).unwrap();
        let parked = sessions.park(named).unwrap();
        // Parked: never expired, however long it is silent.
        assert!(sessions.expired(later, Duration::from_secs(1)).is_empty());
        sessions.unpark(parked, later);
        sessions.touch(named, later);
        assert!(sessions.expired(later, Duration::from_secs(1)).is_empty());
        // Names that differ anywhere are another member.
        for other in [
            poll("t", "g", "m2"),
            poll("t", "g2", "m"),
            poll("t2", "g", "m"),
        ] {
            sessions.left(MemberRef::of(&other).unwrap());
        }
        assert_eq!(sessions.joined_through(7), vec![key_of(&joined).unwrap()]);
        assert!(MemberRef::of(&Command::Describe { topic: None }).is_none());
    }

    #[test]
    fn a_request_parked_before_a_rejoin_does_not_count_for_the_new_session() {
        let start = Instant::now();
        let timeout = Duration::from_secs(2);
        let mut sessions = Sessions::default();
        let request = poll("t", "g", "m");
        let key = key_of(&request).unwrap();
        sessions.joined(key.clone(), 1, start);
        let first = sessions.park(key.as_ref()).unwrap();
        // The member leaves and joins again while its first poll is still parked.
        sessions.left(key.as_ref());
        sessions.joined(key.clone(), 1, start);
        let _second = sessions.park(key.as_ref()).unwrap();
        // The first poll finishes: the second is still parked and still protects the member.
        sessions.unpark(first, start);
        let much_later = start + 10 * timeout;
        assert!(sessions.expired(much_later, timeout).is_empty());
    }

    #[test]
    fn a_repeated_join_keeps_the_session_and_its_parked_requests() {
        let start = Instant::now();
        let timeout = Duration::from_secs(2);
        let mut sessions = Sessions::default();
        let key = key_of(&poll("t", "g", "m")).unwrap();
        sessions.joined(key.clone(), 1, start);
        let parked = sessions.park(key.as_ref()).unwrap();
        sessions.joined(key.clone(), 2, start);
        assert!(sessions.expired(start + 10 * timeout, timeout).is_empty());
        sessions.unpark(parked, start);
        assert_eq!(sessions.expired(start + 10 * timeout, timeout), vec![key]);
    }

    #[test]
    fn expiry_selects_without_forgetting() {
        let start = Instant::now();
        let timeout = Duration::from_secs(1);
        let mut sessions = Sessions::default();
        let key = key_of(&poll("t", "g", "m")).unwrap();
        sessions.joined(key.clone(), 3, start);
        let later = start + timeout;
        // Until its leave is applied the session stays, and is selected again next time.
        assert_eq!(sessions.expired(later, timeout), vec![key.clone()]);
        assert_eq!(sessions.expired(later, timeout), vec![key.clone()]);
        sessions.forget(&key);
        assert!(sessions.expired(later, timeout).is_empty());
    }

    #[test]
    fn a_disconnected_member_whose_leave_failed_is_removed_at_the_next_tick() {
        let start = Instant::now();
        let timeout = Duration::from_secs(30);
        let mut sessions = Sessions::default();
        let key = key_of(&poll("t", "g", "m")).unwrap();
        sessions.joined(key.clone(), 3, start);
        assert!(sessions.expired(start, timeout).is_empty());
        sessions.mark_disconnected(&key);
        assert_eq!(sessions.expired(start, timeout), vec![key.clone()]);
        // Joining again (through a live connection) makes it an ordinary session again.
        sessions.joined(key.clone(), 4, start);
        assert!(sessions.expired(start, timeout).is_empty());
    }
}
