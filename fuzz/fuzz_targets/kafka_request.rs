//! The Kafka request decoder (`silt_kafka::codec`): frames taken off a connection's bytes
//! (`take_frame`) and decoded, header and body, for every API and version the broker serves
//! (`decode_request`), on whatever a client sends before it has authenticated.
//!
//! Besides "never panic": a frame is never longer than the limit, decoding holds memory in
//! proportion to the frame (a count on the wire is not an allocation), and a decoded request
//! encodes (header and body, at its version) and decodes back to itself, unless it carries a
//! tagged field kafka-protocol cannot encode (see `check`).
#![no_main]

#[path = "common/alloc.rs"]
mod alloc;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use silt_kafka::codec::{Body, LENGTH_PREFIX, decode_request, take_frame};
use silt_kafka::kafka_protocol::protocol::Encodable;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

const MAX_FRAME: usize = 1 << 20;

/// Memory a decode may hold per byte of its frame, and beyond that: a decoded message is a
/// tree of structs and vectors, each element a few hundred bytes for a few bytes of wire.
const PER_BYTE: usize = 1024;
const SLACK: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // As a connection reads: frames off the stream, one after another.
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = take_frame(&mut buf, MAX_FRAME) {
        assert!(frame.len() <= MAX_FRAME);
        check(frame);
    }
    // And the whole input as one frame, without a length prefix to get right.
    if data.len() > LENGTH_PREFIX {
        check(Bytes::copy_from_slice(data));
    }
});

fn check(frame: Bytes) {
    let len = frame.len();
    let (decoded, peak) = alloc::peak(|| decode_request(frame));
    assert!(peak <= PER_BYTE * len + SLACK, "decoding a {len}-byte frame held {peak} bytes");
    let Ok(req) = decoded else { return };
    let Body::Decoded(body) = &req.body else { return };
    let mut out = BytesMut::new();
    req.header.encode(&mut out, req.key.request_header_version(req.version)).expect("a decoded request header encodes");
    body.encode(&mut out, req.version).expect("a decoded request body encodes");
    let again = decode_request(out.freeze());
    if again.as_ref().ok() != Some(&req) {
        // The one known way a request does not round-trip: kafka-protocol keeps a tag of 2^31
        // or more as a negative i32 key and leaves such keys out when it encodes (while counting
        // them). Harmless here: the broker never re-encodes a request.
        let unencodable_tag = format!("{req:?}").contains("unknown_tagged_fields: {-");
        assert!(unencodable_tag, "a request did not round-trip: {req:?} came back as {again:?}");
    }
}
