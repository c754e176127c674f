//! The state as a [`StateImage`] and back, and the state of a version 1 image.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use super::check::check_topic;
use super::group::{Group, GroupPartition, Member};
use super::idempotence::{Producer, RecentBatch, Sequences, RECENT_BATCHES};
use super::log::{Cold, PartitionLog, StoredRecord};
use super::memory::Memory;
use super::topic::Topic;
use super::{unknown_topic, BrokerState, Limits};
use crate::cold::{Appended, ColdStore, LogId};
use crate::image::{
    v1, GroupImage, GroupPartitionImage, HeaderImage, PartitionImage, ProducerImage, RecordImage,
    SequencesImage, StateImage, TopicImage,
};
use crate::revision::Revision;
use crate::{
    Assignor, BrokerError, Discard, GroupSettings, Header, KeyHash, NameRules, Retention, StartAt,
    TopicName, TopicSettings,
};

impl BrokerState {
    /// The whole state as plain data, topics and groups sorted by name (so equal states give
    /// equal images). Records are shared, not copied.
    pub fn to_image(&self) -> StateImage {
        self.image_of(false)
    }

    /// The image of the state with every record it holds in memory counted as in its cold
    /// store, for a storage layer that wrote each one there as it was appended (see
    /// [`BrokerState::record_appends`]); with, for each partition that holds records in
    /// memory, the offsets they take (the cold store must hold them before the image is
    /// loaded, and [`BrokerState::evict`] may then take them out of memory). Copies no record.
    pub fn to_image_with_records_stored(&self) -> (StateImage, Vec<(LogId, Range<i64>)>) {
        let image = self.image_of(true);
        let mut in_memory = Vec::new();
        for topic in self.topics.values() {
            for (number, log) in topic.partitions.iter().enumerate() {
                if !log.records.is_empty() {
                    let log_id = LogId {
                        topic: topic.id,
                        // At most 65,536 partitions (see `Limits`).
                        partition: number as u32,
                    };
                    in_memory.push((log_id, log.cold_end()..log.end()));
                }
            }
        }
        (image, in_memory)
    }

    /// The image of the state; with `records_stored`, every record held in memory is counted as
    /// in the cold store instead of copied into the image.
    fn image_of(&self, records_stored: bool) -> StateImage {
        let mut topics: Vec<(String, TopicImage)> = self
            .topics
            .iter()
            .map(|(name, topic)| (name.clone(), topic_image(topic, records_stored)))
            .collect();
        topics.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        StateImage {
            capacity: self.capacity,
            clock_ms: self.clock_ms,
            next_topic_id: self.next_topic_id,
            topics,
            memory_budget: self.memory.budget,
            retained_bytes: self.memory.retained,
            max_topics: self.limits.max_topics as u64,
            max_partitions: self.limits.max_partitions as u64,
            max_groups_per_topic: self.limits.max_groups_per_topic as u64,
            max_members_per_group: self.limits.max_members_per_group as u64,
        }
    }

    /// Counts every offset every group holds as stored (see
    /// [`crate::EventBroker::stored_offsets`]): what a state rebuilt from the files of an
    /// earlier format, which did not say, is given, so that a group answers the same whether
    /// an old snapshot held it or an old log created it.
    pub fn count_every_offset_as_stored(&mut self) {
        for topic in self.topics.values_mut() {
            for group in topic.groups.values_mut() {
                for progress in &mut group.partitions {
                    progress.has_commit = true;
                }
            }
        }
    }

