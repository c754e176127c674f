//! Decompressing a produced record batch as its records are read, within a budget: a batch of
//! a few megabytes of zeros would otherwise decompress to gigabytes in the server's memory.
//! The codecs are Kafka's: gzip, snappy (Kafka's Java framing, or a raw block), LZ4 frames and
//! zstd. No codec here allocates past the budget it is given: the streaming ones keep small
//! buffers of their own, and snappy checks each block's length before it decompresses it.

use std::io::{self, Cursor, Read};

use bytes::{Buf, Bytes};
use kafka_protocol::records::Compression;

/// The header of snappy data framed as Kafka's Java client frames it (xerial).
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";

/// The whole of the xerial header: magic, version and compatible version.
const XERIAL_HEADER_LEN: usize = 16;

/// The largest zstd window a batch may ask for, as a power of two: 8 MiB. A zstd frame names
/// the window its decoder must keep, up to 2 GiB; Kafka's producers compress batches of at
/// most a few megabytes, whose windows are no larger.
const ZSTD_WINDOW_LOG_MAX: u32 = 23;

/// A reader of `compressed` decompressed with `compression` (anything but
/// [`Compression::None`], which the caller reads in place), allocating at most `limit` bytes of
/// output at once (snappy's blocks; the other codecs stream).
///
/// # Errors
/// A codec that cannot start on the data (a bad frame header), or a snappy block longer than
/// `limit`.
pub(crate) fn inflating(
    compressed: Bytes,
    compression: Compression,
    limit: usize,
) -> io::Result<Box<dyn Read + Send>> {
    Ok(match compression {
        Compression::None => Box::new(compressed.reader()),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(compressed.reader())),
        Compression::Lz4 => Box::new(lz4::Decoder::new(compressed.reader())?),
        Compression::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::new(compressed.reader())?;
            decoder.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
            Box::new(decoder)
        }
        Compression::Snappy => Box::new(Snappy::new(compressed, limit)),
    })
}

/// Snappy in Kafka's framing (the xerial header, then blocks each preceded by its length), or
/// one raw block, decompressed a block at a time.
struct Snappy {
    /// The blocks not decompressed yet (after the header, for the framing).
    rest: Bytes,
    /// Whether `rest` is framed blocks rather than one raw block.
    framed: bool,
    /// The block being read.
    block: Cursor<Vec<u8>>,
    /// What the blocks may still decompress to.
    limit: usize,
    decoder: snap::raw::Decoder,
}

impl Snappy {
    fn new(input: Bytes, limit: usize) -> Self {
        let framed = input.starts_with(XERIAL_MAGIC);
        let rest = match framed {
            true => input.slice(XERIAL_HEADER_LEN.min(input.len())..),
            false => input,
        };
        Snappy {
            rest,
            framed,
            block: Cursor::new(Vec::new()),
            limit,
            decoder: snap::raw::Decoder::new(),
        }
    }

    /// Decompresses the next block into `block`; `false` when there is none.
    fn next_block(&mut self) -> io::Result<bool> {
        if self.rest.is_empty() {
            return Ok(false);
        }
        let compressed = match self.framed {
            false => self.rest.split_to(self.rest.len()),
            true => {
                let length = self
                    .rest
                    .first_chunk::<4>()
                    .map(|length| u32::from_be_bytes(*length) as usize)
                    .ok_or_else(|| invalid("a snappy block without its length"))?;
                if length
                    .checked_add(4)
                    .is_none_or(|whole| self.rest.len() < whole)
                {
                    return Err(invalid("a snappy block shorter than its length"));
                }
                self.rest.advance(4);
                self.rest.split_to(length)
            }
        };
        let length = snap::raw::decompress_len(&compressed).map_err(invalid)?;
        if length > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "a snappy block decompresses past the limit",
            ));
        }
        self.limit -= length;
        let mut block = vec![0; length];
        self.decoder
            .decompress(&compressed, &mut block)
            .map_err(invalid)?;
        self.block = Cursor::new(block);
        Ok(true)
    }
}

impl Read for Snappy {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let read = self.block.read(out)?;
            if read > 0 || out.is_empty() || !self.next_block()? {
                return Ok(read);
            }
        }
    }
}

