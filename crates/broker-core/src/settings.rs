//! What a topic and a group are created with, beyond their names: how a topic's partitions
//! retain records, and where a new group starts, how long a delivery may stay unacknowledged
//! and how many times a record may be delivered before it goes to a dead-letter topic.
//!
//! Each is a struct ([`TopicSettings`], [`GroupSettings`]) for programs, and a list of settings
//! ([`TopicSetting`], [`GroupSetting`]) for the wire: a setting a later version adds is one more
//! variant of the list, so the encoding of the others never changes.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::duration_text;
use crate::validate::{NameRules, MAX_KAFKA_NAME_LEN, MAX_PRODUCT_CAPACITY};
use crate::BrokerError;

/// A valid topic name held inline (by default at most [`crate::MAX_IDENTIFIER_LEN`] ASCII
/// letters, digits, `_` or `-`; see [`TopicName::with_rules`]), so that settings naming a topic
/// stay `Copy`. Encoded as a string.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopicName {
    len: u8,
    bytes: [u8; MAX_KAFKA_NAME_LEN],
}

impl TopicName {
    /// `name` if it is a valid identifier ([`NameRules::Broker`]).
    ///
    /// # Errors
    /// `InvalidArgument` naming what is wrong with it.
    pub fn new(name: &str) -> Result<TopicName, BrokerError> {
        TopicName::with_rules(name, NameRules::Broker)
    }

    /// `name` if `rules` take it. A broker checks the names settings carry by its own rules.
    ///
    /// # Errors
    /// `InvalidArgument` naming what is wrong with it.
    pub fn with_rules(name: &str, rules: NameRules) -> Result<TopicName, BrokerError> {
        rules.check("topic", name)?;
        let mut bytes = [0; MAX_KAFKA_NAME_LEN];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Ok(TopicName {
            // At most MAX_KAFKA_NAME_LEN (249), checked above.
            len: name.len() as u8,
            bytes,
        })
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever stored (checked by `new`).
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl fmt::Debug for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TopicName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TopicName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        // Any name some broker takes: the broker given it checks it by its own rules.
        TopicName::with_rules(&name, NameRules::Kafka).map_err(serde::de::Error::custom)
    }
}

/// How a topic's partitions decide which records to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Retention {
    /// A record leaves once every group of the topic has consumed it; a full partition refuses
    /// new records (`-1`). With no groups nothing leaves. The default.
    #[default]
    Interest,
    /// Records are kept up to the topic's limits (count, bytes, age), consumed or not; at a
    /// limit the oldest leave, or new ones are refused ([`Discard`]).
    Limits,
}

/// What a partition at one of its limits does with a new record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Discard {
    /// Refuse it (`-1`), keeping what is there. Interest retention always does this.
    #[default]
    New,
    /// Discard the oldest records to make room (limits retention only).
    Old,
}

impl Retention {
    /// `interest` or `limits`.
    pub fn name(self) -> &'static str {
        match self {
            Retention::Interest => "interest",
            Retention::Limits => "limits",
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Discard {
    /// `new` or `old`.
    pub fn name(self) -> &'static str {
        match self {
            Discard::New => "new",
            Discard::Old => "old",
        }
    }
}

impl fmt::Display for Discard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a topic's partitions retain records. The default is interest retention with the broker's
/// capacity per partition: exactly the broker's behaviour without settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct TopicSettings {
    /// Interest or limits retention.
    pub retention: Retention,
    /// Records a partition keeps at most, 1 to 2,147,483,647. Without it, interest retention
    /// keeps the broker's capacity and limits retention has no count limit.
    pub max_records: Option<u64>,
    /// Payload, key and header bytes a partition keeps at most.
    pub max_bytes: Option<u64>,
    /// The longest a record is kept, in milliseconds, by its time; older records leave, in
    /// either retention, consumed or not.
    pub max_age_ms: Option<u64>,
    /// What a partition at its count or byte limit does with a new record: interest retention
    /// refuses it ([`Discard::New`]); limits retention discards the oldest unless told to refuse.
    pub discard: Discard,
}

impl TopicSettings {
    /// Limits retention that discards the oldest records, with no limit set yet.
    pub fn limits() -> TopicSettings {
        TopicSettings {
            retention: Retention::Limits,
            discard: Discard::Old,
            ..TopicSettings::default()
        }
    }

