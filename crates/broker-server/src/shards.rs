//! A single broker's topics spread over several shards (`--shards N`), so that requests about
//! different topics are applied under different locks, on different cores.
//!
//! Each shard is a [`Broker`]: a state of its own behind its own lock, with its own journal and
//! checkpoints when there is a data directory. A topic, its partitions, its consumer groups and
//! their offsets live in exactly one shard, so every call about one topic is applied atomically
//! by one state, as with one shard: nothing about a single topic's calls changes. What the
//! shards share is only the [`Placement`]: which shard holds which topic.
//!
//! - A command about one topic goes to its topic's shard ([`Route::One`]); one about a topic no
//!   shard holds goes to shard 0, which answers as any broker does about an unknown topic.
//! - A description of every topic is gathered from every shard ([`Route::Every`]): each topic
//!   as of a moment within the call, not every topic at one moment. A shard whose storage
//!   failed (it refuses every call until the restart) is left out, so that the others' topics
//!   stay listed and reachable.
//! - Commands that change the placement ([`Route::Placing`]: creating, deleting and growing a
//!   topic, naming a group's dead-letter topic) are applied one at a time ([`Shards::place`]),
//!   so that no two shards ever create the same name.
//!
//! # Locks
//!
//! A placing command takes `placing` first, with no shard's lock held, then its shard's lock;
//! the placement itself is only ever held for a lookup or an update, never while a shard's
//! lock is waited for. So routing (which reads the placement while a batch may hold a shard's
//! lock) never waits for anything but such a moment.
//!
//! # Where a new topic goes
//!
//! A name some group gives as its dead-letter topic goes to that group's shard; a topic whose
//! name is another topic's followed by a separator and a suffix of a dead-letter or retry topic
//! ([`broker_core::companions_of`]: `orders-dlq`, `orders_retry`) goes to that topic's shard;
//! any other to the shard holding the fewest partitions (the lowest id among equals, skipping
//! shards whose storage failed), so that `orders-0`, `orders-1`, ... spread. A group's
//! dead-letter topic must be held by the group's shard (a record moves to it atomically):
//! naming one that another shard holds, or that another shard's group names, is refused.
//!
//! With one shard (the default) every command goes to it and the placement is never consulted.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use broker_core::{BrokerDescription, BrokerError, Command, GroupSetting, Outcome};
use broker_proto::ErrorReply;

use crate::broker::Broker;

/// The shards of a broker and where its topics are.
#[derive(Debug)]
pub(crate) struct Shards {
    brokers: Vec<Arc<Broker>>,
    /// Which shard holds which topic; consulted only with several shards. Held only for a
    /// lookup or an update (see the module's "Locks").
    placement: RwLock<Placement>,
    /// Held by a placing command from its decision to its placement's update, so that placing
    /// commands apply one at a time. Taken before any shard's lock. Holds when lapsed
    /// dead-letter names were last looked for ([`Shards::forget_lapsed_dead_letters`]).
    placing: Mutex<Option<std::time::Instant>>,
    /// The most topics the broker holds, across its shards.
    max_topics: usize,
}

/// Where a command is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// In this shard.
    One(usize),
    /// In every shard, the answers merged ([`merge`]).
    Every,
    /// In the shard [`Shards::place`] decides, with the placement locked.
    Placing,
}

impl Shards {
    /// A broker of one shard.
    pub(crate) fn single(broker: Broker) -> Shards {
        Shards {
            brokers: vec![Arc::new(broker)],
            placement: RwLock::new(Placement::new(1)),
            placing: Mutex::new(None),
            max_topics: usize::MAX,
        }
    }

    /// A broker of the shards `brokers` (shard `i` is `brokers[i]`; at least one), holding at
    /// most `max_topics` topics across them. No two of them may hold a topic of the same name
    /// (see [`duplicate_topic`]).
    pub(crate) fn new(brokers: Vec<Broker>, max_topics: usize) -> Shards {
        let mut placement = Placement::new(brokers.len());
        for (shard, broker) in brokers.iter().enumerate() {
            let description = broker.lock().describe();
            for topic in &description.topics {
                placement.created(&topic.name, shard, topic.partitions.len());
                for group in &topic.groups {
                    for setting in &group.settings {
                        if let GroupSetting::DeadLetter(name) = setting {
                            placement.names_dead_letter(name.as_str(), shard);
                        }
                    }
                }
            }
        }
        Shards {
            brokers: brokers.into_iter().map(Arc::new).collect(),
            placement: RwLock::new(placement),
            placing: Mutex::new(None),
            max_topics,
        }
    }

