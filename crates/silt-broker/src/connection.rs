//! One MQTT connection: the CONNECT handshake, then a loop that reads packets, pushes
//! deliveries within the flow-control window, acknowledges publishes once durable, and keeps
//! the session's cursors persisted.
//!
//! Inbound QoS 1/2 publishes are pipelined: each is handed to the log in arrival order and its
//! PUBACK/PUBREC goes out, in the same order, when the log reports it durable. Outbound
//! delivery is pull-based: a wake-up from the router (or an acknowledgement freeing the window)
//! makes the connection pull from its session's cursors; a subscriber that stops reading stops
//! the pulls, so its backlog stays in the log and not in memory.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use silt_mqtt::{
    AckProperties, ConnAck, Connect, Disconnect, InboundAliases, Outbound, OutboundAliases, Packet, PacketId,
    ProtocolVersion, PubRecOutcome, PubResponse, Publish, PublishProperties, QoS, ReasonCode, RetainHandling, SubAck,
    Subscribe, UnsubAck, Unsubscribe,
};
use silt_storage::Appended;
use silt_types::{Offset, Timestamp, TopicFilter, TopicName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::auth::{Access, AuthError};
use crate::broker::{Broker, ConnId, GroupRef, SessionRef};
use crate::message::Message;
use crate::session::{OutboundQos2, SharedMembership, SubscriptionState, parse_shared};

mod inbound;
mod outbound;

/// How long a client has to send CONNECT.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most messages pulled per wake-up before the loop services the socket again.
const PULL_BATCH: usize = 256;

type AckFuture = std::pin::Pin<Box<dyn std::future::Future<Output = silt_storage::Result<Appended>> + Send>>;

/// An inbound QoS 1/2 publish waiting for the log.
struct PendingIn {
    packet_id: PacketId,
    qos: QoS,
    ack: AckFuture,
}

/// An outbound QoS 1/2 message waiting for the client.
struct Inflight {
    settles: Vec<(String, Offset)>,
    /// The shared group the message came from (its cursor settles it), if any.
    group: Option<GroupRef>,
}

/// Why the main loop ended.
enum Close {
    /// DISCONNECT from the client; `will` says whether the will must still be sent (0x04).
    Client {
        will: bool,
    },
    /// The socket closed or failed, or keep alive expired: the will is sent.
    Lost,
    /// A protocol violation: DISCONNECT with this reason (5.0), then close; the will is sent.
    Violation(ReasonCode),
    TakenOver,
    Shutdown,
}

pub(crate) async fn run<S>(broker: Arc<Broker>, stream: S, peer: SocketAddr, shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    // Small to start: an idle connection should cost little; buffers grow with traffic.
    let mut inbuf = BytesMut::with_capacity(512);
    let mut rd = rd;
    let mut wr = wr;
    // The rarely-run steps are boxed so that the future every connection keeps alive stays
    // small: its size is that of its largest state.
    let connect = match Box::pin(read_connect(&broker, &mut rd, &mut wr, &mut inbuf)).await {
        Some(c) => c,
        None => return,
    };
    let mut conn = match Box::pin(Conn::accept(broker, rd, wr, inbuf, peer, *connect, shutdown)).await {
        Some(c) => c,
        None => return,
    };
    let close = conn.serve().await;
    Box::pin(conn.finish(close)).await;
}

/// Reads and decodes the CONNECT, answering malformed ones as the spec asks.
async fn read_connect<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    broker: &Broker,
    rd: &mut R,
    wr: &mut W,
    buf: &mut BytesMut,
) -> Option<Box<Connect>> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match silt_mqtt::decode_connect(buf, broker.config.max_packet_size) {
            Ok(Some(c)) => return Some(Box::new(c)),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "CONNECT refused");
                // Only a peer that named a version we speak gets a CONNACK; 3.x has no code for
                // a malformed CONNECT except an unsupported version.
                if let Some(v) = e.version {
                    let code = e.reason_code();
                    if v.is_v5() || code == ReasonCode::UnsupportedProtocolVersion {
                        let _ = write_packet(wr, v, &Packet::ConnAck(Box::new(ConnAck::refused(code)))).await;
                    }
                } else if e.reason_code() == ReasonCode::UnsupportedProtocolVersion {
                    let _ = write_packet(
                        wr,
                        ProtocolVersion::V3_1_1,
                        &Packet::ConnAck(Box::new(ConnAck::refused(ReasonCode::UnsupportedProtocolVersion))),
                    )
                    .await;
                }
                return None;
            }
        }
        match tokio::time::timeout_at(deadline, rd.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return None,
        }
    }
}

