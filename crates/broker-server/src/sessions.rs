//! Consumer liveness: which members joined through which connection and when a request last
//! named them, so that a member whose consumer crashed is removed after the session timeout
//! (and, with `--leave-on-disconnect`, when its connection closes). This module only keeps the
//! books; the reaper (`reaper`) applies the leaves.
//!
//! The sessions live beside the broker's state under its one lock (`broker::Locked`), so a
//! session and the membership it mirrors always change together.

use std::hash::RandomState;

use broker_core::{Command, MemberName};
use hashbrown::hash_map::Entry;
use hashbrown::{Equivalent, HashMap};
use tokio::time::{self, Instant};

/// Identifies a member: the topic, the group and the member id.
///
/// Its hash is [`MemberName`]'s (both derive `Hash` over the same three strings, in order), so
/// a session is found by a `MemberName` borrowed from a request, without copying the names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct MemberKey {
    pub(crate) topic: String,
    pub(crate) group: String,
    pub(crate) member: String,
}

impl MemberKey {
    /// An owned key for `name`.
    pub(crate) fn of(name: MemberName<'_>) -> MemberKey {
        MemberKey {
            topic: name.topic.to_owned(),
            group: name.group.to_owned(),
            member: name.member.to_owned(),
        }
    }

    /// The command that removes the member.
    pub(crate) fn leave(&self) -> Command {
        Command::Leave {
            topic: self.topic.clone(),
            group: self.group.clone(),
            member: self.member.clone(),
        }
    }

    /// The key, borrowed.
    pub(crate) fn as_name(&self) -> MemberName<'_> {
        MemberName {
            topic: &self.topic,
            group: &self.group,
            member: &self.member,
        }
    }
}

impl Equivalent<MemberKey> for MemberName<'_> {
    fn equivalent(&self, key: &MemberKey) -> bool {
        *self == key.as_name()
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
    // hashbrown's map for lookups by `MemberName`; std's `RandomState` (SipHash with random
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
    pub(crate) fn left(&mut self, key: MemberName<'_>) {
        self.members.remove(&key);
    }

    /// A request named `key`.
    pub(crate) fn touch(&mut self, key: MemberName<'_>, now: Instant) {
        if let Some(session) = self.members.get_mut(&key) {
            session.last_seen = now;
        }
    }

    /// A waiting request of `key` was parked: while it waits, the member is never expired.
    /// `None` when `key` has no session (the request protects nothing).
    pub(crate) fn park(&mut self, key: MemberName<'_>) -> Option<ParkedIn> {
        let session = self.members.get_mut(&key)?;
        session.parked += 1;
        Some(ParkedIn {
            key: MemberKey::of(key),
            generation: session.generation,
        })
    }

    /// The waiting request that `parked` was taken for finished waiting. Counts only if the
    /// session is still the one it parked in: a member that left and joined again while it
    /// waited has a new session, which that request never protected.
    pub(crate) fn unpark(&mut self, parked: ParkedIn, now: Instant) {
        if let Some(session) = self.members.get_mut(&parked.key.as_name()) {
            if session.generation == parked.generation {
                session.parked = session.parked.saturating_sub(1);
                session.last_seen = now;
            }
        }
    }

    /// The members silent for `timeout` with nothing parked, and those whose connection closed
    /// with `--leave-on-disconnect` before their leave could be applied.
    pub(crate) fn expired(&self, now: Instant, timeout: time::Duration) -> Vec<MemberKey> {
        self.keys_where(|session| {
            session.disconnected
                || (session.parked == 0 && now.duration_since(session.last_seen) >= timeout)
        })
    }

    /// The members last joined through `connection`.
    pub(crate) fn joined_through(&self, connection: u64) -> Vec<MemberKey> {
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
    pub(crate) fn forget(&mut self, key: &MemberKey) {
        self.members.remove(key);
    }

    /// Forgets the sessions of `topic`'s members: the topic was deleted, and its groups with it.
    pub(crate) fn forget_topic(&mut self, topic: &str) {
        self.retain(|key| key.topic != topic);
    }

    /// Keeps only the sessions of the members `keep` says are still members.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&MemberKey) -> bool) {
        self.members.retain(|key, _| keep(key));
    }

    /// `key`'s connection closed but its leave could not be applied: the reaper tries again.
    pub(crate) fn mark_disconnected(&mut self, key: &MemberKey) {
        if let Some(session) = self.members.get_mut(key) {
            session.disconnected = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use broker_core::Command;

    use super::*;

    fn key_of(command: &Command) -> Option<MemberKey> {
        command.member().map(MemberKey::of)
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
        let named = request.member().unwrap();
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
            sessions.left(other.member().unwrap());
        }
        assert_eq!(sessions.joined_through(7), vec![key_of(&joined).unwrap()]);
        assert!(Command::Describe { topic: None }.member().is_none());
    }

    #[test]
    fn a_request_parked_before_a_rejoin_does_not_count_for_the_new_session() {
        let start = Instant::now();
        let timeout = Duration::from_secs(2);
        let mut sessions = Sessions::default();
        let request = poll("t", "g", "m");
        let key = key_of(&request).unwrap();
        sessions.joined(key.clone(), 1, start);
        let first = sessions.park(key.as_name()).unwrap();
        // The member leaves and joins again while its first poll is still parked.
        sessions.left(key.as_name());
        sessions.joined(key.clone(), 1, start);
        let _second = sessions.park(key.as_name()).unwrap();
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
        let parked = sessions.park(key.as_name()).unwrap();
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
    fn deleting_a_topic_ends_the_sessions_of_its_members_only() {
        let start = Instant::now();
        let timeout = Duration::from_secs(1);
        let mut sessions = Sessions::default();
        let gone = key_of(&poll("t", "g", "m")).unwrap();
        let kept = key_of(&poll("t2", "g", "m")).unwrap();
        sessions.joined(gone.clone(), 1, start);
        sessions.joined(kept.clone(), 1, start);
        sessions.forget_topic("t");
        assert_eq!(sessions.expired(start + timeout, timeout), vec![kept]);
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
