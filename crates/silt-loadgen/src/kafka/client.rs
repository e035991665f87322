//! A minimal Kafka client: one tokio `TcpStream`, two buffers, and the `kafka-protocol`
//! crate's generated codecs (the same ones the broker decodes with).
//!
//! Requests are pipelined: [`KafkaClient::send`] queues one and remembers its correlation id,
//! key and version; [`KafkaClient::recv`] takes the next response, which a Kafka broker sends
//! in request order on a connection, and checks that it is the one expected. Versions are
//! negotiated once per connection from ApiVersions: the highest both sides speak, capped at
//! [`CLIENT_MAX`] so that Silt and a reference broker are driven with the same requests
//! (Fetch 13+ and Produce 13+ address topics by id, which this client does not do).
//!
//! Not handled: SASL, TLS, metadata of other brokers (every request goes to the one address
//! given), retries. A response with an error code is reported, never retried.

use std::net::SocketAddr;

use anyhow::{Context, bail, ensure};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreateTopicsRequest, FetchRequest, FetchResponse,
    ListOffsetsRequest, MetadataRequest, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response frame accepted (a Fetch response is bounded by its `max_bytes`).
pub const MAX_FRAME: usize = 256 << 20;

/// The highest version this client sends of each API it uses.
pub const CLIENT_MAX: &[(ApiKey, i16)] = &[
    (ApiKey::Produce, 9),
    (ApiKey::Fetch, 12),
    (ApiKey::ListOffsets, 7),
    (ApiKey::Metadata, 12),
    (ApiKey::CreateTopics, 7),
];

/// `ListOffsets` timestamps that ask for the earliest and the latest offset.
pub const EARLIEST: i64 = -2;
pub const LATEST: i64 = -1;

/// The versions negotiated with one broker, per API this client uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Versions {
    pub produce: i16,
    pub fetch: i16,
    pub list_offsets: i16,
    pub metadata: i16,
    pub create_topics: i16,
}

impl Versions {
    /// The highest version of each API in both `CLIENT_MAX` (within what the codec knows) and
    /// the broker's ranges; an error names an API the two have no version of in common.
    pub fn negotiate(broker: &ApiVersionsResponse) -> anyhow::Result<Self> {
        let pick = |key: ApiKey| -> anyhow::Result<i16> {
            let ours = CLIENT_MAX.iter().find(|(k, _)| *k == key).map(|(_, v)| *v).unwrap_or(0);
            let known = key.valid_versions();
            let theirs = broker
                .api_keys
                .iter()
                .find(|a| a.api_key == key as i16)
                .with_context(|| format!("the broker does not serve {key:?}"))?;
            let v = ours.min(known.max).min(theirs.max_version);
            ensure!(
                v >= theirs.min_version && v >= known.min,
                "no common version of {key:?}: broker {}..={}, client {}..={ours}",
                theirs.min_version,
                theirs.max_version,
                known.min
            );
            Ok(v)
        };
        Ok(Self {
            produce: pick(ApiKey::Produce)?,
            fetch: pick(ApiKey::Fetch)?,
            list_offsets: pick(ApiKey::ListOffsets)?,
            metadata: pick(ApiKey::Metadata)?,
            create_topics: pick(ApiKey::CreateTopics)?,
        })
    }
}

/// A request sent whose response has not been read yet.
#[derive(Clone, Copy, Debug)]
struct Pending {
    correlation_id: i32,
    key: i16,
    version: i16,
}

pub struct KafkaClient {
    stream: TcpStream,
    inbuf: BytesMut,
    out: BytesMut,
    client_id: StrBytes,
    next_correlation: i32,
    pending: std::collections::VecDeque<Pending>,
    pub versions: Versions,
}

/// The error of a response's `error_code`, named.
pub fn check(code: i16, what: &str) -> anyhow::Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!("{what}: {e} (error code {code})"),
    }
}

pub fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