    /// Every shard, by id.
    pub(crate) fn all(&self) -> &[Arc<Broker>] {
        &self.brokers
    }

    /// Shard `shard` (shard 0 for an id out of range, which no route gives).
    pub(crate) fn get(&self, shard: usize) -> &Arc<Broker> {
        self.brokers.get(shard).unwrap_or(&self.brokers[0])
    }

    /// Shard 0: the only one of a cluster node.
    pub(crate) fn first(&self) -> &Arc<Broker> {
        &self.brokers[0]
    }

    /// Where `command` is applied.
    pub(crate) fn route(&self, command: &Command) -> Route {
        if self.brokers.len() == 1 {
            return Route::One(0);
        }
        let places = match command {
            Command::Create { .. }
            | Command::DeleteTopic { .. }
            | Command::AddPartitions { .. } => true,
            Command::Join { settings, .. } | Command::ConfigureGroup { settings, .. } => {
                dead_letter_of(settings).is_some()
            }
            _ => false,
        };
        if places {
            return Route::Placing;
        }
        match command.topic() {
            Some(topic) => Route::One(self.shard_of(topic)),
            None if matches!(command, Command::Describe { topic: None }) => Route::Every,
            None => Route::One(0),
        }
    }

    /// The shard holding `topic`: shard 0 when none does.
    pub(crate) fn shard_of(&self, topic: &str) -> usize {
        if self.brokers.len() == 1 {
            return 0;
        }
        self.read_placement().shard_of(topic).unwrap_or(0)
    }

    /// Applies `command` (of [`Route::Placing`]) in the shard it belongs to, through
    /// `execute`, one placing command at a time; returns that shard with what `execute`
    /// returned, or the refusal of a command the placement does not allow (a new topic past the
    /// broker's maximum, a group's dead-letter topic in another shard than the group). Must be
    /// called with no shard's lock held.
    pub(crate) fn place<T>(
        &self,
        command: Command,
        execute: impl FnOnce(&Broker, Command) -> (Result<Outcome, ErrorReply>, T),
    ) -> Result<(usize, Result<Outcome, ErrorReply>, T), ErrorReply> {
        let mut placing = self.placing.lock().unwrap_or_else(PoisonError::into_inner);
        let failed = match &command {
            Command::Create { .. } => self
                .brokers
                .iter()
                .map(|broker| broker.lock().failure().is_some())
                .collect(),
            _ => Vec::new(),
        };
        let mut decided = self
            .read_placement()
            .shard_for(&command, self.max_topics, &failed);
        if matches!(decided, Err(Refusal::TooManyTopics(_))) {
            // Names that groups gave as dead-letter topics and no longer give count no more.
            self.forget_lapsed_dead_letters(&mut placing);
            decided = self
                .read_placement()
                .shard_for(&command, self.max_topics, &failed);
        }
        let shard = match decided {
            Ok(shard) => shard,
            // A name only a group of another shard gave, which no group there gives any more
            // (its topic was deleted, or the group reconfigured): the reservation lapsed.
            Err(Refusal::DeadLetterElsewhere {
                name,
                other,
                shard,
                exists: false,
                ..
            }) if !self.names_dead_letter(other, &name) => {
                self.write_placement().dead_letters.remove(&name);
                shard
            }
            Err(refusal) => return Err(refusal.reply()),
        };
        let change = PlacementChange::of(&command);
        let (result, extra) = execute(&self.brokers[shard], command);
        if let Ok(outcome) = &result {
            if let (PlacementChange::Created { topic, .. }, Outcome::Created(true)) =
                (&change, outcome)
            {
                tracing::info!(%topic, shard, "topic placed");
            }
            let names_dead_letter = matches!(change, PlacementChange::NamesDeadLetter(_));
            change.apply(&mut self.write_placement(), shard, outcome);
            // Each group reconfigured with a new name adds one: kept within the broker's
            // maximum of topics by forgetting those no group gives any more.
            if names_dead_letter && self.read_placement().dead_letters.len() > self.max_topics {
                self.forget_lapsed_dead_letters(&mut placing);
            }
        }
        Ok((shard, result, extra))
    }

