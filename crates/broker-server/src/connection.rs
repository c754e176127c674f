//! Framing on one connection: a [`Connection`] reads frames from the stream's read half, and
//! [`write_responses`] owns the write half, encoding queued responses and writing each group of
//! them with one flush. Both are generic over the stream, so plain TCP and TLS share this code.

use std::io;
use std::net::SocketAddr;

use broker_net::{FrameError, FrameReader, FrameRoom, FrameTimeouts, RequestMemory};
use broker_proto::{Decoded, ErrorReply, ProtocolError, RequestFrame, ResponseFrame, ServerCodec};
use bytes::BytesMut;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{self, Duration};
use tokio_util::codec::{Decoder, Encoder};
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::counted::Counted;
use crate::reply::Outgoing;

/// Encoded responses are written out whenever this many bytes are waiting.
const WRITE_CHUNK: usize = 256 * 1024;

/// A request read, with its frame's room in the request memory (none for a small frame).
pub(crate) type RoomedRequest = (Decoded<RequestFrame>, Option<FrameRoom>);

/// The read side of a connection: the stream and the bytes read but not yet decoded.
#[derive(Debug)]
pub(crate) struct Connection<R> {
    reader: FrameReader<Counted<R>>,
}

impl<R: AsyncRead + Unpin> Connection<R> {
    /// A connection reading from `stream`, counting the bytes read in `received` when given.
    pub(crate) fn new(stream: R, received: Option<Counter>) -> Self {
        Connection {
            reader: FrameReader::new(Counted::receiving(stream, received)),
        }
    }

    /// Reads until one frame decodes. `Ok(None)` on a clean end of stream; an error on an end
    /// of stream inside a frame, on a frame over the limit and on I/O errors. For the hello,
    /// which is small and read before the connection shares the request memory.
    ///
    /// Cancel safe: everything read stays in the connection's buffer.
    pub(crate) async fn read_frame<D>(
        &mut self,
        codec: &mut D,
    ) -> Result<Option<D::Item>, ProtocolError>
    where
        D: Decoder<Error = ProtocolError>,
    {
        loop {
            if let Some(frame) = codec.decode(self.reader.buffered_mut())? {
                return Ok(Some(frame));
            }
            if self.reader.fill().await? == 0 {
                return codec.decode_eof(self.reader.buffered_mut());
            }
        }
    }

    /// Reads the next request frame with room for it in `memory`, the process's request
    /// memory (see [`FrameReader::next`]): the room goes with the request and is given back
    /// when the request is answered. Within two timeouts:
    ///
    /// - `idle`: the peer sends nothing while `busy()` is false (it has no request outstanding)
    ///   for this long;
    /// - `frame`: a frame whose first bytes have arrived is not complete within this long
    ///   after it got its room (a slowloris sending a byte now and then).
    ///
    /// Either is an [`io::ErrorKind::TimedOut`] error, after which the connection closes.
    /// `Ok(None)` on a clean end of stream. Cancel safe, as [`FrameReader::next`].
    pub(crate) async fn read_request(
        &mut self,
        codec: &mut ServerCodec,
        memory: &RequestMemory,
        idle: Duration,
        frame: Duration,
        busy: impl Fn() -> bool,
    ) -> Result<Option<RoomedRequest>, ProtocolError> {
        let timeouts = FrameTimeouts { idle, frame };
        let read = self.reader.next(codec.max_frame(), memory, timeouts, busy);
        match read.await.map_err(protocol_error)? {
            Some((frame, room)) => Ok(Some((decode_whole(codec, frame)?, room))),
            None => Ok(None),
        }
    }

    /// The next frame already whole in the buffer, without reading from the socket, if
    /// `memory` has room for it now (otherwise [`Connection::read_request`] waits for it).
    pub(crate) fn buffered_frame(
        &mut self,
        codec: &mut ServerCodec,
        memory: &RequestMemory,
    ) -> Result<Option<RoomedRequest>, ProtocolError> {
        let buffered = self.reader.next_buffered(codec.max_frame(), memory);
        match buffered.map_err(protocol_error)? {
            Some((frame, room)) => Ok(Some((decode_whole(codec, frame)?, room))),
            None => Ok(None),
        }
    }
}

/// The request in `frame`, a whole frame (length prefix and body).
fn decode_whole(
    codec: &mut ServerCodec,
    mut frame: BytesMut,
) -> Result<Decoded<RequestFrame>, ProtocolError> {
    let length = frame.len();
    codec
        .decode(&mut frame)?
        .ok_or(ProtocolError::TruncatedFrame { buffered: length })
}

