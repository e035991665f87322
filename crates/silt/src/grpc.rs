//! The gRPC admin API (`proto/silt/admin/v1/admin.proto`, package `silt.admin.v1`), served on
//! the admin listener beside its HTTP routes ([`crate::admin`]); `silt status`, `silt
//! sessions`, ... ([`crate::cli`]) are its client.
//!
//! Reads of the index (backlogs, partition bounds, offsets by time) run on the blocking pool;
//! no lock is held across them. Not guaranteed: a listing is a snapshot, and a session or group
//! may change between a List and the next call.

use std::sync::Arc;

use silt_broker::{Broker, DeleteRefused};
use silt_kafka::group::GroupState;
use silt_kafka::kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use silt_kafka::kafka_protocol::messages::{GroupId, OffsetCommitRequest, ResponseKind, TopicName};
use silt_kafka::kafka_protocol::protocol::StrBytes;
use silt_kafka_broker::Kafka;
use silt_storage::{QueueName, Storage};
use silt_types::{Offset, Partition, Timestamp};
use tonic::{Request, Response, Status};

use crate::admin::AdminState;
use crate::metrics::Sources;

/// The generated messages, server and client.
pub mod pb {
    tonic::include_proto!("silt.admin.v1");
}

use pb::admin_server::AdminServer;

/// The service's name, the first segment of its paths.
pub const SERVICE: &str = <AdminServer<Api> as tonic::server::NamedService>::NAME;

/// The service, for [`crate::admin`] to route to.
pub fn service(state: Arc<AdminState>) -> AdminServer<Api> {
    AdminServer::new(Api { state })
}

pub struct Api {
    state: Arc<AdminState>,
}

type Reply<T> = Result<Response<T>, Status>;

/// Runs `f` on the blocking pool (it reads the index).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, Status> + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f).await.map_err(|e| Status::internal(format!("admin task failed: {e}")))?
}

fn storage_error(e: silt_storage::Error) -> Status {
    match e {
        silt_storage::Error::Closed => Status::unavailable("the node is stopping"),
        e => Status::internal(e.to_string()),
    }
}

fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(value)
}

impl Api {
    fn sources(&self) -> Result<&Sources, Status> {
        self.state.metrics.get().ok_or_else(|| Status::unavailable("the node is recovering"))
    }

    fn broker(&self) -> Result<Arc<Broker>, Status> {
        self.sources()?.broker.upgrade().ok_or_else(|| Status::unavailable("the node is stopping"))
    }

    fn kafka(&self) -> Result<Arc<Kafka>, Status> {
        match &self.sources()?.kafka {
            Some(k) => k.upgrade().ok_or_else(|| Status::unavailable("the node is stopping")),
            None => Err(Status::failed_precondition("the Kafka listener is disabled (kafka.enabled = false)")),
        }
    }

    async fn sessions(&self, only: Option<String>) -> Result<Vec<pb::Session>, Status> {
        let broker = self.broker()?;
        let views = broker.session_views(only.as_deref()).await;
        let storage = self.sources()?.storage.clone();
        blocking(move || {
            Ok(views
                .into_iter()
                .map(|v| pb::Session {
                    backlog: v.backlog(&storage),
                    client_id: v.client_id,
                    online: v.online,
                    subscriptions: v.subscriptions,
                })
                .collect())
        })
        .await
    }

    async fn groups(&self, only: Option<String>) -> Result<Vec<pb::Group>, Status> {
        let kafka = self.kafka()?;
        blocking(move || {
            let mut groups: Vec<pb::Group> = kafka.groups.now(|coord, _| {
                let views: Vec<_> = match &only {
                    Some(id) => coord.group(id).into_iter().collect(),
                    None => coord.groups().collect(),
                };
                views
                    .into_iter()
                    .map(|g| {
                        let members = g
                            .members
                            .iter()
                            .map(|m| pb::Member {
                                member_id: m.member_id.to_owned(),
                                client_id: m.client_id.to_owned(),
                                client_host: m.client_host.to_owned(),
                                group_instance_id: m.group_instance_id.unwrap_or_default().to_owned(),
                            })
                            .collect();
                        pb::Group {
                            group: g.id.to_owned(),
                            state: g.state.name().to_owned(),
                            protocol_type: g.protocol_type.unwrap_or_default().to_owned(),
                            protocol: g.protocol.unwrap_or_default().to_owned(),
                            generation: g.generation,
                            members,
                            offsets: Vec::new(),
                        }
                    })
                    .collect()
            });
            groups.sort_by(|a, b| a.group.cmp(&b.group));
            // The lag as /metrics reports it (one computation for every view).
            for l in kafka.group_lags(usize::MAX).map_err(storage_error)? {
                if let Ok(i) = groups.binary_search_by(|g| g.group.as_str().cmp(&l.group)) {
                    let (topic, partition, committed, end, lag) = (l.topic, l.partition, l.committed, l.end, l.lag);
                    groups[i].offsets.push(pb::PartitionLag { topic, partition, committed, end, lag });
                }
            }
            Ok(groups)
        })
        .await
    }

