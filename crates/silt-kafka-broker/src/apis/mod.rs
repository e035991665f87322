//! The requests a connection serves, one module per API family, and the one mapping from the
//! engine's errors to Kafka error codes.

mod fetch;
mod groups;
mod metadata;
mod offsets;
mod produce;
mod topics;
mod txn;

use silt_auth::{Access, Reach};
use silt_kafka::codec::{Body, Request};
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::{RequestKind, ResponseKind};
use silt_storage::ErrorKind;

use crate::node::Kafka;

/// What a request asks of the connection after its answer.
pub enum Outcome {
    /// Send this response.
    Respond(Box<ResponseKind>),
    /// Send nothing (a produce with acks = 0).
    Silent,
    /// The request cannot be served on this connection: close it, saying why.
    Close(String),
}

fn respond(body: ResponseKind) -> Outcome {
    Outcome::Respond(Box::new(body))
}

/// The ApiVersions answer, with `error_code` (0, or UNSUPPORTED_VERSION).
pub fn api_versions(error_code: i16) -> Outcome {
    respond(ResponseKind::ApiVersions(silt_kafka::versions::api_versions(error_code)))
}

/// Who sent a request.
pub struct Ctx {
    pub peer: std::net::SocketAddr,
    pub client_id: String,
    /// The authenticated user; `None`: anonymous.
    pub user: Option<String>,
    /// Whether it came by the TLS listener (Metadata names that listener's address).
    pub tls: bool,
}

impl Ctx {
    /// How much of `topic` this client may read or write (the MQTT topic rules of its user).
    pub fn reach(&self, kafka: &Kafka, access: Access, topic: &str) -> Reach {
        kafka.auth.reach(self.user.as_deref(), &self.client_id, access, topic)
    }

    /// May this client read or write the MQTT topic `mqtt_topic`?
    pub fn may(&self, kafka: &Kafka, access: Access, mqtt_topic: &str) -> bool {
        kafka.auth.allows_topic(self.user.as_deref(), &self.client_id, access, mqtt_topic)
    }

    /// May it see that `topic` exists (read or write some of it)?
    pub fn may_describe(&self, kafka: &Kafka, topic: &str) -> bool {
        self.reach(kafka, Access::Read, topic) != Reach::None || self.reach(kafka, Access::Write, topic) != Reach::None
    }

    pub fn may_use_group(&self, kafka: &Kafka, group: &str) -> bool {
        kafka.auth.allows_group(self.user.as_deref(), group)
    }

    pub fn may_use_transactional_id(&self, kafka: &Kafka, id: &str) -> bool {
        kafka.auth.allows_transactional_id(self.user.as_deref(), id)
    }
}

/// Serves one request.
pub async fn handle(kafka: &Kafka, ctx: &Ctx, req: Request) -> Outcome {
    let version = req.version;
    let body = match req.body {
        Body::UnsupportedApiVersions => return api_versions(ResponseError::UnsupportedVersion.code()),
        Body::Decoded(b) => *b,
    };
    match body {
        RequestKind::ApiVersions(_) => api_versions(0),
        RequestKind::Metadata(r) => respond(ResponseKind::Metadata(metadata::metadata(kafka, ctx, r).await)),
        RequestKind::Produce(r) => produce::produce(kafka, ctx, r).await,
        RequestKind::Fetch(r) => respond(ResponseKind::Fetch(fetch::fetch(kafka, ctx, r, version).await)),
        RequestKind::ListOffsets(r) => respond(ResponseKind::ListOffsets(offsets::list_offsets(kafka, ctx, r).await)),
        RequestKind::CreateTopics(r) => respond(ResponseKind::CreateTopics(topics::create(kafka, ctx, r).await)),
        RequestKind::DeleteTopics(r) => respond(ResponseKind::DeleteTopics(topics::delete(kafka, ctx, r).await)),
        RequestKind::DescribeConfigs(r) => {
            respond(ResponseKind::DescribeConfigs(topics::describe_configs(kafka, ctx, r)))
        }
        RequestKind::FindCoordinator(r) => {
            respond(ResponseKind::FindCoordinator(metadata::find_coordinator(kafka, ctx, r, version)))
        }
        body @ (RequestKind::JoinGroup(_)
        | RequestKind::SyncGroup(_)
        | RequestKind::Heartbeat(_)
        | RequestKind::LeaveGroup(_)
        | RequestKind::OffsetCommit(_)
        | RequestKind::OffsetFetch(_)
        | RequestKind::DescribeGroups(_)
        | RequestKind::ListGroups(_)
        | RequestKind::DeleteGroups(_)) => groups::handle(kafka, ctx, version, body).await,
        RequestKind::InitProducerId(r) => {
            respond(ResponseKind::InitProducerId(txn::init_producer_id(kafka, ctx, r, version).await))
        }
        RequestKind::AddPartitionsToTxn(r) => {
            respond(ResponseKind::AddPartitionsToTxn(txn::add_partitions(kafka, ctx, r, version).await))
        }
        RequestKind::AddOffsetsToTxn(r) => {
            respond(ResponseKind::AddOffsetsToTxn(txn::add_offsets(kafka, ctx, r).await))
        }
        RequestKind::TxnOffsetCommit(r) => {
            respond(ResponseKind::TxnOffsetCommit(txn::txn_offset_commit(kafka, ctx, r).await))
        }
        RequestKind::EndTxn(r) => respond(ResponseKind::EndTxn(txn::end_txn(kafka, ctx, r).await)),
        other => Outcome::Close(format!("{:?} is not served", std::mem::discriminant(&other))),
    }
}

