//! Reading length-prefixed frames (a 4-byte big-endian body length, then the body: the framing
//! of both the broker's protocol and Kafka's) from a connection, each frame larger than a read
//! chunk with room in the process's [`RequestMemory`] before its body is read, within an idle
//! and a frame timeout.

use std::io;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::{self, Instant};

use crate::memory::{declared_length, FrameRoom, RequestMemory, LENGTH_PREFIX};

/// Frames of at most this many bytes (the read chunk) take no room in the request memory: they
/// arrive within the chunk a connection reads at a time whatever their size, so what they hold
/// is bounded by the connections' count (`--max-connections` chunks), and small requests pay
/// nothing for the accounting. Larger frames make the connection's buffer grow: that growth is
/// what the request memory bounds.
pub const SMALL_FRAME: usize = crate::READ_CHUNK;

/// How long a connection may keep the server waiting for its frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTimeouts {
    /// The peer sends nothing while it has no request outstanding for this long.
    pub idle: Duration,
    /// A frame whose first bytes have arrived is not whole within this long after it got its
    /// room (a slowloris sending a byte now and then). A frame that starts while the
    /// connection is waiting is noticed within this long, so it is refused one to two of
    /// these after its first byte.
    pub frame: Duration,
}

/// Why no frame could be read; the connection cannot go on after any of these.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading the socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// A length prefix announced a frame larger than the limit (its body is never read).
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The announced size.
        size: u64,
        /// The limit in force.
        limit: u64,
    },
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed in the middle of a frame ({buffered} bytes buffered)")]
    Truncated {
        /// Bytes of the unfinished frame that had arrived.
        buffered: usize,
    },
    /// The peer sent nothing for the idle timeout while it had no request outstanding.
    #[error("the connection was idle for too long")]
    Idle,
    /// A frame did not arrive whole within the frame timeout.
    #[error("a frame did not arrive completely in time")]
    Slow,
}

/// A connection's read side: its stream and the bytes read from it not yet taken as frames.
#[derive(Debug)]
pub struct FrameReader<R> {
    stream: R,
    buffer: BytesMut,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader of `stream`, nothing buffered yet.
    pub fn new(stream: R) -> Self {
        FrameReader {
            stream,
            buffer: BytesMut::with_capacity(crate::READ_CHUNK),
        }
    }

    /// The bytes read and not yet taken.
    pub fn buffered(&self) -> &BytesMut {
        &self.buffer
    }

    /// The bytes read and not yet taken, for a decoder that takes its frames itself (a
    /// handshake's, before the connection shares the request memory).
    pub fn buffered_mut(&mut self) -> &mut BytesMut {
        &mut self.buffer
    }

    /// The stream, to write to it when it is both halves.
    pub fn stream_mut(&mut self) -> &mut R {
        &mut self.stream
    }

    /// Reads more bytes into the buffer; 0 at the end of the stream.
    pub async fn fill(&mut self) -> io::Result<usize> {
        crate::make_room(&mut self.buffer);
        match self.stream.read_buf(&mut self.buffer).await {
            // A TLS peer that closes without a close_notify alert: the frames say where
            // messages end, so this is a clean end between frames and an error inside one.
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
            read => read,
        }
    }

    /// The length (prefix included) of the frame at the start of the buffer once its prefix
    /// has arrived; an error for a frame over `limit` bytes of body, which is never read.
    fn next_frame_bytes(&self, limit: usize) -> Result<Option<usize>, FrameError> {
        let Some(length) = declared_length(&self.buffer) else {
            return Ok(None);
        };
        if length > limit {
            return Err(FrameError::TooLarge {
                size: length as u64,
                limit: limit as u64,
            });
        }
        Ok(Some(LENGTH_PREFIX + length))
    }

