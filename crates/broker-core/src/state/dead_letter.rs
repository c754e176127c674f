//! Ack mode's answers to a record that keeps failing: a delayed retry holds a partition's next
//! record back until a time (nothing later is delivered before it), and a group with a maximum
//! of deliveries moves a record delivered that many times, and released again unacknowledged,
//! to its dead-letter topic, so that the partition moves on.
//!
//! A dead-lettered record keeps its key, payload and headers and gains headers that say where
//! it came from. The dead-letter topic is created on demand (one partition, limits retention);
//! if it cannot take the record (a full topic that refuses new records, the memory budget, the
//! broker's maximum of topics), the record stays where it is and is delivered again, as
//! without a maximum: nothing is lost.

use bytes::Bytes;

use super::log::StoredRecord;
use super::BrokerState;
use crate::validate::{MAX_HEADERS, MAX_KAFKA_NAME_LEN};
use crate::{BrokerError, Header, KeyHash, NameRules, Retention, TopicSetting};

/// The names of the headers a dead-lettered record gains, in order.
const PROVENANCE: [&str; 6] = [
    "dead-letter.topic",
    "dead-letter.partition",
    "dead-letter.offset",
    "dead-letter.group",
    "dead-letter.deliveries",
    "dead-letter.reason",
];

/// The most bytes the provenance headers add to a dead-lettered record: their names, two
/// names (a topic's and a group's, as long as [`crate::NameRules::Kafka`] allows), three numbers of at most 20 digits and the longest reason. A record in a
/// dead-letter topic may be this much larger than any record published, so a server's payload
/// limit must allow for it in what a data directory retains.
pub const DEAD_LETTER_HEADER_BYTES: u64 = {
    let mut names = 0;
    let mut index = 0;
    while index < PROVENANCE.len() {
        names += PROVENANCE[index].len();
        index += 1;
    }
    (names + 2 * MAX_KAFKA_NAME_LEN + 3 * 20 + "ack timeout".len()) as u64
};

/// The most dead-letter events kept for [`BrokerState::take_dead_letters`]: a server takes
/// them after every command; a program that never does keeps only the latest.
const MAX_PENDING_EVENTS: usize = 1024;

/// Why a record went to its dead-letter topic: how it was released the last time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// The consumer retried it (with or without a delay).
    Retried,
    /// It stayed unacknowledged past the group's acknowledgement timeout.
    AckTimeout,
    /// Its delivery was released otherwise: its partition changed owner, or its member asked
    /// for its deliveries again; or the group's maximum of deliveries was lowered to no more
    /// than it had.
    Released,
}

impl DeadLetterReason {
    /// `retried`, `ack timeout` or `released`: the value of the `dead-letter.reason` header.
    pub fn name(self) -> &'static str {
        match self {
            DeadLetterReason::Retried => "retried",
            DeadLetterReason::AckTimeout => "ack timeout",
            DeadLetterReason::Released => "released",
        }
    }
}

/// A record past its group's last delivery, moved to the dead-letter topic or, if that topic
/// could not take it, left where it was; as [`BrokerState::take_dead_letters`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettered {
    /// Where it was.
    pub topic: String,
    /// Its partition there.
    pub partition: i32,
    /// Its offset there.
    pub offset: i64,
    /// The group that gave up on it.
    pub group: String,
    /// How many times it was delivered to the group.
    pub deliveries: u32,
    /// How it was released the last time.
    pub reason: DeadLetterReason,
    /// The dead-letter topic.
    pub dead_letter: String,
    /// Its partition and offset in the dead-letter topic; `None` when that topic could not
    /// take it (it refuses new records when full, the memory budget, the broker's maximum of
    /// topics): the record then stayed where it was and is delivered again.
    pub stored_at: Option<(i32, i64)>,
    /// Whether this move created the dead-letter topic (one partition, limits retention).
    pub created_dead_letter: bool,
}

impl BrokerState {
    /// See [`crate::Command::RetryAfter`]: [`BrokerState::retry`], after which the record is
    /// delivered again no earlier than `delay_ms` from now (the broker's clock); its partition
    /// delivers nothing else meanwhile. A record that has had its group's maximum of
    /// deliveries goes to the dead-letter topic instead.
    ///
    /// # Errors
    /// As [`crate::EventBroker::retry`].
    pub fn retry_after(
        &mut self,
        topic: &str,
        group: &str,
        member: &str,
        partition: i32,
        offset: i64,
        delay_ms: u64,
    ) -> Result<bool, BrokerError> {
        let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
        let until = self.clock_ms.saturating_add(delay);
        self.retry_until(topic, group, member, partition, offset, Some(until))
    }

