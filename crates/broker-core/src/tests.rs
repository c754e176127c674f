//! Unit tests of the core: one rule, one test, named after the rule.
//!
//! `contract` holds the core contract's rules and worked examples, `validation` every validation
//! rule (each also checking that the invalid call changed nothing), `kafka` the Kafka-style
//! consumption with its decided edge cases, `memory` the memory budget, `batch` batch
//! publishing, `idempotence` what is remembered of idempotent producers, `ack_and_poll` the
//! combined call, `limits` the topic, group and member limits, and `configure` changing an
//! existing topic's settings.

#![allow(clippy::unwrap_used)]

mod ack_and_poll;
mod batch;
mod configure;
mod contract;
mod idempotence;
mod kafka;
mod limits;
mod memory;
mod moves;
mod redeliver;
mod validation;

use std::fmt::Debug;

use crate::{BrokerError, BrokerRecord, EventBroker};

/// A broker with the given capacity; panics on an invalid one (tests pass valid ones).
fn broker(capacity: i32) -> EventBroker {
    EventBroker::new(capacity).unwrap()
}

/// `(partition, offset)` of each record, in the order returned.
fn positions(records: &[BrokerRecord]) -> Vec<(i32, i64)> {
    records.iter().map(|r| (r.partition, r.offset)).collect()
}

/// Asserts that `call` is refused with `InvalidArgument` and that `describe()` is unchanged.
fn assert_invalid<T: Debug>(
    broker: &EventBroker,
    call: impl FnOnce(&EventBroker) -> Result<T, BrokerError>,
) {
    let before = broker.describe();
    let result = call(broker);
    assert!(
        matches!(result, Err(BrokerError::InvalidArgument(_))),
        "expected InvalidArgument, got {result:?}"
    );
    assert_eq!(
        broker.describe(),
        before,
        "an invalid call changed the broker"
    );
}

/// Asserts that `call` returns `expected` and that `describe()` is unchanged.
fn assert_no_change<T: Debug + PartialEq>(
    broker: &EventBroker,
    expected: T,
    call: impl FnOnce(&EventBroker) -> Result<T, BrokerError>,
) {
    let before = broker.describe();
    assert_eq!(call(broker).unwrap(), expected);
    assert_eq!(broker.describe(), before, "the call changed the broker");
}
mod exactness;
mod revisions;
