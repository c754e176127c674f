//! Identifiers the listener hands out: producer ids and group member ids.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// 64 random bits: the process's random hashing keys, fed a counter so that no two draws of
/// the process repeat.
pub(crate) fn random_u64() -> u64 {
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(DRAWN.fetch_add(1, Ordering::Relaxed));
    hasher.finish()
}

/// A producer id no other producer has, with overwhelming likelihood: 63 random bits (Kafka's
/// producer ids are never negative). The broker remembers producers by id across restarts, so
/// ids are drawn at random rather than counted from zero.
pub(crate) fn new_producer_id() -> i64 {
    (random_u64() >> 1) as i64
}

/// A new member id for a client that joins a group, named after its client id as Kafka names
/// them.
pub(crate) fn new_member_id(client_id: &str) -> String {
    format!("{client_id}-{:016x}", random_u64())
}
