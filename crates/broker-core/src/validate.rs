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

/// Identifiers are 1 to 64 ASCII letters, digits, `_` or `-`, case-sensitive and untrimmed.
pub(crate) fn check_identifier(kind: &str, value: &str) -> Result<(), BrokerError> {
    let valid = (1..=MAX_IDENTIFIER_LEN).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(BrokerError::invalid(format!(
            "{kind} {value:?} is not a valid identifier (1 to {MAX_IDENTIFIER_LEN} ASCII letters, digits, '_' or '-')"
        )))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_accept_letters_digits_underscore_and_dash_up_to_64() {
        for ok in ["a", "Z", "0", "_", "-", "orders-2_EU", &"x".repeat(64)] {
            assert!(check_identifier("topic", ok).is_ok(), "{ok:?}");
        }
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
                    check_identifier("topic", bad),
                    Err(BrokerError::InvalidArgument(_))
                ),
                "{bad:?}"
            );
        }
    }
}
