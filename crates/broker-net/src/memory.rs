//! The memory every connection's requests share: a process-wide budget of request bytes that a
//! connection takes room from before it reads a frame's body, and gives back once the request
//! is answered. However many clients send at once, and however large their frames, the frames
//! held stay within the budget: a connection short of room stops reading (its client's sends
//! then wait on TCP's flow control) instead of the server allocating for it.
//!
//! Answers that carry records take room from the same budget before they are built
//! ([`RequestMemory::answer_room`]): a small read can ask for megabytes, and a client that
//! pipelines many of them without reading the answers would otherwise have the server build
//! them all.
//!
//! A connection may hold only its share of the budget ([`RequestMemory::for_connection`]): a
//! client that sends or asks for more than it reads holds up its own connection, not every
//! other client's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Room is counted in units of this many bytes (a frame takes at least one): enough for a
/// budget of hundreds of gigabytes in the semaphore's `u32` acquisitions, and a small request
/// is charged about what its decoded form holds rather than its few wire bytes.
pub const ROOM_UNIT: usize = 64;

/// Bytes of the length prefix before every frame of both protocols (big-endian `u32`).
pub const LENGTH_PREFIX: usize = 4;

/// The request bytes a process holds at once: cloned into every connection of every listener
/// (as [`RequestMemory::for_connection`] to bound what one connection holds).
#[derive(Debug, Clone)]
pub struct RequestMemory {
    units: Arc<Semaphore>,
    limit_units: u32,
    waits: Arc<AtomicU64>,
    /// One connection's share, which its room is taken from as well, and its size in units;
    /// `None` for the process-wide handle.
    share: Option<(Arc<Semaphore>, u32)>,
}

/// Room for one frame's bytes (or one answer's) in a [`RequestMemory`], given back when
/// dropped.
#[derive(Debug)]
pub struct FrameRoom {
    units: OwnedSemaphorePermit,
    /// As many units of the connection's share, if room is taken from one.
    shared: Option<OwnedSemaphorePermit>,
}

impl FrameRoom {
    /// The bytes of room held.
    pub fn bytes(&self) -> u64 {
        self.units.num_permits() as u64 * ROOM_UNIT as u64
    }

    /// Gives back what the room holds beyond `bytes` (rounded up to whole units, at least one
    /// kept): for an answer that turned out smaller than the room taken for it.
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = usize::try_from(bytes.div_ceil(ROOM_UNIT as u64))
            .unwrap_or(usize::MAX)
            .max(1);
        let excess = self.units.num_permits().saturating_sub(keep);
        // Dropped at once: given back.
        drop(self.units.split(excess));
        if let Some(shared) = &mut self.shared {
            drop(shared.split(excess));
        }
    }

    /// Adds `other`'s room, taken from the same handle, to this one.
    fn merge(&mut self, other: FrameRoom) {
        self.units.merge(other.units);
        if let (Some(shared), Some(more)) = (&mut self.shared, other.shared) {
            shared.merge(more);
        }
    }
}

impl RequestMemory {
    /// A budget of `limit` bytes (rounded down to [`ROOM_UNIT`], at least one unit, at most
    /// `u32::MAX` units).
    pub fn new(limit: u64) -> Self {
        let limit_units = u32::try_from(limit / ROOM_UNIT as u64)
            .unwrap_or(u32::MAX)
            .max(1);
        RequestMemory {
            units: Arc::new(Semaphore::new(limit_units as usize)),
            limit_units,
            waits: Arc::new(AtomicU64::new(0)),
            share: None,
        }
    }