async fn write_packet<W: AsyncWrite + Unpin>(wr: &mut W, v: ProtocolVersion, p: &Packet) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    p.encode(v, &mut out).map_err(std::io::Error::other)?;
    wr.write_all(&out).await?;
    wr.flush().await
}

struct Conn<R, W> {
    broker: Arc<Broker>,
    rd: R,
    wr: W,
    inbuf: BytesMut,
    out: BytesMut,
    version: ProtocolVersion,
    peer: SocketAddr,
    client_id: String,
    session: SessionRef,
    conn_id: ConnId,
    wake: Arc<Notify>,
    kicked: Arc<Notify>,
    shutdown: watch::Receiver<bool>,
    keep_alive: Duration,
    last_packet: Instant,
    /// Inbound QoS 1/2 publishes awaiting durability, in arrival order.
    pending_in: VecDeque<PendingIn>,
    topic_aliases_in: InboundAliases,
    /// Outbound messages awaiting PUBACK / PUBREC / PUBCOMP, by packet id.
    inflight: Outbound<Inflight>,
    client_max_packet: u32,
    topic_aliases_out: OutboundAliases,
    /// Retained messages owed to new subscriptions (message, granted QoS, subscription id).
    retained_queue: VecDeque<(Message, QoS, Option<u32>)>,
    want_pull: bool,
    will: Option<(Message, u32)>,
    session_expiry: u32,
    username: Option<String>,
    /// QoS 2 deliveries queued but not yet persisted: written before the PUBLISH leaves.
    qos2_unpersisted: Vec<OutboundQos2>,
}

