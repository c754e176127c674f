//! What every load generator of a run shares: the counters, what one producer is asked to do,
//! the payload each record carries (its producer, sequence number and send time, so consumers
//! can check exactly-once delivery and measure latency) and the latency histograms.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;

/// Bytes at the start of every payload: producer (u32), sequence (u64), send time (u64 ns).
pub(crate) const HEADER_BYTES: usize = 20;

/// Counters shared by every task of a run.
pub(crate) struct Shared {
    pub(crate) start: Instant,
    pub(crate) published: AtomicU64,
    pub(crate) refused: AtomicU64,
    /// Publish requests answered (a batch is one).
    pub(crate) requests: AtomicU64,
    pub(crate) producers_done: AtomicBool,
}

/// What one producer publishes, and how.
pub(crate) struct Producer {
    pub(crate) topic: String,
    pub(crate) index: u32,
    pub(crate) share: u64,
    pub(crate) partitions: i32,
    pub(crate) size: usize,
    pub(crate) depth: usize,
    pub(crate) batch: usize,
    pub(crate) retry_full: bool,
    pub(crate) deadline: Option<Instant>,
    pub(crate) shared: Arc<Shared>,
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    // 1 ns to 100 s with 3 significant digits: every latency a run can see.
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
        .unwrap_or_else(|_| unreachable!("the bounds are constant and valid"))
}

pub(crate) fn encode_payload(size: usize, producer: u32, sequence: u64, sent_nanos: u64) -> Bytes {
    let mut payload = BytesMut::with_capacity(size);
    payload.put_u32_le(producer);
    payload.put_u64_le(sequence);
    payload.put_u64_le(sent_nanos);
    payload.resize(size, b'x');
    payload.freeze()
}

pub(crate) fn decode_header(payload: &[u8]) -> Option<(u32, u64, u64)> {
    let header = payload.get(..HEADER_BYTES)?;
    let u64_at = |at: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let mut producer = [0u8; 4];
    producer.copy_from_slice(&header[..4]);
    Some((u32::from_le_bytes(producer), u64_at(4), u64_at(12)))
}
