//! The broker's state and its member sessions behind one lock, and the journal that makes
//! changes durable.
//!
//! One `std::sync::Mutex` guards both the core's [`BrokerState`] and the [`Sessions`], so a
//! session and the membership it mirrors always change together and there is no lock order to
//! get wrong: the only way to either is a [`BrokerGuard`]. A std mutex (not an async one) is
//! right here because each critical section is a short, synchronous batch of core calls and
//! never spans an `.await`. The journal's own lock is taken inside this one, never the other way
//! round (see `broker_storage::Journal`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use broker_core::cold::LogId;
use broker_core::image::{StateImage, TopicImage};
use broker_core::{
    BrokerDescription, BrokerError, BrokerState, ColdReads, Command, Membership, NameRules,
    Outcome, PendingRead, ReadAhead, ReadAheadAt, TopicExport,
};
use broker_proto::ErrorReply;
use broker_storage::{Journal, JournalError};
use tokio::time::Instant;

use crate::sessions::{MemberKey, Sessions};

/// The state and sessions under one lock, with the journal when there is a data directory.
#[derive(Debug)]
pub(crate) struct Broker {
    locked: Mutex<Locked>,
    journal: Option<Journal>,
    /// Whether changes applied here are logged (administrative changes, dead letters): always
    /// for a single broker; in a cluster only on the leader, so that each change is logged once
    /// and a node catching up does not log its history again.
    audited: AtomicBool,
}

/// What the lock guards.
#[derive(Debug)]
struct Locked {
    state: BrokerState,
    sessions: Sessions,
    /// Records moved to dead-letter topics since the server started.
    dead_lettered: u64,
    /// Records past their last delivery that their dead-letter topic could not take.
    dead_letters_refused: u64,
    /// The last storage error logged, so that a read clients retry is logged once.
    reported_storage_error: Option<String>,
}

/// The broker, locked: every change to the state and the sessions goes through here.
pub(crate) struct BrokerGuard<'a> {
    locked: MutexGuard<'a, Locked>,
    journal: Option<&'a Journal>,
    /// The wall clock when the lock was taken, in milliseconds since the Unix epoch: the time
    /// of every command applied under it.
    now_ms: i64,
    /// [`Broker::audited`] when the lock was taken.
    audited: bool,
}

/// A command applied: its result and, if it was logged, its log entry.
#[derive(Debug)]
pub(crate) struct Executed {
    /// What to answer.
    pub(crate) result: Result<Outcome, ErrorReply>,
    /// The log entry the answer must wait for (see [`Journal::durable`]).
    pub(crate) entry: Option<u64>,
}

impl Broker {
    /// A broker serving `state`, logging to `journal` if there is one.
    pub(crate) fn new(mut state: BrokerState, journal: Option<Journal>) -> Broker {
        // Records a log replay moved to dead-letter topics were moved, logged and counted by the
        // server that logged the moves: not news.
        drop(state.take_dead_letters());
        Broker {
            locked: Mutex::new(Locked {
                state,
                sessions: Sessions::default(),
                dead_lettered: 0,
                dead_letters_refused: 0,
                reported_storage_error: None,
            }),
            journal,
            audited: AtomicBool::new(true),
        }
    }

    /// Logs the changes applied from now on, or not (see `audited`).
    pub(crate) fn set_audited(&self, audited: bool) {
        self.audited.store(audited, Ordering::Relaxed);
    }

    /// Locks the state and the sessions.
    pub(crate) fn lock(&self) -> BrokerGuard<'_> {
        BrokerGuard {
            // The state's methods validate before they mutate and never panic on any input, and
            // session updates cannot stop halfway, so a lock poisoned by a panic elsewhere in
            // the panicking thread still guards consistent data.
            locked: self.locked.lock().unwrap_or_else(PoisonError::into_inner),
            journal: self.journal.as_ref(),
            now_ms: wall_clock_ms(),
            audited: self.audited.load(Ordering::Relaxed),
        }
    }

    /// The journal, with a data directory.
    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }
}

