//! Length-prefixed bincode frames: the one codec both ends use.

use std::io;
use std::marker::PhantomData;

use bincode::config::{Configuration, Fixint, Limit, LittleEndian};
use bytes::{Buf, BufMut, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::codec::{Decoder, Encoder};

use crate::{ErrorReply, RequestFrame, RequestFrameRef, ResponseFrame};
use broker_core::{GroupSetting, Outcome};

/// No frame may ever be larger than this (64 MiB), whatever a server is configured with. It is
/// also bincode's decode limit, so no length field inside a frame can make the decoder allocate
/// more than this.
pub const MAX_FRAME_CEILING: usize = 64 * 1024 * 1024;

/// The bincode configuration of every frame body.
pub type WireConfig = Configuration<LittleEndian, Fixint, Limit<MAX_FRAME_CEILING>>;

/// The bincode 2.0.1 configuration of every frame body: little-endian, fixed-width integers
/// (enum variant tags are `u32`, lengths `u64`), decoding limited to [`MAX_FRAME_CEILING`].
pub fn config() -> WireConfig {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
        .with_limit::<MAX_FRAME_CEILING>()
}

/// The bytes `outcome` takes in a response body (besides the correlation id and the result's
/// tag), as the current protocol version encodes it: for weighing an answer before it is
/// written. An outcome that cannot be encoded weighs [`MAX_FRAME_CEILING`] (its response is
/// refused when written).
pub fn outcome_bytes(outcome: &Outcome) -> u64 {
    let mut size = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(outcome, &mut size, config()) {
        Ok(()) => size.bytes_written as u64,
        Err(_) => MAX_FRAME_CEILING as u64,
    }
}

/// A failure that ends the connection: the byte stream can no longer be trusted or continued.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// Reading or writing the socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// A length prefix announced a frame larger than the limit.
    #[error("frame of {size} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge {
        /// The announced size.
        size: u64,
        /// The limit in force.
        limit: u64,
    },
    /// The peer closed the connection in the middle of a frame.
    #[error("connection closed in the middle of a frame ({buffered} bytes buffered)")]
    TruncatedFrame {
        /// Bytes of the unfinished frame that had arrived.
        buffered: usize,
    },
    /// A message could not be encoded (a bug, or a value too large for a frame).
    #[error("cannot encode message: {0}")]
    Encode(String),
}

/// One decoded frame: its message, or why its body could not be decoded. A body that does not
/// decode leaves the stream intact (the length prefix told where the frame ends), so the
/// connection can answer it and go on.
#[derive(Debug)]
pub enum Decoded<T> {
    /// The frame's body decoded as a `T`.
    Message(T),
    /// The body did not decode.
    Malformed {
        /// The first 8 bytes of the body read as a little-endian `u64`, when there are 8: for
        /// request frames, the correlation id to answer with.
        leading_u64: Option<u64>,
        /// Why decoding failed.
        reason: String,
    },
}

/// Frames with a 4-byte big-endian length prefix; decodes bodies as `In`, encodes `Out`.
#[derive(Debug)]
pub struct Codec<In, Out> {
    max_frame: usize,
    _messages: PhantomData<fn(Out) -> In>,
}

const LENGTH_PREFIX: usize = 4;

/// The protocol version that added [`ErrorReply::Pending`].
const PENDING_VERSION: u16 = 12;

impl<In, Out> Codec<In, Out> {
    /// A codec that refuses frames larger than `max_frame` bytes (capped at
    /// [`MAX_FRAME_CEILING`]).
    pub fn new(max_frame: usize) -> Self {
        Codec {
            max_frame: max_frame.min(MAX_FRAME_CEILING),
            _messages: PhantomData,
        }
    }

    /// The largest frame body this codec reads or writes.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// The same framing for other message types: for switching from handshake to requests
    /// without losing buffered bytes (see `Framed::map_codec`).
    pub fn retype<In2, Out2>(&self) -> Codec<In2, Out2> {
        Codec::new(self.max_frame)
    }
}

