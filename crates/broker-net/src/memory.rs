//! The memory every connection's requests share: a process-wide budget of request bytes that a
//! connection takes room from before it reads a frame's body, and gives back once the request
//! is answered. However many clients send at once, and however large their frames, the frames
//! held stay within the budget: a connection short of room stops reading (its client's sends
//! then wait on TCP's flow control) instead of the server allocating for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Room is counted in units of this many bytes (a frame takes at least one): enough for a
/// budget of hundreds of gigabytes in the semaphore's `u32` acquisitions, and a small request
/// is charged about what its decoded form holds rather than its few wire bytes.
pub const ROOM_UNIT: usize = 64;

/// Bytes of the length prefix before every frame of both protocols (big-endian `u32`).
pub const LENGTH_PREFIX: usize = 4;

/// The request bytes a process holds at once: cloned into every connection of every listener.
#[derive(Debug, Clone)]
pub struct RequestMemory {
    units: Arc<Semaphore>,
    limit_units: u32,
    waits: Arc<AtomicU64>,
}

/// Room for one frame's bytes in a [`RequestMemory`], given back when dropped.
#[derive(Debug)]
pub struct FrameRoom {
    _units: OwnedSemaphorePermit,
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
        }
    }

    /// The budget in bytes.
    pub fn limit(&self) -> u64 {
        u64::from(self.limit_units) * ROOM_UNIT as u64
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
        let units = Arc::clone(&self.units)
            .acquire_many_owned(self.units_for(bytes))
            .await
            // The semaphore is never closed: it lives as long as `self`.
            .unwrap_or_else(|_| unreachable!("the request memory's semaphore is never closed"));
        FrameRoom { _units: units }
    }

    /// Room for a frame of `bytes` if there is some now.
    pub fn try_room(&self, bytes: usize) -> Option<FrameRoom> {
        Arc::clone(&self.units)
            .try_acquire_many_owned(self.units_for(bytes))
            .ok()
            .map(|units| FrameRoom { _units: units })
    }

    fn units_for(&self, bytes: usize) -> u32 {
        let units = bytes.div_ceil(ROOM_UNIT).max(1);
        u32::try_from(units)
            .unwrap_or(u32::MAX)
            .min(self.limit_units)
    }
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