fn invalid(why: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;

    use super::*;

    /// `data` compressed with `compression` as Kafka's producers compress a batch's records.
    fn compress(compression: Compression, data: &[u8]) -> Bytes {
        Bytes::from(match compression {
            Compression::None => data.to_vec(),
            Compression::Gzip => {
                let mut gzip =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gzip.write_all(data).unwrap();
                gzip.finish().unwrap()
            }
            Compression::Snappy => snap::raw::Encoder::new().compress_vec(data).unwrap(),
            Compression::Lz4 => {
                let mut lz4 = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
                lz4.write_all(data).unwrap();
                let (out, result) = lz4.finish();
                result.unwrap();
                out
            }
            Compression::Zstd => zstd::encode_all(data, 3).unwrap(),
        })
    }

    fn inflate(compressed: Bytes, compression: Compression, limit: usize) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        inflating(compressed, compression, limit)?.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Snappy framed as Kafka's Java client frames it, one block per chunk of `chunks`.
    fn xerial(chunks: &[&[u8]]) -> Bytes {
        let mut framed = Vec::from(&XERIAL_MAGIC[..]);
        framed.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 1]);
        for chunk in chunks {
            let block = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            framed.extend_from_slice(&(block.len() as u32).to_be_bytes());
            framed.extend_from_slice(&block);
        }
        Bytes::from(framed)
    }

    #[test]
    fn every_codec_streams_what_was_compressed() {
        let data: Vec<u8> = (0..100_000_u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for compression in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let compressed = compress(compression, &data);
            assert!(compressed.len() < data.len(), "{compression:?} compresses");
            assert_eq!(
                inflate(compressed, compression, data.len()).unwrap(),
                data,
                "{compression:?}"
            );
        }
        let framed = xerial(&[&data[..1000], &data[1000..]]);
        assert_eq!(inflate(framed, Compression::Snappy, 1 << 20).unwrap(), data);
    }

    #[test]
    fn a_snappy_block_past_the_limit_is_refused_before_it_is_decompressed() {
        let raw = compress(Compression::Snappy, &[7; 1000]);
        assert_eq!(
            inflate(raw.clone(), Compression::Snappy, 1000)
                .unwrap()
                .len(),
            1000
        );
        let refused = inflate(raw, Compression::Snappy, 999).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::OutOfMemory);
        // The limit holds across a frame's blocks: the second block is refused.
        let framed = xerial(&[&[1; 600], &[2; 600]]);
        let refused = inflate(framed, Compression::Snappy, 1000).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::OutOfMemory);
    }

    #[test]
    fn damaged_data_is_an_error() {
        let mut gzip = compress(Compression::Gzip, &[1; 100]).to_vec();
        gzip.truncate(gzip.len() / 2);
        assert!(inflate(Bytes::from(gzip), Compression::Gzip, 1000).is_err());
        let mut framed = xerial(&[]).to_vec();
        framed.extend_from_slice(&100u32.to_be_bytes());
        framed.extend_from_slice(&[1, 2]);
        let refused = inflate(Bytes::from(framed), Compression::Snappy, 1000).unwrap_err();
        assert!(
            refused.to_string().contains("shorter than its length"),
            "{refused}"
        );
        let mut cut = xerial(&[]).to_vec();
        cut.extend_from_slice(&[0, 0]);
        let refused = inflate(Bytes::from(cut), Compression::Snappy, 1000).unwrap_err();
        assert!(
            refused.to_string().contains("without its length"),
            "{refused}"
        );
    }

    #[test]
    fn a_zstd_frame_asking_for_a_larger_window_than_batches_need_is_refused() {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.window_log(ZSTD_WINDOW_LOG_MAX + 4).unwrap();
        encoder.write_all(&[5; 1000]).unwrap();
        let large_window = Bytes::from(encoder.finish().unwrap());
        assert!(inflate(large_window, Compression::Zstd, 1 << 20).is_err());
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.window_log(ZSTD_WINDOW_LOG_MAX).unwrap();
        encoder.write_all(&[5; 1000]).unwrap();
        let small_window = Bytes::from(encoder.finish().unwrap());
        assert_eq!(
            inflate(small_window, Compression::Zstd, 1 << 20).unwrap(),
            [5; 1000]
        );
    }
}
