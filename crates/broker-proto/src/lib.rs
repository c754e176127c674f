//! The broker's wire protocol, in one place: a pure codec with no I/O and no async, shared by
//! `broker-server` and `broker-client`. `proto.md` at the repository root mirrors this module
//! byte for byte.
//!
//! # Frames
//!
//! Every message in either direction is one frame:
//!
//! ```text
//! +----------------------+------------------------------+
//! | length: u32, big-end | body: `length` bytes          |
//! +----------------------+------------------------------+
//! ```
//!
//! The body is a bincode 2.0.1 (serde) encoding with [`config()`]: little-endian, fixed-width
//! integers, enum variants as `u32`, lengths as `u64`, `Option` as a `u8` tag.
//!
//! # Conversation
//!
//! 1. The client sends a [`Hello`] naming the newest protocol version it speaks; the server
//!    answers a [`HelloReply`] welcoming it in that version (any of [`OLDEST_PROTOCOL_VERSION`]
//!    to [`PROTOCOL_VERSION`]). A refused hello (wrong magic, unsupported version) is answered
//!    and the connection closed.
//! 2. The client then sends [`RequestFrame`]s, as many as it likes before reading (pipelining);
//!    the server answers each with a [`ResponseFrame`] carrying the same correlation id.
//!    Responses to waiting requests may come back out of order.

mod codec;
mod error;
mod message;

pub use codec::{
    config, outcome_bytes, Codec, Decoded, ProtocolError, ServerCodec, WireConfig,
    MAX_FRAME_CEILING,
};
pub use error::{ErrorKind, ErrorReply};
pub use message::{
    v1, Hello, HelloReply, RequestFrame, RequestFrameRef, ResponseFrame, ServerLimits, MAGIC,
    MAX_HELLO_FRAME, OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// The codec a client uses after the handshake: it sends requests and reads responses, in the
/// newest version ([`PROTOCOL_VERSION`]).
pub type ClientCodec = Codec<ResponseFrame, RequestFrame>;
/// The codec a client uses for the handshake.
pub type ClientHandshakeCodec = Codec<HelloReply, Hello>;
/// The codec a server uses for the handshake.
pub type ServerHandshakeCodec = Codec<Hello, HelloReply>;
