//! Bounded decompression of produced batches. `kafka-protocol`'s own decompressors inflate
//! into memory without a limit (and its snappy path allocates whatever size a block's header
//! claims), so a small compressed batch could take gigabytes: here every codec stops at
//! `limit` bytes of output, and a batch that would inflate beyond it is refused.
//!
//! Codecs as Kafka writes them: gzip, snappy in snappy-java's framing (or raw, as the Java
//! client also accepts), LZ4 frames, zstd.

use std::io::Read;

use anyhow::{Context, bail};
use bytes::{Buf, Bytes};
use silt_kafka::kafka_protocol::records::Compression;

/// snappy-java's stream header, which Kafka clients write before snappy blocks.
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_LEN: usize = 16;

/// `data` inflated with `codec`, at most `limit` bytes.
pub fn decompress(data: &mut Bytes, codec: Compression, limit: usize) -> anyhow::Result<Bytes> {
    let input = data.split_to(data.len());
    match codec {
        Compression::None => Ok(input),
        Compression::Gzip => read_bounded(flate2::read::GzDecoder::new(input.reader()), limit),
        Compression::Zstd => read_bounded(zstd::stream::read::Decoder::new(input.reader())?, limit),
        Compression::Lz4 => read_bounded(lz4::Decoder::new(input.reader())?, limit),
        Compression::Snappy => snappy(input, limit),
    }
}

fn read_bounded(r: impl Read, limit: usize) -> anyhow::Result<Bytes> {
    let mut out = Vec::new();
    r.take(limit as u64 + 1).read_to_end(&mut out).context("corrupt compressed batch")?;
    if out.len() > limit {
        bail!("batch inflates beyond {limit} bytes");
    }
    Ok(Bytes::from(out))
}

fn snappy(mut input: Bytes, limit: usize) -> anyhow::Result<Bytes> {
    let block = |b: &[u8], out: &mut Vec<u8>| -> anyhow::Result<()> {
        let n = snap::raw::decompress_len(b).context("corrupt snappy block")?;
        if out.len() + n > limit {
            bail!("batch inflates beyond {limit} bytes");
        }
        let at = out.len();
        out.resize(at + n, 0);
        snap::raw::Decoder::new().decompress(b, &mut out[at..]).context("corrupt snappy block")?;
        Ok(())
    };
    let mut out = Vec::new();
    if input.len() < XERIAL_HEADER_LEN || &input[..8] != XERIAL_MAGIC {
        block(&input, &mut out)?;
        return Ok(Bytes::from(out));
    }
    input.advance(XERIAL_HEADER_LEN);
    while input.has_remaining() {
        if input.len() < 4 {
            bail!("truncated snappy block length");
        }
        let n = input.get_u32() as usize;
        if n > input.len() {
            bail!("truncated snappy block");
        }
        let b = input.split_to(n);
        block(&b, &mut out)?;
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn every_codec_inflates_and_none_beyond_the_limit() {
        let plain = vec![b'x'; 100_000];
        let gz = {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(&plain).unwrap();
            e.finish().unwrap()
        };
        let zs = zstd::encode_all(&plain[..], 3).unwrap();
        let lz = {
            let mut e = lz4::EncoderBuilder::new().build(Vec::new()).unwrap();
            e.write_all(&plain).unwrap();
            e.finish().0
        };
        let sn = {
            let block = snap::raw::Encoder::new().compress_vec(&plain).unwrap();
            let mut framed = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
            framed.extend_from_slice(&(block.len() as u32).to_be_bytes());
            framed.extend_from_slice(&block);
            framed
        };
        for (codec, data) in
            [(Compression::Gzip, gz), (Compression::Zstd, zs), (Compression::Lz4, lz), (Compression::Snappy, sn)]
        {
            let out = decompress(&mut Bytes::from(data.clone()), codec, 200_000).unwrap();
            assert_eq!(&out[..], &plain[..], "{codec:?}");
            let err = decompress(&mut Bytes::from(data), codec, 50_000).unwrap_err();
            assert!(err.to_string().contains("beyond"), "{codec:?}: {err}");
        }
    }

    #[test]
    fn a_snappy_header_claiming_gigabytes_allocates_nothing() {
        // A raw snappy block whose varint length says 4 GiB.
        let bomb = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]);
        assert!(decompress(&mut bomb.clone(), Compression::Snappy, 1 << 20).is_err());
    }
}
