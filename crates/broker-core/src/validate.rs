//! Argument validation shared by every call, with one message per kind of bad input.

use crate::{BrokerError, Header};

/// Longest valid identifier, in bytes.
pub const MAX_IDENTIFIER_LEN: usize = 64;
/// Largest `capacity_per_partition` of [`crate::EventBroker::new`].
pub const MAX_CAPACITY: i32 = 1_000;
/// Largest capacity a [`crate::BrokerState`] (a server) or a topic's `max_records` may have.
pub const MAX_PRODUCT_CAPACITY: i32 = i32::MAX;
/// Most partitions a topic can have by default (the [`crate::Limits`] a broker starts with).
pub const MAX_PARTITIONS: i32 = 64;
/// Most partitions a broker's [`crate::Limits`] may allow a topic.
pub const MAX_PARTITIONS_LIMIT: i32 = 65_536;
/// Most records one `poll` can reserve.
pub const MAX_POLL_RECORDS: i32 = 64;
/// Most records one `fetch` can return.
pub const MAX_FETCH_RECORDS: i32 = 10_000;
/// Most records one `publish_batch` can carry.
pub const MAX_BATCH_RECORDS: usize = 10_000;
/// Most headers one record may carry.
pub const MAX_HEADERS: usize = 64;
/// Longest header name, in bytes (of UTF-8; a name is at least 1 byte).
pub const MAX_HEADER_NAME_LEN: usize = 255;
/// Most acknowledgements one `ack_and_poll` can carry: a member has at most one delivery in
/// flight per partition, and a topic has at most [`MAX_PARTITIONS`] partitions by default.
pub const MAX_ACKS: usize = MAX_PARTITIONS as usize;

/// The most bytes of records (payload, key and header bytes) a topic of a cluster may hold to
/// be moved to another group: the leader of the group it leaves reads it whole into memory,
/// and every member of the group it goes to holds its records in memory from their arrival
/// until its next snapshot writes them to disk.
pub const MAX_MOVE_BYTES: u64 = 256 * 1024 * 1024;

/// Longest name [`NameRules::Kafka`] accepts, in bytes: Kafka's own limit for topic names.
pub const MAX_KAFKA_NAME_LEN: usize = 249;

/// Which names of topics, groups and members a broker accepts. Names are case-sensitive and
/// untrimmed under either rule, and every call of a broker checks them by the same rule.
///
/// Encoded (as in a cluster's log) as a `u32`: 0 for `Broker`, 1 for `Kafka`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub enum NameRules {
    /// 1 to [`MAX_IDENTIFIER_LEN`] (64) ASCII letters, digits, `_` or `-`. The default.
    #[default]
    Broker,
    /// Kafka's topic names: 1 to [`MAX_KAFKA_NAME_LEN`] (249) ASCII letters, digits, `.`, `_`
    /// or `-`, but neither `.` nor `..`. Every name [`NameRules::Broker`] accepts is accepted.
    /// Unlike Kafka, which refuses a topic whose name differs from an existing one's only by
    /// `.` against `_` (its metric names cannot tell them apart), such names are two topics
    /// here: nothing the broker names by topic confuses them.
    Kafka,
}

impl NameRules {
    /// Whether `value` is a name under these rules.
    pub fn allows(self, value: &str) -> bool {
        let (longest, dots) = match self {
            NameRules::Broker => (MAX_IDENTIFIER_LEN, false),
            NameRules::Kafka => (MAX_KAFKA_NAME_LEN, true),
        };
        (1..=longest).contains(&value.len())
            && value != "."
            && value != ".."
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (dots && b == b'.'))
    }

    /// `value` if it is a name under these rules.
    ///
    /// # Errors
    /// `InvalidArgument` naming the `kind` of name (topic, group, member) and the rules.
    pub fn check(self, kind: &str, value: &str) -> Result<(), BrokerError> {
        if self.allows(value) {
            return Ok(());
        }
        Err(BrokerError::invalid(match self {
            NameRules::Broker if NameRules::Kafka.allows(value) => format!(
                "{kind} {value:?} is not a valid identifier (1 to {MAX_IDENTIFIER_LEN} ASCII \
                 letters, digits, '_' or '-'); this broker is not set to take Kafka's names, \
                 which also allow '.' and up to {MAX_KAFKA_NAME_LEN} characters (a server \
                 takes them when started with --names kafka)"
            ),
            NameRules::Broker => format!(
                "{kind} {value:?} is not a valid identifier (1 to {MAX_IDENTIFIER_LEN} ASCII letters, digits, '_' or '-')"
            ),
            NameRules::Kafka => format!(
                "{kind} {value:?} is not a valid name (1 to {MAX_KAFKA_NAME_LEN} ASCII letters, \
                 digits, '.', '_' or '-', other than '.' and '..')"
            ),
        }))
    }
}

impl std::fmt::Display for NameRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameRules::Broker => "broker",
            NameRules::Kafka => "kafka",
        })
    }
}

fn check_range(what: &str, value: i32, max: i32) -> Result<(), BrokerError> {
    if (1..=max).contains(&value) {
        Ok(())
    } else {
        Err(BrokerError::invalid(format!(
            "{what} must be from 1 to {max}, got {value}"
        )))
    }
}

pub(crate) fn check_capacity(capacity: i32) -> Result<(), BrokerError> {
    check_range("capacity per partition", capacity, MAX_CAPACITY)
}

pub(crate) fn check_product_capacity(capacity: i32) -> Result<(), BrokerError> {
    check_range("capacity per partition", capacity, MAX_PRODUCT_CAPACITY)
}