    /// Each partition's offset at `at` (`None`: the end), for ListOffsets and the resets.
    async fn offsets(&self, topic: &str, at: At) -> Result<Vec<pb::PartitionOffset>, Status> {
        let broker = self.broker()?;
        let Some(meta) = broker.appender().streams().get(topic) else {
            return Err(Status::not_found(format!("no stream named {topic:?}")));
        };
        let storage = self.sources()?.storage.clone();
        let topic = topic.to_owned();
        blocking(move || {
            (0..meta.partitions)
                .map(|p| {
                    let offset = offset_at(&storage, &topic, p, at).map_err(storage_error)?;
                    Ok(pb::PartitionOffset {
                        topic: topic.clone(),
                        partition: i32::try_from(p).unwrap_or(i32::MAX),
                        offset,
                    })
                })
                .collect()
        })
        .await
    }
}

#[derive(Clone, Copy, Debug)]
enum At {
    Earliest,
    Latest,
    Time(i64),
}

/// A partition's offset at `at`; -1 for a time no record reaches (as Kafka's ListOffsets).
fn offset_at(storage: &Storage, stream: &str, partition: u32, at: At) -> silt_storage::Result<i64> {
    let name = QueueName::Partition { stream: stream.to_owned(), partition: Partition(partition) };
    let Some(id) = storage.queue_id(&name)? else {
        return Ok(if matches!(at, At::Time(_)) { -1 } else { 0 });
    };
    let (first, next) = storage.queue_bounds(id)?;
    let as_i64 = |o: Offset| i64::try_from(o.get()).unwrap_or(i64::MAX);
    Ok(match at {
        At::Earliest => as_i64(first),
        At::Latest => as_i64(next),
        At::Time(ms) => storage.offset_for_time(id, first, Timestamp(ms))?.map_or(-1, as_i64),
    })
}