    /// Forgets the dead-letter names that no group of their shard gives any more (its group was
    /// reconfigured, or its topic deleted) and that are no topic: they count against the
    /// broker's maximum of topics no more. Describes each shard holding such a name once, and
    /// so looks at most once a second (`last`, held under the placing lock): refusals at the
    /// limit, repeated, cost a describe of the state once a second, not each.
    fn forget_lapsed_dead_letters(&self, last: &mut Option<std::time::Instant>) {
        if last.is_some_and(|at| at.elapsed() < std::time::Duration::from_secs(1)) {
            return;
        }
        *last = Some(std::time::Instant::now());
        let reserved: Vec<(String, usize)> = {
            let placement = self.read_placement();
            placement
                .dead_letters
                .iter()
                .filter(|(name, _)| !placement.topics.contains_key(*name))
                .map(|(name, &shard)| (name.clone(), shard))
                .collect()
        };
        let mut given: HashMap<usize, HashSet<String>> = HashMap::new();
        for &(_, shard) in &reserved {
            given.entry(shard).or_insert_with(|| {
                let description = self.get(shard).lock().describe();
                description
                    .topics
                    .iter()
                    .flat_map(|topic| {
                        topic
                            .groups
                            .iter()
                            .filter_map(|group| dead_letter_of(&group.settings))
                            .map(str::to_owned)
                            .chain(std::iter::once(topic.name.clone()))
                    })
                    .collect()
            });
        }
        let mut placement = self.write_placement();
        for (name, shard) in reserved {
            if !given.get(&shard).is_some_and(|names| names.contains(&name)) {
                placement.dead_letters.remove(&name);
            }
        }
    }

    /// Whether shard `shard` holds a topic named `name` or a group that names it as its
    /// dead-letter topic.
    fn names_dead_letter(&self, shard: usize, name: &str) -> bool {
        let description = self.get(shard).lock().describe();
        description.topics.iter().any(|topic| {
            topic.name == name
                || topic
                    .groups
                    .iter()
                    .any(|group| dead_letter_of(&group.settings) == Some(name))
        })
    }

    /// A description of `topic` (an unknown one is refused), or of every topic of every shard
    /// whose storage has not failed when `None`, sorted by name (refused only when every
    /// shard's storage failed).
    pub(crate) fn describe_topics(
        &self,
        topic: Option<&str>,
    ) -> Result<BrokerDescription, BrokerError> {
        match topic {
            Some(topic) => self
                .get(self.shard_of(topic))
                .lock()
                .describe_topics(Some(topic)),
            None => {
                let mut all: Option<BrokerDescription> = None;
                let mut failure = None;
                for broker in &self.brokers {
                    let broker = broker.lock();
                    // As in a gathered description: a shard whose storage failed is left out,
                    // so that the topics the others serve stay listed.
                    if let Some(why) = broker.failure() {
                        failure.get_or_insert(why);
                        continue;
                    }
                    let description = broker.describe();
                    match &mut all {
                        Some(all) => all.topics.extend(description.topics),
                        None => all = Some(description),
                    }
                }
                let mut all = match (all, failure) {
                    (Some(all), _) => all,
                    (None, Some(why)) => return Err(BrokerError::Storage(why)),
                    (None, None) => BrokerDescription::default(),
                };
                all.topics.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(all)
            }
        }
    }

    fn read_placement(&self) -> RwLockReadGuard<'_, Placement> {
        self.placement
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_placement(&self) -> RwLockWriteGuard<'_, Placement> {
        self.placement
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A topic name two of `shards` (each a list of topic names, by shard) both hold, with the
/// two shards: a directory whose shards were tampered with.
pub(crate) fn duplicate_topic<'a>(
    shards: impl IntoIterator<Item = Vec<&'a str>>,
) -> Option<(&'a str, usize, usize)> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (shard, topics) in shards.into_iter().enumerate() {
        for topic in topics {
            if let Some(other) = seen.insert(topic, shard) {
                return Some((topic, other, shard));
            }
        }
    }
    None
}

