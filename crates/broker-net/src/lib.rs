//! What the broker's server, client and command line share about reaching a broker, so that
//! each rule has one implementation: the forms an address takes ([`listen_address`],
//! [`connect_address`]), where the auth token comes from ([`auth_token`]), how a connection
//! sizes its buffers ([`make_room`], [`release_if_grown`]) and shares the process's request
//! memory ([`RequestMemory`]), how another protocol met where the
//! broker's or Kafka's was expected is recognised ([`Foreign`]), and how a connection that
//! reached its own port is refused ([`connect`], [`refuse_self_connection`]).

mod address;
mod buffer;
mod foreign;
mod frames;
mod memory;
mod self_connection;
mod token;

pub use address::{
    connect_address, connect_addresses, host_of, listen_address, AddressError, DEFAULT_PORT,
};
pub use buffer::{make_room, release_if_grown, KEEP_BUFFER_BYTES, READ_CHUNK};
pub use foreign::{looks_like_http, Foreign};
pub use frames::{FrameError, FrameReader, FrameTimeouts, SMALL_FRAME};
pub use memory::{declared_length, FrameRoom, RequestMemory, LENGTH_PREFIX, ROOM_UNIT};
pub use self_connection::{connect, refuse_self_connection};
pub use token::{auth_token, read_token_file, TokenError, AUTH_TOKEN_ENV};