/// The Kafka error code for an engine error.
pub fn storage_error(e: &silt_storage::Error) -> i16 {
    match e.kind() {
        ErrorKind::InvalidInput => ResponseError::InvalidRecord.code(),
        ErrorKind::Corrupt => ResponseError::CorruptMessage.code(),
        ErrorKind::Closed => match e {
            // Another node owns the bucket prefix: this one is no leader of anything.
            silt_storage::Error::Fenced => ResponseError::NotLeaderOrFollower.code(),
            _ => ResponseError::KafkaStorageError.code(),
        },
        ErrorKind::Expired => ResponseError::OffsetOutOfRange.code(),
        ErrorKind::Internal => ResponseError::KafkaStorageError.code(),
        // A good copy exists but is out of reach for now (the store is down): try again.
        ErrorKind::Retryable => ResponseError::RequestTimedOut.code(),
    }
}

/// The offset the record at `position` got in a partition, once indexed.
pub async fn offset_of(
    kafka: &Kafka,
    topic: &str,
    partition: u32,
    position: silt_types::LogPosition,
) -> Result<i64, i16> {
    let storage = kafka.storage().clone();
    storage.wait_dispatched(position.add(1)).await.map_err(|e| storage_error(&e))?;
    let name =
        silt_storage::QueueName::Partition { stream: topic.to_owned(), partition: silt_types::Partition(partition) };
    let found = tokio::task::spawn_blocking(move || {
        let id = storage.queue_id(&name)?.ok_or(silt_storage::Error::NotFound(position.get()))?;
        storage.offset_of(id, position)
    })
    .await;
    match found {
        Ok(Ok(Some(o))) => Ok(o.get() as i64),
        Ok(Ok(None)) => Err(ResponseError::KafkaStorageError.code()),
        Ok(Err(e)) => Err(storage_error(&e)),
        Err(_) => Err(ResponseError::UnknownServerError.code()),
    }
}

/// A partition's log start offset (0 before its first record; -1 if unknown).
pub async fn log_start(kafka: &Kafka, topic: &str, partition: u32) -> i64 {
    let storage = kafka.storage().clone();
    let name =
        silt_storage::QueueName::Partition { stream: topic.to_owned(), partition: silt_types::Partition(partition) };
    let found = tokio::task::spawn_blocking(move || match storage.queue_id(&name)? {
        Some(id) => storage.queue_bounds(id).map(|(s, _)| s.get() as i64),
        None => Ok(0),
    })
    .await;
    match found {
        Ok(Ok(start)) => start,
        _ => -1,
    }
}

/// A partition's end offset as indexed now (0 before its first record, and when unknown:
/// callers use it as a lower bound).
pub async fn log_end(kafka: &Kafka, topic: &str, partition: u32) -> i64 {
    let storage = kafka.storage().clone();
    let name =
        silt_storage::QueueName::Partition { stream: topic.to_owned(), partition: silt_types::Partition(partition) };
    let found = tokio::task::spawn_blocking(move || match storage.queue_id(&name)? {
        Some(id) => storage.queue_bounds(id).map(|(_, e)| e.get() as i64),
        None => Ok(0),
    })
    .await;
    match found {
        Ok(Ok(end)) => end,
        _ => 0,
    }
}

/// Applies a committed transaction's staged offsets to their groups (durably).
pub async fn apply_transaction_offsets(
    kafka: &Kafka,
    offsets: &[(String, silt_kafka::txn::StagedOffset)],
) -> Result<(), i16> {
    groups::apply_transaction_offsets(kafka, offsets).await
}