    /// The state an image describes, once every invariant the methods rely on is checked (see
    /// [`BrokerState::check_consistency`]): an image from a damaged or hand-edited file is
    /// refused here instead of failing later. Records the image places in a cold store are read
    /// from `cold`, which must hold them (an image with such records and no store is refused).
    ///
    /// # Errors
    /// A description of the first thing wrong.
    pub fn from_image(
        image: StateImage,
        cold: Option<Arc<dyn ColdStore>>,
    ) -> Result<BrokerState, String> {
        let mut topics = HashMap::with_capacity(image.topics.len());
        for (name, topic) in image.topics {
            let topic =
                topic_from(topic, cold.as_ref()).map_err(|why| format!("topic {name:?}: {why}"))?;
            if topic.id >= image.next_topic_id {
                return Err(format!(
                    "topic {name:?} has id {}, not below the next id {}",
                    topic.id, image.next_topic_id
                ));
            }
            if topics.insert(name.clone(), topic).is_some() {
                return Err(format!("topic {name:?} appears twice"));
            }
        }
        finish(
            BrokerState {
                capacity: image.capacity,
                clock_ms: image.clock_ms,
                next_topic_id: image.next_topic_id,
                cold,
                failure: None,
                topics,
                memory: Memory {
                    budget: image.memory_budget,
                    retained: image.retained_bytes,
                    // Counted by `finish`.
                    records: 0,
                    rules: Revision::NEWEST.rules().budget,
                },
                limits: Limits::default(),
                // Not kept in images: the broker opening one sets them.
                names: NameRules::default(),
                revision: Revision::NEWEST,
                rules: Revision::NEWEST.rules(),
                dead_letters: Vec::new(),
                dead_letter_events: 0,
                appended: None,
            },
            [
                image.max_topics,
                image.max_partitions,
                image.max_groups_per_topic,
                image.max_members_per_group,
            ],
        )
    }

