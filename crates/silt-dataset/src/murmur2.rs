//! Kafka's default partitioner hash: murmur2 with Kafka's seed, exactly as
//! `org.apache.kafka.common.utils.Utils.murmur2`, so a key lands in the partition a Java
//! producer (or librdkafka with `partitioner=murmur2_random`) would choose for it.

/// Kafka's `Utils.murmur2` (a signed 32-bit result, as Java has it).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's default partitioner gives `key` among `partitions`
/// (`toPositive(murmur2(key)) % partitions`).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own values (`Utils.murmur2`).
    #[test]
    fn agrees_with_kafka() {
        for (s, want) in
            [("1", -1993445489), ("12", 126087238), ("123", -267702483), ("1234", -1614185708), ("12345", -1188365604)]
        {
            assert_eq!(murmur2(s.as_bytes()), want, "{s}");
        }
    }

    #[test]
    fn partitions_are_in_range_and_stable() {
        for n in 1..10 {
            let p = partition_for_key(b"factory/line1/temp", n);
            assert!(p < n);
            assert_eq!(p, partition_for_key(b"factory/line1/temp", n));
        }
    }
}
