//! Kafka's classic consumer group protocol: the coordinator that keeps each group's members and
//! generations, gathers the members at a rebalance (JoinGroup), relays the assignment the
//! group's leader computed to every member (SyncGroup), and watches their heartbeats.
//!
//! Membership lives in the server's memory; what must survive, the committed offsets, is the
//! broker's (see the handler's OffsetCommit). A coordinator that does not know a group (it
//! restarted, or took over from a node that stopped leading) rebuilds it from its members as
//! they come back, as Kafka's coordinator loads a group after a failover:
//!
//! - A heartbeat or commit that names a member id and a generation of the group takes that
//!   member in, and starts a rebalance as any other: heartbeats are answered
//!   `REBALANCE_IN_PROGRESS`, members of the group's generation may commit, and each member
//!   joins again under its own id. So the members give their partitions up as in any
//!   rebalance, committing what they consumed first, rather than losing them uncommitted
//!   (which would have each partition's next owner consume again what was read since the last
//!   commit).
//! - The rebalance does not complete within [`REBUILD_WINDOW`] of the first such request, so
//!   that every live member is heard from. Until it completes, every member that names the
//!   group's generation is taken in, and a member naming a later generation leaves out those
//!   taken in at an earlier one (the later generation had fenced them), whether they joined
//!   again or not; that member's heartbeat moves the group on, waiting for the commits on
//!   their way, and a commit of its generation meanwhile is answered
//!   `COORDINATOR_LOAD_IN_PROGRESS` (Kafka's clients try it again). The rebalance waits for
//!   every member taken in, up to the longest rebalance timeout of those that joined again; a
//!   member not heard from within [`ADOPTED_SESSION_TIMEOUT`] is left out.
//! - What a rebuilding coordinator cannot know: a member that a later generation fenced, whose
//!   requests arrive before any member of that generation is heard from, may commit until one
//!   is, as it could have just before the later generation began.
//!
//! A group this coordinator forgot when its last member left or expired, after a rebalance
//! completed here, keeps its last generation for a while (see [`Coordinator::forgotten`]): a
//! member of that generation or an earlier one, which a later generation fenced, is not taken
//! back in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::Notify;
use tokio::time::Instant;

use broker_core::{KafkaGroupDescription, KafkaMemberDescription};

use crate::assignment::assigned_partitions;
use crate::ids::new_member_id;

/// The protocol type of Kafka's consumers, whose assignments say which partitions each
/// member consumes.
pub(crate) const CONSUMER_PROTOCOL: &str = "consumer";

/// The state DescribeGroups gives a group the coordinator does not know.
pub(crate) const DEAD: &str = "Dead";

/// Where a group is in its cycle, named as Kafka's DescribeGroups names the states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No members.
    Empty,
    /// A rebalance gathers the members: each must join again before `deadline`.
    Preparing { deadline: Instant },
    /// Every member joined: the leader is to send the assignment.
    Syncing,
    /// The assignment is out; members heartbeat.
    Stable,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::Preparing { .. } => "PreparingRebalance",
            Phase::Syncing => "CompletingRebalance",
            Phase::Stable => "Stable",
        }
    }
}

/// One member of a group.
#[derive(Debug, Clone)]
struct Member {
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    /// The protocols it speaks, by preference, with its metadata for each.
    protocols: Vec<(String, Bytes)>,
    /// Its part of the leader's assignment, in the current generation.
    assignment: Bytes,
    /// Whether it joined in the rebalance under way.
    joined: bool,
    /// Whether a JoinGroup or SyncGroup of its own is waiting: it is alive.
    waiting: bool,
    /// Whether the request waiting is a JoinGroup, which counts as joined in any rebalance
    /// that starts meanwhile (a SyncGroup does not: its member joins again once answered).
    joining: bool,
    /// The round it was counted in, for its waiting JoinGroup to answer with.
    answer: Option<Round>,
    /// When it was last heard from.
    last_seen: Instant,
    /// The generation it named when it was taken back in (see the module's documentation),
    /// kept when it joins again, so that a later generation leaves it out.
    adopted_in: Option<i32>,
}

/// How long a member taken back in (see the module's documentation) may go unheard before it
/// joins again: about three heartbeats of Kafka's consumers (every 3 s by default).
const ADOPTED_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a coordinator rebuilding a group takes in its members before the group's
/// rebalance goes on: two heartbeats of Kafka's consumers, so that every live member (which
/// finds the new coordinator within a heartbeat or so) is heard from.
pub(crate) const REBUILD_WINDOW: Duration = Duration::from_secs(6);

/// The longest member id taken back in: Kafka's ids are a client id and a UUID.
const MAX_ADOPTED_ID_BYTES: usize = 512;

impl Member {
    /// A member of the group's `generation` that this coordinator never saw join: known by
    /// its id only until it joins again (with no protocols meanwhile).
    fn adopted(generation: i32, now: Instant) -> Member {
        Member {
            client_id: String::new(),
            client_host: String::new(),
            session_timeout: ADOPTED_SESSION_TIMEOUT,
            rebalance_timeout: ADOPTED_SESSION_TIMEOUT,
            protocols: Vec::new(),
            assignment: Bytes::new(),
            joined: false,
            waiting: false,
            joining: false,
            answer: None,
            last_seen: now,
            adopted_in: Some(generation),
        }
    }

    /// Whether it was adopted and has not joined again since.
    fn is_adopted(&self) -> bool {
        self.protocols.is_empty()
    }

    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(name, _)| name == protocol)
            .map(|(_, metadata)| metadata.clone())
            .unwrap_or_default()
    }
}

/// The outcome of a completed rebalance, as JoinGroup answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    /// The new generation.
    pub(crate) generation: i32,
    /// The protocol every member speaks, chosen for the group.
    pub(crate) protocol: String,
    /// The leader, which computes the assignment.
    pub(crate) leader: String,
    /// Every member with its metadata for the protocol (sent to the leader only).
    pub(crate) members: Vec<(String, Bytes)>,
}

/// One group.
#[derive(Debug)]
struct Group {
    /// The group's id, for the log.
    name: String,
    phase: Phase,
    generation: i32,
    protocol_type: String,
    members: BTreeMap<String, Member>,
    /// The last completed rebalance.
    round: Option<Round>,
    /// For a group being rebuilt from its members (see the module's documentation), the end
    /// of the window in which they are taken in.
    rebuilding_until: Option<Instant>,
}

impl Group {
    fn new(name: &str, protocol_type: &str) -> Group {
        Group {
            name: name.to_owned(),
            phase: Phase::Empty,
            generation: 0,
            protocol_type: protocol_type.to_owned(),
            members: BTreeMap::new(),
            round: None,
            rebuilding_until: None,
        }
    }

    /// A group to rebuild from its members, from `now` (see the module's documentation).
    fn rebuilt(name: &str, now: Instant) -> Group {
        let window_end = now + REBUILD_WINDOW;
        Group {
            phase: Phase::Preparing {
                deadline: window_end + ADOPTED_SESSION_TIMEOUT,
            },
            rebuilding_until: Some(window_end),
            ..Group::new(name, "")
        }
    }

    /// Whether its members are still being taken in (its rebalance does not complete, and a
    /// later generation may still come).
    fn loading(&self, now: Instant) -> bool {
        self.round.is_none() && self.rebuilding_until.is_some_and(|end| now < end)
    }

    /// Removes the members not heard from within their session timeout (none is while a
    /// request of its own waits); a rebalance starts if any was removed and others remain.
    /// Whether any was.
    fn expire(&mut self, now: Instant) -> bool {
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, member)| {
                !member.waiting && now.duration_since(member.last_seen) > member.session_timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        if expired.is_empty() {
            return false;
        }
        for id in &expired {
            self.members.remove(id);
        }
        tracing::info!(
            group = self.name,
            members = ?expired,
            "Kafka group members expired (no heartbeat within their session timeout)"
        );
        self.rebalance(now);
        true
    }