    /// The next frame (its length prefix, then its body) of at most `limit` bytes of body,
    /// with room for it in `memory` if it is larger than [`SMALL_FRAME`]: once the prefix of
    /// such a frame has arrived the reader reads no more of it until it has room for all of
    /// it. Within `timeouts`, the idle one counted only while
    /// `busy()` is false (the peer has no request outstanding); waiting for room counts as
    /// neither. `Ok(None)` on a clean end of stream between frames.
    ///
    /// Cancel safe: everything read stays buffered, and room not yet returned with a frame is
    /// given back.
    pub async fn next(
        &mut self,
        limit: usize,
        memory: &RequestMemory,
        timeouts: FrameTimeouts,
        busy: impl Fn() -> bool,
    ) -> Result<Option<(BytesMut, Option<FrameRoom>)>, FrameError> {
        let mut idle_since = Instant::now();
        let mut partial_since = None;
        let mut room = None;
        loop {
            let frame_bytes = self.next_frame_bytes(limit)?;
            if let Some(bytes) = frame_bytes.filter(|&bytes| bytes <= SMALL_FRAME) {
                if self.buffer.len() >= bytes {
                    return Ok(Some((self.buffer.split_to(bytes), None)));
                }
            } else if let Some(bytes) = frame_bytes {
                let held = match room.take() {
                    Some(held) => held,
                    None => {
                        let held = memory.room(bytes).await;
                        partial_since = Some(Instant::now());
                        held
                    }
                };
                if self.buffer.len() >= bytes {
                    return Ok(Some((self.buffer.split_to(bytes), Some(held))));
                }
                // Room for the rest of it, at once: reads then go into one allocation.
                self.buffer.reserve(bytes - self.buffer.len());
                room = Some(held);
            }
            let now = Instant::now();
            if !self.buffer.is_empty() && partial_since.is_none() {
                partial_since = Some(now);
            }
            let deadline = match partial_since {
                Some(since) => since + timeouts.frame,
                None => (idle_since + timeouts.idle).min(now + timeouts.frame),
            };
            let Ok(read) = time::timeout_at(deadline, self.fill()).await else {
                let now = Instant::now();
                if partial_since.is_some() {
                    return Err(FrameError::Slow);
                }
                if busy() {
                    idle_since = now;
                } else if now >= idle_since + timeouts.idle {
                    return Err(FrameError::Idle);
                }
                continue;
            };
            if read? == 0 {
                return match self.buffer.len() {
                    0 => Ok(None),
                    buffered => Err(FrameError::Truncated { buffered }),
                };
            }
        }
    }

    /// The next frame if it is whole in the buffer already and `memory` has room for it now
    /// (otherwise [`FrameReader::next`] waits for it), without reading from the socket.
    pub fn next_buffered(
        &mut self,
        limit: usize,
        memory: &RequestMemory,
    ) -> Result<Option<(BytesMut, Option<FrameRoom>)>, FrameError> {
        let Some(bytes) = self.next_frame_bytes(limit)? else {
            return Ok(None);
        };
        if self.buffer.len() < bytes {
            return Ok(None);
        }
        if bytes <= SMALL_FRAME {
            return Ok(Some((self.buffer.split_to(bytes), None)));
        }
        let Some(room) = memory.try_room(bytes) else {
            return Ok(None);
        };
        Ok(Some((self.buffer.split_to(bytes), Some(room))))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    const TIMEOUTS: FrameTimeouts = FrameTimeouts {
        idle: Duration::from_secs(60),
        frame: Duration::from_secs(60),
    };

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    }

