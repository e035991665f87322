//! One MQTT connection: the CONNECT handshake, then a loop that reads packets, pushes
//! deliveries within the flow-control window, acknowledges publishes once durable, and keeps
//! the session's cursors persisted.
//!
//! Inbound QoS 1/2 publishes are pipelined: each is handed to the log in arrival order and its
//! PUBACK/PUBREC goes out, in the same order, when the log reports it durable. Outbound
//! delivery is pull-based: a wake-up from the router (or an acknowledgement freeing the window)
//! makes the connection pull from its session's cursors; a subscriber that stops reading stops
//! the pulls, so its backlog stays in the log and not in memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use silt_mqtt::{
    AckProperties, ConnAck, Connect, Disconnect, Packet, PacketId, ProtocolVersion, PubResponse, Publish,
    PublishProperties, QoS, ReasonCode, RetainHandling, SubAck, Subscribe, UnsubAck, Unsubscribe,
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
    qos: QoS,
    /// PUBREC received and PUBREL sent (QoS 2).
    released: bool,
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
    let connect = match read_connect(&broker, &mut rd, &mut wr, &mut inbuf).await {
        Some(c) => c,
        None => return,
    };
    let mut conn = match Conn::accept(broker, rd, wr, inbuf, peer, *connect, shutdown).await {
        Some(c) => c,
        None => return,
    };
    let close = conn.serve().await;
    conn.finish(close).await;
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
    topic_aliases_in: HashMap<u16, String>,
    topic_alias_max_in: u16,
    /// Outbound messages awaiting PUBACK / PUBREC / PUBCOMP, by packet id.
    inflight: BTreeMap<u16, Inflight>,
    next_packet_id: u16,
    window: usize,
    client_max_packet: u32,
    topic_aliases_out: HashMap<String, u16>,
    topic_alias_max_out: u16,
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
            topic_aliases_in: HashMap::new(),
            topic_alias_max_in: if v.is_v5() { cfg.topic_alias_maximum } else { 0 },
            inflight: BTreeMap::new(),
            next_packet_id: 1,
            window: usize::from(window.max(1)),
            client_max_packet: connect.properties.maximum_packet_size.unwrap_or(u32::MAX),
            topic_aliases_out: HashMap::new(),
            topic_alias_max_out: connect.properties.topic_alias_maximum.unwrap_or(0),
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

    /// Resends the QoS 2 deliveries a previous connection (or broker) left incomplete, with
    /// their original packet ids, and holds their offsets so they are not sent again as new.
    async fn restore_qos2(&mut self) {
        let restored: Vec<OutboundQos2> = {
            let mut s = self.session.lock().await;
            let list: Vec<OutboundQos2> = s.outbound_qos2.values().cloned().collect();
            for o in &list {
                s.subs.hold(&o.settles(), o.entry());
            }
            list
        };
        for o in restored {
            let Ok(record) = self.broker.storage.read_record(&o.entry()) else {
                tracing::warn!(client_id = %self.client_id, packet_id = o.packet_id, "in-flight QoS 2 message unreadable");
                continue;
            };
            let Some(id) = PacketId::new(o.packet_id) else { continue };
            let m = Message::from_record(record);
            let mut p = Publish::new(m.topic.clone(), m.payload.clone());
            p.qos = QoS::ExactlyOnce;
            p.dup = true;
            p.packet_id = Some(id);
            if self.version.is_v5() {
                p.properties = publish_properties(&m, o.subscription_ids.clone(), Timestamp::now());
            }
            self.inflight.insert(
                o.packet_id,
                Inflight { qos: QoS::ExactlyOnce, released: false, settles: o.settles(), group: None },
            );
            self.queue(&Packet::Publish(p));
        }
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
            let deadline = self.last_packet + keep_alive + keep_alive / 2;
            let has_pending = !self.pending_in.is_empty();
            // More to deliver right now (a full batch was pulled, or the window freed up): go
            // round again instead of waiting for a wake-up. A QoS 0 subscriber sends nothing
            // back, so nothing else would wake it.
            let more = self.want_pull && self.inflight.len() < self.window;
            if self.inbuf.capacity() - self.inbuf.len() < 1024 {
                self.inbuf.reserve(4096);
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
                _ = tokio::time::sleep_until(deadline), if !keep_alive.is_zero() => {
                    tracing::debug!(client_id = %self.client_id, "keep alive expired");
                    return Close::Violation(ReasonCode::KeepAliveTimeout);
                }
                _ = commit.tick() => {
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
                // Last, so that under continuous delivery the branches above still get their turn.
                _ = std::future::ready(()), if more => {}
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

    async fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(p) => self.on_publish(p).await,
            Packet::PubAck(r) => {
                self.on_ack(r.packet_id, QoS::AtLeastOnce).await;
                Ok(())
            }
            Packet::PubRec(r) => {
                if r.reason_code.is_error() {
                    self.on_ack(r.packet_id, QoS::ExactlyOnce).await;
                } else if let Some(f) = self.inflight.get_mut(&r.packet_id.get()) {
                    f.released = true;
                    self.queue(&Packet::PubRel(PubResponse::new(r.packet_id)));
                } else {
                    let mut rel = PubResponse::new(r.packet_id);
                    rel.reason_code = ReasonCode::PacketIdentifierNotFound;
                    self.queue(&Packet::PubRel(rel));
                }
                Ok(())
            }
            Packet::PubComp(r) => {
                self.on_ack(r.packet_id, QoS::ExactlyOnce).await;
                Ok(())
            }
            Packet::PubRel(r) => {
                let known = self.session.lock().await.inbound_qos2.remove(&r.packet_id.get());
                let mut comp = PubResponse::new(r.packet_id);
                if !known {
                    comp.reason_code = ReasonCode::PacketIdentifierNotFound;
                }
                self.queue(&Packet::PubComp(comp));
                Ok(())
            }
            Packet::Subscribe(s) => self.on_subscribe(s).await,
            Packet::Unsubscribe(u) => {
                self.on_unsubscribe(u).await;
                Ok(())
            }
            Packet::PingReq => {
                self.queue(&Packet::PingResp);
                Ok(())
            }
            Packet::Disconnect(d) => {
                if self.version.is_v5()
                    && let Some(e) = d.properties.session_expiry_interval
                {
                    if self.session_expiry == 0 && e > 0 {
                        return Err(Close::Violation(ReasonCode::ProtocolError));
                    }
                    self.session_expiry = e.min(self.broker.config.max_session_expiry_secs);
                    self.session.lock().await.expiry_secs = self.session_expiry;
                }
                Err(Close::Client { will: d.reason_code == ReasonCode::DisconnectWithWillMessage })
            }
            Packet::Auth(_) => Err(Close::Violation(ReasonCode::BadAuthenticationMethod)),
            Packet::Connect(_) => Err(Close::Violation(ReasonCode::ProtocolError)),
            Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                Err(Close::Violation(ReasonCode::ProtocolError))
            }
        }
    }

    async fn on_publish(&mut self, p: Publish) -> Result<(), Close> {
        let topic = match (p.properties.topic_alias, p.topic.is_empty()) {
            (Some(0), _) => return Err(Close::Violation(ReasonCode::TopicAliasInvalid)),
            (Some(a), _) if a > self.topic_alias_max_in => return Err(Close::Violation(ReasonCode::TopicAliasInvalid)),
            (Some(a), true) => match self.topic_aliases_in.get(&a) {
                Some(t) => t.clone(),
                None => return Err(Close::Violation(ReasonCode::ProtocolError)),
            },
            (Some(a), false) => {
                self.topic_aliases_in.insert(a, p.topic.clone());
                p.topic.clone()
            }
            (None, true) => return Err(Close::Violation(ReasonCode::ProtocolError)),
            (None, false) => p.topic.clone(),
        };
        if TopicName::new(topic.clone()).is_err() {
            return Err(Close::Violation(ReasonCode::TopicNameInvalid));
        }
        if p.qos != QoS::AtMostOnce {
            let waiting = self.pending_in.len() + self.session.lock().await.inbound_qos2.len();
            if waiting >= usize::from(self.broker.config.receive_maximum) {
                return Err(Close::Violation(ReasonCode::ReceiveMaximumExceeded));
            }
        }
        let packet_id = p.packet_id;
        if p.qos == QoS::ExactlyOnce
            && let Some(id) = packet_id
            && self.session.lock().await.inbound_qos2.contains(&id.get())
        {
            // A resend of a QoS 2 message already stored: acknowledge, never store twice.
            self.queue(&Packet::PubRec(PubResponse::new(id)));
            return Ok(());
        }
        let denied = topic.starts_with("$SYS") // the broker's statistics are its own
            || !self.broker.auth.allows_topic(self.username.as_deref(), &self.client_id, Access::Write, &topic);
        if denied {
            tracing::debug!(client_id = %self.client_id, topic = %topic, "publish not authorized");
            // MQTT 3.1.1 cannot say no: the message is acknowledged and dropped, as mosquitto does.
            if let Some(id) = packet_id {
                let mut r = PubResponse::new(id);
                r.reason_code = ReasonCode::NotAuthorized;
                let ack = if p.qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) };
                self.queue(&ack);
            }
            return Ok(());
        }
        let message = Message {
            topic,
            payload: p.payload,
            qos: p.qos.as_u8(),
            retain: p.retain,
            utf8_payload: p.properties.payload_format_indicator.unwrap_or(false),
            expiry: p.properties.message_expiry_interval,
            content_type: p.properties.content_type,
            response_topic: p.properties.response_topic,
            correlation_data: p.properties.correlation_data,
            user_properties: p.properties.user_properties,
            publisher: Some(self.client_id.clone()),
            timestamp: Timestamp::now(),
        };
        let ack = match self.broker.submit(&message).await {
            Ok(ack) => ack,
            Err(e) => {
                tracing::warn!(client_id = %self.client_id, error = %e, "publish could not be stored");
                return match packet_id {
                    Some(id) if self.version.is_v5() => {
                        let mut r = PubResponse::new(id);
                        r.reason_code = ReasonCode::UnspecifiedError;
                        let ack = if p.qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) };
                        self.queue(&ack);
                        Ok(())
                    }
                    Some(_) => Err(Close::Lost), // 3.1.1 has no negative ack: close, the client resends
                    None => Ok(()),
                };
            }
        };
        match packet_id {
            Some(id) if p.qos != QoS::AtMostOnce => {
                self.pending_in.push_back(PendingIn { packet_id: id, qos: p.qos, ack })
            }
            // QoS 0: nobody waits for the log; the append still happens in order.
            _ => {
                tokio::spawn(async move {
                    let _ = ack.await;
                });
            }
        }
        Ok(())
    }

    async fn acknowledge_publish(
        &mut self,
        packet_id: PacketId,
        qos: QoS,
        result: silt_storage::Result<Appended>,
    ) -> Result<(), Close> {
        let mut r = PubResponse::new(packet_id);
        if let Err(e) = result {
            tracing::warn!(client_id = %self.client_id, error = %e, "publish not durable");
            if !self.version.is_v5() {
                return Err(Close::Lost);
            }
            r.reason_code = ReasonCode::UnspecifiedError;
        } else if qos == QoS::ExactlyOnce {
            self.session.lock().await.inbound_qos2.insert(packet_id.get());
        }
        let packet = if qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) };
        self.queue(&packet);
        Ok(())
    }

    /// Settles an outbound message acknowledged with PUBACK (QoS 1), PUBCOMP or an error
    /// PUBREC (QoS 2). Acknowledgements for unknown ids or of the wrong kind are ignored.
    async fn on_ack(&mut self, id: PacketId, qos: QoS) {
        if self.inflight.get(&id.get()).is_none_or(|f| f.qos != qos) {
            return;
        }
        let f = self.inflight.remove(&id.get()).expect("invariant: checked above");
        if let Some(group) = &f.group {
            let mut g = group.lock().await;
            g.subs.settle(&f.settles);
            g.dirty = true;
            self.want_pull = true;
            return;
        }
        let mut s = self.session.lock().await;
        if qos == QoS::ExactlyOnce {
            s.outbound_qos2.remove(&id.get());
            s.dirty = true;
        }
        if !f.settles.is_empty() {
            s.subs.settle(&f.settles);
            s.dirty = true;
        }
        self.want_pull = true;
    }

    async fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let sub_id = s.properties.subscription_identifier;
        if sub_id == Some(0) {
            return Err(Close::Violation(ReasonCode::ProtocolError));
        }
        let mut codes = Vec::with_capacity(s.subscriptions.len());
        let mut retained = Vec::new();
        {
            let session_ref = self.session.clone();
            let mut session = session_ref.lock().await;
            for sub in &s.subscriptions {
                if sub.filter.starts_with("$share/") {
                    codes.push(
                        self.subscribe_shared(&mut session, &sub.filter, sub.options.qos, sub_id, sub.options.no_local)
                            .await,
                    );
                    continue;
                }
                let filter = match TopicFilter::new(sub.filter.clone()) {
                    Ok(f) => f,
                    Err(_) => {
                        codes.push(if self.version.is_v5() {
                            ReasonCode::TopicFilterInvalid
                        } else {
                            ReasonCode::UnspecifiedError
                        });
                        continue;
                    }
                };
                if !self.broker.auth.allows_subscribe(self.username.as_deref(), &self.client_id, filter.as_str()) {
                    tracing::debug!(client_id = %self.client_id, filter = %filter, "subscribe not authorized");
                    codes.push(if self.version.is_v5() {
                        ReasonCode::NotAuthorized
                    } else {
                        ReasonCode::UnspecifiedError
                    });
                    continue;
                }
                let existed = session.subs.subs.contains_key(filter.as_str());
                let o = sub.options;
                let state = SubscriptionState {
                    filter: filter.as_str().to_owned(),
                    qos: o.qos.as_u8(),
                    no_local: o.no_local && self.version.is_v5(),
                    retain_as_published: o.retain_as_published && self.version.is_v5(),
                    subscription_id: sub_id,
                    cursor: 0,
                    sent: 0,
                };
                match self.broker.subscribe(self.conn_id, &self.wake, &mut session, &filter, state).await {
                    Ok(()) => {
                        codes.push(match o.qos {
                            QoS::AtMostOnce => ReasonCode::Success,
                            QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
                            QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
                        });
                        let send_retained = match o.retain_handling {
                            RetainHandling::SendAtSubscribe => true,
                            RetainHandling::SendAtSubscribeIfNew => !existed,
                            RetainHandling::DoNotSend => false,
                        };
                        if send_retained || !self.version.is_v5() {
                            retained.push((filter, o.qos));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(client_id = %self.client_id, error = %e, "subscribe failed");
                        codes.push(ReasonCode::UnspecifiedError);
                    }
                }
            }
        }
        if let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.client_id, error = %e, "session snapshot after SUBSCRIBE failed");
        }
        self.queue(&Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            properties: AckProperties::default(),
        }));
        for (filter, qos) in retained {
            for m in self.broker.retained_for(&filter) {
                self.retained_queue.push_back((m, qos, sub_id));
            }
        }
        self.want_pull = true;
        Ok(())
    }

    /// One `$share/{group}/{filter}` entry of a SUBSCRIBE; returns its reason code.
    async fn subscribe_shared(
        &mut self,
        session: &mut crate::broker::Session,
        key: &str,
        qos: QoS,
        sub_id: Option<u32>,
        no_local: bool,
    ) -> ReasonCode {
        let invalid = if self.version.is_v5() { ReasonCode::TopicFilterInvalid } else { ReasonCode::UnspecifiedError };
        let Some((_, filter)) = parse_shared(key) else { return invalid };
        if no_local && self.version.is_v5() {
            return ReasonCode::ProtocolError; // [MQTT-3.8.3-4]: no-local on a shared subscription
        }
        if !self.broker.auth.allows_subscribe(self.username.as_deref(), &self.client_id, filter.as_str()) {
            return if self.version.is_v5() { ReasonCode::NotAuthorized } else { ReasonCode::UnspecifiedError };
        }
        let membership = SharedMembership { key: key.to_owned(), qos: qos.as_u8(), subscription_id: sub_id };
        match self.broker.subscribe_shared(self.conn_id, &self.wake, session, key, membership).await {
            Ok(()) => match qos {
                QoS::AtMostOnce => ReasonCode::Success,
                QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
                QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
            },
            Err(e) => {
                tracing::warn!(client_id = %self.client_id, error = %e, "shared subscribe failed");
                ReasonCode::UnspecifiedError
            }
        }
    }

    async fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut codes = Vec::with_capacity(u.filters.len());
        {
            let mut session = self.session.lock().await;
            for f in &u.filters {
                if f.starts_with("$share/") {
                    let gone = self.broker.unsubscribe_shared(self.conn_id, &mut session, f).await;
                    codes.push(if gone { ReasonCode::Success } else { ReasonCode::NoSubscriptionExisted });
                    continue;
                }
                let code = match TopicFilter::new(f.clone()) {
                    Ok(filter) => {
                        if self.broker.unsubscribe(self.conn_id, &mut session, &filter).await {
                            ReasonCode::Success
                        } else {
                            ReasonCode::NoSubscriptionExisted
                        }
                    }
                    Err(_) => ReasonCode::TopicFilterInvalid,
                };
                codes.push(code);
            }
        }
        if let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.client_id, error = %e, "session snapshot after UNSUBSCRIBE failed");
        }
        self.queue(&Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            properties: AckProperties::default(),
        }));
    }

    /// Pushes retained messages owed to new subscriptions, then pulls from the cursors, within
    /// the window.
    async fn deliver(&mut self) -> Result<(), Close> {
        let now = Timestamp::now();
        while let Some((m, granted, sub_id)) = self.retained_queue.front().cloned() {
            let qos = QoS::from_u8(m.qos.min(granted.as_u8())).unwrap_or_default();
            if qos != QoS::AtMostOnce && self.inflight.len() >= self.window {
                return Ok(());
            }
            self.retained_queue.pop_front();
            if m.remaining_expiry(now) == Some(0) {
                continue;
            }
            self.send_message(&m, qos, true, false, sub_id.into_iter().collect(), Vec::new(), None, now);
        }
        if !self.want_pull {
            return Ok(());
        }
        let room = self.window.saturating_sub(self.inflight.len()).min(PULL_BATCH);
        if room == 0 {
            return Ok(());
        }
        let batch = {
            let mut s = self.session.lock().await;
            match s.subs.pull(&self.broker.storage, &self.client_id, now, room) {
                Ok(b) => {
                    if !b.is_empty() {
                        s.dirty = true;
                    }
                    b
                }
                Err(e) => {
                    tracing::warn!(client_id = %self.client_id, error = %e, "delivery read failed");
                    return Err(Close::Violation(ReasonCode::UnspecifiedError));
                }
            }
        };
        self.want_pull = batch.len() == room;
        let mut room = room - batch.len();
        for o in batch {
            let qos = QoS::from_u8(o.qos).unwrap_or_default();
            self.send_message(&o.message, qos, o.retain, o.dup, o.subscription_ids, o.settles, Some(o.entry), now);
        }
        // Shared groups: whichever member pulls first gets the message.
        let memberships: Vec<SharedMembership> = self.session.lock().await.shared.values().cloned().collect();
        for m in memberships {
            if room == 0 {
                self.want_pull = true;
                break;
            }
            let Some(group) = self.broker.group(&m.key) else { continue };
            let batch = {
                let mut g = group.lock().await;
                match g.subs.pull(&self.broker.storage, "", now, room) {
                    Ok(b) => {
                        if !b.is_empty() {
                            g.dirty = true;
                        }
                        b
                    }
                    Err(e) => {
                        tracing::warn!(client_id = %self.client_id, error = %e, "shared delivery read failed");
                        continue;
                    }
                }
            };
            if batch.len() == room {
                self.want_pull = true;
            }
            room -= batch.len();
            for o in batch {
                let qos = QoS::from_u8(o.qos.min(m.qos)).unwrap_or_default();
                let ids = m.subscription_id.into_iter().collect();
                if qos == QoS::AtMostOnce {
                    group.lock().await.subs.settle(&o.settles);
                    self.send_message(&o.message, qos, false, false, ids, Vec::new(), None, now);
                } else {
                    self.send_shared(&o.message, qos, o.dup, ids, o.settles, &group, now);
                }
            }
        }
        Ok(())
    }

    /// Sends a QoS 1/2 message from a shared group; its acknowledgement settles the group.
    #[allow(clippy::too_many_arguments)]
    fn send_shared(
        &mut self,
        m: &Message,
        qos: QoS,
        dup: bool,
        ids: Vec<u32>,
        settles: Vec<(String, Offset)>,
        group: &GroupRef,
        now: Timestamp,
    ) {
        let mut p = Publish::new(m.topic.clone(), m.payload.clone());
        p.qos = qos;
        p.dup = dup;
        if self.version.is_v5() {
            p.properties = publish_properties(m, ids, now);
            self.apply_topic_alias(&mut p);
        }
        let id = self.allocate_packet_id();
        p.packet_id = Some(id);
        let packet = Packet::Publish(p);
        if packet.encoded_len(self.version).is_ok_and(|n| n as u64 > u64::from(self.client_max_packet)) {
            let group = group.clone();
            tokio::spawn(async move { group.lock().await.subs.settle(&settles) });
            return;
        }
        self.inflight.insert(id.get(), Inflight { qos, released: false, settles, group: Some(group.clone()) });
        self.queue(&packet);
        self.broker.stats.messages_sent.fetch_add(1, Ordering::Relaxed);
    }

    #[allow(clippy::too_many_arguments)]
    fn send_message(
        &mut self,
        m: &Message,
        qos: QoS,
        retain: bool,
        dup: bool,
        subscription_ids: Vec<u32>,
        settles: Vec<(String, Offset)>,
        entry: Option<silt_storage::IndexEntry>,
        now: Timestamp,
    ) {
        if self.broker.auth.has_acl()
            && !self.broker.auth.allows_topic(self.username.as_deref(), &self.client_id, Access::Read, &m.topic)
        {
            self.settle_now(settles);
            return;
        }
        let mut p = Publish::new(m.topic.clone(), m.payload.clone());
        p.qos = qos;
        p.retain = retain;
        p.dup = dup;
        if self.version.is_v5() {
            p.properties = publish_properties(m, subscription_ids.clone(), now);
            self.apply_topic_alias(&mut p);
        }
        let packet_id = if qos != QoS::AtMostOnce { Some(self.allocate_packet_id()) } else { None };
        p.packet_id = packet_id;
        let packet = Packet::Publish(p);
        let fits = packet.encoded_len(self.version).is_ok_and(|n| n as u64 <= u64::from(self.client_max_packet));
        if !fits {
            // The client could not accept it: the spec says discard, as if delivered.
            tracing::debug!(client_id = %self.client_id, "message larger than the client's maximum packet size dropped");
            self.settle_now(settles);
            return;
        }
        if let Some(id) = packet_id {
            if qos == QoS::ExactlyOnce
                && let Some(entry) = entry
            {
                self.qos2_unpersisted.push(OutboundQos2 {
                    packet_id: id.get(),
                    position: entry.position.get(),
                    size: entry.size,
                    timestamp: entry.timestamp.get(),
                    settles: settles.iter().map(|(f, o)| (f.clone(), o.get())).collect(),
                    subscription_ids,
                });
            }
            self.inflight.insert(id.get(), Inflight { qos, released: false, settles, group: None });
        }
        self.queue(&packet);
        self.broker.stats.messages_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Settles a message that will not be sent (denied by an ACL, too large for the client).
    fn settle_now(&self, settles: Vec<(String, Offset)>) {
        if !settles.is_empty() {
            let session = self.session.clone();
            tokio::spawn(async move { session.lock().await.subs.settle(&settles) });
        }
    }

    fn apply_topic_alias(&mut self, p: &mut Publish) {
        if self.topic_alias_max_out == 0 {
            return;
        }
        if let Some(&a) = self.topic_aliases_out.get(&p.topic) {
            p.properties.topic_alias = Some(a);
            p.topic.clear();
        } else if self.topic_aliases_out.len() < usize::from(self.topic_alias_max_out) {
            let a = self.topic_aliases_out.len() as u16 + 1;
            self.topic_aliases_out.insert(p.topic.clone(), a);
            p.properties.topic_alias = Some(a);
        }
    }

    fn allocate_packet_id(&mut self) -> PacketId {
        loop {
            let id = self.next_packet_id;
            self.next_packet_id = if id == u16::MAX { 1 } else { id + 1 };
            if !self.inflight.contains_key(&id) {
                return PacketId::new(id).expect("invariant: ids start at 1 and skip 0");
            }
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
        for (_, f) in std::mem::take(&mut self.inflight) {
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
