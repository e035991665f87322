//! Framing and the request/response envelope, on the `kafka-protocol` crate's generated
//! message codecs (Kafka's own JSON schemas; hand-writing 70 APIs would be a second source of
//! truth).
//!
//! A frame is a 4-byte big-endian length and that many bytes. Check-then-parse: the length is
//! checked against the limit before the body is awaited, so a peer cannot make the broker
//! buffer more than `max_frame_bytes`; "incomplete" (`Ok(None)`) is not an error.
//!
//! Version rules, as Kafka applies them:
//! - an ApiVersions request of a version this broker does not speak is still answered, with
//!   UNSUPPORTED_VERSION in an ApiVersions v0 response listing what it does speak (the client
//!   then retries with a version from the list);
//! - any other request of an unsupported version, or an unknown API key, is a protocol
//!   violation: the connection is closed;
//! - ApiVersions responses always use response header v0, whatever their version.
//!
//! Responses leave out tagged fields that hold their default value (the generated encoders
//! do): older clients (librdkafka 2.0) cannot parse an ApiVersions v3 response that carries
//! them.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::versions;

/// Bytes of the length prefix.
pub const LENGTH_PREFIX: usize = 4;

/// Why a frame or request cannot be served. All of them close the connection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds the limit of {max} (kafka.max_request_bytes)")]
    TooLarge { size: u64, max: usize },
    #[error("negative frame length {0}")]
    NegativeLength(i32),
    #[error("unknown API key {0}")]
    UnknownApiKey(i16),
    #[error("{key:?} version {version} is not supported (this broker speaks {min}..={max})")]
    UnsupportedVersion { key: ApiKey, version: i16, min: i16, max: i16 },
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

/// Takes the next whole frame (without its length prefix) off `buf`. `Ok(None)`: more bytes
/// are needed, and `buf` is untouched.
pub fn take_frame(buf: &mut BytesMut, max_frame_bytes: usize) -> Result<Option<Bytes>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX) else { return Ok(None) };
    let len = i32::from_be_bytes(prefix.try_into().expect("invariant: four bytes"));
    if len < 0 {
        return Err(FrameError::NegativeLength(len));
    }
    let len = len as usize;
    if len > max_frame_bytes {
        return Err(FrameError::TooLarge { size: len as u64, max: max_frame_bytes });
    }
    if buf.len() < LENGTH_PREFIX + len {
        return Ok(None);
    }
    buf.advance(LENGTH_PREFIX);
    Ok(Some(buf.split_to(len).freeze()))
}

/// A decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    pub body: Body,
}

/// A request's body: decoded, or an ApiVersions request of a version this broker does not
/// speak (answered with UNSUPPORTED_VERSION, see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Decoded(Box<RequestKind>),
    UnsupportedApiVersions,
}

impl Request {
    pub fn correlation_id(&self) -> i32 {
        self.header.correlation_id
    }

    /// The client id of the header, for logs.
    pub fn client_id(&self) -> &str {
        self.header.client_id.as_deref().unwrap_or("")
    }
}