    /// Starts a rebalance (unless one is under way): every member must join again.
    fn rebalance(&mut self, now: Instant) {
        if self.members.is_empty() {
            self.phase = Phase::Empty;
            return;
        }
        if let Phase::Preparing { .. } = self.phase {
            return;
        }
        let timeout = self
            .members
            .values()
            .map(|member| member.rebalance_timeout)
            .max()
            .unwrap_or_default();
        for member in self.members.values_mut() {
            // A member whose JoinGroup still waits has joined this rebalance too.
            member.joined = member.joining && member.answer.is_none();
        }
        self.phase = Phase::Preparing {
            deadline: now + timeout,
        };
    }

    /// Completes the rebalance under way once every member joined, or at its deadline
    /// without those that did not.
    fn try_complete(&mut self, now: Instant) {
        let Phase::Preparing { deadline } = self.phase else {
            return;
        };
        if self.loading(now) {
            return;
        }
        let waiting = self.members.values().any(|member| !member.joined);
        if waiting && now < deadline {
            return;
        }
        self.members.retain(|_, member| member.joined);
        let Some(first) = self.members.keys().next().cloned() else {
            self.phase = Phase::Empty;
            return;
        };
        let leader = self
            .round
            .as_ref()
            .map(|round| round.leader.clone())
            .filter(|leader| self.members.contains_key(leader))
            .unwrap_or(first);
        let protocol = self.common_protocol(&leader).unwrap_or_default();
        // A generation a client named may be the last one: the next wraps to the first.
        self.generation = self.generation.checked_add(1).unwrap_or(1);
        let round = Round {
            generation: self.generation,
            members: self
                .members
                .iter()
                .map(|(id, member)| (id.clone(), member.metadata(&protocol)))
                .collect(),
            protocol,
            leader,
        };
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
            member.answer = Some(round.clone());
        }
        tracing::info!(
            group = self.name,
            generation = self.generation,
            members = ?self.members.keys().collect::<Vec<_>>(),
            "Kafka group rebalanced"
        );
        self.round = Some(round);
        self.phase = Phase::Syncing;
    }

    /// The leader's most preferred protocol that every member speaks.
    fn common_protocol(&self, leader: &str) -> Option<String> {
        let preferred = &self.members.get(leader)?.protocols;
        preferred
            .iter()
            .map(|(name, _)| name)
            .find(|name| {
                self.members
                    .values()
                    .all(|member| member.protocols.iter().any(|(other, _)| other == *name))
            })
            .cloned()
    }

    /// Whether a member speaking `protocols` can join: some protocol every member speaks.
    fn accepts(&self, member_id: &str, protocols: &[(String, Bytes)]) -> bool {
        protocols.iter().any(|(name, _)| {
            self.members
                .iter()
                .filter(|(id, member)| id.as_str() != member_id && !member.is_adopted())
                .all(|(_, member)| member.protocols.iter().any(|(other, _)| other == name))
        })
    }

    /// The refusal of a request of `member_id` in `generation`, if any: an unknown member, a
    /// rebalance under way, or another generation.
    fn check(&self, member_id: &str, generation: i32) -> Result<(), ResponseError> {
        if !self.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if let Phase::Preparing { .. } = self.phase {
            return Err(ResponseError::RebalanceInProgress);
        }
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// Whether the group is being rebuilt from the members that come back: until its first
    /// rebalance here completes.
    fn adopting(&self) -> bool {
        self.round.is_none() && self.rebuilding_until.is_some()
    }

    /// Takes `member_id` of `generation` in, while the group is being rebuilt (see the
    /// module's documentation): a later generation than the one so far (only when
    /// `may_raise`) leaves out the members taken in at the earlier one (a later generation had
    /// fenced them), joined again or not.
    fn adopt(&mut self, member_id: &str, generation: i32, may_raise: bool, now: Instant) {
        if self.members.contains_key(member_id) || generation < self.generation {
            return;
        }
        // (The first member taken in names the generation: no commit can be on its way.)
        if generation > self.generation {
            if !may_raise && !self.members.is_empty() {
                return;
            }
            self.members
                .retain(|_, member| member.adopted_in.is_none_or(|taken| taken >= generation));
            self.generation = generation;
        }
        self.members
            .insert(member_id.to_owned(), Member::adopted(generation, now));
        // Members who went silent may have left it without any (see `Group::expire`).
        if self.phase == Phase::Empty {
            let window_end = self.rebuilding_until.unwrap_or(now).max(now);
            self.phase = Phase::Preparing {
                deadline: window_end + ADOPTED_SESSION_TIMEOUT,
            };
        }
        tracing::info!(
            group = self.name,
            member = member_id,
            generation,
            "Kafka group member adopted: it joined the group where another coordinator (or this \
             one before a restart) coordinated it"
        );
    }

    /// While the group is being rebuilt, makes its rebalance wait `timeout` from now for the
    /// members still to join again (a member that joined waits as long as its rebalance
    /// timeout says, as in any rebalance).
    fn wait_for_rebuilding(&mut self, timeout: Duration, now: Instant) {
        if !self.adopting() {
            return;
        }
        if let Phase::Preparing { deadline } = &mut self.phase {
            *deadline = (*deadline).max(now + timeout);
        }
    }
}

/// What a client sends to join a group.
#[derive(Debug, Clone)]
pub(crate) struct Join {
    /// Its member id, empty for a new member.
    pub(crate) member_id: String,
    /// Its client id, which a new member id is named after.
    pub(crate) client_id: String,
    /// Where it connects from.
    pub(crate) client_host: String,
    /// The group's protocol type (`consumer` for Kafka's consumers).
    pub(crate) protocol_type: String,
    /// The protocols it speaks, by preference, with its metadata for each.
    pub(crate) protocols: Vec<(String, Bytes)>,
    /// How long it may go unheard before it is removed.
    pub(crate) session_timeout: Duration,
    /// How long a rebalance waits for it.
    pub(crate) rebalance_timeout: Duration,
}

/// What a group looks like, as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Described {
    /// The state's name (`Stable`, `PreparingRebalance`, ...; `Dead` for no such group).
    pub(crate) state: &'static str,
    /// The group's protocol type.
    pub(crate) protocol_type: String,
    /// The protocol chosen for the current generation.
    pub(crate) protocol: String,
    /// Each member: id, client id, host, metadata and assignment.
    pub(crate) members: Vec<(String, String, String, Bytes, Bytes)>,
}

/// How long a group forgotten when it had no members left keeps its last generation (see
/// [`Coordinator::forgotten`]): longer than any member, which a later generation fenced, can
/// have gone unheard without knowing it.
const FORGOTTEN_FOR: Duration = Duration::from_secs(30 * 60);

/// A group's turn ([`Coordinator::turn`], [`Coordinator::commit_turn`]), held until dropped.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    coordinator: &'a Coordinator,
    group: String,
    held: Option<Held>,
}

/// How a [`Turn`] holds its group's gate (until the guard drops).
#[derive(Debug)]
enum Held {
    /// With other commits.
    Shared {
        _guard: tokio::sync::OwnedRwLockReadGuard<()>,
    },
    /// Alone.
    Alone {
        _guard: tokio::sync::OwnedRwLockWriteGuard<()>,
    },
}

impl Drop for Turn<'_> {
    /// Gives the turn up, and forgets the group's gate when no call holds or awaits it (every
    /// holder clones the gate under the map's lock, so the count cannot grow meanwhile).
    fn drop(&mut self) {
        drop(self.held.take());
        let mut turns = self
            .coordinator
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if turns
            .get(&self.group)
            .is_some_and(|gate| Arc::strong_count(gate) == 1)
        {
            turns.remove(&self.group);
        }
    }
}

