//! Feeds arbitrary bytes to both MQTT decoder entry points. Besides "never panic", checks
//! that whatever decodes re-encodes and decodes back to the same packet, and that encoded_len
//! agrees with encode.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use silt_mqtt::{Packet, ProtocolVersion, decode, decode_connect};

const MAX: u32 = 1 << 20;

fn check_round_trip(packet: &Packet, version: ProtocolVersion) {
    let version = match packet {
        Packet::Connect(c) => c.protocol_version,
        _ => version,
    };
    let mut buf = BytesMut::new();
    packet.encode(version, &mut buf).expect("a decoded packet re-encodes");
    assert_eq!(packet.encoded_len(version), Ok(buf.len()));
    let again = match packet {
        Packet::Connect(_) => decode_connect(&mut buf, u32::MAX).map(|c| c.map(Packet::from)).map_err(|e| e.error),
        _ => decode(&mut buf, version, u32::MAX),
    };
    assert_eq!(again.as_ref(), Ok(&Some(packet.clone())));
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the version for `decode`; the whole input also goes to
    // `decode_connect`, as the first bytes of a connection would.
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let version = match selector % 3 {
        0 => ProtocolVersion::V3_1,
        1 => ProtocolVersion::V3_1_1,
        _ => ProtocolVersion::V5,
    };
    let mut buf = BytesMut::from(rest);
    while let Ok(Some(packet)) = decode(&mut buf, version, MAX) {
        check_round_trip(&packet, version);
    }
    let mut buf = BytesMut::from(data);
    if let Ok(Some(connect)) = decode_connect(&mut buf, MAX) {
        let version = connect.protocol_version;
        check_round_trip(&Packet::from(connect), version);
        while let Ok(Some(packet)) = decode(&mut buf, version, MAX) {
            check_round_trip(&packet, version);
        }
    }
});