impl<R, W> Conn<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    async fn accept(
        broker: Arc<Broker>,
        rd: R,
        mut wr: W,
        inbuf: BytesMut,
        peer: SocketAddr,
        connect: Connect,
        shutdown: watch::Receiver<bool>,
    ) -> Option<Self> {
        let v = connect.protocol_version;
        let refuse = |code: ReasonCode| Packet::ConnAck(Box::new(ConnAck::refused(code)));
        let verdict = if broker.auth.verifies_password(connect.username.as_deref()) {
            let auth = broker.auth.clone();
            let (user, pass) = (connect.username.clone(), connect.password.clone());
            // argon2 is deliberately slow: keep it off the runtime's worker threads.
            tokio::task::spawn_blocking(move || auth.authenticate(user.as_deref(), pass.as_deref(), peer))
                .await
                .unwrap_or(Err(AuthError::NotAuthorized))
        } else {
            broker.auth.authenticate(connect.username.as_deref(), connect.password.as_deref(), peer)
        };
        if let Err(e) = verdict {
            tracing::info!(%peer, user = ?connect.username, reason = ?e, "connection refused");
            let code = match e {
                AuthError::BadCredentials => ReasonCode::BadUserNameOrPassword,
                AuthError::NotAuthorized => ReasonCode::NotAuthorized,
            };
            let _ = write_packet(&mut wr, v, &refuse(code)).await;
            return None;
        }
        let mut client_id = connect.client_id.clone();
        if client_id.starts_with("$share/") {
            // Reserved: shared-subscription groups are stored under these names.
            let _ = write_packet(&mut wr, v, &refuse(ReasonCode::ClientIdentifierNotValid)).await;
            return None;
        }
        let mut assigned = None;
        if client_id.is_empty() {
            if !v.is_v5() && !connect.clean_start {
                let _ = write_packet(&mut wr, v, &refuse(ReasonCode::ClientIdentifierNotValid)).await;
                return None;
            }
            client_id = format!("silt-{:016x}", rand_u64());
            assigned = Some(client_id.clone());
        }
        let session_expiry = if v.is_v5() {
            connect.properties.session_expiry_interval.unwrap_or(0).min(broker.config.max_session_expiry_secs)
        } else if connect.clean_start {
            0
        } else {
            u32::MAX
        };
        let will = connect.will.as_ref().and_then(|w| {
            TopicName::new(w.topic.clone()).ok()?;
            let m = Message {
                topic: w.topic.clone(),
                payload: w.payload.clone(),
                qos: w.qos.as_u8(),
                retain: w.retain,
                utf8_payload: w.properties.payload_format_indicator.unwrap_or(false),
                expiry: w.properties.message_expiry_interval,
                content_type: w.properties.content_type.clone(),
                response_topic: w.properties.response_topic.clone(),
                correlation_data: w.properties.correlation_data.clone(),
                user_properties: w.properties.user_properties.clone(),
                publisher: Some(client_id.clone()),
                timestamp: Timestamp(0),
            };
            Some((m, w.properties.will_delay_interval.unwrap_or(0)))
        });
        if connect.will.is_some() && will.is_none() {
            let code = if v.is_v5() { ReasonCode::TopicNameInvalid } else { ReasonCode::UnspecifiedError };
            let _ = write_packet(&mut wr, v, &refuse(code)).await;
            return None;
        }
        if let Some((w, _)) = &will
            && !broker.auth.allows_topic(connect.username.as_deref(), &client_id, Access::Write, &w.topic)
        {
            tracing::info!(%peer, client_id = %client_id, "will topic not authorized");
            let _ = write_packet(&mut wr, v, &refuse(ReasonCode::NotAuthorized)).await;
            return None;
        }
        broker.cancel_will(&client_id);
        let connected = broker.connect(&client_id, connect.clean_start, session_expiry).await;
        let cfg = broker.config.clone();
        let mut keep_alive = connect.keep_alive;
        let server_keep_alive = (cfg.server_keep_alive_secs > 0 && v.is_v5()).then_some(cfg.server_keep_alive_secs);
        if let Some(k) = server_keep_alive {
            keep_alive = k;
        }
        let mut ack = ConnAck::accepted(connected.session_present);
        if v.is_v5() {
            let p = &mut ack.properties;
            p.receive_maximum = Some(cfg.receive_maximum);
            p.maximum_packet_size = Some(cfg.max_packet_size);
            p.topic_alias_maximum = Some(cfg.topic_alias_maximum);
            p.assigned_client_identifier = assigned;
            p.server_keep_alive = server_keep_alive;
            p.retain_available = Some(true);
            p.wildcard_subscription_available = Some(true);
            p.subscription_identifiers_available = Some(true);
            p.shared_subscription_available = Some(true);
            if session_expiry != connect.properties.session_expiry_interval.unwrap_or(0) {
                p.session_expiry_interval = Some(session_expiry);
            }
        }
        if write_packet(&mut wr, v, &Packet::ConnAck(Box::new(ack))).await.is_err() {
            broker.disconnect(connected.conn, &connected.session).await;
            return None;
        }
        let window = connect.properties.receive_maximum.map_or(cfg.max_inflight, |r| r.min(cfg.max_inflight));
        let wake = Arc::new(Notify::new());
        {
            let s = connected.session.lock().await;
            broker.route_all(connected.conn, &wake, &s);
        }
        tracing::debug!(client_id = %client_id, %peer, version = %v, present = connected.session_present, "client connected");
        let mut conn = Conn {
            broker,
            rd,
            wr,
            inbuf,
            out: BytesMut::new(),
            version: v,
            peer,
            client_id,
            session: connected.session,
            conn_id: connected.conn,
            wake,
            kicked: connected.kicked,
            shutdown,
            keep_alive: Duration::from_secs(u64::from(keep_alive)),
            last_packet: Instant::now(),
            pending_in: VecDeque::new(),
            topic_aliases_in: InboundAliases::new(if v.is_v5() { cfg.topic_alias_maximum } else { 0 }),
            inflight: Outbound::new(window),
            client_max_packet: connect.properties.maximum_packet_size.unwrap_or(u32::MAX),
            topic_aliases_out: OutboundAliases::new(connect.properties.topic_alias_maximum.unwrap_or(0)),
            retained_queue: VecDeque::new(),
            want_pull: true,
            will,
            session_expiry,
            username: connect.username.clone(),
            qos2_unpersisted: Vec::new(),
        };
        conn.restore_qos2().await;
        Some(conn)
    }

    async fn serve(&mut self) -> Close {
        let commit_every = Duration::from_millis(self.broker.config.cursor_commit_ms);
        let mut commit = tokio::time::interval(commit_every);
        commit.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Packets that arrived with the CONNECT (one TCP segment, one WebSocket message) are
        // already buffered: handle them now, not when the next bytes happen to arrive.
        if let Err(close) = self.read_packets().await {
            return close;
        }
        loop {
            if let Err(close) = self.deliver().await {
                return close;
            }
            if !self.qos2_unpersisted.is_empty() {
                {
                    let mut s = self.session.lock().await;
                    for o in self.qos2_unpersisted.drain(..) {
                        s.outbound_qos2.insert(o.packet_id, o);
                    }
                }
                if let Err(e) = self.broker.persist(&self.session).await {
                    // Without the record, a restart could resend these as new messages.
                    tracing::warn!(client_id = %self.client_id, error = %e, "QoS 2 state not persisted");
                    return Close::Violation(ReasonCode::UnspecifiedError);
                }
            }
            if !self.out.is_empty() && self.flush().await.is_err() {
                return Close::Lost;
            }
            let keep_alive = self.keep_alive;
            let deadline =
                silt_mqtt::keep_alive_deadline(self.last_packet.into_std(), keep_alive).map(Instant::from_std);
            let has_pending = !self.pending_in.is_empty();
            // More to deliver right now (a full batch was pulled, or the window freed up): go
            // round again instead of waiting for a wake-up. A QoS 0 subscriber sends nothing
            // back, so nothing else would wake it.
            let more = self.want_pull && self.inflight.room() > 0;
            // Grow the read buffer only when a read filled it: an idle connection keeps 512
            // bytes, a busy one doubles towards its packet sizes.
            if self.inbuf.capacity() == self.inbuf.len() {
                self.inbuf.reserve(self.inbuf.len().max(512));
            }
            tokio::select! {
                biased;
                _ = self.shutdown.changed() => return Close::Shutdown,
                _ = self.kicked.notified() => return Close::TakenOver,
                ack = async { (&mut self.pending_in.front_mut().expect("invariant: guarded").ack).await }, if has_pending => {
                    let p = self.pending_in.pop_front().expect("invariant: guarded");
                    if let Err(close) = self.acknowledge_publish(p.packet_id, p.qos, ack).await {
                        return close;
                    }
                }
                read = self.rd.read_buf(&mut self.inbuf) => {
                    match read {
                        Ok(0) | Err(_) => return Close::Lost,
                        Ok(n) => {
                            self.broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                            self.last_packet = Instant::now();
                            if let Err(close) = self.read_packets().await {
                                return close;
                            }
                        }
                    }
                }
                _ = self.wake.notified() => self.want_pull = true,
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    tracing::debug!(client_id = %self.client_id, "keep alive expired");
                    return Close::Violation(ReasonCode::KeepAliveTimeout);
                }
                _ = commit.tick() => Box::pin(self.commit_cursors()).await,
                // Last, so that under continuous delivery the branches above still get their turn.
                _ = std::future::ready(()), if more => {}
            }
        }
    }

    /// Persists the session's and its shared groups' cursors if they moved.
    async fn commit_cursors(&mut self) {
        let (dirty, keys) = {
            let s = self.session.lock().await;
            (s.dirty, s.shared.keys().cloned().collect::<Vec<_>>())
        };
        if dirty && let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.client_id, error = %e, "cursor commit failed");
        }
        for key in keys {
            if let Some(g) = self.broker.group(&key)
                && g.lock().await.dirty
                && let Err(e) = self.broker.persist_group(&g).await
            {
                tracing::warn!(client_id = %self.client_id, error = %e, "shared cursor commit failed");
            }
        }
    }

    async fn read_packets(&mut self) -> Result<(), Close> {
        loop {
            let packet = match silt_mqtt::decode(&mut self.inbuf, self.version, self.broker.config.max_packet_size) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::debug!(client_id = %self.client_id, error = %e, "bad packet");
                    return Err(Close::Violation(e.reason_code()));
                }
            };
            self.handle(packet).await?;
        }
    }

    fn queue(&mut self, p: &Packet) {
        if let Err(e) = p.encode(self.version, &mut self.out) {
            tracing::warn!(client_id = %self.client_id, error = %e, "packet could not be encoded");
        }
    }

    async fn flush(&mut self) -> std::io::Result<()> {
        let n = self.out.len();
        self.wr.write_all(&self.out).await?;
        self.wr.flush().await?;
        self.out.clear();
        if self.out.capacity() > 256 * 1024 {
            self.out = BytesMut::new(); // give a burst's buffer back
        }
        self.broker.stats.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn finish(mut self, close: Close) {
        let (reason, send_will) = match close {
            Close::Client { will } => (None, will),
            Close::Lost => (None, true),
            Close::Violation(code) => (Some(code), true),
            Close::TakenOver => (Some(ReasonCode::SessionTakenOver), true),
            Close::Shutdown => (Some(ReasonCode::ServerShuttingDown), false),
        };
        // Publishes already handed to the log are acknowledged if they become durable.
        while let Some(p) = self.pending_in.pop_front() {
            let r = p.ack.await;
            let _ = self.acknowledge_publish(p.packet_id, p.qos, r).await;
        }
        // Shared-group messages this member never acknowledged go to another member.
        let pending: Vec<Inflight> = self.inflight.drain().collect();
        for f in pending {
            if let Some(group) = f.group {
                group.lock().await.subs.release(&f.settles);
            }
        }
        if let Some(code) = reason
            && self.version.is_v5()
        {
            self.queue(&Packet::Disconnect(Disconnect::new(code)));
        }
        let _ = self.flush().await;
        let _ = self.wr.shutdown().await;
        self.broker.disconnect(self.conn_id, &self.session).await;
        if send_will && let Some((mut will, delay)) = self.will.take() {
            will.timestamp = Timestamp::now();
            let delay = if self.session_expiry == 0 { 0 } else { delay.min(self.session_expiry) };
            self.broker.schedule_will(&self.client_id, will, Duration::from_secs(u64::from(delay)));
        }
        tracing::debug!(client_id = %self.client_id, peer = %self.peer, "client disconnected");
    }
}

/// MQTT 5 properties of an outgoing PUBLISH.
fn publish_properties(m: &Message, subscription_ids: Vec<u32>, now: Timestamp) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: m.utf8_payload.then_some(true),
        message_expiry_interval: m.remaining_expiry(now),
        topic_alias: None,
        response_topic: m.response_topic.clone(),
        correlation_data: m.correlation_data.clone(),
        user_properties: m.user_properties.clone(),
        subscription_identifiers: subscription_ids,
        content_type: m.content_type.clone(),
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Timestamp::now().get() as u64);
    h.finish()
}