    /// `topic` as an image of everything it holds (partitions, groups, idempotent producers),
    /// its records in memory and those in the cold store read back into it: what
    /// [`BrokerState::import_topic`] takes to hold the same topic in another state. Changes
    /// nothing. [`BrokerState::begin_export`] then [`TopicExport::read`] does the same with
    /// the cold store read after the state is let go.
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] for a topic that does not exist;
    /// [`BrokerError::Storage`] if records in the cold store cannot be read.
    pub fn export_topic(&self, topic: &str) -> Result<TopicImage, BrokerError> {
        self.begin_export(topic)?.read()
    }

    /// `topic` as [`BrokerState::export_topic`] exports it, but for its records in the cold
    /// store, which [`TopicExport::read`] reads without this state: a caller holding the state
    /// behind a lock lets it go before reading what may be hundreds of megabytes from disk.
    /// Records in the cold store never change, so the export is the topic as it is now, as
    /// long as they are still retained when read. Changes nothing.
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] for a topic that does not exist.
    pub fn begin_export(&self, topic: &str) -> Result<TopicExport, BrokerError> {
        let held = self.topics.get(topic).ok_or_else(|| unknown_topic(topic))?;
        let cold = held
            .partitions
            .iter()
            .map(|log| {
                log.cold.as_ref().map(|cold| ColdPart {
                    store: Arc::clone(&cold.store),
                    id: cold.id,
                    offsets: log.base..cold.end,
                })
            })
            .collect();
        Ok(TopicExport {
            image: topic_image(held, false),
            cold,
        })
    }

    /// The topics `topic` is tied to by dead-letter topics, sorted and each once: those whose
    /// consumer groups move records to it, and those its own groups move records to (created
    /// or not yet; itself left out). A record moves to a dead-letter topic within one state, so
    /// tied topics move together or not at all.
    pub fn dead_letter_ties(&self, topic: &str) -> Vec<String> {
        let dead_letters = |held: &Topic| -> Vec<String> {
            held.groups
                .values()
                .filter_map(|group| group.settings.dead_letter.as_ref())
                .map(|dead_letter| dead_letter.as_str().to_owned())
                .collect()
        };
        let naming_it = self
            .topics
            .iter()
            .filter(|(_, held)| dead_letters(held).iter().any(|name| name == topic))
            .map(|(name, _)| name.clone());
        let named = self.topics.get(topic).map(dead_letters).unwrap_or_default();
        let mut ties: Vec<String> = naming_it
            .chain(named)
            .filter(|name| name != topic)
            .collect();
        ties.sort_unstable();
        ties.dedup();
        ties
    }

    /// Holds `topic` from now on, as `image` (made by [`BrokerState::export_topic`], here or in
    /// another state) describes it, under an id of this state: every call then answers as it
    /// would have where the image was made (the same offsets, records, groups, positions,
    /// deliveries and producers' sequences). Its records count in the retained bytes, and are
    /// noted as appended (see [`BrokerState::record_appends`]). Changes nothing when refused.
    ///
    /// # Errors
    /// [`BrokerError::InvalidArgument`] if a topic of that name exists, the broker holds its
    /// most topics, or the image is inconsistent (or places records in a cold store).
    pub fn import_topic(&mut self, topic: &str, mut image: TopicImage) -> Result<(), BrokerError> {
        if self.topics.contains_key(topic) {
            return Err(BrokerError::invalid(format!("topic {topic:?} exists")));
        }
        if self.topics.len() >= self.limits.max_topics {
            return Err(BrokerError::invalid(format!(
                "the broker holds its most topics ({})",
                self.limits.max_topics
            )));
        }
        if image.partitions.iter().any(|log| log.cold_end != log.base) {
            return Err(BrokerError::invalid(format!(
                "the image of topic {topic:?} leaves records in a cold store"
            )));
        }
        image.id = self.next_topic_id;
        let imported = topic_from(image, None)
            .map_err(|why| BrokerError::invalid(format!("topic {topic:?}: {why}")))?;
        let held = check_topic(topic, &imported).map_err(BrokerError::InvalidArgument)?;
        if let Some(appended) = &mut self.appended {
            for (number, log) in imported.partitions.iter().enumerate() {
                let id = LogId {
                    topic: imported.id,
                    partition: number as u32,
                };
                appended.extend(log.records.iter().zip(log.base..).map(|(record, offset)| {
                    Appended {
                        log: id,
                        offset,
                        record: RecordImage::from(record),
                    }
                }));
            }
        }
        self.topics.insert(topic.to_owned(), imported);
        self.memory.add(held);
        self.next_topic_id += 1;
        Ok(())
    }

    /// The state a version 1 image (a snapshot of data directory format 1) describes: its
    /// records get time 0 and no headers, its topics interest retention with the broker's
    /// capacity, its groups the default settings; checked as [`BrokerState::from_image`].
    ///
    /// # Errors
    /// A description of the first thing wrong.
    pub fn from_image_v1(image: v1::StateImage) -> Result<BrokerState, String> {
        let mut topics = HashMap::with_capacity(image.topics.len());
        // Ids in name order: the image lists topics sorted by name.
        let mut next_topic_id = 0;
        for (name, topic) in image.topics {
            let topic = topic_from_v1(topic, next_topic_id)
                .map_err(|why| format!("topic {name:?}: {why}"))?;
            next_topic_id += 1;
            if topics.insert(name.clone(), topic).is_some() {
                return Err(format!("topic {name:?} appears twice"));
            }
        }
        finish(
            BrokerState {
                capacity: image.capacity,
                clock_ms: 0,
                next_topic_id,
                cold: None,
                failure: None,
                topics,
                memory: Memory {
                    budget: image.memory_budget,
                    retained: image.retained_bytes,
                    // Counted by `finish`.
                    records: 0,
                    rules: Revision::NEWEST.rules().budget,
                },
                limits: Limits::default(),
                // Not kept in images: the broker opening one sets them.
                names: NameRules::default(),
                revision: Revision::NEWEST,
                rules: Revision::NEWEST.rules(),
                dead_letters: Vec::new(),
                dead_letter_events: 0,
                appended: None,
            },
            [
                image.max_topics,
                Limits::default().max_partitions as u64,
                image.max_groups_per_topic,
                image.max_members_per_group,
            ],
        )
    }
}

/// Sets the limits (topics, partitions, groups, members) and checks the state.
fn finish(mut state: BrokerState, limits: [u64; 4]) -> Result<BrokerState, String> {
    let [max_topics, max_partitions, max_groups_per_topic, max_members_per_group] =
        limits.map(|limit| usize::try_from(limit).unwrap_or(usize::MAX));
    state.limits = Limits {
        max_topics,
        max_partitions,
        max_groups_per_topic,
        max_members_per_group,
    };
    state.memory.records = state
        .topics
        .values()
        .flat_map(|topic| &topic.partitions)
        .map(PartitionLog::len)
        .sum();
    state.check_consistency()?;
    Ok(state)
}

