//! Revisions: which release's rules a command is applied under.
//!
//! A command's effect is part of the data: a data directory replays its log through the core
//! at every start, and every node of a cluster applies every entry of the replicated log
//! itself. A rule that changes (a fix of what a poll does past the maximum of deliveries, say)
//! must therefore apply only to entries written after the change, and an entry must apply
//! forever as it did when it was first applied. Each entry carries the revision it was written
//! under (a data directory in its log segments' format, a cluster in the entry), the state
//! applies it under that revision ([`crate::BrokerState::set_revision`]), and every behaviour
//! that differs between revisions is decided by the one `match` in [`Revision::rules`].

use serde::{Deserialize, Serialize};

/// A set of rules the core applies commands under. Later revisions fix behaviours of earlier
/// ones; an entry written under a revision is always applied under it.
///
/// Encoded (in a cluster's log) as its number, a `u32`: [`Revision::Original`] is 0,
/// [`Revision::Bounded`] 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Revision {
    /// The rules of every release before revisions: what a data directory of format 6 or
    /// earlier, and a cluster entry that names no revision, were written under.
    Original,
    /// The maximum of deliveries and the memory budget hold on every path:
    /// - a delivery is never made past its group's maximum of deliveries, whichever way it was
    ///   released (a poll after its acknowledgement timeout but before the clock's tick,
    ///   `redeliver`, a rebalance after partitions were added): it goes to the dead-letter
    ///   topic instead, as when the tick releases it;
    /// - a delivery stamped later than the broker's clock (a topic moved from a node whose
    ///   clock runs ahead) counts as just made, not as overdue;
    /// - a topic that discards its oldest records makes room for a new one within the memory
    ///   budget by that discard, rather than refusing it;
    /// - a group that committed below the earliest retained record sends the record at the
    ///   earliest offset to its dead-letter topic once it had its maximum of deliveries;
    /// - every retained record counts [`RECORD_OVERHEAD_BYTES`] besides its payload, key and
    ///   headers against the memory budget, so that empty records cannot fill memory without
    ///   bound;
    /// - the byte budget of a poll, fetch or read counts [`HEADER_WIRE_BYTES`] for each header
    ///   of a record besides its name and value, as the header takes on the wire, so that an
    ///   answer of many records with many small headers stays within its frame;
    /// - a reset of a group's offsets cancels its deliveries in flight on the partitions it
    ///   names even where the committed offset does not move (a reset to where the group is),
    ///   so that an operator can unstick a record held by a member that is gone.
    Bounded,
}

/// What a retained record costs in memory besides its payload, key and headers (its offset,
/// time, and the structures that hold it), counted against the memory budget from
/// [`Revision::Bounded`] on.
pub const RECORD_OVERHEAD_BYTES: u64 = 80;

/// What a header takes in an answer besides its name and value (the name's length `u64`, the
/// value's presence `u8` and length `u64`), counted against the byte budget of a poll, fetch
/// or read from [`Revision::Bounded`] on.
pub const HEADER_WIRE_BYTES: u64 = 17;

impl Revision {
    /// The revision this build applies new commands under.
    pub const NEWEST: Revision = Revision::Bounded;

    /// Every revision, oldest first.
    pub const ALL: [Revision; 2] = [Revision::Original, Revision::Bounded];

    /// Its number: 0 for [`Revision::Original`], then one more for each later revision.
    pub fn number(self) -> u32 {
        match self {
            Revision::Original => 0,
            Revision::Bounded => 1,
        }
    }

    /// The revision numbered `number`, if this build knows it.
    pub fn from_number(number: u32) -> Option<Revision> {
        Revision::ALL
            .into_iter()
            .find(|revision| revision.number() == number)
    }

    /// The behaviours that differ between revisions, as this revision has them: the one place
    /// that decides them, so that a new revision is a new arm here, and the compiler names it.
    pub(crate) fn rules(self) -> Rules {
        match self {
            Revision::Original => Rules {
                exhausted_on_every_release: false,
                later_delivery_not_overdue: false,
                exhausted_below_earliest: false,
                budget: BudgetRules {
                    discard_makes_room: false,
                    record_overhead: 0,
                },
                header_wire_bytes: 0,
                reset_cancels_in_place: false,
            },
            Revision::Bounded => Rules {
                exhausted_on_every_release: true,
                later_delivery_not_overdue: true,
                exhausted_below_earliest: true,
                budget: BudgetRules {
                    discard_makes_room: true,
                    record_overhead: RECORD_OVERHEAD_BYTES,
                },
                header_wire_bytes: HEADER_WIRE_BYTES,
                reset_cancels_in_place: true,
            },
        }
    }
}

impl std::fmt::Display for Revision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.number())
    }
}

/// The behaviours that differ between revisions (see [`Revision`] for what each means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    /// A poll of a released delivery, `redeliver` and a rebalance check the maximum of
    /// deliveries as the tick does.
    pub(crate) exhausted_on_every_release: bool,
    /// A delivery stamped later than the clock has had no time yet.
    pub(crate) later_delivery_not_overdue: bool,
    /// The maximum of deliveries applies from the earliest retained record when a group
    /// committed below it.
    pub(crate) exhausted_below_earliest: bool,
    /// How records count against the memory budget.
    pub(crate) budget: BudgetRules,
    /// Bytes each header of a record counts against an answer's byte budget besides its name
    /// and value.
    pub(crate) header_wire_bytes: u64,
    /// A reset cancels the deliveries in flight where the committed offset does not move.
    pub(crate) reset_cancels_in_place: bool,
}

/// How records count against the memory budget, under a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct BudgetRules {
    /// A discard-old topic checks the budget against what remains after its discard.
    pub(crate) discard_makes_room: bool,
    /// Bytes each retained record counts besides its own.
    pub(crate) record_overhead: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_consecutive_and_round_trip() {
        for (expected, revision) in Revision::ALL.into_iter().enumerate() {
            assert_eq!(revision.number(), expected as u32);
            assert_eq!(Revision::from_number(revision.number()), Some(revision));
        }
        assert_eq!(Revision::from_number(Revision::ALL.len() as u32), None);
        assert_eq!(Revision::ALL.last(), Some(&Revision::NEWEST));
    }

    #[test]
    fn the_original_revision_has_none_of_the_later_rules() {
        let original = Revision::Original.rules();
        assert!(!original.exhausted_on_every_release && original.budget.record_overhead == 0);
        assert_ne!(original, Revision::Bounded.rules());
    }
}
