//! Deserialization of the fields that need more than their type's own: the `Bytes` fields of
//! commands, records and snapshots, and a delivered record's topic, with one allocation and one
//! copy per field; and a commit's offsets, whose partitions must strictly ascend.
//!
//! `Bytes`'s and `String`'s own `Deserialize` ask for an owned buffer, which bincode fills by
//! allocating a zeroed `Vec` and copying into it. Asking for borrowed bytes instead lets
//! a decoder that reads from a slice (every decoder here does) hand over the bytes in place, to
//! be copied once into their own allocation. Retained payloads are never views into a larger
//! frame, so a stored record keeps only its own bytes alive. The encoding is unchanged.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserializer, Error, MapAccess, SeqAccess, Visitor};

/// For `#[serde(deserialize_with = "...")]` on a `Bytes` field.
pub(crate) fn bytes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
    deserializer.deserialize_bytes(BytesVisitor)
}

/// For `#[serde(default, deserialize_with = "...")]` on an `Option<Bytes>` field (`default`
/// keeps a missing field `None`, as serde's own `Option` handling does).
pub(crate) fn optional_bytes<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Bytes>, D::Error> {
    deserializer.deserialize_option(OptionalBytesVisitor)
}

/// For `#[serde(deserialize_with = "...")]` on a `String` field decoded once per record.
pub(crate) fn string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    deserializer.deserialize_str(StringVisitor)
}

/// For `#[serde(default, deserialize_with = "...")]` on a commit's `Option<BTreeMap<i32, i64>>`:
/// the partitions must strictly ascend, as every map encoder writes them. Keys out of order or
/// repeated (which a map would silently resolve, the last value winning) make the value
/// malformed instead of ambiguous.
pub(crate) fn optional_ascending_offsets<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<i32, i64>>, D::Error> {
    deserializer.deserialize_option(OptionalOffsetsVisitor)
}

struct OptionalOffsetsVisitor;

impl<'de> Visitor<'de> for OptionalOffsetsVisitor {
    type Value = Option<BTreeMap<i32, i64>>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an optional map of partitions to offsets")
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(OffsetsVisitor).map(Some)
    }
}

struct OffsetsVisitor;

impl<'de> Visitor<'de> for OffsetsVisitor {
    type Value = BTreeMap<i32, i64>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a map of partitions to offsets, partitions strictly ascending")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut offsets = BTreeMap::new();
        let mut last = None;
        while let Some((partition, offset)) = map.next_entry::<i32, i64>()? {
            if last.is_some_and(|last| partition <= last) {
                return Err(A::Error::custom(format!(
                    "commit partitions must strictly ascend: {partition} follows {}",
                    last.unwrap_or_default()
                )));
            }
            last = Some(partition);
            offsets.insert(partition, offset);
        }
        Ok(offsets)
    }
}

struct StringVisitor;

impl Visitor<'_> for StringVisitor {
    type Value = String;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a string")
    }

    fn visit_str<E>(self, text: &str) -> Result<String, E> {
        Ok(text.to_owned())
    }

    fn visit_string<E>(self, text: String) -> Result<String, E> {
        Ok(text)
    }
}

struct BytesVisitor;

impl<'de> Visitor<'de> for BytesVisitor {
    type Value = Bytes;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a byte string")
    }

    fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes::copy_from_slice(bytes))
    }

    fn visit_byte_buf<E>(self, bytes: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes::from(bytes))
    }

    fn visit_str<E>(self, text: &str) -> Result<Bytes, E> {
        Ok(Bytes::copy_from_slice(text.as_bytes()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        Ok(Bytes::from(bytes))
    }
}

struct OptionalBytesVisitor;

impl<'de> Visitor<'de> for OptionalBytesVisitor {
    type Value = Option<Bytes>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an optional byte string")
    }

    fn visit_none<E>(self) -> Result<Option<Bytes>, E> {
        Ok(None)
    }

    fn visit_unit<E>(self) -> Result<Option<Bytes>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<Bytes>, D::Error> {
        bytes(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Fields {
        #[serde(deserialize_with = "string")]
        name: String,
        #[serde(deserialize_with = "bytes")]
        payload: Bytes,
        #[serde(default, deserialize_with = "optional_bytes")]
        key: Option<Bytes>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Commit {
        #[serde(default, deserialize_with = "optional_ascending_offsets")]
        offsets: Option<BTreeMap<i32, i64>>,
    }

    #[test]
    fn commit_partitions_must_strictly_ascend() {
        let config = bincode::config::standard()
            .with_little_endian()
            .with_fixed_int_encoding();
        let decode = |entries: &[(i32, i64)]| {
            let encoded = bincode::serde::encode_to_vec((1u8, entries), config).unwrap();
            bincode::serde::decode_from_slice::<Commit, _>(&encoded, config).map(|(c, _)| c)
        };
        let ascending = decode(&[(0, 5), (2, 1)]).unwrap();
        assert_eq!(ascending.offsets, Some(BTreeMap::from([(0, 5), (2, 1)])));
        assert_eq!(decode(&[]).unwrap().offsets, Some(BTreeMap::new()));
        for bad in [&[(2, 1), (0, 5)][..], &[(1, 1), (1, 2)][..]] {
            let error = decode(bad).unwrap_err().to_string();
            assert!(error.contains("strictly ascend"), "{error}");
        }
        let none = bincode::serde::encode_to_vec(0u8, config).unwrap();
        let (decoded, _): (Commit, usize) =
            bincode::serde::decode_from_slice(&none, config).unwrap();
        assert_eq!(decoded.offsets, None);
        // A map encodes exactly as (length, entries): what `decode` wrote above.
        let map = Commit {
            offsets: Some(BTreeMap::from([(0, 5), (2, 1)])),
        };
        let encoded = bincode::serde::encode_to_vec(&map, config).unwrap();
        let entries: &[(i32, i64)] = &[(0, 5), (2, 1)];
        assert_eq!(
            encoded,
            bincode::serde::encode_to_vec((1u8, entries), config).unwrap()
        );
        let json = serde_json::to_string(&map).unwrap();
        assert_eq!(serde_json::from_str::<Commit>(&json).unwrap(), map);
    }

    #[test]
    fn the_encoding_is_bytes_own_and_decodes_back() {
        let config = bincode::config::standard()
            .with_little_endian()
            .with_fixed_int_encoding();
        for key in [None, Some(Bytes::from_static(b"k")), Some(Bytes::new())] {
            let fields = Fields {
                name: "topic".to_owned(),
                payload: Bytes::from_static(b"payload"),
                key,
            };
            let encoded = bincode::serde::encode_to_vec(&fields, config).unwrap();
            let plain = (&fields.name, &fields.payload, &fields.key);
            let plain = bincode::serde::encode_to_vec(plain, config);
            assert_eq!(encoded, plain.unwrap());
            let (decoded, _): (Fields, usize) =
                bincode::serde::decode_from_slice(&encoded, config).unwrap();
            assert_eq!(decoded, fields);
            let owned: Fields =
                bincode::serde::decode_from_std_read(&mut encoded.as_slice(), config).unwrap();
            assert_eq!(owned, fields);
            let json = serde_json::to_string(&fields).unwrap();
            assert_eq!(serde_json::from_str::<Fields>(&json).unwrap(), fields);
        }
        let without_key: Fields = serde_json::from_str(r#"{"name":"t","payload":[1]}"#).unwrap();
        assert_eq!(without_key.key, None);
    }
}