    /// This budget as one connection takes from it: at most `share` bytes of it at once
    /// (rounded down to [`ROOM_UNIT`], at least one unit, at most the whole budget), so that a
    /// connection whose client sends or asks for more than it reads waits for its own room to
    /// be given back while other connections still find theirs. A frame or answer larger than
    /// the share takes all of it. Each call makes a new share.
    pub fn for_connection(&self, share: u64) -> RequestMemory {
        let share_units = u32::try_from(share / ROOM_UNIT as u64)
            .unwrap_or(u32::MAX)
            .clamp(1, self.limit_units);
        RequestMemory {
            units: Arc::clone(&self.units),
            limit_units: self.limit_units,
            waits: Arc::clone(&self.waits),
            share: Some((Arc::new(Semaphore::new(share_units as usize)), share_units)),
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        u64::from(self.limit_units) * ROOM_UNIT as u64
    }

    /// The most this handle may hold at once, in bytes: the connection's share (see
    /// [`RequestMemory::for_connection`]), or the whole budget. Room for more than is free of
    /// it beside what the handle holds already would be waited for until that is given back.
    pub fn most_held(&self) -> u64 {
        let units = self
            .share
            .as_ref()
            .map_or(self.limit_units, |(_, units)| *units);
        u64::from(units) * ROOM_UNIT as u64
    }

    /// Bytes taken by frames read and not yet answered.
    pub fn held(&self) -> u64 {
        let free = self.units.available_permits() as u64;
        (u64::from(self.limit_units) - free) * ROOM_UNIT as u64
    }

    /// How many times a connection had to wait for room.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Room for a frame of `bytes` (its length prefix included), waiting while other frames
    /// hold the budget. A frame larger than the whole budget takes all of it, so it waits until
    /// nothing else is held but never for ever. Cancel safe: nothing is taken until it returns.
    pub async fn room(&self, bytes: usize) -> FrameRoom {
        if let Some(room) = self.try_room(bytes) {
            return room;
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let units = self.units_for(bytes);
        // The connection's share first: waiting for it holds nothing of the process's budget.
        let shared = match &self.share {
            Some((share, _)) => Some(acquire(share, units).await),
            None => None,
        };
        FrameRoom {
            units: acquire(&self.units, units).await,
            shared,
        }
    }

    /// Room for an answer that may take up to `wanted` bytes but can make do with `least`:
    /// as much of `wanted` as is free now, once at least `least` is (waiting for that much
    /// while other frames and answers hold the budget). The answer is then built within
    /// [`FrameRoom::bytes`]. Cancel safe: nothing is taken until it returns.
    pub async fn answer_room(&self, wanted: u64, least: u64) -> FrameRoom {
        if let Some(room) = self.try_answer_room(wanted, least) {
            return room;
        }
        let mut room = self.room(saturating_usize(least)).await;
        // What else is free now, up to what was wanted.
        let more = wanted.saturating_sub(room.bytes());
        if let Some(extra) = self.take_free(more) {
            room.merge(extra);
        }
        room
    }

    /// [`RequestMemory::answer_room`] if at least `least` is free now, without waiting.
    pub fn try_answer_room(&self, wanted: u64, least: u64) -> Option<FrameRoom> {
        let least_units = self.units_for(saturating_usize(least));
        // Another connection may take some between the look and the taking: then look again.
        loop {
            let free = u32::try_from(self.free_units()).unwrap_or(u32::MAX);
            if free < least_units {
                return None;
            }
            let units = self.units_for(saturating_usize(wanted)).min(free);
            if let Some(room) = self.try_units(units) {
                return Some(room);
            }
        }
    }

    /// Up to `bytes` of room, as much as is free now; `None` when none is.
    fn take_free(&self, bytes: u64) -> Option<FrameRoom> {
        if bytes == 0 {
            return None;
        }
        let wanted = bytes.div_ceil(ROOM_UNIT as u64);
        loop {
            let free = self.free_units() as u64;
            let units = u32::try_from(wanted.min(free)).unwrap_or(u32::MAX);
            if units == 0 {
                return None;
            }
            if let Some(room) = self.try_units(units) {
                return Some(room);
            }
        }
    }

    /// Room for a frame of `bytes` if there is some now.
    pub fn try_room(&self, bytes: usize) -> Option<FrameRoom> {
        self.try_units(self.units_for(bytes))
    }

    /// `units` of the connection's share (if any) and of the budget, if both have them now.
    fn try_units(&self, units: u32) -> Option<FrameRoom> {
        let shared = match &self.share {
            Some((share, _)) => Some(Arc::clone(share).try_acquire_many_owned(units).ok()?),
            None => None,
        };
        // Without room in the budget, the share's units go back as `shared` drops.
        let units = Arc::clone(&self.units).try_acquire_many_owned(units).ok()?;
        Some(FrameRoom { units, shared })
    }

    /// Units free now both in the budget and in the connection's share.
    fn free_units(&self) -> usize {
        let free = self.units.available_permits();
        match &self.share {
            Some((share, _)) => free.min(share.available_permits()),
            None => free,
        }
    }

    fn units_for(&self, bytes: usize) -> u32 {
        let units = bytes.div_ceil(ROOM_UNIT).max(1);
        let most = match &self.share {
            Some((_, share_units)) => *share_units,
            None => self.limit_units,
        };
        u32::try_from(units).unwrap_or(u32::MAX).min(most)
    }
}

/// `units` of `semaphore`, waiting for them.
async fn acquire(semaphore: &Arc<Semaphore>, units: u32) -> OwnedSemaphorePermit {
    Arc::clone(semaphore)
        .acquire_many_owned(units)
        .await
        // The semaphores are never closed: they live as long as their handles.
        .unwrap_or_else(|_| unreachable!("the request memory's semaphores are never closed"))
}

fn saturating_usize(bytes: u64) -> usize {
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// The body length the 4-byte big-endian prefix at the start of `buffer` declares, once the
/// prefix has arrived.
pub fn declared_length(buffer: &[u8]) -> Option<usize> {
    let prefix = buffer.first_chunk::<LENGTH_PREFIX>()?;
    usize::try_from(u32::from_be_bytes(*prefix)).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn room_is_given_back_when_dropped_and_a_waiter_then_gets_it() {
        let memory = RequestMemory::new(1000);
        assert_eq!(memory.limit(), 960, "rounded down to whole units");
        let first = memory.room(600).await;
        assert_eq!(memory.held(), 640);
        assert!(memory.try_room(400).is_none(), "only 320 bytes are free");
        let waiting = tokio::spawn({
            let memory = memory.clone();
            async move { memory.room(400).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "it got room that was not free");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room given back reaches the waiter")
            .expect("the waiter does not panic");
        assert_eq!(memory.held(), 448);
        assert_eq!(memory.waits(), 1);
        drop(second);
        assert_eq!(memory.held(), 0);
    }

    #[tokio::test]
    async fn a_connection_holds_at_most_its_share_and_the_others_still_find_room() {
        let memory = RequestMemory::new(64 * 100);
        let greedy = memory.for_connection(64 * 25);
        // Answers of up to 64 units each, as much as is free: the share gives 25 at most.
        let first = greedy.try_answer_room(64 * 64, 64).unwrap();
        assert_eq!(first.bytes(), 64 * 25);
        assert!(
            greedy.try_answer_room(64 * 64, 64).is_none(),
            "its share is spent"
        );
        let waiting = tokio::spawn({
            let greedy = greedy.clone();
            async move { greedy.answer_room(64 * 64, 64).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "it got room beyond its share");
        // Another connection takes the rest of the budget, and its own share is its own.
        let other = memory.for_connection(64 * 100);
        let room = other
            .try_room(64 * 75)
            .expect("the budget beyond the share is free");
        assert_eq!(memory.held(), 64 * 100);
        drop(room);
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room given back reaches the waiter")
            .expect("the waiter does not panic");
        assert_eq!(second.bytes(), 64 * 25);
        let mut second = second;
        second.shrink_to(64);
        assert_eq!(memory.held(), 64);
        assert!(
            greedy.try_room(64 * 24).is_some(),
            "the share got back what shrank"
        );
        drop(second);
        assert_eq!(memory.held(), 0);
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_budget_takes_all_of_it_instead_of_waiting_for_ever() {
        let memory = RequestMemory::new(1024);
        let small = memory.room(10).await;
        assert_eq!(memory.held(), 64, "a small frame is charged one unit");
        assert!(memory.try_room(1 << 20).is_none(), "something else is held");
        drop(small);
        let whole = memory
            .try_room(1 << 20)
            .expect("nothing else held: it gets in");
        assert_eq!(memory.held(), 1024);
        drop(whole);
    }

    #[tokio::test]
    async fn an_answer_takes_what_is_free_of_what_it_wants_once_its_least_is() {
        let memory = RequestMemory::new(64 * 100);
        let frame = memory.room(64 * 70).await;
        // 30 units free: an answer wanting 50 takes the 30.
        let mut answer = memory.try_answer_room(64 * 50, 64 * 10).unwrap();
        assert_eq!(answer.bytes(), 64 * 30);
        assert!(
            memory.try_answer_room(64 * 50, 64).is_none(),
            "nothing is free"
        );
        // One wanting at least 40 waits until that much comes back.
        let waiting = tokio::spawn({
            let memory = memory.clone();
            async move { memory.answer_room(64 * 50, 64 * 40).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "it got room that was not free");
        // An answer smaller than its room gives the rest back: still not enough for the waiter.
        answer.shrink_to(100);
        assert_eq!(answer.bytes(), 128);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "28 units are free: it needs 40");
        drop(frame);
        let taken = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room given back reaches the waiter")
            .expect("the waiter does not panic");
        assert_eq!(
            taken.bytes(),
            64 * 50,
            "it takes what else is free, up to its want"
        );
        drop(answer);
        drop(taken);
        assert_eq!(memory.held(), 0);
    }

    #[test]
    fn the_declared_length_is_read_once_the_prefix_has_arrived() {
        assert_eq!(declared_length(&[0, 0, 1]), None);
        assert_eq!(declared_length(&[0, 0, 1, 0, 9, 9]), Some(256));
        assert_eq!(
            declared_length(&[255, 255, 255, 255]),
            Some(u32::MAX as usize)
        );
    }

    #[test]
    fn a_budget_too_large_for_the_counter_is_capped_not_wrapped() {
        let memory = RequestMemory::new(u64::MAX);
        assert_eq!(memory.limit(), u64::from(u32::MAX) * ROOM_UNIT as u64);
        assert_eq!(RequestMemory::new(0).limit(), ROOM_UNIT as u64);
    }
}