fn at_of(earliest: bool, latest: bool, time: Option<i64>) -> Result<At, Status> {
    match (earliest, latest, time) {
        (true, false, None) => Ok(At::Earliest),
        (false, true, None) => Ok(At::Latest),
        (false, false, Some(ms)) if ms >= 0 => Ok(At::Time(ms)),
        (false, false, Some(ms)) => Err(Status::invalid_argument(format!("timestamp_ms must be >= 0, not {ms}"))),
        _ => Err(Status::invalid_argument("one of earliest, latest or timestamp_ms is required")),
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for Api {
    async fn status(&self, _: Request<pb::StatusRequest>) -> Reply<pb::StatusResponse> {
        let src = self.sources()?;
        let node = crate::status::node(src);
        let storage = src.storage.clone();
        // The storage figures include the index's size: a RocksDB property read.
        let stats = blocking(move || Ok(storage.stats())).await?;
        let sessions = src.broker.upgrade().map_or(0, |b| b.session_count() as u64);
        let listeners =
            self.state.listeners().into_iter().map(|(protocol, address)| pb::Listener { protocol, address }).collect();
        Ok(Response::new(pb::StatusResponse {
            node_id: node.id,
            epoch: node.epoch,
            version: node.version.to_owned(),
            uptime_secs: node.uptime_secs,
            object_store: node.object_store,
            listeners,
            sessions,
            log_segments: stats.segments as u64,
            log_end: stats.log_end.get(),
        }))
    }

    async fn list_streams(&self, _: Request<pb::ListStreamsRequest>) -> Reply<pb::ListStreamsResponse> {
        let broker = self.broker()?;
        let streams = crate::status::stream_infos(self.sources()?, &broker).into_iter().map(stream).collect();
        Ok(Response::new(pb::ListStreamsResponse { streams }))
    }

    async fn describe_stream(&self, r: Request<pb::DescribeStreamRequest>) -> Reply<pb::Stream> {
        let name = r.into_inner().name;
        required("name", &name)?;
        let broker = self.broker()?;
        crate::status::stream_infos(self.sources()?, &broker)
            .into_iter()
            .find(|s| s.name == name)
            .map(|s| Response::new(stream(s)))
            .ok_or_else(|| Status::not_found(format!("no stream named {name:?}")))
    }

    async fn list_sessions(&self, _: Request<pb::ListSessionsRequest>) -> Reply<pb::ListSessionsResponse> {
        Ok(Response::new(pb::ListSessionsResponse { sessions: self.sessions(None).await? }))
    }

    async fn describe_session(&self, r: Request<pb::DescribeSessionRequest>) -> Reply<pb::Session> {
        let id = r.into_inner().client_id;
        required("client_id", &id)?;
        self.sessions(Some(id.clone()))
            .await?
            .pop()
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("no session of client {id:?}")))
    }

    async fn disconnect_client(&self, r: Request<pb::DisconnectClientRequest>) -> Reply<pb::DisconnectClientResponse> {
        let id = r.into_inner().client_id;
        required("client_id", &id)?;
        match self.broker()?.disconnect_client(&id) {
            true => {
                tracing::info!(client_id = %id, "client disconnected by the admin API");
                Ok(Response::new(pb::DisconnectClientResponse {}))
            }
            false => Err(Status::not_found(format!("client {id:?} is not connected"))),
        }
    }

    async fn delete_session(&self, r: Request<pb::DeleteSessionRequest>) -> Reply<pb::DeleteSessionResponse> {
        let r = r.into_inner();
        required("client_id", &r.client_id)?;
        let id = r.client_id;
        match self.broker()?.delete_session(&id, r.force).await {
            Ok(disconnected) => {
                tracing::info!(client_id = %id, disconnected, "session deleted by the admin API");
                Ok(Response::new(pb::DeleteSessionResponse { disconnected }))
            }
            Err(DeleteRefused::NotFound) => Err(Status::not_found(format!("no session of client {id:?}"))),
            Err(DeleteRefused::Online) => Err(Status::failed_precondition(format!(
                "client {id:?} is connected: disconnect it first, or delete with force"
            ))),
            Err(DeleteRefused::StillOnline) => Err(Status::unavailable(format!(
                "client {id:?} was disconnected but its connection has not closed yet"
            ))),
        }
    }

    async fn list_groups(&self, _: Request<pb::ListGroupsRequest>) -> Reply<pb::ListGroupsResponse> {
        Ok(Response::new(pb::ListGroupsResponse { groups: self.groups(None).await? }))
    }

    async fn describe_group(&self, r: Request<pb::DescribeGroupRequest>) -> Reply<pb::Group> {
        let id = r.into_inner().group;
        required("group", &id)?;
        self.groups(Some(id.clone()))
            .await?
            .pop()
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("no consumer group {id:?}")))
    }

    async fn reset_group_offsets(
        &self,
        r: Request<pb::ResetGroupOffsetsRequest>,
    ) -> Reply<pb::ResetGroupOffsetsResponse> {
        use pb::reset_group_offsets_request::To;
        let r = r.into_inner();
        required("group", &r.group)?;
        required("topic", &r.topic)?;
        let at = match r.to {
            Some(To::Earliest(true)) => at_of(true, false, None)?,
            Some(To::Latest(true)) => at_of(false, true, None)?,
            Some(To::TimestampMs(ms)) => at_of(false, false, Some(ms))?,
            _ => at_of(false, false, None)?,
        };
        let kafka = self.kafka()?;
        // Kafka's tool refuses too: members would overwrite the offsets with their own commits.
        let busy = kafka.groups.now(|coord, _| {
            coord
                .group(&r.group)
                .filter(|g| !matches!(g.state, GroupState::Empty | GroupState::Dead))
                .map(|g| (g.state.name(), g.members.len()))
        });
        if let Some((state, members)) = busy {
            return Err(Status::failed_precondition(format!(
                "consumer group {:?} has {members} active member(s) (state {state}): stop its consumers first",
                r.group
            )));
        }
        let mut offsets = self.offsets(&r.topic, at).await?;
        // A time past the last record: the end, where new records will go (Kafka's tool does
        // the same).
        if offsets.iter().any(|o| o.offset < 0) {
            let ends = self.offsets(&r.topic, At::Latest).await?;
            for (o, end) in offsets.iter_mut().zip(ends) {
                if o.offset < 0 {
                    o.offset = end.offset;
                }
            }
        }
        let partitions = offsets
            .iter()
            .map(|o| {
                OffsetCommitRequestPartition::default()
                    .with_partition_index(o.partition)
                    .with_committed_offset(o.offset)
                    .with_committed_leader_epoch(-1)
            })
            .collect();
        let topic = OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_string(r.topic.clone())))
            .with_partitions(partitions);
        // As an admin client's OffsetCommit: generation -1, no member; the coordinator refuses
        // it if a member joined since the check, and answers once the records are durable.
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(r.group.clone())))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![topic]);
        let answer = kafka.groups.parked(|c, now, t| c.handle_offset_commit(now, t, 8, &request, |_, _| None)).await;
        let failed = match answer.as_deref() {
            Some(ResponseKind::OffsetCommit(resp)) => {
                resp.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).find(|&code| code != 0)
            }
            _ => return Err(Status::unavailable("the group coordinator dropped the commit")),
        };
        if let Some(code) = failed {
            let why = silt_kafka::kafka_protocol::ResponseError::try_from_code(code)
                .map_or_else(|| format!("error {code}"), |e| format!("{e:?}"));
            return Err(Status::failed_precondition(format!(
                "consumer group {:?} refused the new offsets: {why} (did a consumer join?)",
                r.group
            )));
        }
        tracing::info!(group = %r.group, topic = %r.topic, ?at, "group offsets reset by the admin API");
        Ok(Response::new(pb::ResetGroupOffsetsResponse { offsets }))
    }

    async fn list_offsets(&self, r: Request<pb::ListOffsetsRequest>) -> Reply<pb::ListOffsetsResponse> {
        use pb::list_offsets_request::At as PbAt;
        let r = r.into_inner();
        required("topic", &r.topic)?;
        let at = match r.at {
            Some(PbAt::Earliest(true)) => at_of(true, false, None)?,
            Some(PbAt::Latest(true)) => at_of(false, true, None)?,
            Some(PbAt::TimestampMs(ms)) => at_of(false, false, Some(ms))?,
            _ => at_of(false, false, None)?,
        };
        Ok(Response::new(pb::ListOffsetsResponse { offsets: self.offsets(&r.topic, at).await? }))
    }

    type ExportStream = crate::export::ExportStream;

    async fn export(&self, r: Request<pb::ExportRequest>) -> Reply<Self::ExportStream> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let plan = crate::export::Plan::new(r.get_ref(), Timestamp(now))?;
        let storage = self.sources()?.storage.clone();
        Ok(Response::new(crate::export::start(storage, plan)))
    }

    async fn roll_segment(&self, _: Request<pb::RollSegmentRequest>) -> Reply<pb::RollSegmentResponse> {
        let storage = self.sources()?.storage.clone();
        let sealed_end = storage.roll().await.map_err(storage_error)?;
        tracing::info!(%sealed_end, "active segment rolled by the admin API");
        let stats = blocking(move || Ok(storage.stats())).await?;
        Ok(Response::new(pb::RollSegmentResponse { sealed_end: sealed_end.get(), segments: stats.segments as u64 }))
    }
}

fn stream(s: crate::status::StreamInfo) -> pb::Stream {
    pb::Stream {
        name: s.name,
        partitions: s.partitions,
        created_ms: s.created_ms,
        tier: s.tier,
        ack: s.ack,
        retention_ms: s.retention_ms,
        retention_bytes: s.retention_bytes,
        lakehouse_table: s.lakehouse_table.unwrap_or_default(),
        local_bytes: s.local_bytes,
        bucket_bytes: s.bucket_bytes,
    }
}