impl BrokerGuard<'_> {
    /// Where the records `command` would deliver from disk lie, if it is a delivery that
    /// would read some (see [`BrokerState::cold_reads_of`]); `None` without a data directory.
    pub(crate) fn cold_reads_of(&self, command: &Command) -> Option<ColdReads> {
        self.journal?;
        self.locked.state.cold_reads_of(command)
    }

    /// Where the records `command` would deliver from segment files lie, if it is a delivery
    /// that would read some (see [`BrokerState::cold_reads_of`]): a cluster node's, which has
    /// segment files without a journal.
    pub(crate) fn replicated_cold_reads_of(&self, command: &Command) -> Option<ColdReads> {
        self.locked.state.cold_reads_of(command)
    }

    /// Whether `command` may deliver records if applied now (see
    /// [`BrokerState::may_deliver`]).
    pub(crate) fn may_deliver(&self, command: &Command) -> bool {
        self.locked.state.may_deliver(command)
    }

    /// Hands `ahead` to the state, for the commands applied until it is forgotten
    /// ([`BrokerGuard::forget_read_ahead`]) to take from it the records they would read from
    /// disk (see [`BrokerState::read_ahead`]).
    pub(crate) fn read_ahead(&mut self, ahead: ReadAhead) -> ReadAheadAt {
        self.locked.state.read_ahead(ahead)
    }

    /// Drops what [`BrokerGuard::read_ahead`] handed over.
    pub(crate) fn forget_read_ahead(&mut self, at: ReadAheadAt) {
        self.locked.state.forget_read_ahead(at);
    }

    /// [`BrokerGuard::execute`], taking from `ahead` the records it would read from disk.
    pub(crate) fn execute_with(
        &mut self,
        ahead: ReadAhead,
        command: Command,
        connection: u64,
        now: Instant,
        wake: &mut Vec<String>,
    ) -> Executed {
        let at = self.read_ahead(ahead);
        let executed = self.execute(command, connection, now, wake);
        self.forget_read_ahead(at);
        executed
    }

    /// Applies one command for `connection` at `now`: refreshes the session of the member it
    /// names, mirrors joins and leaves in the sessions, and logs the change with a journal (a
    /// state-changing command is refused, unapplied, while the log cannot take entries). When
    /// it succeeds and may have made records eligible for waiting requests, its topic is added
    /// to `wake` (once).
    pub(crate) fn execute(
        &mut self,
        command: Command,
        connection: u64,
        now: Instant,
        wake: &mut Vec<String>,
    ) -> Executed {
        let Locked {
            state, sessions, ..
        } = &mut *self.locked;
        // The session is refreshed before the command is moved into the core, so its names are
        // borrowed, not copied; only a join or a leave (rare) needs a key of its own.
        let named = command.member();
        if let Some(member) = named {
            sessions.touch(member, now);
        }
        let membership = command.kind().membership();
        let key = named
            .filter(|_| membership != Membership::Unchanged)
            .map(MemberKey::of);
        // The topic is copied only the first time a batch wakes it (before the command is moved
        // into the core), and taken back if the command fails.
        let added_wake = match command.wakes() {
            Some(topic) if !wake.iter().any(|woken| woken == topic) => {
                wake.push(topic.to_owned());
                true
            }
            _ => false,
        };
        let deleted = deleted_topic(&command);
        let failed_before = state.failure().is_some();
        let executed = apply(state, self.journal, self.now_ms, command);
        self.report_storage_error(failed_before, &executed.result);
        // Consumers of a dead-letter topic that just took a record may find it now.
        for topic in self.take_dead_letters() {
            if !wake.contains(&topic) {
                wake.push(topic);
            }
        }
        let Locked { sessions, .. } = &mut *self.locked;
        match (&executed.result, key) {
            (Ok(_), Some(key)) => match membership {
                Membership::Joins => sessions.joined(key, connection, now),
                Membership::Leaves => sessions.left(key.as_name()),
                Membership::Unchanged => {}
            },
            (Ok(_), None) => {
                if let Some(topic) = deleted {
                    sessions.forget_topic(&topic);
                }
            }
            (Err(_), _) => {
                if added_wake {
                    wake.pop();
                }
            }
        }
        executed
    }

    /// Applies `command` without any session bookkeeping: for the server's own changes, such as
    /// removing a member whose session expired. Topics whose waiters may find records now
    /// because records moved to dead-letter topics are added to `wake`.
    pub(crate) fn apply(&mut self, command: Command, wake: &mut Vec<String>) -> Executed {
        let failed_before = self.locked.state.failure().is_some();
        let executed = apply(&mut self.locked.state, self.journal, self.now_ms, command);
        self.report_storage_error(failed_before, &executed.result);
        for topic in self.take_dead_letters() {
            if !wake.contains(&topic) {
                wake.push(topic);
            }
        }
        executed
    }

    /// Logs a storage error in `result`, once: the one that makes the state refuse every
    /// change until the server restarts, or a read of records on disk that failed (which
    /// clients retry, so each error is logged once, not at every retry).
    fn report_storage_error(&mut self, failed_before: bool, result: &Result<Outcome, ErrorReply>) {
        if let Err(ErrorReply::Storage(why)) = result {
            self.report_storage_failure(failed_before, why);
        }
    }

    /// [`BrokerGuard::report_storage_error`] of the storage error `why`.
    fn report_storage_failure(&mut self, failed_before: bool, why: &str) {
        let locked = &mut *self.locked;
        let newly_failed = !failed_before && locked.state.failure().is_some();
        let reported = locked.reported_storage_error.as_deref() == Some(why);
        if failed_before || (reported && !newly_failed) {
            return;
        }
        locked.reported_storage_error = Some(why.to_owned());
        if newly_failed {
            tracing::error!(
                cause = %why,
                "storage failed: the broker (with --shards, this shard: every request about \
                 its topics) refuses every request until it is restarted (see Damage in \
                 docs/durability.md)"
            );
        } else {
            tracing::error!(
                cause = %why,
                "records on disk cannot be read: reads of them are refused until they are \
                 purged or the damage is repaired (see Damage in docs/durability.md)"
            );
        }
    }

    /// Logs and counts the records the last change moved to dead-letter topics (or could not);
    /// returns the topics whose waiting consumers may find records now: each dead-letter topic
    /// that took a record, and the topic each came from (its group's next record there is
    /// eligible once it is gone, or the record again when its dead-letter topic refused it;
    /// a poll that dead-letters the record it would have redelivered delivers neither).
    fn take_dead_letters(&mut self) -> Vec<String> {
        let moved = self.locked.state.take_dead_letters();
        let mut topics: Vec<String> = Vec::new();
        for moved in moved {
            if self.audited {
                crate::audit::log_dead_letter(&moved);
            }
            let stored = moved.stored_at.is_some();
            match stored {
                true => self.locked.dead_lettered += 1,
                false => self.locked.dead_letters_refused += 1,
            }
            for topic in [Some(moved.topic), stored.then_some(moved.dead_letter)]
                .into_iter()
                .flatten()
            {
                if !topics.contains(&topic) {
                    topics.push(topic);
                }
            }
        }
        topics
    }

    /// Records moved to dead-letter topics since the server started, and records their
    /// dead-letter topic could not take.
    pub(crate) fn dead_lettered(&self) -> (u64, u64) {
        (self.locked.dead_lettered, self.locked.dead_letters_refused)
    }

    /// Lets time pass in the state: records past their topic's age leave, deliveries past
    /// their group's acknowledgement timeout are released (logged, with a journal, when that
    /// changes anything). Returns the topics where something changed, whose waiters may now
    /// find records.
    pub(crate) fn tick(&mut self) -> Result<Vec<String>, ErrorReply> {
        let state = &mut self.locked.state;
        let changed = match self.journal {
            Some(journal) => journal
                .tick(state, self.now_ms)
                .result
                .map_err(storage_reply),
            None if state.is_due(self.now_ms) => {
                state.advance_clock(self.now_ms).map_err(ErrorReply::from)
            }
            None => Ok(Vec::new()),
        };
        // Their topics are among those that changed.
        self.take_dead_letters();
        changed
    }

    /// Checks names by `names` from now on; the rules it had.
    pub(crate) fn set_names(&mut self, names: NameRules) -> NameRules {
        self.locked.state.set_names(names)
    }

    /// Applies commands under `revision` from now on (see [`BrokerState::set_revision`]); the
    /// revision it had.
    pub(crate) fn set_revision(
        &mut self,
        revision: broker_core::Revision,
    ) -> broker_core::Revision {
        self.locked.state.set_revision(revision)
    }

    /// Sets the memory budget (see [`BrokerState::set_memory_budget`]): a change of the
    /// cluster's log, applied alike by every replica of the group.
    pub(crate) fn set_memory_budget(&mut self, budget: Option<u64>) {
        self.locked.state.set_memory_budget(budget);
    }

    /// Applies one command of the cluster's log at `now_ms`, the leader's clock when it was
    /// proposed: as [`BrokerGuard::apply`] (audited, dead letters taken), with no journal (the
    /// cluster's log is the journal). Topics whose waiters should retry are added to `wake`.
    pub(crate) fn apply_committed(
        &mut self,
        now_ms: i64,
        command: Command,
        wake: &mut Vec<String>,
    ) -> Result<Outcome, BrokerError> {
        let woken = command.wakes().map(str::to_owned);
        let audited = (self.audited && command.kind().is_administrative()).then(|| command.clone());
        let deleted = deleted_topic(&command);
        let state = &mut self.locked.state;
        let failed_before = state.failure().is_some();
        let result = state.apply_at(now_ms, command);
        audit(state, audited, result.as_ref().ok());
        if let Err(BrokerError::Storage(why)) = &result {
            self.report_storage_failure(failed_before, why);
        }
        if let (Ok(_), Some(topic)) = (&result, deleted) {
            self.locked.sessions.forget_topic(&topic);
        }
        if let (Ok(_), Some(topic)) = (&result, woken) {
            wake.push(topic);
        }
        wake.extend(self.take_dead_letters());
        result
    }

    /// Lets time pass to `now_ms` as the cluster's log says: returns the topics where something
    /// changed.
    pub(crate) fn tick_committed(&mut self, now_ms: i64) -> Vec<String> {
        let changed = match self.locked.state.advance_clock(now_ms) {
            Ok(changed) => changed,
            Err(cause) => {
                tracing::warn!(cause = %cause, "letting time pass failed");
                Vec::new()
            }
        };
        self.take_dead_letters();
        changed
    }

    /// Whether letting time pass to `now_ms` would change anything.
    pub(crate) fn is_due(&self, now_ms: i64) -> bool {
        self.locked.state.is_due(now_ms)
    }

    /// `topic` with everything it holds, its records on disk still to be read, without this
    /// lock (see [`BrokerState::begin_export`]).
    pub(crate) fn begin_export(&self, topic: &str) -> Result<TopicExport, BrokerError> {
        self.locked.state.begin_export(topic)
    }

    /// Holds `topic` as `image` describes it (see [`BrokerState::import_topic`]), its members
    /// each given a fresh session, as if they had just joined: a member whose consumer is
    /// gone is removed a session timeout later.
    pub(crate) fn import_topic(
        &mut self,
        topic: &str,
        image: TopicImage,
    ) -> Result<(), BrokerError> {
        let members: Vec<MemberKey> = image
            .groups
            .iter()
            .flat_map(|(group, held)| {
                held.members.iter().map(move |member| MemberKey {
                    topic: topic.to_owned(),
                    group: group.clone(),
                    member: member.id.clone(),
                })
            })
            .collect();
        self.locked.state.import_topic(topic, image)?;
        let now = Instant::now();
        for member in members {
            // Connection ids start at 1, so no connection's close removes these.
            self.locked.sessions.joined(member, 0, now);
        }
        Ok(())
    }

    /// The topics `topic` is tied to by dead-letter topics (see
    /// [`BrokerState::dead_letter_ties`]).
    pub(crate) fn dead_letter_ties(&self, topic: &str) -> Vec<String> {
        self.locked.state.dead_letter_ties(topic)
    }

    /// Drops `topic`, which moved to another group of the cluster: as a delete (unaudited, as
    /// it is no user's), forgetting its sessions. Whether it existed.
    pub(crate) fn drop_topic(&mut self, topic: &str) -> bool {
        let state = &mut self.locked.state;
        let now_ms = state.clock_ms();
        // Whatever rules it was created under.
        let own = state.set_names(NameRules::Kafka);
        let delete = Command::DeleteTopic {
            topic: topic.to_owned(),
        };
        let dropped = matches!(state.apply_at(now_ms, delete), Ok(Outcome::Deleted(true)));
        state.set_names(own);
        if dropped {
            self.locked.sessions.forget_topic(topic);
        }
        dropped
    }

    /// The whole state, for a snapshot of the cluster's log.
    pub(crate) fn image(&self) -> StateImage {
        self.locked.state.to_image()
    }

    /// Lets records on disk leave memory (see [`BrokerState::evict`]).
    pub(crate) fn evict(&mut self, written: &[(LogId, i64)]) {
        self.locked.state.evict(written);
    }

    /// Whether a topic named `topic` exists.
    pub(crate) fn holds_topic(&self, topic: &str) -> bool {
        self.locked.state.holds_topic(topic)
    }

    /// The names of the topics that exist.
    pub(crate) fn topic_names(&self) -> Vec<String> {
        self.locked.state.topic_names().map(str::to_owned).collect()
    }

    /// Why the state refuses every command, if it does (see [`BrokerState::failure`]).
    pub(crate) fn failure(&self) -> Option<String> {
        self.locked.state.failure().map(str::to_owned)
    }

    /// Replaces the state (with a snapshot's, in a cluster), which keeps checking names by
    /// this server's rules (an image does not carry them); the sessions of members the new
    /// state does not have end (their topic was deleted, or they left, in entries the snapshot
    /// stands for).
    pub(crate) fn replace_state(&mut self, state: BrokerState) {
        let mut state = state.with_names(self.locked.state.names());
        drop(state.take_dead_letters());
        self.locked.state = state;
        self.forget_sessions_of_non_members();
    }

    /// Empties the state (topics with their records, groups and producers) and ends every
    /// session, keeping the settings (capacity, memory budget, limits, name rules): what a
    /// cluster node keeps of a group whose copy it gave up, until the group takes it again.
    pub(crate) fn forget_everything(&mut self) {
        let empty = self.locked.state.emptied();
        self.replace_state(empty);
    }

    /// Ends the sessions of members the state no longer has.
    fn forget_sessions_of_non_members(&mut self) {
        let Locked {
            state, sessions, ..
        } = &mut *self.locked;
        sessions.retain(|key| state.is_member(&key.topic, &key.group, &key.member));
    }

    /// The session bookkeeping of a command the cluster applied for `connection`: refreshes the
    /// session of the member it names, and mirrors a join or a leave that succeeded. A join
    /// whose member is gone again (an entry applied after it deleted the topic or removed the
    /// member) starts no session.
    pub(crate) fn track_session(
        &mut self,
        command: &Command,
        succeeded: bool,
        connection: u64,
        now: Instant,
    ) {
        let Some(member) = command.member() else {
            return;
        };
        let Locked {
            state, sessions, ..
        } = &mut *self.locked;
        sessions.touch(member, now);
        if succeeded {
            match command.kind().membership() {
                Membership::Joins
                    if !state.is_member(member.topic, member.group, member.member) => {}
                Membership::Joins => sessions.joined(MemberKey::of(member), connection, now),
                Membership::Leaves => sessions.left(member),
                Membership::Unchanged => {}
            }
        }
    }

    /// Gives every member the state holds a fresh session, as if it had just joined (through no
    /// connection): after a restart, or when this node becomes a cluster's leader, a member
    /// whose consumer is gone is removed a session timeout later.
    pub(crate) fn restore_sessions(&mut self) {
        // Sessions this node kept from an earlier term may name members that left since.
        self.forget_sessions_of_non_members();
        let description = self.locked.state.describe_all();
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
                    self.locked.sessions.joined(key, 0, now);
                }
            }
        }
    }

    /// The sessions.
    pub(crate) fn sessions(&mut self) -> &mut Sessions {
        &mut self.locked.sessions
    }

    /// Whether the log (if any) takes entries now: while it does not, every change is refused.
    pub(crate) fn is_writable(&self) -> bool {
        self.journal
            .is_none_or(|journal| journal.refusing().is_none())
    }

    /// Evicts the records the last checkpoint wrote to disk from memory, and starts a
    /// background checkpoint if enough was logged since the last one: call between commands.
    pub(crate) fn maybe_checkpoint(&mut self) {
        if let Some(journal) = self.journal {
            journal.maybe_checkpoint(&mut self.locked.state);
        }
    }

    /// Begins `command` if it is a [`Command::Read`] (see [`BrokerState::begin_read`]): what
    /// it needs from disk is read by [`PendingRead::finish`], once this lock is let go.
    /// Refused, as every command, once the state failed. `None` for any other command.
    pub(crate) fn begin_read(&self, command: &Command) -> Option<Result<PendingRead, ErrorReply>> {
        let Command::Read {
            topic,
            partition,
            offset,
            max_records,
            max_bytes,
        } = command
        else {
            return None;
        };
        let state = &self.locked.state;
        if let Some(failure) = state.failure() {
            return Some(Err(ErrorReply::Storage(failure.to_owned())));
        }
        let begun = state.begin_read(topic, *partition, *offset, *max_records, *max_bytes);
        Some(begun.map_err(ErrorReply::from))
    }

    /// A description of every topic and group.
    pub(crate) fn describe(&self) -> BrokerDescription {
        self.locked.state.describe_all()
    }

    /// A description of `topic` (an unknown one is refused), or of every topic when `None`.
    pub(crate) fn describe_topics(
        &self,
        topic: Option<&str>,
    ) -> Result<BrokerDescription, BrokerError> {
        self.locked.state.describe(topic)
    }

    /// The memory budget, if there is one, and the bytes it counts now (see
    /// [`BrokerState::budgeted_bytes`]).
    pub(crate) fn memory(&self) -> (Option<u64>, u64) {
        let state = &self.locked.state;
        (state.memory_budget(), state.budgeted_bytes())
    }
}