fn key_hash_code(key_hash: KeyHash) -> u32 {
    match key_hash {
        KeyHash::Murmur2 => 0,
        KeyHash::Fnv1a => 1,
    }
}

fn key_hash_of(code: u32) -> Result<KeyHash, String> {
    match code {
        0 => Ok(KeyHash::Murmur2),
        1 => Ok(KeyHash::Fnv1a),
        code => Err(format!("unknown key hash code {code}")),
    }
}

fn assignor_code(assignor: Assignor) -> u32 {
    match assignor {
        Assignor::RoundRobin => 0,
        Assignor::Range => 1,
    }
}

fn assignor_of(code: u32) -> Result<Assignor, String> {
    match code {
        0 => Ok(Assignor::RoundRobin),
        1 => Ok(Assignor::Range),
        code => Err(format!("unknown assignor code {code}")),
    }
}

fn topic_image(topic: &Topic, records_stored: bool) -> TopicImage {
    let mut groups: Vec<(String, GroupImage)> = topic
        .groups
        .iter()
        .map(|(name, group)| (name.clone(), group_image(group)))
        .collect();
    groups.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let settings = topic.settings;
    TopicImage {
        id: topic.id,
        key_hash: key_hash_code(topic.key_hash),
        retention: match settings.retention {
            Retention::Interest => 0,
            Retention::Limits => 1,
        },
        max_records: settings.max_records,
        max_bytes: settings.max_bytes,
        max_age_ms: settings.max_age_ms,
        discard: match settings.discard {
            Discard::New => 0,
            Discard::Old => 1,
        },
        next_keyless: topic.next_keyless as u64,
        partitions: topic
            .partitions
            .iter()
            .map(|log| {
                let (records, cold_end, cold_bytes) = if records_stored {
                    (Vec::new(), log.end(), log.retained_bytes())
                } else {
                    (
                        log.records.iter().map(RecordImage::from).collect(),
                        log.cold_end(),
                        log.cold.as_ref().map_or(0, |cold| cold.bytes),
                    )
                };
                PartitionImage {
                    base: log.base,
                    cold_end,
                    cold_bytes,
                    first_timestamp_ms: log.earliest_timestamp().unwrap_or(0),
                    last_timestamp_ms: log.last_timestamp_ms,
                    records,
                    retained_bytes: log.retained_bytes(),
                }
            })
            .collect(),
        groups,
        producers: producers_image(&topic.producers),
    }
}

/// A topic's producers, sorted by id and partition.
fn producers_image(producers: &HashMap<u64, Producer>) -> Vec<ProducerImage> {
    let mut images: Vec<ProducerImage> = producers
        .iter()
        .map(|(&id, producer)| {
            // In partition order: the map is ordered.
            let partitions: Vec<SequencesImage> = producer
                .partitions
                .iter()
                .map(|(&partition, sequences)| SequencesImage {
                    partition: partition as u64,
                    next: sequences.next,
                    recent: sequences
                        .recent
                        .iter()
                        .map(|batch| (batch.first_sequence, batch.offsets().collect()))
                        .collect(),
                })
                .collect();
            ProducerImage {
                id,
                last_seen_ms: producer.last_seen_ms,
                partitions,
            }
        })
        .collect();
    images.sort_unstable_by_key(|producer| producer.id);
    images
}