    #[tokio::test]
    async fn a_frame_is_read_only_once_it_has_room_and_its_room_goes_with_it() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut reader = FrameReader::new(server);
        let memory = RequestMemory::new(1 << 20);
        let holder = memory.room(1_000_000).await;
        let body = vec![7; 200_000];
        let sent = frame(&body);
        let sending = tokio::spawn(async move { client.write_all(&sent).await.map(|()| client) });
        let waiting = time::timeout(
            Duration::from_millis(200),
            reader.next(1 << 20, &memory, TIMEOUTS, || false),
        )
        .await;
        assert!(waiting.is_err(), "read a frame with no room for it");
        assert!(
            reader.buffered().len() <= crate::READ_CHUNK,
            "read {} bytes of a frame with no room",
            reader.buffered().len()
        );
        drop(holder);
        let (read, room) = reader
            .next(1 << 20, &memory, TIMEOUTS, || false)
            .await
            .unwrap()
            .unwrap();
        let room = room.expect("a frame larger than a read chunk has room");
        assert_eq!(read.len(), 200_004);
        assert_eq!(&read[4..], &body[..]);
        assert_eq!(memory.held(), 200_004_u64.div_ceil(64) * 64);
        drop(room);
        assert_eq!(memory.held(), 0);
        sending.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn buffered_frames_are_taken_while_there_is_room_and_left_for_later_otherwise() {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let mut reader = FrameReader::new(server);
        let memory = RequestMemory::new(250_000);
        let mut bytes = frame(&[1; 100_000]);
        bytes.extend(frame(&[2; 100_000]));
        bytes.extend(frame(&[3; 100_000]));
        bytes.extend(frame(&[4; 10]));
        client.write_all(&bytes).await.unwrap();
        let (first, first_room) = reader
            .next(1 << 20, &memory, TIMEOUTS, || false)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(first[4], 1);
        let mut second = None;
        while second.is_none() {
            reader.fill().await.unwrap();
            second = reader.next_buffered(1 << 20, &memory).unwrap();
        }
        let (second, _second_room) = second.unwrap();
        assert_eq!(second[4], 2);
        while reader.buffered().len() < 100_004 + 14 {
            reader.fill().await.unwrap();
        }
        assert!(
            reader.next_buffered(1 << 20, &memory).unwrap().is_none(),
            "a third frame fits no more"
        );
        drop(first_room);
        let (third, third_room) = reader.next_buffered(1 << 20, &memory).unwrap().unwrap();
        assert_eq!(third[4], 3);
        assert!(third_room.is_some());
        let (fourth, fourth_room) = reader.next_buffered(1 << 20, &memory).unwrap().unwrap();
        assert_eq!(&fourth[4..], &[4; 10]);
        assert!(fourth_room.is_none(), "a small frame takes no room");
    }

    #[tokio::test]
    async fn a_frame_over_the_limit_is_refused_unread_and_an_early_end_is_truncation() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut reader = FrameReader::new(server);
        let memory = RequestMemory::new(1 << 20);
        client.write_all(&frame(&[0; 10])).await.unwrap();
        match reader.next(5, &memory, TIMEOUTS, || false).await {
            Err(FrameError::TooLarge { size: 10, limit: 5 }) => {}
            other => panic!("expected a frame too large, got {other:?}"),
        }
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut reader = FrameReader::new(server);
        client.write_all(&frame(&[0; 10])[..8]).await.unwrap();
        drop(client);
        match reader.next(100, &memory, TIMEOUTS, || false).await {
            Err(FrameError::Truncated { buffered: 8 }) => {}
            other => panic!("expected a truncated frame, got {other:?}"),
        }
        assert_eq!(
            memory.held(),
            0,
            "the unfinished frame's room was given back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_frame_timeout_runs_from_the_grant_and_idleness_only_while_not_busy() {
        let timeouts = FrameTimeouts {
            idle: Duration::from_secs(10),
            frame: Duration::from_secs(1),
        };
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut reader = FrameReader::new(server);
        let memory = RequestMemory::new(150_000);
        let holder = memory.room(150_000).await;
        client
            .write_all(&frame(&[0; 100_000])[..50_000])
            .await
            .unwrap();
        let release = async {
            time::sleep(Duration::from_secs(5)).await;
            drop(holder);
        };
        let started = Instant::now();
        let (read, ()) = tokio::join!(reader.next(1 << 20, &memory, timeouts, || false), release);
        assert!(matches!(read, Err(FrameError::Slow)), "got {read:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(6),
            "timed out {waited:?} in, counting the wait for room"
        );
        let (_client, server) = tokio::io::duplex(64 * 1024);
        let mut reader = FrameReader::new(server);
        let busy = time::timeout(
            Duration::from_secs(30),
            reader.next(1000, &memory, timeouts, || true),
        )
        .await;
        assert!(busy.is_err(), "a busy connection was called idle");
        let idle = reader.next(1000, &memory, timeouts, || false).await;
        assert!(matches!(idle, Err(FrameError::Idle)), "got {idle:?}");
    }
}