    /// Checks the settings make sense together.
    ///
    /// # Errors
    /// `InvalidArgument` for a limit of 0 or past its maximum, or interest retention told to
    /// discard old records (it never discards an unconsumed record except by age).
    pub fn check(&self) -> Result<(), BrokerError> {
        if let Some(max) = self.max_records {
            if !(1..=MAX_PRODUCT_CAPACITY as u64).contains(&max) {
                return Err(BrokerError::invalid(format!(
                    "max records must be 1 to {MAX_PRODUCT_CAPACITY}, got {max}"
                )));
            }
        }
        if self.max_bytes == Some(0) {
            return Err(BrokerError::invalid("max bytes must be at least 1 byte"));
        }
        if self.max_age_ms == Some(0) {
            return Err(BrokerError::invalid(
                "max age must be at least 1 millisecond",
            ));
        }
        if self.retention == Retention::Interest && self.discard == Discard::Old {
            return Err(BrokerError::invalid(
                "interest retention keeps every record until all groups consumed it: \
                 discarding old records needs limits retention",
            ));
        }
        Ok(())
    }

    /// The settings a list names, starting from the defaults of its retention (limits
    /// retention discards old records unless the list says otherwise).
    ///
    /// # Errors
    /// `InvalidArgument` when a setting appears twice or the result fails
    /// [`TopicSettings::check`].
    pub fn from_list(list: &[TopicSetting]) -> Result<TopicSettings, BrokerError> {
        // The defaults of the list's retention, which the list then changes (a list naming
        // both retentions names a setting twice, which `changed` refuses).
        let limits = list.contains(&TopicSetting::Retention(Retention::Limits));
        let defaults = if limits {
            TopicSettings::limits()
        } else {
            TopicSettings::default()
        };
        defaults.changed(list)
    }

    /// These settings with those `list` names changed and the others as they are: what an
    /// existing topic is configured to. The retention cannot change (a topic keeps the
    /// interest or limits retention it was created with), nor can a limit be removed.
    ///
    /// # Errors
    /// `InvalidArgument` when a setting appears twice, the list names the other retention, or
    /// the result fails [`TopicSettings::check`].
    pub fn changed(&self, list: &[TopicSetting]) -> Result<TopicSettings, BrokerError> {
        check_distinct(list.iter().map(TopicSetting::name))?;
        let mut settings = *self;
        for setting in list {
            match *setting {
                TopicSetting::Retention(retention) if retention != self.retention => {
                    return Err(BrokerError::invalid(format!(
                        "a topic keeps the retention it was created with: {} retention cannot \
                         change to {retention} retention",
                        self.retention
                    )))
                }
                TopicSetting::Retention(_) => {}
                TopicSetting::MaxRecords(max) => settings.max_records = Some(max),
                TopicSetting::MaxBytes(max) => settings.max_bytes = Some(max),
                TopicSetting::MaxAgeMs(max) => settings.max_age_ms = Some(max),
                TopicSetting::Discard(discard) => settings.discard = discard,
            }
        }
        settings.check()?;
        Ok(settings)
    }

    /// The settings as a list: the retention and every limit set, and the discard policy when
    /// it is not the retention's default. [`TopicSettings::from_list`] of it gives them back.
    pub fn to_list(&self) -> Vec<TopicSetting> {
        let default_discard = match self.retention {
            Retention::Interest => Discard::New,
            Retention::Limits => Discard::Old,
        };
        let mut list = vec![TopicSetting::Retention(self.retention)];
        list.extend(self.max_records.map(TopicSetting::MaxRecords));
        list.extend(self.max_bytes.map(TopicSetting::MaxBytes));
        list.extend(self.max_age_ms.map(TopicSetting::MaxAgeMs));
        if self.discard != default_discard {
            list.push(TopicSetting::Discard(self.discard));
        }
        list
    }
}

/// One setting of a topic, as the wire carries it ([`TopicSettings`] says what each means).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopicSetting {
    /// [`TopicSettings::retention`].
    Retention(Retention),
    /// [`TopicSettings::max_records`].
    MaxRecords(u64),
    /// [`TopicSettings::max_bytes`].
    MaxBytes(u64),
    /// [`TopicSettings::max_age_ms`].
    MaxAgeMs(u64),
    /// [`TopicSettings::discard`].
    Discard(Discard),
}