/// What a failed read means for the broker's protocol.
fn protocol_error(error: FrameError) -> ProtocolError {
    match error {
        FrameError::Io(error) => ProtocolError::Io(error),
        FrameError::TooLarge { size, limit } => ProtocolError::FrameTooLarge { size, limit },
        FrameError::Truncated { buffered } => ProtocolError::TruncatedFrame { buffered },
        FrameError::Idle | FrameError::Slow => {
            ProtocolError::Io(io::Error::new(io::ErrorKind::TimedOut, error.to_string()))
        }
    }
}

/// Writes everything sent on `outgoing` to `stream`, in order, until every sender is gone, then
/// shuts the write half down. All answers queued at a time are encoded and written together and
/// then flushed once; the encoding buffer is written out whenever it passes [`WRITE_CHUNK`], so
/// it stays small however large the group. Deferred answers are awaited in their place (after
/// what is buffered before them is written). On a write error, or when the peer takes no bytes
/// for `write_timeout` (it does not read its responses), cancels `closing` so the rest of the
/// connection stops too. Counts the bytes written in `sent`, when given.
pub(crate) async fn write_responses<W: AsyncWrite + Unpin>(
    mut stream: W,
    mut outgoing: mpsc::Receiver<Outgoing>,
    mut codec: ServerCodec,
    closing: CancellationToken,
    peer: SocketAddr,
    write_timeout: Duration,
    sent: Option<Counter>,
) {
    let mut buffer = BytesMut::new();
    let mut written = Vec::new();
    while let Some(first) = outgoing.recv().await {
        let result = async {
            let mut next = Some(first);
            while let Some(item) = next.take() {
                let answers = match item {
                    Outgoing::Ready(answers) => answers,
                    Outgoing::Deferred(deferred) => {
                        // What came before goes out before the wait.
                        write_within(&mut stream, &buffer, write_timeout, sent.as_ref()).await?;
                        buffer.clear();
                        flush_within(&mut stream, write_timeout).await?;
                        written.clear();
                        deferred.await
                    }
                };
                for response in answers.responses {
                    encode_response(&mut codec, response, &mut buffer, peer);
                    if buffer.len() >= WRITE_CHUNK {
                        write_within(&mut stream, &buffer, write_timeout, sent.as_ref()).await?;
                        buffer.clear();
                    }
                }
                written.push(answers.permits);
                next = outgoing.try_recv().ok();
            }
            write_within(&mut stream, &buffer, write_timeout, sent.as_ref()).await?;
            buffer.clear();
            flush_within(&mut stream, write_timeout).await
        }
        .await;
        if let Err(cause) = result {
            error!(peer = %peer, cause = %cause, "writing responses failed; closing connection");
            closing.cancel();
            return;
        }
        // The requests are answered: their in-flight permits go back to the reader.
        written.clear();
        broker_net::release_if_grown(&mut buffer);
    }
    // The peer may already be gone; there is nothing left to tell it either way.
    let _ = time::timeout(write_timeout, stream.shutdown()).await;
}

/// Flushes `stream`; a `TimedOut` error when the peer takes nothing for `limit`.
async fn flush_within<W: AsyncWrite + Unpin>(stream: &mut W, limit: Duration) -> io::Result<()> {
    time::timeout(limit, stream.flush())
        .await
        .unwrap_or_else(|_| Err(write_timed_out()))
}

/// Writes all of `bytes`; a `TimedOut` error when the peer takes none of them for `limit`.
async fn write_within<W: AsyncWrite + Unpin>(
    stream: &mut W,
    mut bytes: &[u8],
    limit: Duration,
    sent: Option<&Counter>,
) -> io::Result<()> {
    while !bytes.is_empty() {
        let written = time::timeout(limit, stream.write(bytes))
            .await
            .unwrap_or_else(|_| Err(write_timed_out()))?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        if let Some(sent) = sent {
            sent.inc_by(written as u64);
        }
        bytes = &bytes[written..];
    }
    Ok(())
}

fn write_timed_out() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the peer took no response bytes within the write timeout",
    )
}

/// Encodes one response; one too large for a frame is replaced by an `ErrorReply::TooLarge`.
fn encode_response(
    codec: &mut ServerCodec,
    response: ResponseFrame,
    buffer: &mut BytesMut,
    peer: SocketAddr,
) {
    let correlation_id = response.correlation_id;
    let refusal = match codec.encode(response, buffer) {
        Ok(()) => return,
        Err(ProtocolError::FrameTooLarge { size, limit }) => ErrorReply::TooLarge {
            what: "response".into(),
            size,
            limit,
        },
        Err(cause) => {
            error!(peer = %peer, cause = %cause, correlation_id, "cannot encode a response");
            ErrorReply::InvalidArgument(format!("the response could not be encoded: {cause}"))
        }
    };
    let refusal = ResponseFrame {
        correlation_id,
        result: Err(refusal),
    };
    if let Err(cause) = codec.encode(refusal, buffer) {
        error!(peer = %peer, cause = %cause, correlation_id, "cannot encode a refusal");
    }
}
