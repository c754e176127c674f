//! Decompressing a produced record batch, with a limit on what it may inflate to: a batch of
//! a few megabytes of zeros would otherwise decompress to gigabytes in the server's memory.
//! The codecs are Kafka's: gzip, snappy (Kafka's Java framing, or a raw block), LZ4 frames and
//! zstd.

use std::io::Read;

use bytes::{Buf, Bytes};
use kafka_protocol::records::Compression;

/// The header of snappy data framed as Kafka's Java client frames it (xerial).
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";

/// The whole of the xerial header: magic, version and compatible version.
const XERIAL_HEADER_LEN: usize = 16;

/// `compressed` decompressed with `compression`, refused once it passes `limit` bytes.
///
/// # Errors
/// Data the codec cannot read, or that inflates past `limit`.
pub(crate) fn decompress(
    compressed: &mut Bytes,
    compression: Compression,
    limit: usize,
) -> anyhow::Result<Bytes> {
    let input = compressed.split_to(compressed.len());
    match compression {
        Compression::None => Ok(input),
        Compression::Gzip => read_capped(flate2::read::GzDecoder::new(input.reader()), limit),
        Compression::Lz4 => read_capped(lz4::Decoder::new(input.reader())?, limit),
        Compression::Zstd => read_capped(zstd::stream::read::Decoder::new(input.reader())?, limit),
        Compression::Snappy => snappy(&input, limit),
    }
}

/// Everything `reader` gives, refused once it passes `limit` bytes.
fn read_capped(reader: impl Read, limit: usize) -> anyhow::Result<Bytes> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(cap).read_to_end(&mut out)?;
    if out.len() > limit {
        anyhow::bail!("the batch decompresses to more than {limit} bytes");
    }
    Ok(Bytes::from(out))
}

/// Snappy in Kafka's framing (the xerial header, then blocks each preceded by its length), or
/// one raw block.
fn snappy(input: &[u8], limit: usize) -> anyhow::Result<Bytes> {
    let mut decoder = snap::raw::Decoder::new();
    let mut block = |compressed: &[u8], out: &mut Vec<u8>| -> anyhow::Result<()> {
        let length = snap::raw::decompress_len(compressed)?;
        if out.len().saturating_add(length) > limit {
            anyhow::bail!("the batch decompresses to more than {limit} bytes");
        }
        let start = out.len();
        out.resize(start + length, 0);
        decoder.decompress(compressed, &mut out[start..])?;
        Ok(())
    };
    let mut out = Vec::new();
    if !input.starts_with(XERIAL_MAGIC) {
        block(input, &mut out)?;
        return Ok(Bytes::from(out));
    }
    let mut rest = input.get(XERIAL_HEADER_LEN..).unwrap_or_default();
    while !rest.is_empty() {
        let (length, after) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| anyhow::anyhow!("a snappy block without its length"))?;
        let length = u32::from_be_bytes(*length) as usize;
        let compressed = after
            .get(..length)
            .ok_or_else(|| anyhow::anyhow!("a snappy block shorter than its length"))?;
        block(compressed, &mut out)?;
        rest = &after[length..];
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;

    use bytes::BytesMut;
    use kafka_protocol::records::{
        Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    use super::*;

    /// A batch of `count` records of `size` zero bytes each, compressed with `compression`.
    fn batch(compression: Compression, count: i64, size: usize) -> Bytes {
        let records: Vec<Record> = (0..count)
            .map(|offset| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: 0,
                producer_id: -1,
                producer_epoch: -1,
                timestamp_type: TimestampType::Creation,
                offset,
                // One batch: offset minus sequence the same for every record.
                sequence: offset as i32 - 1,
                timestamp: 0,
                key: None,
                value: Some(Bytes::from(vec![0; size])),
                headers: Default::default(),
            })
            .collect();
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
        buffer.freeze()
    }

    fn decode(mut bytes: Bytes, limit: usize) -> anyhow::Result<usize> {
        let set = RecordBatchDecoder::decode_with_custom_compression(
            &mut bytes,
            Some(|data: &mut Bytes, compression| decompress(data, compression, limit)),
        )?;
        Ok(set.records.len())
    }

    #[test]
    fn every_codec_decompresses_within_the_limit_and_is_refused_past_it() {
        for compression in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let compressed = batch(compression, 10, 10_000);
            assert!(
                compressed.len() < 10_000,
                "{compression:?} compresses zeros"
            );
            assert_eq!(
                decode(compressed.clone(), 1 << 20).unwrap(),
                10,
                "{compression:?}"
            );
            let refused = decode(compressed, 50_000).unwrap_err().to_string();
            assert!(
                refused.contains("more than 50000 bytes"),
                "{compression:?}: {refused}"
            );
        }
    }

    #[test]
    fn a_raw_snappy_block_and_damaged_data_are_handled() {
        let raw = snap::raw::Encoder::new().compress_vec(&[7; 1000]).unwrap();
        assert_eq!(snappy(&raw, 1000).unwrap().len(), 1000);
        assert!(snappy(&raw, 999).is_err());
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gzip.write_all(&[1; 100]).unwrap();
        let mut damaged = gzip.finish().unwrap();
        damaged.truncate(damaged.len() / 2);
        assert!(decompress(&mut Bytes::from(damaged), Compression::Gzip, 1000).is_err());
        let mut framed = Vec::from(&XERIAL_MAGIC[..]);
        framed.extend_from_slice(&[0; 8]);
        framed.extend_from_slice(&100u32.to_be_bytes());
        framed.extend_from_slice(&[1, 2]);
        assert!(
            snappy(&framed, 1000).is_err(),
            "a block shorter than its length"
        );
    }
}