/// The wall clock in milliseconds since the Unix epoch (0 before it, which no clock shows).
pub(crate) use broker_cluster::wall_clock_ms;

/// The topic `command` deletes, if it deletes one: the sessions of its members end with it, so
/// that the reaper does not later try to remove members of a topic that is gone.
fn deleted_topic(command: &Command) -> Option<String> {
    match command {
        Command::DeleteTopic { topic } => Some(topic.clone()),
        _ => None,
    }
}

/// [`BrokerGuard::apply`] over the borrowed parts.
fn apply(
    state: &mut BrokerState,
    journal: Option<&Journal>,
    now_ms: i64,
    command: Command,
) -> Executed {
    // Administrative changes are rare: copying one to log it costs nothing that matters.
    let audited = command.kind().is_administrative().then(|| command.clone());
    let executed = apply_unaudited(state, journal, now_ms, command);
    audit(state, audited, executed.result.as_ref().ok());
    executed
}

/// Logs an administrative change (`audited`, a copy of the command) that succeeded with
/// `outcome` and changed the state.
fn audit(state: &BrokerState, audited: Option<Command>, outcome: Option<&Outcome>) {
    if let (Some(command), Some(outcome)) = (audited, outcome) {
        if command.kind().changed_state(outcome) {
            crate::audit::log_change(state, &command, outcome);
        }
    }
}