    /// The records past their last delivery since the last call, oldest first: moved to their
    /// dead-letter topic, or (`stored_at` `None`) refused by it; at most the latest 1,024. They
    /// are not part of the state (a log replay finds them again); a server drains them after
    /// each command to log and count them.
    pub fn take_dead_letters(&mut self) -> Vec<DeadLettered> {
        std::mem::take(&mut self.dead_letters)
    }

    /// How many records went past their last delivery since the state was made (each one
    /// [`BrokerState::take_dead_letters`] reports, taken or not). A command during which it
    /// grew changed the state, whatever its outcome says (see
    /// [`crate::CommandKind::changed_state`]): from [`crate::Revision::Bounded`] on, a poll or
    /// a redelivery that delivers nothing may have moved a record to a dead-letter topic.
    pub fn dead_letter_events(&self) -> u64 {
        self.dead_letter_events
    }

    /// Moves `group`'s next record on `partition` of `topic` to the group's dead-letter topic
    /// when it has had the group's maximum of deliveries and is not in flight; the group then
    /// counts it as consumed. Whether it moved.
    pub(super) fn dead_letter_if_exhausted(
        &mut self,
        topic: &str,
        group: &str,
        partition: usize,
        reason: DeadLetterReason,
    ) -> Result<bool, BrokerError> {
        let now = self.clock_ms;
        let Some(source) = self.topics.get(topic) else {
            return Ok(false);
        };
        let Some(group_state) = source.groups.get(group) else {
            return Ok(false);
        };
        let (Some(max), Some(dead_letter)) = (
            group_state.settings.max_deliveries,
            group_state.settings.dead_letter,
        ) else {
            return Ok(false);
        };
        let (Some(state), Some(log)) = (
            group_state.partitions.get(partition),
            source.partitions.get(partition),
        ) else {
            return Ok(false);
        };
        // A group that committed below the earliest record takes that record next.
        let offset = if self.rules.exhausted_below_earliest {
            state.committed.max(log.base)
        } else {
            state.committed
        };
        let exhausted = state.in_flight.is_none() && state.deliveries >= max;
        if !exhausted || offset < log.base || offset >= log.end() {
            return Ok(false);
        }
        let deliveries = state.deliveries;
        let Some(record) = log.run(offset, 1, None)?.next() else {
            return Ok(false);
        };
        let (key, payload, mut headers, _) = record.into_owned().into_parts();
        let values = [
            topic.to_owned(),
            partition.to_string(),
            offset.to_string(),
            group.to_owned(),
            deliveries.to_string(),
            reason.name().to_owned(),
        ];
        let provenance = PROVENANCE.into_iter().zip(values);
        if headers.len() + PROVENANCE.len() > MAX_HEADERS {
            // Its own headers leave no room for where it came from: keep as many of them as
            // fit, the provenance matters more to whoever reads dead letters.
            headers.truncate(MAX_HEADERS - PROVENANCE.len());
        }
        headers.extend(provenance.map(|(name, value)| Header {
            name: name.to_owned(),
            value: Some(Bytes::from(value)),
        }));
        let dead_letter = dead_letter.as_str();
        let mut event = DeadLettered {
            topic: topic.to_owned(),
            partition: partition as i32,
            offset,
            group: group.to_owned(),
            deliveries,
            reason,
            dead_letter: dead_letter.to_owned(),
            stored_at: None,
            created_dead_letter: false,
        };
        if !self.topics.contains_key(dead_letter) {
            let limits = [TopicSetting::Retention(Retention::Limits)];
            // The name was checked when it became the group's setting: whether the topic is
            // created never depends on the rules in force now, so that time passing (which
            // carries no rules) moves a record alike on every replica and in every replay.
            if self
                .create_named(
                    NameRules::Kafka,
                    dead_letter,
                    1,
                    KeyHash::default(),
                    &limits,
                )
                .is_err()
            {
                self.report(event);
                return Ok(false);
            }
            event.created_dead_letter = true;
        }
        let Some(target) = self.topics.get_mut(dead_letter) else {
            return Ok(false);
        };
        let target_partition = partition % target.partitions.len().max(1);
        let stored = StoredRecord::new(key, payload, headers, now);
        let stored_at = target.append(
            target_partition,
            self.capacity,
            &mut self.memory,
            now,
            stored,
            &mut self.appended,
        )?;
        if stored_at < 0 {
            self.report(event);
            return Ok(false);
        }
        let Some(source) = self.topics.get_mut(topic) else {
            return Ok(false);
        };
        if let Some(state) = source
            .groups
            .get_mut(group)
            .and_then(|group| group.partitions.get_mut(partition))
        {
            state.commit_delivery(offset);
        }
        self.memory.remove(source.release(partition)?);
        event.stored_at = Some((target_partition as i32, stored_at));
        self.report(event);
        Ok(true)
    }