/// A topic's partition count, at most `max` (the broker's limit).
pub(crate) fn check_partition_count(count: i32, max: usize) -> Result<(), BrokerError> {
    let max = i32::try_from(max).unwrap_or(MAX_PARTITIONS_LIMIT);
    check_range("partition count", count, max)
}

pub(crate) fn check_poll_max_records(max_records: i32) -> Result<(), BrokerError> {
    check_range("poll max_records", max_records, MAX_POLL_RECORDS)
}

pub(crate) fn check_fetch_max_records(max_records: i32) -> Result<(), BrokerError> {
    check_range("fetch max_records", max_records, MAX_FETCH_RECORDS)
}

/// `len` items where at most `max` are allowed; `what` says where, as "{what} {max} {items}".
fn check_len(len: usize, max: usize, what: &str, items: &str) -> Result<(), BrokerError> {
    if len <= max {
        Ok(())
    } else {
        Err(BrokerError::invalid(format!(
            "{what} {max} {items}, got {len}"
        )))
    }
}

/// Checks a record's headers as every publish does: at most [`MAX_HEADERS`], each name 1 to
/// [`MAX_HEADER_NAME_LEN`] bytes.
///
/// # Errors
/// `InvalidArgument` saying which rule the headers break.
pub fn check_headers(headers: &[Header]) -> Result<(), BrokerError> {
    check_len(
        headers.len(),
        MAX_HEADERS,
        "a record carries at most",
        "headers",
    )?;
    for header in headers {
        if header.name.is_empty() || header.name.len() > MAX_HEADER_NAME_LEN {
            return Err(BrokerError::invalid(format!(
                "a header name is 1 to {MAX_HEADER_NAME_LEN} bytes, got {}",
                header.name.len()
            )));
        }
    }
    Ok(())
}

pub(crate) fn check_batch_len(len: usize) -> Result<(), BrokerError> {
    check_len(len, MAX_BATCH_RECORDS, "a batch holds at most", "records")
}

pub(crate) fn check_acks_len(len: usize) -> Result<(), BrokerError> {
    check_len(len, MAX_ACKS, "one call acknowledges at most", "deliveries")
}

pub(crate) fn check_offset(offset: i64) -> Result<(), BrokerError> {
    if offset >= 0 {
        Ok(())
    } else {
        Err(BrokerError::invalid(format!(
            "offset must not be negative, got {offset}"
        )))
    }
}

/// What may follow a topic's name and a separator (`-`, `_` or `.`) in the name of a topic
/// placed with it: its dead-letter or retry topic.
const COMPANION_SUFFIXES: [&str; 6] = [
    "dlq",
    "dead-letter",
    "dead-letters",
    "deadletter",
    "retry",
    "failed",
];

/// Separators between a topic's name and a [`COMPANION_SUFFIXES`] entry (`.` in Kafka's
/// names, `orders.v1.dlq`).
const COMPANION_SEPARATORS: [char; 3] = ['-', '_', '.'];

/// The names of the topics `topic` would be a companion of (their dead-letter or retry topic),
/// by its name: `orders` for `orders-dlq`, `orders_retry` or `orders.dlq`. A server places a
/// topic with its companions (in one shard, in one group of a cluster), and
/// `broker cluster balance` moves them together.
///
/// ```
/// let of: Vec<&str> = broker_core::companions_of("orders-dlq").collect();
/// assert_eq!(of, ["orders"]);
/// assert_eq!(broker_core::companions_of("orders").count(), 0);
/// ```
pub fn companions_of(topic: &str) -> impl Iterator<Item = &str> {
    COMPANION_SUFFIXES.iter().filter_map(move |suffix| {
        topic
            .strip_suffix(suffix)?
            .strip_suffix(COMPANION_SEPARATORS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_accept_letters_digits_underscore_and_dash_up_to_64() {
        for ok in ["a", "Z", "0", "_", "-", "orders-2_EU", &"x".repeat(64)] {
            assert!(NameRules::Broker.check("topic", ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn kafka_names_add_dots_and_length_up_to_249_but_not_dot_or_dot_dot() {
        for ok in [
            "a",
            "orders.v1",
            "...",
            ".a",
            "a..b",
            "_-.",
            &"x".repeat(249),
        ] {
            assert!(NameRules::Kafka.check("topic", ok).is_ok(), "{ok:?}");
        }
        for bad in ["", ".", "..", &"x".repeat(250), "a b", "a/b", "é", "a:b"] {
            assert!(NameRules::Kafka.check("topic", bad).is_err(), "{bad:?}");
        }
        // Every broker name is a Kafka name.
        for name in ["a", "orders-2_EU", &"x".repeat(64)] {
            assert!(NameRules::Kafka.allows(name) && NameRules::Broker.allows(name));
        }
    }

    #[test]
    fn a_kafka_name_refused_by_the_broker_rules_says_where_it_is_taken() {
        let Err(BrokerError::InvalidArgument(text)) = NameRules::Broker.check("topic", "a.b")
        else {
            panic!("a.b is not a broker name");
        };
        assert!(text.contains("Kafka's names"), "{text}");
        let Err(BrokerError::InvalidArgument(text)) = NameRules::Broker.check("topic", "a b")
        else {
            panic!("a b is no name");
        };
        assert!(!text.contains("Kafka"), "{text}");
    }

    #[test]
    fn identifiers_reject_empty_long_spaces_dots_and_non_ascii() {
        for bad in [
            "",
            &"x".repeat(65),
            " a",
            "a ",
            "a.b",
            "a/b",
            "é",
            "a\0",
            "a\n",
        ] {
            assert!(
                matches!(
                    NameRules::Broker.check("topic", bad),
                    Err(BrokerError::InvalidArgument(_))
                ),
                "{bad:?}"
            );
        }
    }
}