impl TopicSetting {
    /// The setting's name, which a list may hold once.
    pub fn name(&self) -> &'static str {
        match self {
            TopicSetting::Retention(_) => "retention",
            TopicSetting::MaxRecords(_) => "max records",
            TopicSetting::MaxBytes(_) => "max bytes",
            TopicSetting::MaxAgeMs(_) => "max age",
            TopicSetting::Discard(_) => "discard",
        }
    }
}

/// Where a new group starts on each partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartAt {
    /// At the earliest record retained: it consumes everything kept. The default.
    #[default]
    Earliest,
    /// At the end: it consumes only what is published after it was created.
    Latest,
}

impl StartAt {
    /// `earliest` or `latest`.
    pub fn name(self) -> &'static str {
        match self {
            StartAt::Earliest => "earliest",
            StartAt::Latest => "latest",
        }
    }
}

/// What a group is created with. The default starts at the earliest record and keeps a
/// delivery in flight until it is acknowledged or retried: exactly the broker's behaviour
/// without settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct GroupSettings {
    /// Where the group starts on each partition when it is created.
    pub start_at: StartAt,
    /// In ack mode, how long a delivery may stay unacknowledged, in milliseconds: once it is
    /// older, it is released for redelivery (as a retry would), so a consumer that took a
    /// record and vanished (or lost the answer) does not stall its partition. `None` keeps it
    /// in flight until it is acknowledged or retried, or its partition changes owner.
    pub ack_timeout_ms: Option<u64>,
    /// In ack mode, how many times a record may be delivered: once it was delivered this many
    /// times and is released again unacknowledged (retried, timed out, or its partition
    /// changed owner), it moves to [`GroupSettings::dead_letter`] and the partition moves on.
    /// `None` delivers it again for ever. Set together with `dead_letter`.
    pub max_deliveries: Option<u32>,
    /// The topic records past [`GroupSettings::max_deliveries`] go to, created on demand (one
    /// partition, limits retention) if it does not exist. Each keeps its key, payload and
    /// headers, with headers added that say where it came from (`dead-letter.topic`,
    /// `.partition`, `.offset`, `.group`, `.deliveries`, `.reason`).
    pub dead_letter: Option<TopicName>,
}

impl GroupSettings {
    /// The settings a list names, starting from the defaults.
    ///
    /// # Errors
    /// `InvalidArgument` when a setting appears twice, an acknowledgement timeout or a maximum
    /// of deliveries is 0, or only one of a maximum of deliveries and a dead-letter topic is
    /// given.
    pub fn from_list(list: &[GroupSetting]) -> Result<GroupSettings, BrokerError> {
        check_distinct(list.iter().map(GroupSetting::name))?;
        let mut settings = GroupSettings::default();
        for setting in list {
            match *setting {
                GroupSetting::StartAt(start_at) => settings.start_at = start_at,
                GroupSetting::AckTimeoutMs(0) => {
                    return Err(BrokerError::invalid(
                        "the acknowledgement timeout must be at least 1 ms",
                    ))
                }
                GroupSetting::AckTimeoutMs(timeout) => settings.ack_timeout_ms = Some(timeout),
                GroupSetting::MaxDeliveries(0) => {
                    return Err(BrokerError::invalid(
                        "the maximum of deliveries must be at least 1",
                    ))
                }
                GroupSetting::MaxDeliveries(max) => settings.max_deliveries = Some(max),
                GroupSetting::DeadLetter(topic) => settings.dead_letter = Some(topic),
            }
        }
        if settings.max_deliveries.is_some() != settings.dead_letter.is_some() {
            return Err(BrokerError::invalid(
                "a maximum of deliveries and a dead-letter topic go together: give both or \
                 neither",
            ));
        }
        Ok(settings)
    }

    /// The settings that differ from the defaults, as a list.
    pub fn to_list(&self) -> Vec<GroupSetting> {
        let mut list = Vec::new();
        if self.start_at != StartAt::default() {
            list.push(GroupSetting::StartAt(self.start_at));
        }
        list.extend(self.ack_timeout_ms.map(GroupSetting::AckTimeoutMs));
        list.extend(self.max_deliveries.map(GroupSetting::MaxDeliveries));
        list.extend(self.dead_letter.map(GroupSetting::DeadLetter));
        list
    }
}