/// Why the placement refuses a command.
#[derive(Debug)]
enum Refusal {
    /// A new topic past the broker's maximum.
    TooManyTopics(usize),
    /// A group's dead-letter topic that another shard than the group's holds, or that a group
    /// of another shard gives as its own.
    DeadLetterElsewhere {
        name: String,
        topic: String,
        /// The shard of the dead-letter name.
        other: usize,
        /// The shard of the group's topic.
        shard: usize,
        /// Whether the dead-letter topic exists (or only a group names it).
        exists: bool,
    },
}

impl Refusal {
    fn reply(self) -> ErrorReply {
        ErrorReply::InvalidArgument(match self {
            Refusal::TooManyTopics(max) => {
                format!("the broker already holds its maximum of {max} topics")
            }
            Refusal::DeadLetterElsewhere {
                name,
                topic,
                other,
                shard,
                exists,
            } => {
                let suggestion = match name == format!("{topic}-dlq") {
                    true => format!("\"{topic}_dlq\""),
                    false => format!("\"{topic}-dlq\""),
                };
                let why = match exists {
                    true => format!(
                        "topic {name:?} is held by shard {other}; if it holds nothing yet, \
                         delete it and create it after configuring this group (it then goes to \
                         the group's shard), or"
                    ),
                    false => format!(
                        "a group of shard {other} names {name:?} as its dead-letter topic, and \
                         one dead-letter topic serves the groups of one shard:"
                    ),
                };
                format!(
                    "with --shards, a group's dead-letter topic must be in its topic's shard (a \
                     record moves to it in one step), and topic {topic:?} is in shard {shard}: \
                     {why} name another that does not exist yet, such as {suggestion} (the \
                     broker creates it in the group's shard when the first record moves, or \
                     when you create it afterwards)"
                )
            }
        })
    }
}

/// The answers of a description of every topic asked of every shard, as one: the topics of
/// the shards that answered, sorted by name, or the first refusal when none did. (A
/// description changes nothing, so a shard refuses it only when its storage failed: it refuses
/// every call until the restart, and its topics are left out meanwhile.)
pub(crate) fn merge(
    results: impl IntoIterator<Item = Result<Outcome, ErrorReply>>,
) -> Result<Outcome, ErrorReply> {
    let mut merged: Option<Outcome> = None;
    let mut refusal = None;
    for result in results {
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(refused) => {
                refusal.get_or_insert(refused);
                continue;
            }
        };
        merged = Some(match (merged, outcome) {
            (Some(Outcome::Description(mut all)), Outcome::Description(description)) => {
                all.topics.extend(description.topics);
                Outcome::Description(all)
            }
            (None, outcome) => outcome,
            // Only descriptions are gathered; anything else answers as the first shard did.
            (Some(first), _) => first,
        });
    }
    let mut merged = match (merged, refusal) {
        (Some(merged), _) => merged,
        (None, Some(refusal)) => return Err(refusal),
        (None, None) => {
            return Err(ErrorReply::Storage(
                "no shard answered the request".to_owned(),
            ))
        }
    };
    if let Outcome::Description(description) = &mut merged {
        description.topics.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Ok(merged)
}

/// The dead-letter topic named among `settings`, if one is.
pub(crate) fn dead_letter_of(settings: &[GroupSetting]) -> Option<&str> {
    settings.iter().find_map(|setting| match setting {
        GroupSetting::DeadLetter(topic) => Some(topic.as_str()),
        _ => None,
    })
}

/// Which shard holds which topic.
#[derive(Debug)]
struct Placement {
    /// Every topic, with its shard and partition count.
    topics: HashMap<String, Placed>,
    /// Names groups give as their dead-letter topic, with the group's shard: such a topic is
    /// created there (by the broker itself, when a record first moves to it).
    dead_letters: HashMap<String, usize>,
    /// The partitions each shard holds.
    partitions: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Placed {
    shard: usize,
    partitions: u64,
}

impl Placement {
    fn new(shards: usize) -> Placement {
        Placement {
            topics: HashMap::new(),
            dead_letters: HashMap::new(),
            partitions: vec![0; shards.max(1)],
        }
    }

