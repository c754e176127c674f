//! The memory budget: payload, key and header bytes retained across the broker and how many
//! records hold them, counted as records are appended and leave, against an optional budget
//! past which publishes answer "full" (each record counting an overhead from
//! [`crate::Revision::Bounded`] on).

use super::BrokerState;
use crate::revision::BudgetRules;

/// Payload, key and header bytes retained across the broker, and the optional budget they must
/// stay within.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Memory {
    /// Past this many retained bytes, publishes answer "full" (`-1`); `None` for no budget.
    pub(super) budget: Option<u64>,
    /// The sum of every partition's `retained_bytes`.
    pub(super) retained: u64,
    /// How many records every partition retains.
    pub(super) records: u64,
    /// How they count against the budget, under the revision in force (see
    /// [`BrokerState::set_revision`]).
    pub(super) rules: BudgetRules,
}

/// Records that are retained, or that left: their payload, key and header bytes, and how many
/// they are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) bytes: u64,
    pub(super) records: u64,
}

impl std::ops::AddAssign for Held {
    fn add_assign(&mut self, other: Held) {
        self.bytes += other.bytes;
        self.records += other.records;
    }
}

impl Memory {
    /// Whether a record of `size` bytes may be retained without exceeding the budget once the
    /// records `leaving` left, each retained record counting its overhead besides its own
    /// bytes (see [`crate::Revision`]).
    #[inline]
    pub(super) fn fits(&self, size: u64, leaving: Held) -> bool {
        let overhead = self.rules.record_overhead;
        self.budget.is_none_or(|budget| {
            let bytes = self.retained.saturating_sub(leaving.bytes);
            let records = self.records.saturating_sub(leaving.records) + 1;
            bytes
                .saturating_add(size)
                .saturating_add(records.saturating_mul(overhead))
                <= budget
        })
    }

    /// Counts `held` as retained.
    #[inline]
    pub(super) fn add(&mut self, held: Held) {
        self.retained += held.bytes;
        self.records += held.records;
    }

    /// Counts `left` as no longer retained.
    #[inline]
    pub(super) fn remove(&mut self, left: Held) {
        self.retained -= left.bytes;
        self.records -= left.records;
    }
}

impl BrokerState {
    /// This state with a memory budget: once the payload, key and header bytes retained across
    /// the whole broker (with, from [`crate::Revision::Bounded`] on,
    /// [`crate::RECORD_OVERHEAD_BYTES`] for each record) would exceed `budget`, a publish
    /// answers `-1` (full), consuming no offset, as for a partition at capacity. `None`
    /// removes the budget.
    #[must_use]
    pub fn with_memory_budget(mut self, budget: Option<u64>) -> Self {
        self.set_memory_budget(budget);
        self
    }

    /// Sets or removes the memory budget (see [`BrokerState::with_memory_budget`]). Records
    /// already retained stay, even past a lowered budget; publishes are refused until enough
    /// of them are consumed.
    pub fn set_memory_budget(&mut self, budget: Option<u64>) {
        self.memory.budget = budget;
    }

    /// The memory budget in bytes, if there is one.
    pub fn memory_budget(&self) -> Option<u64> {
        self.memory.budget
    }

    /// Payload, key and header bytes retained across every partition of every topic: what the
    /// memory budget bounds (with, from [`crate::Revision::Bounded`] on,
    /// [`crate::RECORD_OVERHEAD_BYTES`] for each of [`BrokerState::retained_records`]).
    pub fn retained_bytes(&self) -> u64 {
        self.memory.retained
    }

    /// How many records every partition of every topic retains.
    pub fn retained_records(&self) -> u64 {
        self.memory.records
    }

    /// What the memory budget counts now: [`BrokerState::retained_bytes`] and, under the
    /// revisions that count it, the overhead of each retained record (see
    /// [`crate::RECORD_OVERHEAD_BYTES`]).
    pub fn budgeted_bytes(&self) -> u64 {
        self.memory.retained.saturating_add(
            self.memory
                .records
                .saturating_mul(self.memory.rules.record_overhead),
        )
    }
}