/// One setting of a group, as the wire carries it ([`GroupSettings`] says what each means).
// `Copy`, so the dead-letter topic's name is held inline (up to Kafka's 249 bytes) rather than
// boxed: settings are few and short-lived, and boxing would take `Copy` away from a public type.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupSetting {
    /// [`GroupSettings::start_at`].
    StartAt(StartAt),
    /// [`GroupSettings::ack_timeout_ms`].
    AckTimeoutMs(u64),
    /// [`GroupSettings::max_deliveries`] (protocol version 4).
    MaxDeliveries(u32),
    /// [`GroupSettings::dead_letter`] (protocol version 4).
    DeadLetter(TopicName),
}

impl GroupSetting {
    /// The setting's name, which a list may hold once.
    pub fn name(&self) -> &'static str {
        match self {
            GroupSetting::StartAt(_) => "start at",
            GroupSetting::AckTimeoutMs(_) => "ack timeout",
            GroupSetting::MaxDeliveries(_) => "max deliveries",
            GroupSetting::DeadLetter(_) => "dead letter",
        }
    }

    /// The protocol version that added this setting: a connection of an older version never
    /// sees it (descriptions leave it out) and cannot send it. A dead-letter topic named under
    /// Kafka's rules only (with `.`, or longer than 64) is of version 11: clients of earlier
    /// versions cannot decode its name.
    pub fn since_version(&self) -> u16 {
        match self {
            GroupSetting::StartAt(_) | GroupSetting::AckTimeoutMs(_) => 2,
            GroupSetting::DeadLetter(name) if !NameRules::Broker.allows(name.as_str()) => 11,
            GroupSetting::MaxDeliveries(_) | GroupSetting::DeadLetter(_) => 4,
        }
    }

    /// Leaves out of `settings` those a connection of protocol `version` never sees (see
    /// [`GroupSetting::since_version`]); a maximum of deliveries leaves with its dead-letter
    /// topic, since neither goes without the other.
    pub fn keep_those_of_version(settings: &mut Vec<GroupSetting>, version: u16) {
        let dead_letter_left = settings.iter().any(|setting| {
            matches!(setting, GroupSetting::DeadLetter(_)) && setting.since_version() > version
        });
        settings.retain(|setting| {
            setting.since_version() <= version
                && !(dead_letter_left && matches!(setting, GroupSetting::MaxDeliveries(_)))
        });
    }
}

/// Refuses a list that names a setting twice.
fn check_distinct(names: impl Iterator<Item = &'static str>) -> Result<(), BrokerError> {
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        if seen.contains(&name) {
            return Err(BrokerError::invalid(format!(
                "the setting {name} is given twice"
            )));
        }
        seen.push(name);
    }
    Ok(())
}

impl std::fmt::Display for TopicSettings {
    /// `interest retention, discard new` or `limits retention, max 100 records, max 1048576
    /// bytes, max age 3d, discard old` (the age as [`duration_text`] writes it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", TopicSetting::Retention(self.retention))?;
        let limits = [
            self.max_records.map(TopicSetting::MaxRecords),
            self.max_bytes.map(TopicSetting::MaxBytes),
            self.max_age_ms.map(TopicSetting::MaxAgeMs),
        ];
        for limit in limits.into_iter().flatten() {
            write!(f, ", {limit}")?;
        }
        write!(f, ", {}", TopicSetting::Discard(self.discard))
    }
}

impl std::fmt::Display for TopicSetting {
    /// One setting as [`TopicSettings`] shows it: `limits retention`, `max 100 records`,
    /// `max 1048576 bytes`, `max age 3d`, `discard old`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            TopicSetting::Retention(retention) => write!(f, "{retention} retention"),
            TopicSetting::MaxRecords(max) => write!(f, "max {max} records"),
            TopicSetting::MaxBytes(max) => write!(f, "max {max} bytes"),
            TopicSetting::MaxAgeMs(ms) => write!(f, "max age {}", duration_text(ms)),
            TopicSetting::Discard(discard) => write!(f, "discard {discard}"),
        }
    }
}