/// A topic's producers from their images, checked against its `partition_count`.
fn producers_from(
    images: Vec<ProducerImage>,
    partition_count: usize,
) -> Result<HashMap<u64, Producer>, String> {
    let mut producers = HashMap::with_capacity(images.len());
    for image in images {
        let mut partitions = BTreeMap::new();
        for sequences in image.partitions {
            let partition = usize::try_from(sequences.partition)
                .ok()
                .filter(|&partition| partition < partition_count)
                .ok_or_else(|| {
                    format!(
                        "producer {:016x} names partition {}",
                        image.id, sequences.partition
                    )
                })?;
            let bad = || format!("producer {:016x}: bad sequences", image.id);
            // A batch's records were stored at consecutive offsets: kept as the first and a
            // count. A batch that stored nothing answers nothing and is left out.
            let recent = sequences
                .recent
                .into_iter()
                .filter_map(|(first_sequence, offsets)| {
                    let &first_offset = offsets.first()?;
                    let consecutive = first_offset >= 0
                        && offsets
                            .windows(2)
                            .all(|pair| pair[0].checked_add(1) == Some(pair[1]));
                    let batch = RecentBatch {
                        first_sequence,
                        first_offset,
                        stored: offsets.len() as u64,
                    };
                    Some(consecutive.then_some(batch).ok_or_else(bad))
                })
                .collect::<Result<VecDeque<_>, _>>()?;
            let stored: u64 = recent.iter().map(|batch| batch.stored).sum();
            if recent.len() > RECENT_BATCHES || stored > sequences.next {
                return Err(bad());
            }
            partitions.insert(
                partition,
                Sequences {
                    next: sequences.next,
                    recent,
                },
            );
        }
        let producer = Producer {
            last_seen_ms: image.last_seen_ms,
            partitions,
        };
        if producers.insert(image.id, producer).is_some() {
            return Err(format!("producer {:016x} appears twice", image.id));
        }
    }
    Ok(producers)
}

fn group_image(group: &Group) -> GroupImage {
    GroupImage {
        assignor: assignor_code(group.assignor),
        start_at: match group.settings.start_at {
            StartAt::Earliest => 0,
            StartAt::Latest => 1,
        },
        ack_timeout_ms: group.settings.ack_timeout_ms,
        max_deliveries: group.settings.max_deliveries,
        dead_letter: group
            .settings
            .dead_letter
            .map(|topic| topic.as_str().to_owned()),
        members: group
            .members
            .iter()
            .map(|member| v1::MemberImage {
                id: member.id.clone(),
                partitions: member.partitions.clone(),
            })
            .collect(),
        partitions: group
            .partitions
            .iter()
            .map(|state| GroupPartitionImage {
                owner: state.owner.map(|owner| owner as u64),
                committed: state.committed,
                position: state.position,
                in_flight: state.in_flight,
                delivered_at_ms: state.delivered_at_ms,
                deliveries: state.deliveries,
                skipped: state.skipped,
                has_commit: state.has_commit,
            })
            .collect(),
    }
}

fn topic_from(image: TopicImage, store: Option<&Arc<dyn ColdStore>>) -> Result<Topic, String> {
    let settings = TopicSettings {
        retention: match image.retention {
            0 => Retention::Interest,
            1 => Retention::Limits,
            code => return Err(format!("unknown retention code {code}")),
        },
        max_records: image.max_records,
        max_bytes: image.max_bytes,
        max_age_ms: image.max_age_ms,
        discard: match image.discard {
            0 => Discard::New,
            1 => Discard::Old,
            code => return Err(format!("unknown discard code {code}")),
        },
    };
    let mut groups = HashMap::with_capacity(image.groups.len());
    for (name, group) in image.groups {
        let group = group_from(group).map_err(|why| format!("group {name:?}: {why}"))?;
        if groups.insert(name.clone(), group).is_some() {
            return Err(format!("group {name:?} appears twice"));
        }
    }
    let mut partitions = Vec::with_capacity(image.partitions.len());
    for (number, log) in image.partitions.into_iter().enumerate() {
        partitions.push(
            log_from(log, image.id, number, store)
                .map_err(|why| format!("partition {number}: {why}"))?,
        );
    }
    let producers = producers_from(image.producers, partitions.len())?;
    Ok(Topic {
        id: image.id,
        key_hash: key_hash_of(image.key_hash)?,
        settings,
        next_keyless: usize::try_from(image.next_keyless)
            .map_err(|_| "next keyless partition out of range".to_owned())?,
        partitions,
        groups,
        producers,
    })
}