impl<In, Out> Codec<In, Out> {
    /// The body of the first frame in `src`, taken out of it, once all of it has arrived.
    fn split_frame(&self, src: &mut BytesMut) -> Result<Option<BytesMut>, ProtocolError> {
        let Some(prefix) = src.get(..LENGTH_PREFIX) else {
            return Ok(None);
        };
        let length = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if length > self.max_frame {
            return Err(ProtocolError::FrameTooLarge {
                size: length as u64,
                limit: self.max_frame as u64,
            });
        }
        if src.len() < LENGTH_PREFIX + length {
            src.reserve(LENGTH_PREFIX + length - src.len());
            return Ok(None);
        }
        src.advance(LENGTH_PREFIX);
        Ok(Some(src.split_to(length)))
    }
}

impl<In: DeserializeOwned, Out> Decoder for Codec<In, Out> {
    type Item = Decoded<In>;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        Ok(self.split_frame(src)?.map(|body| decode_body(&body)))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        let decoded = self.decode(buf)?;
        at_end_of_stream(decoded, buf)
    }
}

/// What decoding found once the peer closed: a frame, nothing (the stream ended between
/// frames), or the error of a frame cut short.
fn at_end_of_stream<T>(decoded: Option<T>, buf: &BytesMut) -> Result<Option<T>, ProtocolError> {
    match decoded {
        Some(frame) => Ok(Some(frame)),
        None if buf.is_empty() => Ok(None),
        None => Err(ProtocolError::TruncatedFrame {
            buffered: buf.len(),
        }),
    }
}

/// Decodes one frame body, which must be consumed exactly.
pub(crate) fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Decoded<T> {
    let leading_u64 = body
        .get(..8)
        .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]));
    match bincode::serde::decode_from_slice::<T, _>(body, config()) {
        Ok((message, used)) if used == body.len() => Decoded::Message(message),
        Ok((_, used)) => Decoded::Malformed {
            leading_u64,
            reason: format!("{} trailing bytes after the message", body.len() - used),
        },
        Err(error) => Decoded::Malformed {
            leading_u64,
            reason: error.to_string(),
        },
    }
}

impl<In, Out: Serialize> Encoder<Out> for Codec<In, Out> {
    type Error = ProtocolError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), Self::Error> {
        self.encode(&item, dst)
    }
}

impl<In, Out: Serialize> Encoder<&Out> for Codec<In, Out> {
    type Error = ProtocolError;

    fn encode(&mut self, item: &Out, dst: &mut BytesMut) -> Result<(), Self::Error> {
        self.encode_body(item, dst)
    }
}

/// A client encodes its requests from borrowed commands: the same bytes as the
/// [`RequestFrame`] they make.
impl Encoder<RequestFrameRef<'_>> for Codec<ResponseFrame, RequestFrame> {
    type Error = ProtocolError;

    fn encode(&mut self, item: RequestFrameRef<'_>, dst: &mut BytesMut) -> Result<(), Self::Error> {
        self.encode_body(&item, dst)
    }
}

impl<In, Out> Codec<In, Out> {
    /// Appends `item`'s frame to `dst`, or appends nothing and fails.
    /// An item larger than a frame stops being written once it passes the limit (an answer
    /// listing a large state is not copied whole into the buffer for nothing); its size is then
    /// counted without writing it.
    fn encode_body<T: Serialize>(&self, item: &T, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        let start = dst.len();
        dst.put_u32(0);
        let mut writer = WithinFrame {
            dst: &mut *dst,
            left: self.max_frame,
            past: false,
        };
        let written = bincode::serde::encode_into_std_write(item, &mut writer, config());
        let past = writer.past;
        let length = match written {
            Ok(length) => length,
            Err(_) if past => {
                dst.truncate(start);
                let mut size = bincode::enc::write::SizeWriter::default();
                let size = match bincode::serde::encode_into_writer(item, &mut size, config()) {
                    Ok(()) => size.bytes_written as u64,
                    Err(_) => MAX_FRAME_CEILING as u64,
                };
                return Err(ProtocolError::FrameTooLarge {
                    size,
                    limit: self.max_frame as u64,
                });
            }
            Err(error) => {
                dst.truncate(start);
                return Err(ProtocolError::Encode(error.to_string()));
            }
        };
        // `length <= max_frame <= MAX_FRAME_CEILING < u32::MAX`, so the cast is lossless.
        dst[start..start + LENGTH_PREFIX].copy_from_slice(&(length as u32).to_be_bytes());
        Ok(())
    }
}

/// A writer into a frame's buffer that refuses to grow it past `left` more bytes.
struct WithinFrame<'a> {
    dst: &'a mut BytesMut,
    left: usize,
    /// Whether a write was refused for the limit.
    past: bool,
}