/// Marks a member's JoinGroup or SyncGroup as waiting while it lives. When it ends, answered
/// or dropped (the client's connection closed), the member was heard from now: it expires after
/// its session timeout unless it is heard from again.
struct Waiting<'a> {
    coordinator: &'a Coordinator,
    group: &'a str,
    member_id: String,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut groups = self.coordinator.lock();
        let member = groups
            .get_mut(self.group)
            .and_then(|state| state.members.get_mut(&self.member_id));
        if let Some(member) = member {
            member.waiting = false;
            member.joining = false;
            member.last_seen = now;
        }
    }
}

/// The coordinator of every Kafka consumer group of one server.
#[derive(Debug)]
pub struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
    /// Each group's [`Turn`], while a call holds or awaits it.
    turns: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    /// Notified on every change a waiting JoinGroup or SyncGroup may be waiting for.
    changed: Notify,
    /// Most groups with members at once: a bound on what clients can make the server hold.
    max_groups: usize,
    /// Most members of one group.
    max_members: usize,
    /// The groups forgotten since they had no member left, with their last generation and
    /// when: a member of that generation or an earlier one (a member fenced meanwhile, whose
    /// requests arrive late) is not taken back in, as Kafka keeps an empty group's generation.
    /// At most `max_groups`, each for [`FORGOTTEN_FOR`].
    forgotten: Mutex<HashMap<String, (i32, Instant)>>,
    /// The group names JoinGroups have claimed while they check for native members (see
    /// [`Coordinator::claim`]), with how many claim each: at most one a connection.
    claims: Mutex<HashMap<String, usize>>,
}

/// A JoinGroup's claim on a group name ([`Coordinator::claim`]), given up when dropped.
#[derive(Debug)]
pub(crate) struct Claim<'a> {
    coordinator: &'a Coordinator,
    group: String,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut claims = self
            .coordinator
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = claims.get_mut(&self.group) {
            *count -= 1;
            if *count == 0 {
                claims.remove(&self.group);
            }
        }
    }
}

impl Default for Coordinator {
    /// The broker's default limits: 1,000 groups of at most 1,000 members.
    fn default() -> Self {
        let limits = broker_core::Limits::default();
        Coordinator::new(limits.max_groups_per_topic, limits.max_members_per_group)
    }
}

impl Coordinator {
    /// A coordinator of at most `max_groups` groups with members at once, each of at most
    /// `max_members` members; a JoinGroup past either is refused (`GROUP_MAX_SIZE_REACHED`).
    pub fn new(max_groups: usize, max_members: usize) -> Coordinator {
        Coordinator {
            groups: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            max_groups,
            max_members,
            forgotten: Mutex::new(HashMap::new()),
            claims: Mutex::new(HashMap::new()),
        }
    }