impl KafkaClient {
    /// Connects and negotiates versions with ApiVersions (v3, or v0 if the broker refuses it).
    pub async fn connect(addr: SocketAddr, client_id: &str) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr).await.with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true)?;
        let mut client = Self {
            stream,
            inbuf: BytesMut::with_capacity(64 * 1024),
            out: BytesMut::with_capacity(64 * 1024),
            client_id: StrBytes::from_string(client_id.to_owned()),
            next_correlation: 1,
            pending: Default::default(),
            versions: Versions::default(),
        };
        let hello = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("silt-loadgen"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let mut resp = client.call(&hello, 3).await?;
        if resp.error_code == ResponseError::UnsupportedVersion.code() {
            resp = client.call(&ApiVersionsRequest::default(), 0).await?;
        }
        check(resp.error_code, "ApiVersions")?;
        client.versions = Versions::negotiate(&resp)?;
        Ok(client)
    }

    /// Encodes `req` at `version` into the output buffer; [`KafkaClient::flush`] sends it.
    pub fn send<R: Request>(&mut self, req: &R, version: i16) -> anyhow::Result<()> {
        let key = ApiKey::try_from(R::KEY).map_err(|()| anyhow::anyhow!("unknown API key {}", R::KEY))?;
        let correlation_id = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let start = self.out.len();
        self.out.put_i32(0);
        RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(self.client_id.clone()))
            .encode(&mut self.out, key.request_header_version(version))
            .with_context(|| format!("encode {key:?} header"))?;
        req.encode(&mut self.out, version).with_context(|| format!("encode {key:?} v{version}"))?;
        let len = i32::try_from(self.out.len() - start - 4).context("request over 2 GiB")?;
        self.out[start..start + 4].copy_from_slice(&len.to_be_bytes());
        self.pending.push_back(Pending { correlation_id, key: R::KEY, version });
        Ok(())
    }

    pub async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Reads the response to the oldest request in flight, which must be an `R`.
    pub async fn recv<R: Request>(&mut self) -> anyhow::Result<R::Response> {
        let Some(&expected) = self.pending.front() else { bail!("no request in flight") };
        ensure!(expected.key == R::KEY, "next response is for API key {}, not {}", expected.key, R::KEY);
        let mut frame = self.frame().await?;
        self.pending.pop_front();
        let header = ResponseHeader::decode(&mut frame, R::Response::header_version(expected.version))
            .context("decode response header")?;
        ensure!(
            header.correlation_id == expected.correlation_id,
            "response correlation id {} where {} was expected",
            header.correlation_id,
            expected.correlation_id
        );
        R::Response::decode(&mut frame, expected.version)
            .with_context(|| format!("decode response to API key {} v{}", R::KEY, expected.version))
    }

    /// Sends `req` and waits for its response (nothing else may be in flight).
    pub async fn call<R: Request>(&mut self, req: &R, version: i16) -> anyhow::Result<R::Response> {
        ensure!(self.pending.is_empty(), "call with requests in flight");
        self.send(req, version)?;
        self.flush().await?;
        self.recv::<R>().await
    }

    /// The next whole frame, without its length prefix.
    async fn frame(&mut self) -> anyhow::Result<Bytes> {
        loop {
            if self.inbuf.len() >= 4 {
                let len = i32::from_be_bytes(self.inbuf[..4].try_into().expect("invariant: four bytes"));
                ensure!(len >= 0 && (len as usize) <= MAX_FRAME, "response frame length {len} out of bounds");
                let len = len as usize;
                if self.inbuf.len() >= 4 + len {
                    self.inbuf.advance(4);
                    return Ok(self.inbuf.split_to(len).freeze());
                }
                self.inbuf.reserve(4 + len - self.inbuf.len());
            } else {
                self.inbuf.reserve(64 * 1024);
            }
            if self.stream.read_buf(&mut self.inbuf).await? == 0 {
                bail!("connection closed by the broker");
            }
        }
    }

    /// Creates `topic` with `partitions` partitions; an existing topic is fine. Returns the
    /// partition count the broker reports.
    pub async fn ensure_topic(&mut self, topic: &str, partitions: i32) -> anyhow::Result<i32> {
        let req = CreateTopicsRequest::default().with_timeout_ms(30_000).with_topics(vec![
            CreatableTopic::default()
                .with_name(topic_name(topic))
                .with_num_partitions(partitions)
                .with_replication_factor(1),
        ]);
        let resp = self.call(&req, self.versions.create_topics).await?;
        for t in &resp.topics {
            if t.error_code != ResponseError::TopicAlreadyExists.code() {
                check(t.error_code, &format!("CreateTopics {topic}"))?;
            }
        }
        self.partitions(topic).await
    }

    /// The number of partitions of `topic`, from Metadata (no auto-creation).
    pub async fn partitions(&mut self, topic: &str) -> anyhow::Result<i32> {
        let req = MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(topic_name(topic)))]))
            .with_allow_auto_topic_creation(false);
        let resp = self.call(&req, self.versions.metadata).await?;
        let t = resp
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.as_str() == topic))
            .with_context(|| format!("Metadata has no topic {topic}"))?;
        check(t.error_code, &format!("Metadata {topic}"))?;
        ensure!(!t.partitions.is_empty(), "topic {topic} has no partitions");
        Ok(t.partitions.len() as i32)
    }

    /// The offset at `timestamp` ([`EARLIEST`], [`LATEST`] or a time in ms) of a partition.
    pub async fn list_offset(&mut self, topic: &str, partition: i32, timestamp: i64) -> anyhow::Result<i64> {
        let req = ListOffsetsRequest::default().with_replica_id((-1).into()).with_topics(vec![
            ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(vec![
                ListOffsetsPartition::default().with_partition_index(partition).with_timestamp(timestamp),
            ]),
        ]);
        let resp = self.call(&req, self.versions.list_offsets).await?;
        let p = resp
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .with_context(|| format!("ListOffsets has no {topic}-{partition}"))?;
        check(p.error_code, &format!("ListOffsets {topic}-{partition}"))?;
        Ok(p.offset)
    }
}

