//! Fuzz target `frames`: arbitrary bytes through the wire codec.
//!
//! The first byte picks the message type (request, hello, response: what a server reads
//! before and after the handshake, and what a client reads) and the frame limit; the second
//! picks how the bytes are split into reads, as a socket would deliver them. Properties:
//!
//! - decoding never panics, and every frame is a message, a malformed body, or a fatal error
//!   that is `FrameTooLarge` (announcing more than the limit) or, at end of stream,
//!   `TruncatedFrame` (bytes of an unfinished frame left);
//! - after a fatal error nothing more is read (the connection closes);
//! - every decoded message encodes again, within the same limit, to a frame that decodes to an
//!   equal message;
//! - a server's codec (which decodes the `Producer`'s publishes directly) decodes every request
//!   stream exactly as the generic codec does, but for a publish of more than 10,000 records
//!   in all, which it refuses as malformed.

use std::fmt::Debug;

use broker_core::{Command, MAX_BATCH_RECORDS};
use broker_proto::{
    Codec, Decoded, Hello, HelloReply, ProtocolError, RequestFrame, ResponseFrame, ServerCodec,
    PROTOCOL_VERSION,
};
use bytes::BytesMut;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::codec::{Decoder, Encoder};

use crate::input::Input;

/// Frame limits the target picks from: small ones so that the fuzzer reaches the limit often.
const LIMITS: [usize; 4] = [16, 300, 4096, 1 << 20];

/// Decodes `data` as a stream of frames; panics if a property in the module documentation
/// fails.
pub fn decode_frames(data: &[u8]) {
    let mut input = Input::new(data);
    let selector = input.byte();
    let limit = LIMITS[usize::from(selector) % LIMITS.len()];
    // 0 delivers everything in one read; otherwise reads of 1 to 255 bytes.
    let chunk = usize::from(input.byte());
    let rest = input.rest();
    match (selector / 4) % 3 {
        0 => {
            decode_stream::<RequestFrame, ResponseFrame>(limit, chunk, rest);
            let generic = decoded_in_one_read(
                RefusingLargePublishes(Codec::<RequestFrame, ResponseFrame>::new(limit)),
                rest,
            );
            let server = decoded_in_one_read(ServerCodec::new(limit, PROTOCOL_VERSION), rest);
            assert_eq!(
                server, generic,
                "the server's codec decodes requests differently"
            );
        }
        1 => decode_stream::<Hello, HelloReply>(limit, chunk, rest),
        _ => decode_stream::<ResponseFrame, RequestFrame>(limit, chunk, rest),
    }
}

fn decode_stream<In, Out>(limit: usize, chunk: usize, data: &[u8])
where
    In: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let mut codec = Codec::<In, Out>::new(limit);
    let mut buffer = BytesMut::new();
    let chunk = if chunk == 0 { data.len().max(1) } else { chunk };
    for piece in data.chunks(chunk) {
        buffer.extend_from_slice(piece);
        loop {
            match codec.decode(&mut buffer) {
                Ok(Some(frame)) => check_frame(limit, frame),
                Ok(None) => break,
                Err(error) => return check_fatal(limit, &error, false),
            }
        }
    }
    loop {
        match codec.decode_eof(&mut buffer) {
            Ok(Some(frame)) => check_frame(limit, frame),
            Ok(None) => {
                assert!(buffer.is_empty(), "a clean end of stream left bytes behind");
                return;
            }
            Err(error) => return check_fatal(limit, &error, true),
        }
    }
}

/// Every frame `codec` decodes from `data` read at once, and how the stream ends, as text.
/// The generic codec as a server applies it: a publish of more than [`MAX_BATCH_RECORDS`]
/// records in all is malformed, as the server's codec refuses it.
struct RefusingLargePublishes(Codec<RequestFrame, ResponseFrame>);

impl Decoder for RefusingLargePublishes {
    type Item = Decoded<RequestFrame>;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        Ok(self.0.decode(src)?.map(refused_if_large))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        Ok(self.0.decode_eof(src)?.map(refused_if_large))
    }
}

fn refused_if_large(decoded: Decoded<RequestFrame>) -> Decoded<RequestFrame> {
    let Decoded::Message(frame) = decoded else {
        return decoded;
    };
    let records = match &frame.command {
        Command::PublishBatch { records, .. } | Command::PublishUntilFull { records, .. } => {
            records.len()
        }
        Command::PublishIdempotent { batches, .. } => {
            batches.iter().map(|batch| batch.records.len()).sum()
        }
        _ => 0,
    };
    if records <= MAX_BATCH_RECORDS {
        return Decoded::Message(frame);
    }
    Decoded::Malformed {
        leading_u64: Some(frame.correlation_id),
        reason: format!("a batch holds at most {MAX_BATCH_RECORDS} records, got {records}"),
    }
}

fn decoded_in_one_read<C>(mut codec: C, data: &[u8]) -> Vec<String>
where
    C: Decoder,
    C::Item: Debug,
    C::Error: Debug,
{
    let mut buffer = BytesMut::from(data);
    let mut decoded = Vec::new();
    loop {
        match codec.decode(&mut buffer) {
            Ok(Some(frame)) => decoded.push(format!("{frame:?}")),
            Ok(None) => break,
            Err(error) => {
                decoded.push(format!("{error:?}"));
                return decoded;
            }
        }
    }
    decoded.push(format!("{:?}", codec.decode_eof(&mut buffer)));
    decoded
}

fn check_fatal(limit: usize, error: &ProtocolError, at_eof: bool) {
    match error {
        ProtocolError::FrameTooLarge { size, limit: told } => {
            assert_eq!(*told, limit as u64, "the error names another limit");
            assert!(
                *size > *told,
                "a frame within the limit was refused: {error}"
            );
        }
        ProtocolError::TruncatedFrame { buffered } => {
            assert!(at_eof, "a truncated frame before the end of the stream");
            assert!(*buffered > 0, "a truncated frame of no bytes");
        }
        other => panic!("unexpected fatal decoding error: {other}"),
    }
}

fn check_frame<In>(limit: usize, frame: Decoded<In>)
where
    In: DeserializeOwned + Serialize + PartialEq + Debug,
{
    let Decoded::Message(message) = frame else {
        return;
    };
    let mut codec = Codec::<In, In>::new(limit);
    let mut encoded = BytesMut::new();
    if let Err(error) = Encoder::<&In>::encode(&mut codec, &message, &mut encoded) {
        panic!("a decoded message does not encode again: {error}: {message:?}");
    }
    match codec.decode(&mut encoded) {
        Ok(Some(Decoded::Message(again))) => {
            assert_eq!(
                again, message,
                "a message changed through encode and decode"
            );
        }
        other => panic!("a re-encoded message does not decode: {other:?}"),
    }
    assert!(encoded.is_empty(), "re-encoding wrote more than one frame");
}