/// Decodes a frame taken by [`take_frame`].
pub fn decode_request(mut frame: Bytes) -> Result<Request, FrameError> {
    if frame.len() < 4 {
        return Err(FrameError::Malformed { what: "request header", detail: "shorter than 4 bytes".into() });
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let key = ApiKey::try_from(raw_key).map_err(|()| FrameError::UnknownApiKey(raw_key))?;
    let supported = versions::supported(key);
    let header_version = key.request_header_version(version.clamp(key.valid_versions().min, key.valid_versions().max));
    let header = RequestHeader::decode(&mut frame, header_version)
        .map_err(|e| FrameError::Malformed { what: "request header", detail: e.to_string() })?;
    let body = match supported {
        Some((min, max)) if (min..=max).contains(&version) => Body::Decoded(Box::new(
            RequestKind::decode(key, &mut frame, version)
                .map_err(|e| FrameError::Malformed { what: "request body", detail: e.to_string() })?,
        )),
        _ if key == ApiKey::ApiVersions => Body::UnsupportedApiVersions,
        Some((min, max)) => return Err(FrameError::UnsupportedVersion { key, version, min, max }),
        None => return Err(FrameError::UnsupportedVersion { key, version, min: 0, max: -1 }),
    };
    Ok(Request { key, version, header, body })
}

/// Encodes the response to a request of `key` at `version` as a whole frame (length prefix
/// included).
pub fn encode_response(key: ApiKey, version: i16, correlation_id: i32, body: &ResponseKind) -> Result<Bytes, String> {
    // ApiVersions answers in header v0 whatever its version (the client cannot know yet).
    let header_version = if key == ApiKey::ApiVersions { 0 } else { key.response_header_version(version) };
    let mut out = BytesMut::with_capacity(64);
    out.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header.encode(&mut out, header_version).map_err(|e| e.to_string())?;
    body.encode(&mut out, version).map_err(|e| e.to_string())?;
    let len = i32::try_from(out.len() - LENGTH_PREFIX).map_err(|_| "response larger than 2 GiB".to_string())?;
    out[..LENGTH_PREFIX].copy_from_slice(&len.to_be_bytes());
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::{ApiVersionsRequest, MetadataRequest};
    use kafka_protocol::protocol::StrBytes;

    use super::*;

    /// A request frame as a client encodes it (length prefix included).
    pub fn client_frame(key: ApiKey, version: i16, correlation_id: i32, body: &RequestKind) -> BytesMut {
        let mut out = BytesMut::new();
        out.put_i32(0);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("test-client")));
        header.encode(&mut out, key.request_header_version(version)).unwrap();
        body.encode(&mut out, version).unwrap();
        let len = (out.len() - 4) as i32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        out
    }

    #[test]
    fn a_frame_is_taken_only_once_whole_and_its_size_is_checked_first() {
        let mut whole = client_frame(ApiKey::Metadata, 9, 7, &RequestKind::Metadata(MetadataRequest::default()));
        let mut part = BytesMut::from(&whole[..whole.len() - 1]);
        assert_eq!(take_frame(&mut part, 1 << 20), Ok(None));
        let frame = take_frame(&mut whole, 1 << 20).unwrap().unwrap();
        assert!(whole.is_empty());
        let req = decode_request(frame).unwrap();
        assert_eq!(
            (req.key, req.version, req.correlation_id(), req.client_id()),
            (ApiKey::Metadata, 9, 7, "test-client")
        );
        let mut huge = BytesMut::from(&[0x7f, 0xff, 0xff, 0xff][..]);
        assert!(matches!(take_frame(&mut huge, 1 << 20), Err(FrameError::TooLarge { .. })));
        let mut negative = BytesMut::from(&[0xff, 0xff, 0xff, 0xff][..]);
        assert_eq!(take_frame(&mut negative, 1 << 20), Err(FrameError::NegativeLength(-1)));
    }

    #[test]
    fn an_api_versions_request_of_an_unknown_version_is_still_answered() {
        let body = RequestKind::ApiVersions(ApiVersionsRequest::default());
        let mut f = client_frame(ApiKey::ApiVersions, 3, 1, &body);
        // Pretend a future version: the header layout (flexible, v2) stays that of v3+.
        f[6..8].copy_from_slice(&99i16.to_be_bytes());
        let req = decode_request(take_frame(&mut f, 1 << 20).unwrap().unwrap()).unwrap();
        assert_eq!(req.body, Body::UnsupportedApiVersions);
        assert_eq!(req.correlation_id(), 1);
    }

    #[test]
    fn other_unsupported_versions_and_unknown_keys_are_refused() {
        let mut f = client_frame(ApiKey::Metadata, 9, 1, &RequestKind::Metadata(MetadataRequest::default()));
        f[6..8].copy_from_slice(&99i16.to_be_bytes());
        let err = decode_request(take_frame(&mut f, 1 << 20).unwrap().unwrap()).unwrap_err();
        assert!(matches!(err, FrameError::UnsupportedVersion { key: ApiKey::Metadata, version: 99, .. }));
        let err = decode_request(Bytes::from_static(&[0x7f, 0x00, 0, 0, 0, 0, 0, 1])).unwrap_err();
        assert_eq!(err, FrameError::UnknownApiKey(0x7f00));
        assert!(matches!(decode_request(Bytes::from_static(&[0, 3, 0])), Err(FrameError::Malformed { .. })));
    }

    #[test]
    fn an_array_count_the_frame_cannot_hold_is_refused_without_allocating_for_it() {
        // Metadata v9 (flexible): header v2 with a null client id and no tagged fields, then a
        // topics array whose varint count claims 4,294,967,294 entries in a frame that holds
        // none. Decoded as counted, it asked for ~300 GB up front and aborted the process.
        let frame = Bytes::from_static(&[0, 3, 0, 9, 0, 0, 0, 1, 0xff, 0xff, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode_request(frame), Err(FrameError::Malformed { what: "request body", .. })));
        // The same with a non-flexible version (Metadata v1: header v1, an i32 count).
        let frame = Bytes::from_static(&[0, 3, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(decode_request(frame), Err(FrameError::Malformed { what: "request body", .. })));
    }

    #[test]
    fn api_versions_responses_use_header_v0_even_when_flexible() {
        let body = ResponseKind::ApiVersions(versions::api_versions(0));
        let bytes = encode_response(ApiKey::ApiVersions, 3, 42, &body).unwrap();
        let mut b = bytes.slice(4..);
        assert_eq!(b.get_i32(), 42, "correlation id, then the body at once: no tagged fields of header v1");
        assert_eq!(b.get_i16(), 0, "error code");
    }
}
