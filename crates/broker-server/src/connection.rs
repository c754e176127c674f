//! Framing on one connection: a [`Connection`] reads frames from the stream's read half, and
//! [`write_responses`] owns the write half, encoding queued responses and writing each group of
//! them with one flush. Both are generic over the stream, so plain TCP and TLS share this code.

use std::io;
use std::net::SocketAddr;

use broker_proto::{ErrorReply, ProtocolError, ResponseFrame, ServerCodec};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::codec::{Decoder, Encoder};
use tokio_util::sync::CancellationToken;
use tracing::error;

/// Bytes requested from the socket per read when the buffer is short of room.
const READ_CHUNK: usize = 64 * 1024;

/// Encoded responses are written out whenever this many bytes are waiting.
const WRITE_CHUNK: usize = 256 * 1024;

/// The read side of a connection: the stream and the bytes read but not yet decoded.
#[derive(Debug)]
pub(crate) struct Connection<R> {
    stream: R,
    buffer: BytesMut,
}

impl<R: AsyncRead + Unpin> Connection<R> {
    /// A connection reading from `stream`.
    pub(crate) fn new(stream: R) -> Self {
        Connection {
            stream,
            buffer: BytesMut::with_capacity(READ_CHUNK),
        }
    }

    /// Reads until one frame decodes. `Ok(None)` on a clean end of stream; an error on an end
    /// of stream inside a frame, on a frame over the limit and on I/O errors.
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
            if let Some(frame) = codec.decode(&mut self.buffer)? {
                return Ok(Some(frame));
            }
            if self.buffer.capacity() - self.buffer.len() < READ_CHUNK / 4 {
                self.buffer.reserve(READ_CHUNK);
            }
            let read = match self.stream.read_buf(&mut self.buffer).await {
                // A TLS peer that closes without a close_notify alert: the frames say where
                // messages end, so this is a clean end between frames and an error inside one.
                Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => 0,
                read => read?,
            };
            if read == 0 {
                return codec.decode_eof(&mut self.buffer);
            }
        }
    }

    /// The next frame already buffered, without reading from the socket.
    pub(crate) fn buffered_frame<D>(
        &mut self,
        codec: &mut D,
    ) -> Result<Option<D::Item>, ProtocolError>
    where
        D: Decoder<Error = ProtocolError>,
    {
        codec.decode(&mut self.buffer)
    }
}

/// Responses on their way to the peer, with the in-flight permits of the requests they answer:
/// the permits are released once the responses are written, so a peer that does not read
/// stops being read from.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The responses, in the order they are to be written.
    pub(crate) responses: Vec<ResponseFrame>,
    /// One permit per request answered here.
    pub(crate) permits: Vec<OwnedSemaphorePermit>,
}

/// Writes everything sent on `outgoing` to `stream` until every sender is gone, then shuts the
/// write half down. All responses queued at a time are encoded and written together and then
/// flushed once; the encoding buffer is written out whenever it passes [`WRITE_CHUNK`], so it
/// stays small however large the group. On a write error, cancels `closing` so the rest of the
/// connection stops too.
pub(crate) async fn write_responses<W: AsyncWrite + Unpin>(
    mut stream: W,
    mut outgoing: mpsc::Receiver<Outgoing>,
    mut codec: ServerCodec,
    closing: CancellationToken,
    peer: SocketAddr,
) {
    let mut buffer = BytesMut::new();
    let mut written = Vec::new();
    while let Some(first) = outgoing.recv().await {
        let result = async {
            let mut next = Some(first);
            while let Some(batch) = next.take() {
                for response in batch.responses {
                    encode_response(&mut codec, response, &mut buffer, peer);
                    if buffer.len() >= WRITE_CHUNK {
                        stream.write_all(&buffer).await?;
                        buffer.clear();
                    }
                }
                written.push(batch.permits);
                next = outgoing.try_recv().ok();
            }
            stream.write_all(&buffer).await?;
            buffer.clear();
            stream.flush().await
        }
        .await;
        if let Err(cause) = result {
            error!(peer = %peer, cause = %cause, "writing responses failed; closing connection");
            closing.cancel();
            return;
        }
        // The requests are answered: their in-flight permits go back to the reader.
        written.clear();
    }
    // The peer may already be gone; there is nothing left to tell it either way.
    let _ = stream.shutdown().await;
}

/// Encodes one response; one too large for a frame is replaced by an `ErrorReply::TooLarge`.
fn encode_response(
    codec: &mut ServerCodec,
    response: ResponseFrame,
    buffer: &mut BytesMut,
    peer: SocketAddr,
) {
    let correlation_id = response.correlation_id;
    let refusal = match codec.encode(&response, buffer) {
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
    if let Err(cause) = codec.encode(&refusal, buffer) {
        error!(peer = %peer, cause = %cause, correlation_id, "cannot encode a refusal");
    }
}