/// One partition's log from its image; its evicted records, if any, are in `store`.
fn log_from(
    image: PartitionImage,
    topic_id: u64,
    partition: usize,
    store: Option<&Arc<dyn ColdStore>>,
) -> Result<PartitionLog, String> {
    if image.cold_end < image.base {
        return Err(format!(
            "records in memory from {}, below the oldest retained {}",
            image.cold_end, image.base
        ));
    }
    let cold = if image.cold_end > image.base {
        let store = store.ok_or("records are in segment files and no store reads them")?;
        Some(Cold {
            store: Arc::clone(store),
            id: LogId {
                topic: topic_id,
                partition: u32::try_from(partition).map_err(|_| "partition out of range")?,
            },
            end: image.cold_end,
            bytes: image.cold_bytes,
            first_timestamp_ms: image.first_timestamp_ms,
            ahead: None,
        })
    } else if image.cold_bytes != 0 {
        return Err("bytes counted for records held nowhere".to_owned());
    } else {
        None
    };
    let records: VecDeque<StoredRecord> =
        image.records.into_iter().map(StoredRecord::from).collect();
    let memory_bytes = records.iter().map(StoredRecord::size).sum();
    if memory_bytes + image.cold_bytes != image.retained_bytes {
        return Err(format!(
            "{} retained bytes counted, {} held",
            image.retained_bytes,
            memory_bytes + image.cold_bytes
        ));
    }
    Ok(PartitionLog {
        base: image.base,
        cold,
        records,
        memory_bytes,
        last_timestamp_ms: image.last_timestamp_ms,
    })
}

fn group_from(image: GroupImage) -> Result<Group, String> {
    let settings = GroupSettings {
        start_at: match image.start_at {
            0 => StartAt::Earliest,
            1 => StartAt::Latest,
            code => return Err(format!("unknown start code {code}")),
        },
        ack_timeout_ms: image.ack_timeout_ms,
        max_deliveries: image.max_deliveries,
        dead_letter: image
            .dead_letter
            .as_deref()
            // Any name some broker takes, as for the state's topics.
            .map(|name| TopicName::with_rules(name, NameRules::Kafka))
            .transpose()
            .map_err(|error| format!("dead-letter topic: {error}"))?,
    };
    if settings.max_deliveries.is_some() != settings.dead_letter.is_some() {
        return Err("a maximum of deliveries without a dead-letter topic, or the reverse".into());
    }
    let mut partitions = Vec::with_capacity(image.partitions.len());
    for state in image.partitions {
        partitions.push(GroupPartition {
            owner: owner_of(state.owner)?,
            committed: state.committed,
            position: state.position,
            in_flight: state.in_flight,
            delivered_at_ms: state.delivered_at_ms,
            deliveries: state.deliveries,
            skipped: state.skipped,
            has_commit: state.has_commit,
        });
    }
    Ok(Group {
        assignor: assignor_of(image.assignor)?,
        settings,
        members: members_from(image.members),
        partitions,
    })
}

fn owner_of(owner: Option<u64>) -> Result<Option<usize>, String> {
    owner
        .map(|owner| usize::try_from(owner).map_err(|_| "owner out of range".to_owned()))
        .transpose()
}

fn members_from(members: Vec<v1::MemberImage>) -> Vec<Member> {
    members
        .into_iter()
        .map(|member| Member {
            id: member.id,
            partitions: member.partitions,
        })
        .collect()
}