    /// Claims `group`'s name for a member about to join through the Kafka listener: until the
    /// claim is dropped, [`Coordinator::has_members`] says the group has members. A group name
    /// is used by one protocol at a time; the member looks for native members of the group
    /// only once it holds the claim, and a server applies a native join only if
    /// `has_members` says no at that moment, so one of the two always sees the other.
    pub(crate) fn claim(&self, group: &str) -> Claim<'_> {
        *self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(group.to_owned())
            .or_default() += 1;
        Claim {
            coordinator: self,
            group: group.to_owned(),
        }
    }

    /// Forgets `group` once it has no members: a group is kept only while it has some, so that
    /// clients naming ever new groups cannot grow the map without end. Its last generation is
    /// kept a while (see [`Coordinator::forgotten`]).
    fn forget_if_empty(&self, groups: &mut HashMap<String, Group>, group: &str) {
        let Some(state) = groups.get(group).filter(|state| state.members.is_empty()) else {
            return;
        };
        // Only a generation this coordinator completed a rebalance in is one it knows fenced
        // the members of earlier ones: a group being rebuilt holds the generation its members
        // named, which other members of it may still name.
        let generation = state.round.as_ref().map(|_| state.generation);
        groups.remove(group);
        let Some(generation) = generation.filter(|generation| *generation >= 1) else {
            return;
        };
        let now = Instant::now();
        let mut forgotten = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if forgotten.len() >= self.max_groups {
            forgotten.retain(|_, (_, at)| now.duration_since(*at) < FORGOTTEN_FOR);
        }
        if forgotten.len() >= self.max_groups {
            // The oldest gives way.
            let oldest = forgotten
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                forgotten.remove(&oldest);
            }
        }
        forgotten.insert(group.to_owned(), (generation, now));
    }

    /// Makes room for one more group when there are `max_groups` (groups whose members all
    /// went silent are forgotten only when touched: at the cap, every group is looked at);
    /// whether there is room.
    fn room_for_a_group(&self, groups: &mut HashMap<String, Group>, now: Instant) -> bool {
        if groups.len() < self.max_groups {
            return true;
        }
        let mut expired = false;
        for state in groups.values_mut() {
            expired |= state.expire(now);
        }
        let empty: Vec<String> = groups
            .iter()
            .filter(|(_, state)| state.members.is_empty())
            .map(|(name, _)| name.clone())
            .collect();
        for name in empty {
            self.forget_if_empty(groups, &name);
        }
        if expired {
            // Members waiting in a rebalance must see the ones it started.
            self.changed.notify_waiters();
        }
        groups.len() < self.max_groups
    }

    /// Whether a member of `group` in `generation` may be taken back in, by what the
    /// coordinator remembers of the group forgotten (see [`Coordinator::forgotten`]).
    fn fenced_when_forgotten(&self, group: &str, generation: i32, now: Instant) -> bool {
        let forgotten = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        forgotten.get(group).is_some_and(|(last, at)| {
            generation <= *last && now.duration_since(*at) < FORGOTTEN_FOR
        })
    }

    /// The groups, locked, with `only` (or every group) rid of the members gone silent, and
    /// forgotten if none is left, so that a listing shows no group whose members all went
    /// away. (Waiting joins are notified: a member left out may be all a round waited for.)
    fn lock_expired(&self, only: Option<&str>) -> MutexGuard<'_, HashMap<String, Group>> {
        let now = Instant::now();
        let mut groups = self.lock();
        let names: Vec<String> = match only {
            Some(group) => vec![group.to_owned()],
            None => groups.keys().cloned().collect(),
        };
        let mut expired = false;
        for name in &names {
            if let Some(state) = groups.get_mut(name) {
                expired |= state.expire(now);
            }
            self.forget_if_empty(&mut groups, name);
        }
        if expired {
            self.changed.notify_waiters();
        }
        groups
    }

    /// Whether `group` is one a member may be taken into: one this coordinator does not
    /// hold, or is rebuilding.
    fn rebuilding(&self, group: &str) -> bool {
        self.lock().get(group).is_none_or(Group::adopting)
    }

    /// Whether this coordinator holds `group` (with members, or being rebuilt).
    pub(crate) fn knows(&self, group: &str) -> bool {
        self.lock().contains_key(group)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Group>> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for `group`'s turn alone: until it ends, no member joins the group and no other
    /// call holding a turn of it goes on. A call that checks the group's members and then
    /// changes what the broker keeps for it (a deletion checked against members) holds a turn
    /// across both, so that what it checked still holds when the change lands: a member
    /// cannot join a group whose offsets are being deleted.
    pub(crate) async fn turn(&self, group: &str) -> Turn<'_> {
        let gate = self.gate(group);
        Turn {
            coordinator: self,
            group: group.to_owned(),
            held: Some(Held::Alone {
                _guard: gate.write_owned().await,
            }),
        }
    }

    /// Waits for `group`'s turn, shared with other commits: a commit checked against the
    /// group's generation is stored before any member joins (a join waits for a turn alone),
    /// so a fenced member's commit cannot land after the new owner's. Commits of the same
    /// generation need no order among themselves and go on together.
    pub(crate) async fn commit_turn(&self, group: &str) -> Turn<'_> {
        let gate = self.gate(group);
        Turn {
            coordinator: self,
            group: group.to_owned(),
            held: Some(Held::Shared {
                _guard: gate.read_owned().await,
            }),
        }
    }

    /// `group`'s gate, made when no turn holds or awaits it.
    fn gate(&self, group: &str) -> Arc<tokio::sync::RwLock<()>> {
        Arc::clone(
            self.turns
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(group.to_owned())
                .or_default(),
        )
    }

    /// Forgets what is kept of `group` once its last member left (see
    /// [`Coordinator::forgotten`]): it was deleted, offsets and all.
    pub(crate) fn deleted(&self, group: &str) {
        self.forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(group);
    }

    /// Forgets every group and its members: this server no longer coordinates them (another
    /// node of its cluster leads now). Requests waiting in a rebalance are answered
    /// `UNKNOWN_MEMBER_ID`; the members join again where their groups are coordinated now.
    pub fn forget_all(&self) {
        self.forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        let forgotten = std::mem::take(&mut *self.lock());
        if !forgotten.is_empty() {
            tracing::info!(
                groups = forgotten.len(),
                "Kafka groups forgotten: another node coordinates them now"
            );
        }
        self.changed.notify_waiters();
    }

    /// Whether `group` has members that joined through Kafka's protocol, or a member is
    /// joining it (see [`Coordinator::claim`]): then a native client may not join it.
    pub fn has_members(&self, group: &str) -> bool {
        // Claims first: a member that claimed, joined and let its claim go meanwhile is then
        // found among the members.
        if self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(group)
        {
            return true;
        }
        let now = Instant::now();
        let mut groups = self.lock();
        let (expired, members) = match groups.get_mut(group) {
            Some(state) => (state.expire(now), !state.members.is_empty()),
            None => (false, false),
        };
        self.forget_if_empty(&mut groups, group);
        drop(groups);
        if expired {
            // Members waiting in a rebalance must see the one this started.
            self.changed.notify_waiters();
        }
        members
    }

    /// Joins `group`: waits until the rebalance it starts (or finds under way) completes, and
    /// answers with the member's id and the round, or why it was refused (with the member id a
    /// refused new member was given, if any).
    pub(crate) async fn join(
        &self,
        group: &str,
        join: Join,
    ) -> Result<(String, Round), ResponseError> {
        let member_id = {
            let _turn = self.turn(group).await;
            let now = Instant::now();
            let mut groups = self.lock();
            if !groups.contains_key(group) && !self.room_for_a_group(&mut groups, now) {
                return Err(ResponseError::GroupMaxSizeReached);
            }
            let state = groups
                .entry(group.to_owned())
                .or_insert_with(|| Group::new(group, &join.protocol_type));
            state.expire(now);
            if state.members.values().all(Member::is_adopted) {
                state.protocol_type.clone_from(&join.protocol_type);
            }
            let refusal = if state.protocol_type != join.protocol_type
                || join.protocols.is_empty()
                || !state.accepts(&join.member_id, &join.protocols)
            {
                Some(ResponseError::InconsistentGroupProtocol)
            } else if !join.member_id.is_empty() && !state.members.contains_key(&join.member_id) {
                Some(ResponseError::UnknownMemberId)
            } else if join.member_id.is_empty() && state.members.len() >= self.max_members {
                Some(ResponseError::GroupMaxSizeReached)
            } else {
                None
            };
            if let Some(refusal) = refusal {
                self.forget_if_empty(&mut groups, group);
                return Err(refusal);
            }
            let member_id = match join.member_id.as_str() {
                "" => new_member_id(&join.client_id),
                known => known.to_owned(),
            };
            let changed = state
                .members
                .get(&member_id)
                .is_none_or(|member| member.protocols != join.protocols);
            // A follower that joins again while the group is stable with nothing changed (a
            // lost answer) is answered the current round without a rebalance, as Kafka's
            // coordinator does. The leader's joining again always rebalances: it does so to
            // assign anew (its topics gained partitions, say).
            let leads = state
                .round
                .as_ref()
                .is_some_and(|round| round.leader == member_id);
            if !changed && !leads && state.phase == Phase::Stable {
                if let Some(member) = state.members.get_mut(&member_id) {
                    member.last_seen = now;
                }
                if let Some(round) = &state.round {
                    return Ok((member_id, round.clone()));
                }
            }
            let rebalance_timeout = join.rebalance_timeout;
            state.members.insert(
                member_id.clone(),
                Member {
                    client_id: join.client_id,
                    client_host: join.client_host,
                    session_timeout: join.session_timeout,
                    rebalance_timeout: join.rebalance_timeout,
                    protocols: join.protocols,
                    assignment: Bytes::new(),
                    joined: false,
                    waiting: true,
                    joining: true,
                    answer: None,
                    last_seen: now,
                    adopted_in: state
                        .members
                        .get(&member_id)
                        .and_then(|member| member.adopted_in),
                },
            );
            state.rebalance(now);
            state.wait_for_rebuilding(rebalance_timeout, now);
            if let Some(member) = state.members.get_mut(&member_id) {
                member.joined = true;
            }
            state.try_complete(now);
            member_id
        };
        let _waiting = Waiting {
            coordinator: self,
            group,
            member_id: member_id.clone(),
        };
        self.changed.notify_waiters();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Completing a round moves the group to a new generation: not while a commit
            // checked against the one before is on its way.
            let turn = self.turn(group).await;
            let deadline = {
                let now = Instant::now();
                let mut groups = self.lock();
                let Some(state) = groups.get_mut(group) else {
                    return Err(ResponseError::UnknownMemberId);
                };
                // Members gone silent are left out, so the round need not wait for them.
                state.expire(now);
                state.try_complete(now);
                let phase = state.phase;
                let Some(member) = state.members.get_mut(&member_id) else {
                    return Err(ResponseError::UnknownMemberId);
                };
                // The round this member was counted in, even if another started since.
                if let Some(round) = member.answer.take() {
                    drop(groups);
                    self.changed.notify_waiters();
                    return Ok((member_id, round));
                }
                // Looked at again each second at least: a member may go silent, or the window
                // of a group being rebuilt end, without a notification.
                match phase {
                    Phase::Preparing { deadline } => deadline.min(now + Duration::from_secs(1)),
                    _ => now + Duration::from_millis(100),
                }
            };
            drop(turn);
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    /// Takes the leader's assignment (when `member_id` leads) and answers the member's part
    /// of it once the leader sent it, or why it cannot.
    pub(crate) async fn sync(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<Bytes, ResponseError> {
        let timeout = {
            let now = Instant::now();
            let mut groups = self.lock();
            let state = groups
                .get_mut(group)
                .ok_or(ResponseError::UnknownMemberId)?;
            state.expire(now);
            state.check(member_id, generation)?;
            let leads = state
                .round
                .as_ref()
                .is_some_and(|round| round.leader == member_id);
            if leads && state.phase == Phase::Syncing {
                for (id, assignment) in assignments {
                    if let Some(member) = state.members.get_mut(&id) {
                        member.assignment = assignment;
                    }
                }
                state.phase = Phase::Stable;
            }
            let member = state
                .members
                .get_mut(member_id)
                .ok_or(ResponseError::UnknownMemberId)?;
            member.last_seen = now;
            member.waiting = true;
            member.rebalance_timeout
        };
        let _waiting = Waiting {
            coordinator: self,
            group,
            member_id: member_id.to_owned(),
        };
        self.changed.notify_waiters();
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let groups = self.lock();
                let state = groups.get(group).ok_or(ResponseError::UnknownMemberId)?;
                state.check(member_id, generation)?;
                if state.phase == Phase::Stable {
                    return state
                        .members
                        .get(member_id)
                        .map(|member| member.assignment.clone())
                        .ok_or(ResponseError::UnknownMemberId);
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(ResponseError::RebalanceInProgress);
            }
        }
    }

    /// The groups, locked, with `member_id` of `generation` taken into `group` if `may_adopt`
    /// and the group has no state here (not fenced by what is remembered of it: see
    /// [`Coordinator::forgotten`]) or is being rebuilt (see the module's documentation),
    /// within the limits on groups, members and member ids.
    fn lock_adopting(
        &self,
        group: &str,
        member: (&str, i32),
        may_adopt: bool,
        may_raise: bool,
        now: Instant,
    ) -> MutexGuard<'_, HashMap<String, Group>> {
        let (member_id, generation) = member;
        let mut groups = self.lock();
        if !may_adopt
            || member_id.is_empty()
            || member_id.len() > MAX_ADOPTED_ID_BYTES
            || generation < 1
        {
            return groups;
        }
        if !groups.contains_key(group) {
            if self.fenced_when_forgotten(group, generation, now) {
                return groups;
            }
            if !self.room_for_a_group(&mut groups, now) {
                return groups;
            }
            groups.insert(group.to_owned(), Group::rebuilt(group, now));
        }
        if let Some(state) = groups.get_mut(group) {
            state.expire(now);
            if state.adopting() && state.members.len() < self.max_members {
                state.adopt(member_id, generation, may_raise, now);
            }
        }
        self.forget_if_empty(&mut groups, group);
        groups
    }

    /// A member's heartbeat: fine, or why it must join again. With `may_adopt`, a member of a
    /// group this coordinator has no state for is taken in while the group is rebuilt (see the
    /// module's documentation).
    pub(crate) async fn heartbeat(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        may_adopt: bool,
    ) -> Result<(), ResponseError> {
        // Taking a member in may move a group being rebuilt to a later generation: not while
        // a commit checked against the earlier one is on its way (see `Coordinator::turn`).
        let _turn = match may_adopt && self.rebuilding(group) {
            true => Some(self.turn(group).await),
            false => None,
        };
        let now = Instant::now();
        let mut groups = self.lock_adopting(group, (member_id, generation), may_adopt, true, now);
        let state = groups
            .get_mut(group)
            .ok_or(ResponseError::UnknownMemberId)?;
        state.expire(now);
        if let Some(member) = state.members.get_mut(member_id) {
            member.last_seen = now;
        }
        let checked = state.check(member_id, generation);
        drop(groups);
        // An expiry may have started a rebalance that waiting members must see.
        self.changed.notify_waiters();
        checked
    }

    /// Whether a commit of `member_id` in `generation` may go on. As Kafka's coordinator
    /// decides: a commit without a generation (-1: a consumer that reads with `assign`, or an
    /// admin tool) may while the group has no members; otherwise only a member of the group's
    /// current generation may (`UNKNOWN_MEMBER_ID` for anyone else, a commit without a member
    /// id included, so that it cannot move the offsets of consumers that hold the partitions).
    /// With `may_adopt`, a member of a group this coordinator has no state for is taken in
    /// while the group is rebuilt (see the module's documentation), and may commit.
    pub(crate) fn may_commit(
        &self,
        group: &str,
        member_id: &str,
        generation: i32,
        may_adopt: bool,
    ) -> Result<(), ResponseError> {
        if generation < 0 && !self.has_members(group) {
            return Ok(());
        }
        let now = Instant::now();
        // A commit holds its group's turn with other commits: the generation of a group being
        // rebuilt moves on only with a heartbeat, which waits for them.
        let mut groups = self.lock_adopting(group, (member_id, generation), may_adopt, false, now);
        let state = groups
            .get_mut(group)
            .ok_or(ResponseError::UnknownMemberId)?;
        if let Some(member) = state.members.get_mut(member_id) {
            member.last_seen = now;
        }
        if state.adopting() && generation > state.generation {
            // Its heartbeat takes it in (Kafka's clients try the commit again).
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        // As Kafka's coordinator does, a member may commit while a rebalance gathers the
        // members (what it consumed before it gives its partitions up), not while the new
        // assignment is on its way.
        if !state.members.contains_key(member_id) {
            return Err(ResponseError::UnknownMemberId);
        }
        if generation != state.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if state.phase == Phase::Syncing {
            return Err(ResponseError::RebalanceInProgress);
        }
        Ok(())
    }

    /// Removes the members of `member_ids` from `group`; each one's answer (unknown or not).
    pub(crate) fn leave(
        &self,
        group: &str,
        member_ids: &[String],
    ) -> Vec<Result<(), ResponseError>> {
        let now = Instant::now();
        let answers = {
            let mut groups = self.lock();
            let Some(state) = groups.get_mut(group) else {
                return member_ids
                    .iter()
                    .map(|_| Err(ResponseError::UnknownMemberId))
                    .collect();
            };
            let answers: Vec<Result<(), ResponseError>> = member_ids
                .iter()
                .map(|id| {
                    state
                        .members
                        .remove(id)
                        .map(|_| ())
                        .ok_or(ResponseError::UnknownMemberId)
                })
                .collect();
            if answers.iter().any(Result::is_ok) {
                tracing::info!(group, members = ?member_ids, "Kafka group members left");
                state.rebalance(now);
            }
            self.forget_if_empty(&mut groups, group);
            answers
        };
        self.changed.notify_waiters();
        answers
    }

    /// `group` as DescribeGroups shows it.
    pub(crate) fn describe(&self, group: &str) -> Described {
        let groups = self.lock_expired(Some(group));
        let Some(state) = groups.get(group) else {
            return Described {
                state: DEAD,
                protocol_type: String::new(),
                protocol: String::new(),
                members: Vec::new(),
            };
        };
        // As Kafka describes a group: its protocol, and its members' metadata and
        // assignments, only while it is stable (a rebalance is deciding them).
        let stable = matches!(state.phase, Phase::Stable);
        let protocol = state
            .round
            .as_ref()
            .filter(|_| stable)
            .map(|round| round.protocol.clone())
            .unwrap_or_default();
        Described {
            state: state.phase.name(),
            protocol_type: state.protocol_type.clone(),
            members: state
                .members
                .iter()
                .map(|(id, member)| {
                    let (metadata, assignment) = match stable {
                        true => (member.metadata(&protocol), member.assignment.clone()),
                        false => (Bytes::new(), Bytes::new()),
                    };
                    (
                        id.clone(),
                        member.client_id.clone(),
                        member.client_host.clone(),
                        metadata,
                        assignment,
                    )
                })
                .collect(),
            protocol,
        }
    }

    /// Every group with its members, by name, as the server lists them for its native
    /// clients: each member with the partitions the group's leader assigned it while the group
    /// is stable and its members are Kafka consumers (protocol type `consumer`); a group whose
    /// last member left in the last 30 minutes as `Empty`, with its last generation. The
    /// assignments are read once the groups' lock is let go (they take what a client sent).
    pub fn groups(&self) -> Vec<KafkaGroupDescription> {
        let groups = self.lock_expired(None);
        let mut copied: Vec<(KafkaGroupDescription, Vec<Option<Bytes>>)> = groups
            .iter()
            .map(|(name, group)| {
                let assigned = matches!(group.phase, Phase::Stable)
                    && group.protocol_type == CONSUMER_PROTOCOL;
                let description = KafkaGroupDescription {
                    name: name.clone(),
                    state: group.phase.name().to_owned(),
                    generation: group.generation,
                    protocol: group
                        .round
                        .as_ref()
                        .map(|round| round.protocol.clone())
                        .unwrap_or_default(),
                    members: group
                        .members
                        .iter()
                        .map(|(id, member)| KafkaMemberDescription {
                            member: id.clone(),
                            client_id: member.client_id.clone(),
                            client_host: member.client_host.clone(),
                            assignment: Vec::new(),
                        })
                        .collect(),
                };
                let assignments = group
                    .members
                    .values()
                    .map(|member| assigned.then(|| member.assignment.clone()))
                    .collect();
                (description, assignments)
            })
            .collect();
        drop(groups);
        // Groups whose last member left lately keep their generation a while, as Kafka keeps
        // an empty group: listed so, with no members (their offsets are the broker's group's).
        let forgotten = self
            .forgotten
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(name, (_, when))| {
                when.elapsed() < FORGOTTEN_FOR
                    && !copied.iter().any(|(listed, _)| listed.name == **name)
            })
            .map(|(name, (generation, _))| {
                let description = KafkaGroupDescription {
                    name: name.clone(),
                    state: Phase::Empty.name().to_owned(),
                    generation: *generation,
                    protocol: String::new(),
                    members: Vec::new(),
                };
                (description, Vec::new())
            })
            .collect::<Vec<_>>();
        copied.extend(forgotten);
        for (description, assignments) in &mut copied {
            for (member, assignment) in description.members.iter_mut().zip(assignments.iter()) {
                member.assignment = assignment
                    .as_deref()
                    .and_then(assigned_partitions)
                    .unwrap_or_default();
            }
        }
        let mut listed: Vec<KafkaGroupDescription> = copied
            .into_iter()
            .map(|(description, _)| description)
            .collect();
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        listed
    }

    /// Every group with its protocol type and state, by name.
    pub(crate) fn list(&self) -> Vec<(String, String, &'static str)> {
        let groups = self.lock_expired(None);
        let mut listed: Vec<_> = groups
            .iter()
            .map(|(name, state)| {
                (
                    name.clone(),
                    state.protocol_type.clone(),
                    state.phase.name(),
                )
            })
            .collect();
        listed.sort();
        listed
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use super::*;

    /// A consumer's request to join as `member_id` (empty for a new member), speaking `range`.
    pub(crate) fn join(member_id: &str) -> Join {
        Join {
            member_id: member_id.to_owned(),
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn a_join_waits_for_its_groups_turn_and_turns_are_forgotten_when_given_up() {
        let coordinator = Coordinator::default();
        // Commits share the turn; a turn alone waits for them.
        let commit = coordinator.commit_turn("g").await;
        let other_commit = coordinator.commit_turn("g").await;
        let alone = coordinator.turn("g");
        tokio::pin!(alone);
        tokio::select! {
            _ = &mut alone => panic!("a turn alone was given during commits"),
            () = tokio::task::yield_now() => {}
        }
        drop((commit, other_commit));
        let turn = alone.await;
        let other = coordinator.turn("h").await;
        let joining = coordinator.join("g", join(""));
        tokio::pin!(joining);
        tokio::select! {
            _ = &mut joining => panic!("joined while the group's turn was held"),
            () = tokio::task::yield_now() => {}
        }
        assert!(!coordinator.has_members("g"));
        drop(turn);
        drop(other);
        let (_member, round) = joining.await.unwrap();
        assert_eq!(round.generation, 1);
        assert!(coordinator.turns.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn groups_are_listed_with_their_members_assignments_once_stable() {
        let coordinator = Arc::new(Coordinator::default());
        let (first, _) = coordinator.join("g", join("")).await.unwrap();
        let mut connect = join("");
        connect.protocol_type = "connect".into();
        let (worker, _) = coordinator.join("workers", connect).await.unwrap();
        let listed = coordinator.groups();
        assert_eq!(
            listed
                .iter()
                .map(|group| (group.name.as_str(), group.state.as_str(), group.generation))
                .collect::<Vec<_>>(),
            [
                ("g", "CompletingRebalance", 1),
                ("workers", "CompletingRebalance", 1)
            ]
        );
        assert_eq!(listed[0].protocol, "range");
        assert_eq!(listed[0].members[0].member, first);
        assert_eq!(listed[0].members[0].client_id, "client");
        assert!(listed[0].members[0].assignment.is_empty(), "not synced yet");
        let assignment = crate::testing::consumer_assignment(1, &[("t", &[1, 0])]);
        coordinator
            .sync("g", &first, 1, vec![(first.clone(), assignment.clone())])
            .await
            .unwrap();
        coordinator
            .sync("workers", &worker, 1, vec![(worker.clone(), assignment)])
            .await
            .unwrap();
        let listed = coordinator.groups();
        assert_eq!(listed[0].state, "Stable");
        assert_eq!(
            listed[0].members[0].assignment,
            [broker_core::TopicPartitions {
                topic: "t".into(),
                partitions: vec![0, 1]
            }]
        );
        // Not a consumer's assignment: not read.
        assert!(listed[1].members[0].assignment.is_empty());
        // Described as Kafka does while it rebalances: no protocol, metadata or assignment.
        let _ = coordinator.leave("workers", std::slice::from_ref(&worker));
        let second = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("")).await }
        });
        tokio::task::yield_now().await;
        let rebalancing = coordinator.describe("g");
        assert_eq!(rebalancing.state, "PreparingRebalance");
        assert_eq!(rebalancing.protocol, "");
        assert!(rebalancing
            .members
            .iter()
            .all(|(_, _, _, metadata, assignment)| metadata.is_empty() && assignment.is_empty()));
        second.abort();
        // A group whose last member left is listed empty, with its last generation.
        let workers = coordinator
            .groups()
            .into_iter()
            .find(|group| group.name == "workers")
            .unwrap();
        assert_eq!(
            (
                workers.state.as_str(),
                workers.generation,
                workers.members.len()
            ),
            ("Empty", 1, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_member_rebalances_the_group_and_both_get_the_leaders_assignment() {
        let coordinator = Arc::new(Coordinator::default());
        let (first, round) = coordinator.join("g", join("")).await.unwrap();
        assert_eq!(
            (round.generation, round.leader.as_str()),
            (1, first.as_str())
        );
        coordinator
            .sync(
                "g",
                &first,
                1,
                vec![(first.clone(), Bytes::from_static(b"all"))],
            )
            .await
            .unwrap();
        assert_eq!(coordinator.describe("g").state, "Stable");
        // A second member joins: the first learns of the rebalance by its heartbeat.
        let second = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("")).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(
            coordinator.heartbeat("g", &first, 1, true).await,
            Err(ResponseError::RebalanceInProgress)
        );
        let (_, round) = coordinator.join("g", join(&first)).await.unwrap();
        let (second_id, second_round) = second.await.unwrap().unwrap();
        assert_eq!(round, second_round);
        assert_eq!(round.generation, 2);
        assert_eq!(round.leader, first, "the leader stays the leader");
        assert_eq!(round.members.len(), 2);
        let waiting = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            let second_id = second_id.clone();
            async move { coordinator.sync("g", &second_id, 2, Vec::new()).await }
        });
        tokio::task::yield_now().await;
        let assignments = vec![
            (first.clone(), Bytes::from_static(b"p0")),
            (second_id.clone(), Bytes::from_static(b"p1")),
        ];
        assert_eq!(
            coordinator.sync("g", &first, 2, assignments).await.unwrap(),
            "p0"
        );
        assert_eq!(waiting.await.unwrap().unwrap(), "p1");
        assert_eq!(
            coordinator.heartbeat("g", &second_id, 2, true).await,
            Ok(())
        );
        assert_eq!(
            coordinator.heartbeat("g", &second_id, 1, true).await,
            Err(ResponseError::IllegalGeneration)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_joining_again_rebalances_and_its_new_assignment_is_taken() {
        let coordinator = Coordinator::default();
        let (leader, round) = coordinator.join("g", join("")).await.unwrap();
        coordinator
            .sync(
                "g",
                &leader,
                round.generation,
                vec![(leader.clone(), Bytes::from_static(b"old"))],
            )
            .await
            .unwrap();
        // Alone in the group, it joins again (its topic gained partitions): a new generation,
        // and the assignment it sends then is the one it gets.
        let (_, again) = coordinator.join("g", join(&leader)).await.unwrap();
        assert_eq!(again.generation, round.generation + 1);
        let assigned = coordinator
            .sync(
                "g",
                &leader,
                again.generation,
                vec![(leader.clone(), Bytes::from_static(b"new"))],
            )
            .await
            .unwrap();
        assert_eq!(assigned, "new");
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_gets_the_round_it_was_counted_in_even_if_another_starts_first() {
        let coordinator = Arc::new(Coordinator::default());
        let started = Instant::now();
        let (a, _) = coordinator.join("g", join("")).await.unwrap();
        coordinator.sync("g", &a, 1, Vec::new()).await.unwrap();
        let b = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("")).await }
        });
        tokio::task::yield_now().await;
        // A joins again: the round of A and B completes, but before B's request hears of it a
        // third member starts the next rebalance.
        let (_, round) = coordinator.join("g", join(&a)).await.unwrap();
        assert_eq!((round.generation, round.members.len()), (2, 2));
        let c = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("")).await }
        });
        tokio::task::yield_now().await;
        let (b, b_round) = b.await.unwrap().unwrap();
        assert_eq!(b_round, round, "B is answered the round it was counted in");
        // A and B join again, and C's round completes with the three, before any deadline.
        let again = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join(&b)).await }
        });
        let (_, last) = coordinator.join("g", join(&a)).await.unwrap();
        assert_eq!(again.await.unwrap().unwrap().1, last);
        assert_eq!(c.await.unwrap().unwrap().1, last);
        assert_eq!((last.generation, last.members.len()), (3, 3));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited out a deadline"
        );
    }

    /// A member whose SyncGroup waits (its leader has not assigned yet) when a rebalance
    /// starts has not joined that rebalance: it is answered REBALANCE_IN_PROGRESS and must join
    /// again, and the rebalance waits for it rather than completing without it (which would
    /// start yet another one when it joins).
    #[tokio::test(start_paused = true)]
    async fn a_member_waiting_in_sync_group_has_not_joined_a_rebalance_that_starts() {
        let coordinator = Arc::new(Coordinator::default());
        let (first, _) = coordinator.join("g", join("")).await.unwrap();
        let second = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("")).await }
        });
        tokio::task::yield_now().await;
        coordinator.join("g", join(&first)).await.unwrap();
        let (second, round) = second.await.unwrap().unwrap();
        assert_eq!(round.generation, 2);
        // The follower waits in SyncGroup for the leader's assignment.
        let syncing = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            let second = second.clone();
            async move { coordinator.sync("g", &second, 2, Vec::new()).await }
        });
        tokio::task::yield_now().await;
        // A third member joins meanwhile, and the leader joins again.
        let third = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("")).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(
            syncing.await.unwrap(),
            Err(ResponseError::RebalanceInProgress)
        );
        let leader = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            let first = first.clone();
            async move { coordinator.join("g", join(&first)).await }
        });
        tokio::task::yield_now().await;
        assert!(
            !leader.is_finished(),
            "completed without the syncing member"
        );
        let (_, round) = coordinator.join("g", join(&second)).await.unwrap();
        assert_eq!((round.generation, round.members.len()), (3, 3));
        assert_eq!(leader.await.unwrap().unwrap().1, round);
        assert_eq!(third.await.unwrap().unwrap().1, round);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_stops_heartbeating_is_removed_and_a_leave_rebalances() {
        let coordinator = Coordinator::default();
        let (first, _) = coordinator.join("g", join("")).await.unwrap();
        coordinator.sync("g", &first, 1, Vec::new()).await.unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!coordinator.has_members("g"));
        // A group without members is forgotten: it starts afresh.
        assert_eq!(coordinator.describe("g").state, "Dead");
        let (again, round) = coordinator.join("g", join("")).await.unwrap();
        assert_eq!(round.generation, 1);
        assert_eq!(
            coordinator.leave("g", &[again.clone(), "nobody".into()]),
            vec![Ok(()), Err(ResponseError::UnknownMemberId)]
        );
        assert_eq!(coordinator.describe("g").state, "Dead");
        assert!(coordinator.list().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn members_of_a_group_coordinated_elsewhere_are_taken_in_commit_and_join_again() {
        let coordinator = Arc::new(Coordinator::default());
        let rebalancing = Err(ResponseError::RebalanceInProgress);
        // Another coordinator had the group at generation 7 with members a and b; a stale
        // member z of generation 6 shows up first (and may commit: nothing says yet that a
        // later generation fenced it).
        assert_eq!(coordinator.heartbeat("g", "z", 6, true).await, rebalancing);
        assert_eq!(coordinator.may_commit("g", "z", 6, true), Ok(()));
        assert_eq!(coordinator.heartbeat("g", "a", 7, true).await, rebalancing);
        // Generation 7 fences z, which may no longer commit nor come back in.
        for _ in 0..2 {
            assert_eq!(
                coordinator.may_commit("g", "z", 6, true),
                Err(ResponseError::UnknownMemberId)
            );
        }
        assert_eq!(coordinator.describe("g").state, "PreparingRebalance");
        // a joins again at once: the round waits for the window to end, and for b.
        let a = tokio::spawn({
            let coordinator = Arc::clone(&coordinator);
            async move { coordinator.join("g", join("a")).await }
        });
        tokio::task::yield_now().await;
        tokio::time::advance(REBUILD_WINDOW / 2).await;
        assert!(!a.is_finished(), "completed within the window");
        assert_eq!(coordinator.heartbeat("g", "b", 7, true).await, rebalancing);
        tokio::time::advance(REBUILD_WINDOW).await;
        assert!(!a.is_finished(), "completed without b");
        // b commits what it consumed, then joins again; a stranger naming no generation may
        // not commit, and a commit naming a later one waits for its member's heartbeat (which
        // would take it in, and leave a and b out).
        assert_eq!(coordinator.may_commit("g", "b", 7, true), Ok(()));
        assert_eq!(
            coordinator.may_commit("g", "", -1, true),
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            coordinator.may_commit("g", "y", 8, true),
            Err(ResponseError::CoordinatorLoadInProgress)
        );
        let (b, round) = coordinator.join("g", join("b")).await.unwrap();
        assert_eq!(b, "b");
        assert_eq!((round.generation, round.members.len()), (8, 2));
        assert_eq!(a.await.unwrap().unwrap().1, round);
        // Rebuilt, the group takes no one in any more.
        assert_eq!(
            coordinator.heartbeat("g", "w", 8, true).await,
            Err(ResponseError::UnknownMemberId)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_generation_fences_the_members_taken_in_before_whenever_it_comes() {
        let coordinator = Arc::new(Coordinator::default());
        let rebalancing = Err(ResponseError::RebalanceInProgress);
        // A fenced member comes first, and is heard from again after the window.
        assert_eq!(coordinator.heartbeat("g", "z", 6, true).await, rebalancing);
        tokio::time::advance(REBUILD_WINDOW).await;
        assert_eq!(coordinator.heartbeat("g", "z", 6, true).await, rebalancing);
        // A member of the later generation arrives before the round completes: z is left out.
        assert_eq!(coordinator.heartbeat("g", "a", 7, true).await, rebalancing);
        assert_eq!(
            coordinator.heartbeat("g", "z", 6, true).await,
            Err(ResponseError::UnknownMemberId)
        );
        assert_eq!(
            coordinator.may_commit("g", "z", 6, true),
            Err(ResponseError::UnknownMemberId)
        );
        let (_, round) = coordinator.join("g", join("a")).await.unwrap();
        assert_eq!((round.generation, round.members.len()), (8, 1));
        // A member that leaves while the group is rebuilt leaves no mark that would keep out
        // the others of its generation.
        assert_eq!(coordinator.heartbeat("h", "a", 3, true).await, rebalancing);
        assert_eq!(coordinator.leave("h", &["a".to_owned()]), vec![Ok(())]);
        assert_eq!(coordinator.heartbeat("h", "b", 3, true).await, rebalancing);
        // Nor does a group whose members all went silent stop taking them in: the next one
        // starts its rebalance again.
        tokio::time::advance(ADOPTED_SESSION_TIMEOUT * 2).await;
        assert_eq!(coordinator.heartbeat("h", "c", 3, true).await, rebalancing);
        assert_eq!(coordinator.describe("h").state, "PreparingRebalance");
    }

    #[tokio::test(start_paused = true)]
    async fn some_members_are_never_taken_in() {
        let coordinator = Coordinator::default();
        // A member id longer than Kafka's, a group whose name has native members (the caller
        // says so), a generation of none.
        let long = "m".repeat(MAX_ADOPTED_ID_BYTES + 1);
        for (member, generation, may_adopt) in [
            (long.as_str(), 1, true),
            ("m", 1, false),
            ("m", 0, true),
            ("", 3, true),
        ] {
            assert_eq!(
                coordinator
                    .heartbeat("h", member, generation, may_adopt)
                    .await,
                Err(ResponseError::UnknownMemberId),
                "{member:.8} {generation} {may_adopt}"
            );
        }
        assert!(!coordinator.knows("h"));
        // Nor does a coordinator take members in past its limits.
        let small = Coordinator::new(1, 1);
        let rebalancing = Err(ResponseError::RebalanceInProgress);
        assert_eq!(small.heartbeat("g", "a", 1, true).await, rebalancing);
        for (group, member) in [("g", "b"), ("h", "a")] {
            assert_eq!(
                small.heartbeat(group, member, 1, true).await,
                Err(ResponseError::UnknownMemberId),
                "{group} {member}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_taken_in_that_does_not_join_again_is_left_out() {
        let coordinator = Coordinator::default();
        let rebalancing = Err(ResponseError::RebalanceInProgress);
        assert_eq!(coordinator.may_commit("g", "gone", 3, true), Ok(()));
        assert_eq!(
            coordinator.heartbeat("g", "back", 3, true).await,
            rebalancing
        );
        tokio::time::advance(REBUILD_WINDOW).await;
        let started = Instant::now();
        let (_, round) = coordinator.join("g", join("back")).await.unwrap();
        assert_eq!((round.generation, round.members.len()), (4, 1));
        // Left out once it went unheard for its session, not at the joiner's longer deadline.
        assert!(
            started.elapsed() <= ADOPTED_SESSION_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
        // A group taken in by one heartbeat of a member that then went away is forgotten once
        // it is looked at (and, never rebuilt, leaves no generation behind).
        assert_eq!(
            coordinator.heartbeat("ghost", "late", 5, true).await,
            rebalancing
        );
        tokio::time::advance(ADOPTED_SESSION_TIMEOUT * 2).await;
        assert_eq!(coordinator.describe("ghost").state, DEAD);
        assert!(coordinator.list().iter().all(|(name, ..)| name != "ghost"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_member_of_a_group_forgotten_is_not_taken_back_in() {
        let coordinator = Coordinator::default();
        let (a, round) = coordinator.join("g", join("")).await.unwrap();
        coordinator
            .sync("g", &a, round.generation, Vec::new())
            .await
            .unwrap();
        assert_eq!(
            coordinator.leave("g", std::slice::from_ref(&a)),
            vec![Ok(())]
        );
        assert_eq!(coordinator.describe("g").state, DEAD);
        for generation in [round.generation - 1, round.generation] {
            assert_eq!(
                coordinator.may_commit("g", "z", generation, true),
                Err(ResponseError::UnknownMemberId)
            );
        }
        // The generation wraps rather than overflowing.
        let wrapping = Coordinator::default();
        assert_eq!(
            wrapping.heartbeat("w", "m", i32::MAX, true).await,
            Err(ResponseError::RebalanceInProgress)
        );
        tokio::time::advance(REBUILD_WINDOW).await;
        let (_, round) = wrapping.join("w", join("m")).await.unwrap();
        assert_eq!(round.generation, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_without_a_generation_goes_on_only_while_the_group_has_no_members() {
        let coordinator = Coordinator::default();
        assert_eq!(coordinator.may_commit("g", "", -1, true), Ok(()));
        let (member, _) = coordinator.join("g", join("")).await.unwrap();
        coordinator.sync("g", &member, 1, Vec::new()).await.unwrap();
        assert_eq!(coordinator.may_commit("g", &member, 1, true), Ok(()));
        // Nobody else moves the offsets of the partitions its member holds, whatever member id
        // it names.
        for stranger in ["", "stranger"] {
            assert_eq!(
                coordinator.may_commit("g", stranger, -1, true),
                Err(ResponseError::UnknownMemberId),
                "{stranger:?}"
            );
        }
        assert_eq!(
            coordinator.may_commit("g", &member, -1, true),
            Err(ResponseError::IllegalGeneration)
        );
        // Once its member is gone (no heartbeat within its session timeout), it may again.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(coordinator.may_commit("g", "", -1, true), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_that_does_not_join_again_is_left_out_at_the_deadline() {
        let coordinator = Arc::new(Coordinator::default());
        let (first, _) = coordinator.join("g", join("")).await.unwrap();
        coordinator.sync("g", &first, 1, Vec::new()).await.unwrap();
        // The first member never joins again: the second waits the rebalance timeout.
        let (second, round) = coordinator.join("g", join("")).await.unwrap();
        assert_eq!(round.members.len(), 1);
        assert_eq!(round.leader, second);
        assert_eq!(
            coordinator.join("g", join("unknown")).await.map(|_| ()),
            Err(ResponseError::UnknownMemberId)
        );
        let mut other = join("");
        other.protocols = vec![("roundrobin".into(), Bytes::new())];
        assert_eq!(
            coordinator.join("g", other).await.map(|_| ()),
            Err(ResponseError::InconsistentGroupProtocol)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn groups_and_members_past_the_limits_are_refused() {
        let coordinator = Coordinator::new(1, 1);
        let (first, _) = coordinator.join("g", join("")).await.unwrap();
        assert_eq!(
            coordinator.join("g", join("")).await.map(|_| ()),
            Err(ResponseError::GroupMaxSizeReached)
        );
        assert_eq!(
            coordinator.join("other", join("")).await.map(|_| ()),
            Err(ResponseError::GroupMaxSizeReached)
        );
        // Its own member joins again; once it left, another group may form.
        coordinator.join("g", join(&first)).await.unwrap();
        coordinator.leave("g", &[first]);
        coordinator.join("other", join("")).await.unwrap();
        // A group whose members vanished without leaving (their sessions timed out) does not
        // hold its place: a new group forms in it, without the old one being named again.
        tokio::time::advance(Duration::from_secs(11)).await;
        coordinator.join("third", join("")).await.unwrap();
        assert!(!coordinator.has_members("other"));
    }
}