    /// The shard of `topic`, or of the group that names it as its dead-letter topic.
    fn shard_of(&self, topic: &str) -> Option<usize> {
        self.topics
            .get(topic)
            .map(|placed| placed.shard)
            .or_else(|| self.dead_letters.get(topic).copied())
    }

    /// The shard a new topic named `topic` goes to (see the module's documentation); of the
    /// shards placed by load, none that `failed` marks (unless all are).
    fn home_for(&self, topic: &str, failed: &[bool]) -> usize {
        if let Some(shard) = self.shard_of(topic) {
            return shard;
        }
        let companion_of = broker_core::companions_of(topic).find_map(|base| self.shard_of(base));
        if let Some(shard) = companion_of {
            return shard;
        }
        let serving = |shard: &usize| !failed.get(*shard).copied().unwrap_or(false);
        let by_load = |shards: &mut dyn Iterator<Item = (usize, &u64)>| {
            shards
                .min_by_key(|(shard, partitions)| (**partitions, *shard))
                .map(|(shard, _)| shard)
        };
        by_load(
            &mut self
                .partitions
                .iter()
                .enumerate()
                .filter(|(shard, _)| serving(shard)),
        )
        .or_else(|| by_load(&mut self.partitions.iter().enumerate()))
        .unwrap_or(0)
    }

    /// The shard `command` is applied in, or why the placement refuses it; a new topic is not
    /// placed by load on a shard `failed` marks.
    fn shard_for(
        &self,
        command: &Command,
        max_topics: usize,
        failed: &[bool],
    ) -> Result<usize, Refusal> {
        match command {
            Command::Create { topic, .. } => {
                let counted =
                    self.topics.contains_key(topic) || self.dead_letters.contains_key(topic);
                if !counted && self.topics_counted() >= max_topics {
                    return Err(Refusal::TooManyTopics(max_topics));
                }
                Ok(self.home_for(topic, failed))
            }
            Command::Join {
                topic, settings, ..
            }
            | Command::ConfigureGroup {
                topic, settings, ..
            } => {
                let Some(shard) = self.shard_of(topic) else {
                    // An unknown topic: any shard refuses it.
                    return Ok(0);
                };
                match dead_letter_of(settings).and_then(|name| Some((name, self.shard_of(name)?))) {
                    Some((name, other)) if other != shard => Err(Refusal::DeadLetterElsewhere {
                        name: name.to_owned(),
                        topic: topic.clone(),
                        other,
                        shard,
                        exists: self.topics.contains_key(name),
                    }),
                    _ => Ok(shard),
                }
            }
            other => Ok(other
                .topic()
                .and_then(|topic| self.shard_of(topic))
                .unwrap_or(0)),
        }
    }

    /// The topics counted against the broker's maximum: those that exist, and the names
    /// groups give as dead-letter topics that do not exist yet (their shard creates one when a
    /// record first moves to it, without asking the placement, so it is counted from the
    /// moment a group names it). A name given while the broker is full is not refused (as with
    /// one shard, the group is configured); its topic may then take the broker one past its
    /// maximum per such name.
    fn topics_counted(&self) -> usize {
        let reserved = self
            .dead_letters
            .keys()
            .filter(|name| !self.topics.contains_key(*name))
            .count();
        self.topics.len() + reserved
    }

    fn created(&mut self, topic: &str, shard: usize, partitions: usize) {
        let partitions = partitions as u64;
        self.topics
            .insert(topic.to_owned(), Placed { shard, partitions });
        if let Some(load) = self.partitions.get_mut(shard) {
            *load += partitions;
        }
    }

    fn deleted(&mut self, topic: &str) {
        if let Some(placed) = self.topics.remove(topic) {
            if let Some(load) = self.partitions.get_mut(placed.shard) {
                *load = load.saturating_sub(placed.partitions);
            }
        }
    }

    fn resized(&mut self, topic: &str, partitions: usize) {
        if let Some(placed) = self.topics.get(topic).copied() {
            self.deleted(topic);
            self.created(topic, placed.shard, partitions);
        }
    }