fn topic_from_v1(image: v1::TopicImage, id: u64) -> Result<Topic, String> {
    let mut groups = HashMap::with_capacity(image.groups.len());
    for (name, group) in image.groups {
        let mut partitions = Vec::with_capacity(group.partitions.len());
        for state in group.partitions {
            partitions.push(GroupPartition {
                owner: owner_of(state.owner)?,
                committed: state.committed,
                position: state.position,
                in_flight: state.in_flight,
                delivered_at_ms: 0,
                deliveries: 0,
                skipped: 0,
                // The first releases did not say: as a stored offset, which is how they
                // answered.
                has_commit: true,
            });
        }
        let group = Group {
            assignor: assignor_of(group.assignor)
                .map_err(|why| format!("group {name:?}: {why}"))?,
            settings: GroupSettings::default(),
            members: members_from(group.members),
            partitions,
        };
        if groups.insert(name.clone(), group).is_some() {
            return Err(format!("group {name:?} appears twice"));
        }
    }
    let mut partitions = Vec::with_capacity(image.partitions.len());
    for (number, log) in image.partitions.into_iter().enumerate() {
        let records: VecDeque<StoredRecord> = log
            .records
            .into_iter()
            .map(|record| StoredRecord::new(record.key, record.payload, Vec::new(), 0))
            .collect();
        let memory_bytes = records.iter().map(StoredRecord::size).sum();
        if memory_bytes != log.retained_bytes {
            return Err(format!(
                "partition {number}: {} retained bytes counted, {memory_bytes} held",
                log.retained_bytes
            ));
        }
        partitions.push(PartitionLog {
            base: log.base,
            cold: None,
            records,
            memory_bytes,
            last_timestamp_ms: 0,
        });
    }
    Ok(Topic {
        id,
        key_hash: key_hash_of(image.key_hash)?,
        settings: TopicSettings::default(),
        next_keyless: usize::try_from(image.next_keyless)
            .map_err(|_| "next keyless partition out of range".to_owned())?,
        partitions,
        groups,
        producers: HashMap::new(),
    })
}

impl From<&StoredRecord> for RecordImage {
    fn from(record: &StoredRecord) -> RecordImage {
        RecordImage {
            key: record.key().cloned(),
            payload: record.payload.clone(),
            headers: record.headers().iter().map(HeaderImage::from).collect(),
            timestamp_ms: record.timestamp_ms,
        }
    }
}

impl From<&Header> for HeaderImage {
    fn from(header: &Header) -> HeaderImage {
        HeaderImage {
            name: header.name.clone(),
            value: header.value.clone(),
        }
    }
}

impl From<HeaderImage> for Header {
    fn from(image: HeaderImage) -> Header {
        Header {
            name: image.name,
            value: image.value,
        }
    }
}

/// A topic exported by [`BrokerState::begin_export`]: its image, with the records of its
/// partitions' cold stores still to be read by [`TopicExport::read`].
pub struct TopicExport {
    image: TopicImage,
    /// Per partition, the records its cold store holds (none for a partition without one).
    cold: Vec<Option<ColdPart>>,
}

/// The records of one partition in its cold store, to be read back.
struct ColdPart {
    store: Arc<dyn ColdStore>,
    id: LogId,
    offsets: std::ops::Range<i64>,
}

impl std::fmt::Debug for TopicExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cold: Vec<_> = self
            .cold
            .iter()
            .map(|part| part.as_ref().map(|part| part.offsets.clone()))
            .collect();
        f.debug_struct("TopicExport")
            .field("id", &self.image.id)
            .field("cold", &cold)
            .finish_non_exhaustive()
    }
}

impl TopicExport {
    /// The topic's image with every record, those of the cold stores read back (blocking on
    /// their reads).
    ///
    /// # Errors
    /// [`BrokerError::Storage`] if records cannot be read: among them records retention
    /// removed since the export began (export again).
    pub fn read(self) -> Result<TopicImage, BrokerError> {
        let TopicExport { mut image, cold } = self;
        for (part, partition) in cold.into_iter().zip(&mut image.partitions) {
            let Some(ColdPart { store, id, offsets }) = part else {
                continue;
            };
            let mut records = store
                .read(id, offsets.clone(), None)
                .map_err(|error| BrokerError::Storage(error.to_string()))?;
            if records.len() as i64 != offsets.end - offsets.start {
                return Err(BrokerError::Storage(format!(
                    "the records of {id:?} at offsets {}..{} read back as {}",
                    offsets.start,
                    offsets.end,
                    records.len()
                )));
            }
            records.append(&mut partition.records);
            partition.records = records;
            partition.cold_end = offsets.start;
            partition.cold_bytes = 0;
        }
        Ok(image)
    }
}