    /// Keeps `event` for [`BrokerState::take_dead_letters`], forgetting the oldest past
    /// [`MAX_PENDING_EVENTS`].
    fn report(&mut self, event: DeadLettered) {
        self.dead_letter_events += 1;
        if self.dead_letters.len() >= MAX_PENDING_EVENTS {
            self.dead_letters.remove(0);
        }
        self.dead_letters.push(event);
    }

    /// Moves every exhausted record of `group` to its dead-letter topic: after a rebalance,
    /// which releases the deliveries of partitions that change owner.
    pub(super) fn dead_letter_group(
        &mut self,
        topic: &str,
        group: &str,
    ) -> Result<(), BrokerError> {
        let partitions = match self.topics.get(topic).and_then(|t| t.groups.get(group)) {
            Some(group_state) if group_state.settings.max_deliveries.is_some() => {
                group_state.partitions.len()
            }
            _ => return Ok(()),
        };
        for partition in 0..partitions {
            self.dead_letter_if_exhausted(topic, group, partition, DeadLetterReason::Released)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Command, GroupSetting, Outcome, TopicName};

    fn dead_letter_settings(max: u32) -> Vec<GroupSetting> {
        vec![
            GroupSetting::MaxDeliveries(max),
            GroupSetting::DeadLetter(TopicName::new("dlq").unwrap()),
        ]
    }

    /// A broker with topic `t` (one partition) holding `a` and `b`, and member `m` of group
    /// `g` created with `settings`.
    fn broker(settings: Vec<GroupSetting>) -> BrokerState {
        let mut state = BrokerState::new(10).unwrap();
        state.create("t", 1, KeyHash::default(), &[]).unwrap();
        state.join("t", "g", "m", None, &settings).unwrap();
        for payload in ["a", "b"] {
            state.publish("t", 0, payload.into()).unwrap();
        }
        state
    }

    fn poll(state: &mut BrokerState, at: i64) -> Vec<(Bytes, u32)> {
        let command = Command::Poll {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            max_records: 1,
            max_bytes: None,
        };
        match state.apply_at(at, command).unwrap() {
            Outcome::Records(records) => records
                .into_iter()
                .map(|record| (record.payload, record.delivery_count))
                .collect(),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn dead_letter_records(state: &mut BrokerState) -> Vec<crate::BrokerRecord> {
        state.join("dlq", "reader", "r", None, &[]).unwrap();
        state.fetch("dlq", "reader", "r", 100, None).unwrap()
    }

    #[test]
    fn a_record_retried_after_its_last_delivery_goes_to_the_dead_letter_topic() {
        let mut state = broker(dead_letter_settings(2));
        assert_eq!(poll(&mut state, 1), [("a".into(), 1)]);
        assert!(state.retry("t", "g", "m", 0, 0).unwrap());
        assert_eq!(poll(&mut state, 2), [("a".into(), 2)]);
        assert!(state.take_dead_letters().is_empty());
        assert!(state.retry("t", "g", "m", 0, 0).unwrap());
        let moved = state.take_dead_letters();
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].reason, DeadLetterReason::Retried);
        assert_eq!((moved[0].offset, moved[0].deliveries), (0, 2));
        assert_eq!(moved[0].stored_at, Some((0, 0)));
        assert!(moved[0].created_dead_letter);
        // The partition moved on, and the group counts the record as consumed.
        assert_eq!(poll(&mut state, 3), [("b".into(), 1)]);
        assert_eq!(state.committed("t", "g", 0).unwrap(), 1);
        let dead = dead_letter_records(&mut state);
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].payload, "a");
        let header = |name: &str| {
            dead[0]
                .headers
                .iter()
                .find(|header| header.name == name)
                .and_then(|header| header.value.clone())
        };
        assert_eq!(header("dead-letter.topic"), Some("t".into()));
        assert_eq!(header("dead-letter.partition"), Some("0".into()));
        assert_eq!(header("dead-letter.offset"), Some("0".into()));
        assert_eq!(header("dead-letter.group"), Some("g".into()));
        assert_eq!(header("dead-letter.deliveries"), Some("2".into()));
        assert_eq!(header("dead-letter.reason"), Some("retried".into()));
    }

    #[test]
    fn a_dead_letter_is_reported_appended_to_its_topic() {
        let mut state = broker(dead_letter_settings(1));
        state.record_appends(true);
        assert_eq!(poll(&mut state, 1), [("a".into(), 1)]);
        assert!(state.retry("t", "g", "m", 0, 0).unwrap());
        let appended = state.take_appended();
        assert_eq!(appended.len(), 1, "{appended:?}");
        let image = state.to_image();
        let dead_letter_topic = image
            .topics
            .iter()
            .find(|(name, _)| name == "dlq")
            .unwrap()
            .1
            .id;
        assert_eq!(appended[0].log.topic, dead_letter_topic);
        assert_eq!((appended[0].log.partition, appended[0].offset), (0, 0));
        assert_eq!(appended[0].record.payload, "a");
        assert!(state.take_appended().is_empty(), "taken once");
    }

    #[test]
    fn a_delivery_that_times_out_on_its_last_chance_goes_to_the_dead_letter_topic() {
        let mut settings = dead_letter_settings(1);
        settings.push(GroupSetting::AckTimeoutMs(10));
        let mut state = broker(settings);
        assert_eq!(poll(&mut state, 0), [("a".into(), 1)]);
        assert!(!state.is_due(5));
        assert!(state.is_due(10));
        let woken = state.advance_clock(10).unwrap();
        assert_eq!(woken, ["dlq", "t"]);
        let moved = state.take_dead_letters();
        assert_eq!(moved[0].reason, DeadLetterReason::AckTimeout);
        assert_eq!(poll(&mut state, 11), [("b".into(), 1)]);
    }

    #[test]
    fn a_rebalance_that_releases_a_last_delivery_dead_letters_it() {
        let mut state = broker(dead_letter_settings(1));
        state.join("t", "g", "n", None, &[]).unwrap();
        // `m` owns the partition (the first of two members, in id order) and takes `a`.
        assert_eq!(poll(&mut state, 0), [("a".into(), 1)]);
        assert!(state.leave("t", "g", "m").unwrap());
        let moved = state.take_dead_letters();
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].reason, DeadLetterReason::Released);
        assert_eq!(state.committed("t", "g", 0).unwrap(), 1);
    }

    #[test]
    fn a_dead_letter_topic_that_refuses_the_record_leaves_it_where_it_is() {
        let mut state = broker(dead_letter_settings(1));
        let full = [
            TopicSetting::Retention(Retention::Limits),
            TopicSetting::MaxRecords(1),
            TopicSetting::Discard(crate::Discard::New),
        ];
        state.create("dlq", 1, KeyHash::default(), &full).unwrap();
        state.publish("dlq", 0, "taken".into()).unwrap();
        assert_eq!(poll(&mut state, 0), [("a".into(), 1)]);
        assert!(state.retry("t", "g", "m", 0, 0).unwrap());
        let refused = state.take_dead_letters();
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].stored_at, None);
        assert!(!refused[0].created_dead_letter, "the topic existed");
        // Nothing is lost: it is delivered again, as without a maximum.
        assert_eq!(poll(&mut state, 1), [("a".into(), 2)]);
    }

    #[test]
    fn a_delayed_retry_holds_its_partition_until_the_delay_ends() {
        let mut state = broker(Vec::new());
        assert_eq!(poll(&mut state, 0), [("a".into(), 1)]);
        let retry = Command::RetryAfter {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            partition: 0,
            offset: 0,
            delay_ms: 100,
        };
        assert_eq!(state.apply_at(10, retry), Ok(Outcome::Retried(true)));
        // Neither the record nor anything after it comes before the delay ends.
        assert_eq!(poll(&mut state, 50), []);
        assert!(!state.is_due(109));
        assert!(state.is_due(110));
        assert_eq!(state.advance_clock(110).unwrap(), ["t"]);
        assert_eq!(poll(&mut state, 110), [("a".into(), 2)]);
        // An acknowledgement then moves on at once.
        assert!(state.ack("t", "g", "m", 0, 0).unwrap());
        assert_eq!(poll(&mut state, 111), [("b".into(), 1)]);
    }

    #[test]
    fn a_maximum_set_later_dead_letters_a_record_past_it_at_once() {
        let mut state = broker(Vec::new());
        assert_eq!(poll(&mut state, 0), [("a".into(), 1)]);
        assert!(state.retry("t", "g", "m", 0, 0).unwrap());
        assert_eq!(poll(&mut state, 1), [("a".into(), 2)]);
        assert!(state.retry("t", "g", "m", 0, 0).unwrap());
        let now = state
            .configure_group("t", "g", &dead_letter_settings(2))
            .unwrap();
        assert_eq!(now, dead_letter_settings(2));
        assert_eq!(state.take_dead_letters().len(), 1);
        assert_eq!(poll(&mut state, 2), [("b".into(), 1)]);
        // Where a group starts cannot change; an unknown group is refused.
        let latest = [GroupSetting::StartAt(crate::StartAt::Latest)];
        assert!(state.configure_group("t", "g", &latest).is_err());
        assert!(state.configure_group("t", "nosuch", &[]).is_err());
        assert_eq!(state.configure_group("t", "g", &[]).unwrap(), []);
    }

    #[test]
    fn the_provenance_headers_stay_within_their_bound() {
        // proto.md gives the bound.
        assert_eq!(DEAD_LETTER_HEADER_BYTES, 682);
        let mut state = BrokerState::new(10)
            .unwrap()
            .with_names(crate::NameRules::Kafka);
        let long = "t".repeat(MAX_KAFKA_NAME_LEN);
        let group = "g".repeat(MAX_KAFKA_NAME_LEN);
        state.create(&long, 1, KeyHash::default(), &[]).unwrap();
        let mut settings = dead_letter_settings(1);
        settings.push(GroupSetting::AckTimeoutMs(1));
        state.join(&long, &group, "m", None, &settings).unwrap();
        state.publish(&long, 0, Bytes::new()).unwrap();
        let poll = Command::Poll {
            topic: long.clone(),
            group: group.clone(),
            member: "m".into(),
            max_records: 1,
            max_bytes: None,
        };
        state.apply_at(0, poll).unwrap();
        state.advance_clock(10).unwrap();
        let dead = dead_letter_records(&mut state);
        let added: usize = dead[0].headers.iter().map(Header::size).sum();
        assert!(added as u64 <= DEAD_LETTER_HEADER_BYTES, "{added}");
    }

    #[test]
    fn the_end_of_a_delay_is_reported_by_the_next_tick_whatever_moved_the_clock() {
        let mut state = broker(Vec::new());
        assert_eq!(poll(&mut state, 0), [("a".into(), 1)]);
        let retry = Command::RetryAfter {
            topic: "t".into(),
            group: "g".into(),
            member: "m".into(),
            partition: 0,
            offset: 0,
            delay_ms: 100,
        };
        state.apply_at(10, retry).unwrap();
        // A request after the delay ended moves the clock past it before any tick.
        state
            .apply_at(150, Command::Describe { topic: None })
            .unwrap();
        assert!(state.is_due(160));
        assert_eq!(state.advance_clock(160).unwrap(), ["t"]);
        assert!(!state.is_due(170), "reported once");
        assert_eq!(poll(&mut state, 170), [("a".into(), 2)]);
    }

    #[test]
    fn settings_that_cannot_work_are_refused_at_join() {
        let mut state = broker(Vec::new());
        let own = vec![
            GroupSetting::MaxDeliveries(1),
            GroupSetting::DeadLetter(TopicName::new("t").unwrap()),
        ];
        assert!(state.join("t", "h", "m", None, &own).is_err());
        assert!(state
            .join("t", "h", "m", None, &[GroupSetting::MaxDeliveries(1)])
            .is_err());
        assert!(TopicName::new("no such name").is_err());
        assert!(TopicName::new(&"x".repeat(65)).is_err());
    }
}
