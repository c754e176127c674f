//! Key hashing for keyed publishes: Kafka's murmur2 and 32-bit FNV-1a.

use crate::KeyHash;

/// Kafka's murmur2 hash, bit for bit as `org.apache.kafka.common.utils.Utils.murmur2`, returned
/// as the signed 32-bit value Java computes.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java's `int` arithmetic wraps, and `>>>` is a logical shift: u32 does both.
    let mut h: u32 = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// 32-bit FNV-1a with offset basis `0x811c9dc5` and prime `0x01000193`.
pub fn fnv1a(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// The partition, in `0..partition_count`, that `key` goes to under `key_hash`.
///
/// `partition_count` must be positive; topics always have at least one partition.
pub fn partition_for(key_hash: KeyHash, key: &[u8], partition_count: usize) -> usize {
    let hash = match key_hash {
        // Kafka's `Utils.toPositive`: clear the sign bit rather than take the absolute value.
        KeyHash::Murmur2 => (murmur2(key) & 0x7fff_ffff) as u32,
        KeyHash::Fnv1a => fnv1a(key),
    };
    hash as usize % partition_count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's own `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_matches_kafkas_published_test_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, expected) in cases {
            assert_eq!(
                murmur2(key),
                expected,
                "murmur2({:?})",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn murmur2_partition_clears_the_sign_bit_like_kafkas_to_positive() {
        // murmur2("21") = -973932308; & 0x7fffffff = 1173551340.
        assert_eq!(
            partition_for(KeyHash::Murmur2, b"21", 2_147_483_647),
            1_173_551_340
        );
        assert_eq!(partition_for(KeyHash::Murmur2, b"21", 7), 1_173_551_340 % 7);
    }

    #[test]
    fn fnv1a_matches_reference_vectors() {
        assert_eq!(fnv1a(b""), 0x811c_9dc5);
        assert_eq!(fnv1a(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn every_key_maps_inside_the_partition_range() {
        for n in 1..=64 {
            for key in [&b""[..], b"k", b"key-1", b"\xff\xfe\xfd"] {
                assert!(partition_for(KeyHash::Murmur2, key, n) < n);
                assert!(partition_for(KeyHash::Fnv1a, key, n) < n);
            }
        }
    }
}
