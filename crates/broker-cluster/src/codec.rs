//! The byte encoding of everything the cluster writes to disk or sends to a peer: bincode
//! 2.0.1's serde encoding with fixed-width little-endian integers, the same layout as the
//! broker's wire protocol and data directory.

use bincode::config::{Config as AnyConfig, Configuration, Fixint, LittleEndian, NoLimit};
use bincode::error::{DecodeError, EncodeError};
use serde::de::DeserializeOwned;
use serde::Serialize;

type Config = Configuration<LittleEndian, Fixint, NoLimit>;

fn config() -> Config {
    bincode::config::standard()
        .with_little_endian()
        .with_fixed_int_encoding()
}

/// `value`'s bytes.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, EncodeError> {
    bincode::serde::encode_to_vec(value, config())
}

/// How many bytes `value` takes encoded, counted without writing them (0 for a value that
/// cannot be encoded, which [`encode`] then refuses).
pub(crate) fn encoded_len<T: Serialize>(value: &T) -> usize {
    let mut size = bincode::enc::write::SizeWriter::default();
    match bincode::serde::encode_into_writer(value, &mut size, config()) {
        Ok(()) => size.bytes_written,
        Err(_) => 0,
    }
}

/// The value `bytes` encode, which must be all of them: for what this node wrote itself (its
/// files, checked by their checksums), however large.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    decode_with(bytes, config())
}

/// [`decode`] for what a peer sent, whose lengths are not to be trusted: a length that claims
/// more than `LIMIT` bytes in all is refused instead of being allocated.
pub(crate) fn decode_at_most<T: DeserializeOwned, const LIMIT: usize>(
    bytes: &[u8],
) -> Result<T, DecodeError> {
    decode_with(bytes, config().with_limit::<LIMIT>())
}

/// The value at the start of `bytes`, and how many bytes it took: for a value followed by
/// another, in what this node wrote itself.
pub(crate) fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), DecodeError> {
    bincode::serde::decode_from_slice(bytes, config())
}

fn decode_with<T: DeserializeOwned, C: AnyConfig>(
    bytes: &[u8],
    config: C,
) -> Result<T, DecodeError> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, config)?;
    if read != bytes.len() {
        return Err(DecodeError::OtherString(format!(
            "{} bytes after the value",
            bytes.len() - read
        )));
    }
    Ok(value)
}