/// A Produce request of one partition's record batch(es).
pub fn produce_request(topic: &TopicName, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default().with_acks(acks).with_timeout_ms(30_000).with_topic_data(vec![
        TopicProduceData::default().with_name(topic.clone()).with_partition_data(vec![
            PartitionProduceData::default().with_index(partition).with_records(Some(records)),
        ]),
    ])
}

/// The base offset of the one partition a produce response answers, or its error.
pub fn produce_result(resp: &ProduceResponse) -> anyhow::Result<i64> {
    let p = resp
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter())
        .next()
        .context("Produce response without a partition")?;
    if let Some(e) = ResponseError::try_from_code(p.error_code) {
        let msg = p.error_message.as_ref().map(|m| m.as_str()).unwrap_or("");
        bail!("Produce: {e} (error code {}) {msg}", p.error_code);
    }
    Ok(p.base_offset)
}

/// How a consumer asks: the long poll and the byte limits of a Fetch.
#[derive(Clone, Copy, Debug)]
pub struct FetchLimits {
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    /// Whole response (Kafka's `fetch.max.bytes`).
    pub max_bytes: i32,
    /// Per partition (Kafka's `max.partition.fetch.bytes`).
    pub partition_max_bytes: i32,
}

impl Default for FetchLimits {
    /// The Java consumer's defaults.
    fn default() -> Self {
        Self { max_wait_ms: 500, min_bytes: 1, max_bytes: 50 << 20, partition_max_bytes: 1 << 20 }
    }
}

/// A Fetch of `positions` (partition, offset) of one topic.
pub fn fetch_request(topic: &TopicName, positions: &[(i32, i64)], limits: FetchLimits) -> FetchRequest {
    let partitions = positions
        .iter()
        .map(|&(partition, offset)| {
            FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(limits.partition_max_bytes)
        })
        .collect();
    FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(limits.max_wait_ms)
        .with_min_bytes(limits.min_bytes)
        .with_max_bytes(limits.max_bytes)
        .with_isolation_level(0)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default().with_topic(topic.clone()).with_partitions(partitions)])
}

/// What a Fetch response holds for one partition.
pub struct Fetched {
    pub partition: i32,
    pub records: Bytes,
}

/// Every partition of a Fetch response, or the first error in it.
pub fn fetch_result(resp: &FetchResponse) -> anyhow::Result<Vec<Fetched>> {
    check(resp.error_code, "Fetch")?;
    let mut out = Vec::new();
    for p in resp.responses.iter().flat_map(|t| t.partitions.iter()) {
        check(p.error_code, &format!("Fetch partition {}", p.partition_index))?;
        out.push(Fetched { partition: p.partition_index, records: p.records.clone().unwrap_or_default() });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::api_versions_response::ApiVersion;

    use super::*;

    fn broker(ranges: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
        ApiVersionsResponse::default().with_api_keys(
            ranges
                .iter()
                .map(|&(k, min, max)| {
                    ApiVersion::default().with_api_key(k as i16).with_min_version(min).with_max_version(max)
                })
                .collect(),
        )
    }

    #[test]
    fn versions_are_the_highest_both_sides_speak_capped_at_the_client_maximum() {
        let b = broker(&[
            (ApiKey::Produce, 3, 11),
            (ApiKey::Fetch, 4, 8),
            (ApiKey::ListOffsets, 0, 7),
            (ApiKey::Metadata, 0, 13),
            (ApiKey::CreateTopics, 2, 7),
        ]);
        let v = Versions::negotiate(&b).unwrap();
        assert_eq!(v, Versions { produce: 9, fetch: 8, list_offsets: 7, metadata: 12, create_topics: 7 });
    }

    #[test]
    fn a_broker_without_a_common_version_is_refused_by_name() {
        let b = broker(&[
            (ApiKey::Produce, 13, 13),
            (ApiKey::Fetch, 4, 12),
            (ApiKey::ListOffsets, 0, 7),
            (ApiKey::Metadata, 0, 12),
            (ApiKey::CreateTopics, 2, 7),
        ]);
        let e = Versions::negotiate(&b).unwrap_err().to_string();
        assert!(e.contains("Produce"), "{e}");
        let missing = broker(&[(ApiKey::Produce, 3, 9)]);
        assert!(Versions::negotiate(&missing).unwrap_err().to_string().contains("Fetch"));
    }
}