impl io::Write for WithinFrame<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.len() > self.left {
            self.past = true;
            return Err(io::Error::other("past the frame limit"));
        }
        self.left -= buf.len();
        self.dst.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<T> Decoded<T> {
    /// The message turned into another type; a malformed frame stays malformed.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Decoded<U> {
        match self {
            Decoded::Message(message) => Decoded::Message(f(message)),
            Decoded::Malformed {
                leading_u64,
                reason,
            } => Decoded::Malformed {
                leading_u64,
                reason,
            },
        }
    }
}

/// The codec a server uses after the handshake, in the protocol version agreed there: it decodes
/// requests into the current shapes ([`RequestFrame`]) and encodes responses in the version's
/// own, so everything past the codec speaks one version.
#[derive(Debug)]
pub struct ServerCodec {
    framing: Codec<RequestFrame, ResponseFrame>,
    version: u16,
}

impl ServerCodec {
    /// A codec for protocol `version` (one the server welcomed) that refuses frames larger than
    /// `max_frame` bytes (capped at [`MAX_FRAME_CEILING`]).
    pub fn new(max_frame: usize, version: u16) -> Self {
        ServerCodec {
            framing: Codec::new(max_frame),
            version,
        }
    }

    /// The protocol version of the connection.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The largest frame body this codec reads or writes.
    pub fn max_frame(&self) -> usize {
        self.framing.max_frame()
    }

    /// The same codec (version and limit): one for the reading half, one for the writing half.
    pub fn twin(&self) -> ServerCodec {
        ServerCodec::new(self.max_frame(), self.version)
    }
}

impl ServerCodec {
    /// A request of the connection's version: version 1's shapes are converted to the
    /// current ones, and a command a later version added is malformed.
    fn of_version(&self, decoded: Option<Decoded<RequestFrame>>) -> Option<Decoded<RequestFrame>> {
        match decoded? {
            Decoded::Message(frame) if frame.command.since_version() > self.version => {
                Some(Decoded::Malformed {
                    leading_u64: Some(frame.correlation_id),
                    reason: format!(
                        "{} needs protocol version {}; this connection speaks version {}",
                        frame.command.kind().name(),
                        frame.command.since_version(),
                        self.version
                    ),
                })
            }
            decoded => Some(decoded),
        }
    }
}

impl Decoder for ServerCodec {
    type Item = Decoded<RequestFrame>;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        if self.version == 1 {
            let framing = self.framing.retype::<crate::v1::RequestFrame, ()>();
            return Ok(framing.split_frame(src)?.map(|body| {
                direct::v1_batch_over_limit(&body).unwrap_or_else(|| {
                    decode_body::<crate::v1::RequestFrame>(&body).map(RequestFrame::from)
                })
            }));
        }
        // Publishes take the direct decoder; everything else the generic one.
        let decoded = self
            .framing
            .split_frame(src)?
            .map(|body| direct::publish(&body).unwrap_or_else(|| decode_body(&body)));
        Ok(self.of_version(decoded))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        let decoded = self.decode(src)?;
        at_end_of_stream(decoded, src)
    }
}

impl Encoder<ResponseFrame> for ServerCodec {
    type Error = ProtocolError;

    fn encode(&mut self, mut item: ResponseFrame, dst: &mut BytesMut) -> Result<(), Self::Error> {
        // Error codes a later version added reach an earlier one as what it knows.
        if let Err(ErrorReply::Pending(text)) = &mut item.result {
            if self.version < PENDING_VERSION {
                item.result = Err(ErrorReply::InvalidArgument(std::mem::take(text)));
            }
        }
        if self.version == 1 {
            let mut framing = self.framing.retype::<(), crate::v1::ResponseFrame>();
            return framing.encode(crate::v1::ResponseFrame::from(item), dst);
        }
        // Settings a later version added are not part of this version's answers.
        match &mut item.result {
            Ok(Outcome::Description(description)) => {
                for group in description
                    .topics
                    .iter_mut()
                    .flat_map(|t| t.groups.iter_mut())
                {
                    GroupSetting::keep_those_of_version(&mut group.settings, self.version);
                }
            }
            Ok(Outcome::GroupSettings(settings)) => {
                GroupSetting::keep_those_of_version(settings, self.version);
            }
            _ => {}
        }
        self.framing.encode(item, dst)
    }
}

mod direct;

#[cfg(test)]
mod tests;
