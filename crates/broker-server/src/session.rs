//! Consumer liveness (seed 001, "a consumer crashes"): which members joined through which
//! connection and when a request last named them. A reaper removes members silent for the
//! session timeout with a normal core `leave`, so their partitions rebalance to the others.
//!
//! Lock order: the sessions mutex is only ever taken inside the broker's lock
//! (`EventBroker::with_state`), so a session and the membership it mirrors change together.

use std::hash::RandomState;
use std::sync::Arc;

use broker_core::{BrokerDescription, BrokerState, Command};
use hashbrown::{Equivalent, HashMap};
use tokio::time::{self, Instant, MissedTickBehavior};
use tracing::{info, warn};

use crate::durability::{apply_logged, Journal};
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
    /// The member a command names, if it names one.
    pub(crate) fn of(command: &Command) -> Option<MemberKey> {
        MemberRef::of(command).map(MemberRef::to_key)
    }

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
    /// The connection the member last joined through.
    connection: u64,
    /// When a request last named the member.
    last_seen: Instant,
    /// Waiting requests of the member now parked; a member with one is never expired.
    parked: usize,
}

/// Every member joined over a connection and not yet gone.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    // hashbrown's map for lookups by `MemberRef`; std's `RandomState` (SipHash with random
    // keys), as std's map, because clients choose the names.
    members: HashMap<MemberKey, Session, RandomState>,
}

impl Sessions {
    /// `key` joined (or joined again) through `connection`.
    pub(crate) fn joined(&mut self, key: MemberKey, connection: u64, now: Instant) {
        let session = self.members.entry(key).or_insert(Session {
            connection,
            last_seen: now,
            parked: 0,
        });
        session.connection = connection;
        session.last_seen = now;
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

    /// A waiting request of `key` was parked.
    pub(crate) fn park(&mut self, key: MemberRef<'_>) {
        if let Some(session) = self.members.get_mut(&key) {
            session.parked += 1;
        }
    }

    /// A waiting request of `key` finished waiting.
    pub(crate) fn unpark(&mut self, key: MemberRef<'_>, now: Instant) {
        if let Some(session) = self.members.get_mut(&key) {
            session.parked = session.parked.saturating_sub(1);
            session.last_seen = now;
        }
    }

    /// Removes and returns the members silent for `timeout` with nothing parked.
    fn expire(&mut self, now: Instant, timeout: time::Duration) -> Vec<MemberKey> {
        self.remove_where(|session| {
            session.parked == 0 && now.duration_since(session.last_seen) >= timeout
        })
    }

    /// Removes and returns the members last joined through `connection`.
    fn disconnect(&mut self, connection: u64) -> Vec<MemberKey> {
        self.remove_where(|session| session.connection == connection)
    }

    fn remove_where(&mut self, mut gone: impl FnMut(&Session) -> bool) -> Vec<MemberKey> {
        let keys: Vec<MemberKey> = self
            .members
            .iter()
            .filter(|(_, session)| gone(session))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &keys {
            self.members.remove(key);
        }
        keys
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
        remove(&shared, "session timed out", |sessions| {
            sessions.expire(now, timeout)
        });
    }
}

/// Removes the members joined through `connection` (with `leave_on_disconnect`).
pub(crate) fn disconnect(shared: &Shared, connection: u64) {
    remove(shared, "connection closed", |sessions| {
        sessions.disconnect(connection)
    });
}

/// Leaves, in the core, every member `select` removes from the sessions, then wakes the waiters
/// of their topics: a rebalance can make records eligible for the remaining members.
fn remove(shared: &Shared, why: &str, select: impl FnOnce(&mut Sessions) -> Vec<MemberKey>) {
    let topics = shared.broker.with_state(|state| {
        let journal = shared.journal.as_ref();
        if journal.is_some_and(|journal| journal.check_writable().is_err()) {
            // A leave that cannot be logged must not happen: try again at the next tick.
            return Vec::new();
        }
        let gone = select(&mut shared.lock_sessions());
        leave_all(state, journal, &gone, why)
    });
    shared.signals.wake(&topics);
}

fn leave_all(
    state: &mut BrokerState,
    journal: Option<&Journal>,
    gone: &[MemberKey],
    why: &str,
) -> Vec<String> {
    let mut topics: Vec<String> = Vec::new();
    for key in gone {
        let leave = Command::Leave {
            topic: key.topic.clone(),
            group: key.group.clone(),
            member: key.member.clone(),
        };
        match apply_logged(state, journal, leave).0 {
            Ok(_) => info!(
                topic = %key.topic,
                group = %key.group,
                member = %key.member,
                reason = why,
                "member removed"
            ),
            Err(cause) => warn!(
                topic = %key.topic,
                group = %key.group,
                member = %key.member,
                cause = %cause,
                "removing a member failed"
            ),
        }
        if !topics.contains(&key.topic) {
            topics.push(key.topic.clone());
        }
    }
    topics
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
        sessions.joined(MemberKey::of(&joined).unwrap(), 7, start);
        let later = start + Duration::from_secs(5);
        let request = poll("t", "g", "m");
        let named = MemberRef::of(&request).unwrap();
        sessions.park(named);
        // Parked: never expired, however long it is silent.
        assert!(sessions.expire(later, Duration::from_secs(1)).is_empty());
        sessions.unpark(named, later);
        sessions.touch(named, later);
        assert!(sessions.expire(later, Duration::from_secs(1)).is_empty());
        // Names that differ anywhere are another member.
        for other in [
            poll("t", "g", "m2"),
            poll("t", "g2", "m"),
            poll("t2", "g", "m"),
        ] {
            sessions.left(MemberRef::of(&other).unwrap());
        }
        assert_eq!(
            sessions.disconnect(7),
            vec![MemberKey::of(&joined).unwrap()]
        );
        assert!(MemberRef::of(&Command::Describe { topic: None }).is_none());
    }
}