impl std::fmt::Display for GroupSettings {
    /// `start at earliest, no acknowledgement timeout` or `start at latest, acknowledgement
    /// timeout 1m 30s` (the timeout as [`duration_text`] writes it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "start at {}, ", self.start_at.name())?;
        match self.ack_timeout_ms {
            Some(ms) => write!(f, "acknowledgement timeout {}", duration_text(ms))?,
            None => write!(f, "no acknowledgement timeout")?,
        }
        match (self.max_deliveries, self.dead_letter) {
            (Some(max), Some(topic)) => {
                let deliveries = if max == 1 { "delivery" } else { "deliveries" };
                write!(
                    f,
                    ", at most {max} {deliveries}, then to dead-letter topic {topic}"
                )
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_list_gives_back_the_settings_it_came_from() {
        let settings = TopicSettings {
            retention: Retention::Limits,
            max_records: Some(10),
            max_bytes: Some(1 << 20),
            max_age_ms: Some(60_000),
            discard: Discard::New,
        };
        assert_eq!(
            TopicSettings::from_list(&settings.to_list()).unwrap(),
            settings
        );
        assert_eq!(
            TopicSettings::from_list(&[]).unwrap(),
            TopicSettings::default()
        );
        let limits = TopicSettings::from_list(&[TopicSetting::Retention(Retention::Limits)]);
        assert_eq!(limits.unwrap().discard, Discard::Old);
        let group = GroupSettings {
            start_at: StartAt::Latest,
            ack_timeout_ms: Some(500),
            max_deliveries: Some(3),
            dead_letter: Some(TopicName::new("orders-dlq").unwrap()),
        };
        assert_eq!(GroupSettings::from_list(&group.to_list()).unwrap(), group);
        assert!(GroupSettings::default().to_list().is_empty());
    }

    #[test]
    fn a_change_keeps_what_it_does_not_name_and_never_the_retention() {
        let limits = TopicSettings {
            max_records: Some(10),
            max_age_ms: Some(60_000),
            ..TopicSettings::limits()
        };
        let changed = limits.changed(&[TopicSetting::MaxBytes(100)]).unwrap();
        assert_eq!(
            changed,
            TopicSettings {
                max_bytes: Some(100),
                ..limits
            }
        );
        assert_eq!(limits.changed(&[]).unwrap(), limits);
        let same = [TopicSetting::Retention(Retention::Limits)];
        assert_eq!(limits.changed(&same).unwrap(), limits);
        let interest = [TopicSetting::Retention(Retention::Interest)];
        let refused = limits.changed(&interest).unwrap_err().to_string();
        assert!(
            refused.contains("limits retention") && refused.contains("interest retention"),
            "{refused}"
        );
        // Validated as at creation.
        for list in [
            vec![TopicSetting::MaxRecords(0)],
            vec![TopicSetting::MaxAgeMs(0)],
            vec![TopicSetting::MaxBytes(1), TopicSetting::MaxBytes(2)],
        ] {
            assert!(limits.changed(&list).is_err(), "{list:?}");
        }
        let old = [TopicSetting::Discard(Discard::Old)];
        assert!(TopicSettings::default().changed(&old).is_err());
    }

    /// What the audit log and the refusal of a join with other settings show.
    #[test]
    fn settings_in_words_show_durations_as_they_would_be_typed() {
        let topic = TopicSettings {
            max_records: Some(100),
            max_age_ms: Some(259_200_000),
            ..TopicSettings::limits()
        };
        assert_eq!(
            topic.to_string(),
            "limits retention, max 100 records, max age 3d, discard old"
        );
        let group = GroupSettings {
            start_at: StartAt::Latest,
            ack_timeout_ms: Some(5_400_000),
            ..GroupSettings::default()
        };
        assert_eq!(
            group.to_string(),
            "start at latest, acknowledgement timeout 1h 30m"
        );
    }

    #[test]
    fn settings_that_make_no_sense_are_refused() {
        for list in [
            vec![TopicSetting::MaxRecords(0)],
            vec![TopicSetting::MaxRecords(MAX_PRODUCT_CAPACITY as u64 + 1)],
            vec![TopicSetting::MaxBytes(0)],
            vec![TopicSetting::MaxAgeMs(0)],
            vec![TopicSetting::Discard(Discard::Old)],
            vec![TopicSetting::MaxBytes(1), TopicSetting::MaxBytes(2)],
        ] {
            assert!(TopicSettings::from_list(&list).is_err(), "{list:?}");
        }
        let dlq = TopicName::new("dlq").unwrap();
        for list in [
            vec![GroupSetting::AckTimeoutMs(0)],
            vec![
                GroupSetting::MaxDeliveries(0),
                GroupSetting::DeadLetter(dlq),
            ],
            vec![GroupSetting::MaxDeliveries(3)],
            vec![GroupSetting::DeadLetter(dlq)],
            vec![
                GroupSetting::StartAt(StartAt::Latest),
                GroupSetting::StartAt(StartAt::Earliest),
            ],
        ] {
            assert!(GroupSettings::from_list(&list).is_err(), "{list:?}");
        }
    }
}
