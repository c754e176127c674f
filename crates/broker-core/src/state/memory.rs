//! The memory budget: payload, key and header bytes retained across the broker, counted as
//! records are appended and leave, against an optional budget past which publishes answer
//! "full".

use super::BrokerState;

/// Payload, key and header bytes retained across the broker, and the optional budget they must
/// stay within.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Memory {
    /// Past this many retained bytes, publishes answer "full" (`-1`); `None` for no budget.
    pub(super) budget: Option<u64>,
    /// The sum of every partition's `retained_bytes`.
    pub(super) retained: u64,
}

impl Memory {
    /// Whether a record of `size` bytes may be retained without exceeding the budget.
    #[inline]
    pub(super) fn fits(&self, size: u64) -> bool {
        self.budget
            .is_none_or(|budget| self.retained.saturating_add(size) <= budget)
    }
}

impl BrokerState {
    /// This state with a memory budget: once the payload and key bytes retained across the
    /// whole broker would exceed `budget`, a publish answers `-1` (full), consuming no offset,
    /// as for a partition at capacity. `None` removes the budget.
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

    /// Payload and key bytes retained across every partition of every topic: what the memory
    /// budget bounds.
    pub fn retained_bytes(&self) -> u64 {
        self.memory.retained
    }
}