/// [`apply`] without the audit log.
fn apply_unaudited(
    state: &mut BrokerState,
    journal: Option<&Journal>,
    now_ms: i64,
    command: Command,
) -> Executed {
    match journal {
        Some(journal) => {
            let applied = journal.apply(state, now_ms, command);
            Executed {
                result: applied.result.map_err(storage_reply),
                entry: applied.entry,
            }
        }
        None => Executed {
            result: state.apply_at(now_ms, command).map_err(ErrorReply::from),
            entry: None,
        },
    }
}

/// The error reply for a journal error.
pub(crate) fn storage_reply(error: JournalError) -> ErrorReply {
    match error {
        JournalError::Broker(error) => ErrorReply::from(error),
        JournalError::Refused(why) | JournalError::NotDurable(why) => ErrorReply::Storage(why),
    }
}

/// Reads the records of `planned` on a blocking thread, with no lock held, and counts them
/// (`broker_records_read_ahead_total`); none when the thread fails (they are then read when
/// their commands apply).
pub(crate) async fn read_ahead(
    planned: Vec<ColdReads>,
    metrics: Option<&crate::metrics::Metrics>,
) -> Vec<ReadAhead> {
    let read = tokio::task::spawn_blocking(move || {
        planned
            .into_iter()
            .map(ColdReads::read)
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_else(|failed| {
        tracing::error!(cause = %failed, "reading records ahead from disk failed; they are read when applied");
        Vec::new()
    });
    if let Some(metrics) = metrics {
        metrics.read_ahead(read.iter().map(ReadAhead::len).sum());
    }
    read
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn join(topic: &str) -> Command {
        Command::Join {
            topic: topic.to_owned(),
            group: "g".to_owned(),
            member: "m".to_owned(),
            assignor: None,
            settings: Vec::new(),
        }
    }

    fn delete(topic: &str) -> Command {
        Command::DeleteTopic {
            topic: topic.to_owned(),
        }
    }

    fn broker_with_topics(topics: &[&str]) -> Broker {
        let mut state = BrokerState::new(10).unwrap();
        for topic in topics {
            state
                .create(topic, 1, broker_core::KeyHash::default(), &[])
                .unwrap();
        }
        Broker::new(state, None)
    }

    /// The members whose sessions would be checked for expiry, long after now.
    fn sessions_of(broker: &Broker, now: Instant) -> Vec<String> {
        let timeout = Duration::from_secs(1);
        let mut keys: Vec<String> = broker
            .lock()
            .sessions()
            .expired(now + 10 * timeout, timeout)
            .into_iter()
            .map(|key| format!("{}/{}/{}", key.topic, key.group, key.member))
            .collect();
        keys.sort();
        keys
    }

    /// A poll that finds its member's delivery overdue with no delivery left moves the record
    /// to the dead-letter topic and delivers nothing: it wakes the dead-letter topic's waiters
    /// and its own topic's, whose next record is eligible now (a waiting poll of the member
    /// would otherwise wait out its time, nothing else waking it).
    #[test]
    fn a_poll_that_dead_letters_a_record_wakes_its_topic_and_the_dead_letter_topic() {
        let broker = broker_with_topics(&["t"]);
        let mut guard = broker.lock();
        let mut wake = Vec::new();
        let mut apply = |now_ms: i64, command: Command| {
            wake.clear();
            let outcome = guard.apply_committed(now_ms, command, &mut wake).unwrap();
            (outcome, wake.clone())
        };
        for payload in ["r0", "r1"] {
            let publish = Command::Publish {
                topic: "t".into(),
                partition: 0,
                payload: payload.into(),
            };
            apply(0, publish);
        }
        let settings = vec![
            broker_core::GroupSetting::AckTimeoutMs(1000),
            broker_core::GroupSetting::MaxDeliveries(1),
            broker_core::GroupSetting::DeadLetter(broker_core::TopicName::new("d").unwrap()),
        ];
        let join = Command::Join {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            assignor: None,
            settings,
        };
        apply(0, join);
        let poll = || Command::Poll {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 1,
            max_bytes: None,
        };
        let (first, _) = apply(1000, poll());
        assert_eq!(first.records().map(<[_]>::len), Some(1));
        // Past the timeout, before a tick let it pass.
        let (second, woken) = apply(5000, poll());
        assert_eq!(second.records().map(<[_]>::len), Some(0));
        assert_eq!(woken, ["t", "d"]);
    }

    #[test]
    fn deleting_a_topic_ends_its_members_sessions() {
        let broker = broker_with_topics(&["t", "u"]);
        let now = Instant::now();
        let mut wake = Vec::new();
        let mut guard = broker.lock();
        for command in [join("t"), join("u"), delete("t")] {
            assert!(guard.execute(command, 1, now, &mut wake).result.is_ok());
        }
        drop(guard);
        assert_eq!(sessions_of(&broker, now), ["u/g/m"]);
    }

    #[test]
    fn a_replicated_join_applied_before_its_topic_was_deleted_starts_no_session() {
        let broker = broker_with_topics(&["t"]);
        let now = Instant::now();
        let mut wake = Vec::new();
        let mut guard = broker.lock();
        // Both entries are applied before the join's connection does its bookkeeping.
        for command in [join("t"), delete("t")] {
            guard.apply_committed(0, command, &mut wake).unwrap();
        }
        guard.track_session(&join("t"), true, 1, now);
        drop(guard);
        assert!(sessions_of(&broker, now).is_empty());
    }

    #[test]
    fn a_new_state_ends_the_sessions_of_members_it_does_not_have() {
        let broker = broker_with_topics(&["t", "u"]);
        let now = Instant::now();
        let mut wake = Vec::new();
        let mut guard = broker.lock();
        for command in [join("t"), join("u")] {
            assert!(guard.execute(command, 1, now, &mut wake).result.is_ok());
        }
        // A snapshot in which t was deleted and u's member stayed.
        let mut snapshot = BrokerState::new(10).unwrap();
        snapshot
            .create("u", 1, broker_core::KeyHash::default(), &[])
            .unwrap();
        snapshot.join("u", "g", "m", None, &[]).unwrap();
        guard.replace_state(snapshot);
        drop(guard);
        assert_eq!(sessions_of(&broker, now), ["u/g/m"]);
    }
}