    fn names_dead_letter(&mut self, topic: &str, shard: usize) {
        self.dead_letters.entry(topic.to_owned()).or_insert(shard);
    }
}

/// How a placing command changes the placement once applied.
enum PlacementChange {
    Created { topic: String, partitions: usize },
    Deleted(String),
    Resized(String),
    NamesDeadLetter(String),
    None,
}

impl PlacementChange {
    fn of(command: &Command) -> PlacementChange {
        match command {
            Command::Create {
                topic,
                partition_count,
                ..
            } => PlacementChange::Created {
                topic: topic.clone(),
                partitions: usize::try_from(*partition_count).unwrap_or(0),
            },
            Command::DeleteTopic { topic } => PlacementChange::Deleted(topic.clone()),
            Command::AddPartitions { topic, .. } => PlacementChange::Resized(topic.clone()),
            Command::Join { settings, .. } | Command::ConfigureGroup { settings, .. } => {
                match dead_letter_of(settings) {
                    Some(name) => PlacementChange::NamesDeadLetter(name.to_owned()),
                    None => PlacementChange::None,
                }
            }
            _ => PlacementChange::None,
        }
    }

    fn apply(self, placement: &mut Placement, shard: usize, outcome: &Outcome) {
        match (self, outcome) {
            (PlacementChange::Created { topic, partitions }, Outcome::Created(true)) => {
                placement.created(&topic, shard, partitions);
            }
            (PlacementChange::Deleted(topic), Outcome::Deleted(true)) => placement.deleted(&topic),
            (PlacementChange::Resized(topic), Outcome::PartitionCount(count)) => {
                placement.resized(&topic, usize::try_from(*count).unwrap_or(0));
            }
            (PlacementChange::NamesDeadLetter(name), _) => {
                placement.names_dead_letter(&name, shard);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use broker_core::{BrokerState, KeyHash, TopicName};

    use super::*;

    fn create(topic: &str, partitions: i32) -> Command {
        Command::Create {
            topic: topic.into(),
            partition_count: partitions,
            key_hash: KeyHash::default(),
            settings: Vec::new(),
        }
    }

    fn shards(count: usize, max_topics: usize) -> Shards {
        let brokers = (0..count)
            .map(|_| Broker::new(BrokerState::new(10).unwrap(), None))
            .collect();
        Shards::new(brokers, max_topics)
    }

    /// Applies `command` where the shards send it; its shard and answer.
    fn apply(shards: &Shards, command: Command) -> (usize, Result<Outcome, ErrorReply>) {
        let execute = |broker: &Broker, command: Command| {
            let executed = broker.lock().apply(command, &mut Vec::new());
            (executed.result, ())
        };
        match shards.route(&command) {
            Route::One(shard) => (shard, execute(shards.get(shard), command).0),
            Route::Every => (
                0,
                merge(
                    shards
                        .all()
                        .iter()
                        .map(|broker| execute(broker, command.clone()).0),
                ),
            ),
            Route::Placing => match shards.place(command, execute) {
                Ok((shard, result, ())) => (shard, result),
                Err(refusal) => (usize::MAX, Err(refusal)),
            },
        }
    }

    fn dead_letter_join(topic: &str, dead_letter: &str) -> Command {
        Command::Join {
            topic: topic.into(),
            group: "g".into(),
            member: "m".into(),
            assignor: None,
            settings: vec![
                GroupSetting::MaxDeliveries(2),
                GroupSetting::DeadLetter(TopicName::new(dead_letter).unwrap()),
            ],
        }
    }

    #[test]
    fn new_topics_go_to_the_shard_with_the_fewest_partitions_and_stay_there() {
        let shards = shards(3, 100);
        assert_eq!(apply(&shards, create("a", 4)).0, 0);
        assert_eq!(apply(&shards, create("b", 1)).0, 1);
        assert_eq!(apply(&shards, create("c", 2)).0, 2);
        // Shard 1 holds 1 partition, shard 2 holds 2.
        assert_eq!(apply(&shards, create("d", 2)).0, 1);
        // Created again: the same shard answers that it exists.
        assert_eq!(
            apply(&shards, create("c", 2)),
            (2, Ok(Outcome::Created(false)))
        );
        for (topic, shard) in [("a", 0), ("b", 1), ("c", 2), ("d", 1)] {
            let publish = Command::Publish {
                topic: topic.into(),
                partition: 0,
                payload: "x".into(),
            };
            assert_eq!(apply(&shards, publish), (shard, Ok(Outcome::Published(0))));
        }
        // A description of everything gathers every shard's topics, sorted.
        match apply(&shards, Command::Describe { topic: None }).1.unwrap() {
            Outcome::Description(description) => {
                let names: Vec<_> = description.topics.iter().map(|t| t.name.as_str()).collect();
                assert_eq!(names, ["a", "b", "c", "d"]);
            }
            other => panic!("unexpected {other:?}"),
        }
        let all = shards.describe_topics(None).unwrap();
        assert_eq!(all.topics.len(), 4);
        // Deleted, its partitions no longer count: the next topic goes to shard 0 (4 - 4).
        assert_eq!(
            apply(&shards, Command::DeleteTopic { topic: "a".into() }),
            (0, Ok(Outcome::Deleted(true)))
        );
        assert_eq!(apply(&shards, create("e", 1)).0, 0);
    }

    #[test]
    fn a_topic_named_after_another_with_a_companion_suffix_goes_with_it() {
        let shards = shards(2, 100);
        let created = |shard| (shard, Ok(Outcome::Created(true)));
        assert_eq!(apply(&shards, create("orders", 1)), created(0));
        assert_eq!(apply(&shards, create("payments", 1)), created(1));
        assert_eq!(apply(&shards, create("orders-dlq", 1)), created(0));
        assert_eq!(apply(&shards, create("payments_retry", 1)), created(1));
        assert_eq!(apply(&shards, create("orders-dead-letter", 1)), created(0));
        // Other names go by load, so that a topic split into several spreads: shard 0 holds 3
        // partitions, shard 1 holds 2.
        assert_eq!(apply(&shards, create("orders-0", 1)), created(1));
        assert_eq!(apply(&shards, create("orders-1", 1)), created(0));
        assert_eq!(apply(&shards, create("ordersdlq", 1)), created(1));
    }

    #[test]
    fn a_dead_letter_topic_is_held_with_its_group() {
        let shards = shards(2, 100);
        assert_eq!(apply(&shards, create("orders", 1)).0, 0);
        assert_eq!(apply(&shards, create("failed", 1)).0, 1);
        // A dead-letter topic in another shard is refused, and changes nothing.
        match apply(&shards, dead_letter_join("orders", "failed")) {
            (_, Err(ErrorReply::InvalidArgument(why))) => {
                assert!(why.contains("must be in its topic's shard"), "{why}");
                assert!(why.contains("topic \"failed\" is held by shard 1"), "{why}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(shards.get(0).lock().describe().topics[0].groups.is_empty());
        // One that does not exist yet is placed with the group, and created there.
        assert_eq!(
            apply(&shards, dead_letter_join("orders", "later")).1,
            Ok(Outcome::Partitions(vec![0]))
        );
        assert_eq!(apply(&shards, create("later", 1)).0, 0);
        // A placement rebuilt from the shards' states knows it too.
        let rebuilt = Shards::new(
            shards
                .all()
                .iter()
                .map(|broker| {
                    Broker::new(
                        BrokerState::from_image(broker.lock().image(), None).unwrap(),
                        None,
                    )
                })
                .collect(),
            100,
        );
        assert_eq!(rebuilt.shard_of("later"), 0);
        assert_eq!(rebuilt.shard_of("failed"), 1);
    }

    /// Polls the record at `offset` of `topic` for group `g` and retries it, twice: past the
    /// group's two deliveries, it moves to the group's dead-letter topic.
    fn dead_letter_one(shards: &Shards, topic: &str, offset: i64) {
        for _ in 0..2 {
            deliver_and_retry(shards, topic, offset);
        }
    }

    fn deliver_and_retry(shards: &Shards, topic: &str, offset: i64) {
        let poll = Command::Poll {
            topic: topic.into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 1,
            max_bytes: None,
        };
        apply(shards, poll).1.unwrap();
        let retry = Command::Retry {
            topic: topic.into(),
            group: "g".into(),
            member: "m".into(),
            partition: 0,
            offset,
        };
        assert_eq!(apply(shards, retry).1, Ok(Outcome::Retried(true)));
    }

    #[test]
    fn a_dead_letter_topic_the_broker_created_is_found_in_its_shard() {
        let shards = shards(2, 100);
        apply(&shards, create("a", 1)).1.unwrap();
        assert_eq!(apply(&shards, create("b", 1)).0, 1);
        apply(&shards, dead_letter_join("b", "b_dead")).1.unwrap();
        let publish = Command::Publish {
            topic: "b".into(),
            partition: 0,
            payload: "x".into(),
        };
        apply(&shards, publish).1.unwrap();
        dead_letter_one(&shards, "b", 0);
        // Created by shard 1's core when the record moved: joined there, with a dead-letter
        // topic of its own, and its own dead-letter topic goes there too.
        assert_eq!(
            apply(&shards, dead_letter_join("b_dead", "b_dead_again")),
            (1, Ok(Outcome::Partitions(vec![0])))
        );
        assert_eq!(apply(&shards, create("b_dead-dlq", 1)).0, 1);
    }

    #[test]
    fn a_dead_letter_name_no_group_gives_any_more_is_free_again() {
        let shards = shards(2, 100);
        apply(&shards, create("orders", 1)).1.unwrap();
        assert_eq!(apply(&shards, create("payments", 1)).0, 1);
        apply(&shards, dead_letter_join("orders", "x")).1.unwrap();
        // While a group of shard 0 names it, a group of shard 1 may not.
        match apply(&shards, dead_letter_join("payments", "x")) {
            (_, Err(ErrorReply::InvalidArgument(why))) => {
                assert!(why.contains("a group of shard 0 names \"x\""), "{why}");
            }
            other => panic!("unexpected {other:?}"),
        }
        apply(
            &shards,
            Command::DeleteTopic {
                topic: "orders".into(),
            },
        )
        .1
        .unwrap();
        assert_eq!(
            apply(&shards, dead_letter_join("payments", "x")),
            (1, Ok(Outcome::Partitions(vec![0])))
        );
        assert_eq!(apply(&shards, create("x", 1)).0, 1);
    }

    #[test]
    fn the_topic_limit_holds_across_shards() {
        let shards = shards(2, 2);
        apply(&shards, create("a", 1)).1.unwrap();
        apply(&shards, create("b", 1)).1.unwrap();
        match apply(&shards, create("c", 1)) {
            (_, Err(ErrorReply::InvalidArgument(why))) => {
                assert!(why.contains("maximum of 2 topics"), "{why}");
            }
            other => panic!("unexpected {other:?}"),
        }
        // An existing topic is still answered.
        assert_eq!(
            apply(&shards, create("a", 1)).1,
            Ok(Outcome::Created(false))
        );
    }

    #[test]
    fn a_dead_letter_name_counts_against_the_topic_limit_before_its_topic_exists() {
        let shards = shards(2, 2);
        apply(&shards, create("orders", 1)).1.unwrap();
        apply(&shards, dead_letter_join("orders", "parked"))
            .1
            .unwrap();
        match apply(&shards, create("other", 1)) {
            (_, Err(ErrorReply::InvalidArgument(why))) => {
                assert!(why.contains("maximum of 2 topics"), "{why}");
            }
            other => panic!("unexpected {other:?}"),
        }
        // The reserved name itself may still be created, in the group's shard.
        let (shard, created) = apply(&shards, create("parked", 1));
        assert_eq!(
            (shard, created),
            (shards.shard_of("orders"), Ok(Outcome::Created(true)))
        );
    }

    #[test]
    fn one_shard_routes_everything_to_it() {
        let shards = Shards::single(Broker::new(BrokerState::new(10).unwrap(), None));
        assert_eq!(shards.route(&create("a", 1)), Route::One(0));
        assert_eq!(
            shards.route(&Command::Describe { topic: None }),
            Route::One(0)
        );
    }
}
