//! A [`World`]: the server core, a minimal client built from the codec and flow types, and a
//! fake broker (an in-memory executor of the core's events), all in virtual time. Bytes move
//! between client and server only inside [`World::run`]; packets from the server can be lost
//! on the way ([`World::lose`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use silt_mqtt::server::{
    Close, Connection, DelayedWill, Event, Refusal, Sent, Settings, Stored, Subscribed, SubscriptionFilter, Token,
    UnsubscribeFilter,
};
use silt_mqtt::{
    ConnAck, Connect, ConnectProperties, InboundAliases, Outbound, Packet, PacketId, ProtocolVersion, PubRecOutcome,
    PubResponse, Publish, QoS, ReasonCode, decode,
};

pub const V5: ProtocolVersion = ProtocolVersion::V5;
pub const V311: ProtocolVersion = ProtocolVersion::V3_1_1;

pub fn id(n: u16) -> PacketId {
    PacketId::new(n).expect("non-zero")
}

pub fn publish(topic: &str, payload: &'static [u8], qos: QoS) -> Publish {
    let mut p = Publish::new(topic, Bytes::from_static(payload));
    p.qos = qos;
    p
}

/// Small limits, so that tests reach them in a few packets.
pub fn settings() -> Settings {
    Settings {
        max_packet_size: 1 << 20,
        receive_maximum: 4,
        max_inflight: 8,
        topic_alias_maximum: 4,
        server_keep_alive: 0,
        max_session_expiry: u32::MAX,
        connect_timeout: Duration::from_secs(10),
        max_connect_size: 4096,
        max_topic_levels: 8,
    }
}

/// A CONNECT for a session that outlives the connection (an hour in 5.0; no clean session
/// in 3.1.1), with keep alive 60 s.
pub fn persistent(version: ProtocolVersion, client_id: &str) -> Connect {
    let mut c = Connect::new(version, client_id, 60);
    c.clean_start = false;
    if version.is_v5() {
        c.properties = ConnectProperties { session_expiry_interval: Some(3600), ..ConnectProperties::default() };
    }
    c
}

/// The client side: sends what a test asks, completes its own QoS 1/2 publishes, and
/// (with `auto_ack`) acknowledges the server's.
pub struct Client {
    pub version: ProtocolVersion,
    to_server: BytesMut,
    /// Bytes were sent since the server last read: the driver reads only after they arrive.
    fresh: bool,
    from_server: BytesMut,
    /// Every packet received, in order.
    pub received: Vec<Packet>,
    /// Application messages received, topics resolved from aliases.
    pub messages: Vec<Publish>,
    /// Our QoS 1/2 publishes awaiting completion (kept across reconnects: the session's).
    pub outbound: Outbound<Publish>,
    aliases: InboundAliases,
    pub auto_ack: bool,
}

impl Client {
    fn new(version: ProtocolVersion, alias_maximum: u16, outbound: Outbound<Publish>) -> Self {
        Self {
            version,
            to_server: BytesMut::new(),
            fresh: false,
            from_server: BytesMut::new(),
            received: Vec::new(),
            messages: Vec::new(),
            outbound,
            aliases: InboundAliases::new(alias_maximum),
            auto_ack: true,
        }
    }

    pub fn send(&mut self, p: Packet) {
        p.encode(self.version, &mut self.to_server).expect("client packets encode");
        self.fresh = true;
    }

    /// Sends raw bytes (a malformed or partial packet).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        self.to_server.extend_from_slice(bytes);
        self.fresh = true;
    }

    /// Publishes; QoS 1/2 messages are tracked until completed and get their packet id.
    pub fn publish(&mut self, mut p: Publish) -> Option<PacketId> {
        if p.qos != QoS::AtMostOnce {
            let id = self.outbound.send(p.qos, p.clone());
            p.packet_id = Some(id);
            // Keep the copy with its id, for a resend.
            self.outbound.restore(id, p.qos, p.clone());
        }
        let id = p.packet_id;
        self.send(Packet::Publish(p));
        id
    }

    /// Sends again, with DUP, every publish not yet completed (after a reconnect).
    pub fn resend_unacked(&mut self) {
        let pending: Vec<Publish> = self.outbound.drain().collect();
        for mut p in pending {
            let id = p.packet_id.expect("tracked with its id");
            self.outbound.restore(id, p.qos, p.clone());
            p.dup = true;
            self.send(Packet::Publish(p));
        }
    }

    /// Acknowledges a PUBLISH the server sent (when `auto_ack` is off).
    pub fn ack(&mut self, p: &Publish) {
        let id = p.packet_id.expect("QoS 1/2");
        let r = PubResponse::new(id);
        self.send(if p.qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) });
    }

    fn receive(&mut self, p: Packet) {
        match &p {
            Packet::Publish(publish) => {
                let mut m = publish.clone();
                self.aliases.resolve(m.properties.topic_alias, &mut m.topic).expect("the server's aliases are valid");
                if self.auto_ack && m.packet_id.is_some() {
                    self.ack(&m);
                }
                self.messages.push(m);
            }
            Packet::PubRel(r) if self.auto_ack => self.send(Packet::PubComp(PubResponse::new(r.packet_id))),
            Packet::PubAck(r) => {
                self.outbound.on_puback(r.packet_id);
            }
            Packet::PubRec(r) => match self.outbound.on_pubrec(r.packet_id, r.reason_code) {
                PubRecOutcome::Release => self.send(Packet::PubRel(PubResponse::new(r.packet_id))),
                PubRecOutcome::Refused(_) | PubRecOutcome::Unknown => {}
            },
            Packet::PubComp(r) => {
                self.outbound.on_pubcomp(r.packet_id);
            }
            _ => {}
        }
        self.received.push(p);
    }
}

/// A session as the fake broker keeps it.
#[derive(Default)]
pub struct Session {
    pub awaiting_release: BTreeSet<u16>,
    pub subscriptions: BTreeMap<String, QoS>,
    pub shared: BTreeSet<String>,
    /// Delivered QoS 1/2 messages not yet completed, by handle, with their packet id.
    pub inflight: BTreeMap<u64, (Publish, PacketId)>,
    /// Packet ids of QoS 2 deliveries whose PUBREL went out.
    pub released: BTreeSet<u16>,
    pub expiry: u32,
}

/// An in-memory broker: executes the core's events, with knobs for refusals and failures.
#[derive(Default)]
pub struct Broker {
    pub sessions: HashMap<String, Session>,
    /// The client id of the current connection.
    pub client_id: String,
    /// Application messages stored, in order.
    pub log: Vec<Publish>,
    /// Stores wait for [`World::complete_store`] instead of completing at once.
    pub manual_stores: bool,
    pub pending: Vec<(Token, Publish)>,
    pub fail_stores: bool,
    /// Publishing and subscribing under this prefix is not authorized.
    pub deny_prefix: Option<&'static str>,
    pub fail_subscribes: bool,
    pub refuse_credentials: Option<Refusal>,
    pub refuse_will: bool,
    pub retained: Vec<Publish>,
    /// Messages waiting to be delivered, offered while the window has room.
    pub backlog: VecDeque<(u64, Publish)>,
    /// Handles of delivered messages the client completed (or that were discarded as such).
    pub settled: Vec<u64>,
    pub undelivered: Vec<u64>,
    pub closed: Option<(Close, Option<DelayedWill>)>,
    next_handle: u64,
}

impl Broker {
    fn session(&mut self) -> &mut Session {
        self.sessions.entry(self.client_id.clone()).or_default()
    }

    fn denied(&self, topic: &str) -> bool {
        self.deny_prefix.is_some_and(|d| topic.starts_with(d))
    }
}

type LossFilter = Box<dyn FnMut(&Packet) -> bool>;

pub struct World {
    pub now: Instant,
    pub settings: Settings,
    pub server: Connection<u64>,
    pub broker: Broker,
    pub client: Client,
    /// Drops the next server packet that matches, once each.
    lose: Vec<LossFilter>,
    /// Packets lost on the way to the client.
    pub lost: Vec<Packet>,
}

impl World {
    pub fn new(version: ProtocolVersion) -> Self {
        Self::with_settings(version, settings())
    }

    pub fn with_settings(version: ProtocolVersion, settings: Settings) -> Self {
        let now = Instant::now();
        Self {
            now,
            settings,
            server: Connection::new(now, settings, 0x5eed),
            broker: Broker::default(),
            client: Client::new(version, 0, Outbound::new(u16::MAX)),
            lose: Vec::new(),
            lost: Vec::new(),
        }
    }

    /// A world whose client connected with `connect` and was accepted.
    pub fn connected(connect: Connect) -> Self {
        let mut w = Self::new(connect.protocol_version);
        let ack = w.connect(connect).expect("a CONNACK");
        assert_eq!(ack.reason_code, ReasonCode::Success);
        w
    }

    /// Sends `connect` on the current connection and returns the CONNACK, if one came.
    pub fn connect(&mut self, connect: Connect) -> Option<ConnAck> {
        let aliases = connect.properties.topic_alias_maximum.unwrap_or(0);
        let outbound = std::mem::replace(&mut self.client.outbound, Outbound::new(1));
        self.client = Client::new(connect.protocol_version, aliases, outbound);
        self.client.send(Packet::from(connect));
        self.run();
        self.client.received.iter().find_map(|p| match p {
            Packet::ConnAck(a) => Some((**a).clone()),
            _ => None,
        })
    }

    /// The transport drops; a new connection of the same client sends `connect`. The client
    /// keeps its session (publishes not completed); the broker keeps its sessions.
    pub fn reconnect(&mut self, connect: Connect) -> Option<ConnAck> {
        if self.broker.closed.is_none() {
            self.server.close(Close::Lost);
            self.run();
        }
        self.broker.closed = None;
        self.server = Connection::new(self.now, self.settings, 0x5eed);
        self.connect(connect)
    }

    /// Parks the server's connection and takes it back at once, as a driver does with an
    /// idle one; returns whether it was at rest (if not, it is left as it was).
    pub fn park_and_resume(&mut self) -> bool {
        let placeholder = Connection::new(self.now, self.settings, 0);
        match std::mem::replace(&mut self.server, placeholder).park() {
            Ok(parked) => {
                self.server = Connection::unpark(parked, self.settings);
                true
            }
            Err(working) => {
                self.server = working;
                false
            }
        }
    }

    /// Drops the next packet from the server that `matches`.
    pub fn lose(&mut self, matches: impl FnMut(&Packet) -> bool + 'static) {
        self.lose.push(Box::new(matches));
    }

    /// Queues a message for delivery to the client; returns its handle.
    pub fn deliver(&mut self, p: Publish) -> u64 {
        self.broker.next_handle += 1;
        let h = self.broker.next_handle;
        self.broker.backlog.push_back((h, p));
        self.run();
        h
    }

    /// Completes the `n`th store still pending (in request order).
    pub fn complete_store(&mut self, n: usize) {
        let (token, p) = self.broker.pending.remove(n);
        self.broker.log.push(p);
        self.server.handle_stored(token, Stored::Durable);
        self.run();
    }

    /// Fails the `n`th store still pending.
    pub fn fail_store(&mut self, n: usize) {
        let (token, _) = self.broker.pending.remove(n);
        self.server.handle_stored(token, Stored::Failed);
        self.run();
    }

    /// Virtual time passes.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
        self.server.handle_timeout(self.now);
        self.run();
    }

    /// Sends a PUBLISH whose topic name holds a wildcard (the codec would refuse to build one).
    pub fn send_wildcard_topic(&mut self) {
        let mut bytes = bytes::BytesMut::new();
        Packet::Publish(Publish::new("a/b", bytes::Bytes::new()))
            .encode(self.client.version, &mut bytes)
            .expect("encodable");
        let at = bytes.iter().position(|&b| b == b'b').expect("topic byte");
        bytes[at] = b'+';
        self.client.send_bytes(&bytes);
        self.run();
    }

    /// Whether the server ended the connection, and why.
    pub fn close_reason(&self) -> Option<&Close> {
        self.broker.closed.as_ref().map(|(r, _)| r)
    }

    /// Moves bytes both ways and executes events until nothing moves.
    pub fn run(&mut self) {
        for _ in 0..10_000 {
            let mut progress = false;
            if std::mem::take(&mut self.client.fresh) {
                while self.server.handle_input(self.now, &mut self.client.to_server) {
                    self.execute();
                    progress = true;
                }
            }
            progress |= self.execute();
            progress |= self.pump();
            while let Some(bytes) = self.server.poll_transmit() {
                self.client.from_server.extend_from_slice(&bytes);
                progress = true;
            }
            while let Some(p) = decode(&mut self.client.from_server, self.client.version, u32::MAX)
                .expect("the server's packets decode")
            {
                if let Some(at) = self.lose.iter_mut().position(|f| f(&p)) {
                    drop(self.lose.remove(at));
                    self.lost.push(p);
                    continue;
                }
                self.client.receive(p);
            }
            if !progress {
                return;
            }
        }
        panic!("the conversation never settles");
    }

    /// Offers the backlog while the window has room, as the driver's pulls do.
    fn pump(&mut self) -> bool {
        let mut any = false;
        while let Some((_, p)) = self.broker.backlog.front() {
            if p.qos != QoS::AtMostOnce && self.server.send_room() == 0 {
                break;
            }
            let (h, p) = self.broker.backlog.pop_front().expect("front exists");
            any = true;
            match self.server.send(p.view(), h) {
                Sent::Queued(Some(id)) => {
                    self.broker.session().inflight.insert(h, (p, id));
                }
                Sent::Queued(None) => {}
                Sent::TooLarge(h) => self.broker.settled.push(h),
                Sent::NoRoom(h) => {
                    self.broker.backlog.push_front((h, p));
                    return any;
                }
            }
        }
        any
    }

    /// Executes the core's events as a broker would; returns whether there were any.
    fn execute(&mut self) -> bool {
        let mut any = false;
        while let Some(event) = self.server.poll_event() {
            any = true;
            let b = &mut self.broker;
            match event {
                Event::Authenticate(_) => self.server.handle_authenticated(b.refuse_credentials.map_or(Ok(()), Err)),
                Event::Open(request) => {
                    if b.refuse_will && request.will_topic.is_some() {
                        self.server.refuse(Refusal::NotAuthorized);
                        continue;
                    }
                    b.client_id = request.client_id.clone();
                    if request.clean_start {
                        b.sessions.remove(&request.client_id);
                    }
                    let present = b.sessions.contains_key(&request.client_id);
                    let s = b.session();
                    s.expiry = request.session_expiry;
                    let awaiting = s.awaiting_release.iter().map(|&n| id(n)).collect::<Vec<_>>();
                    self.server.accept(self.now, present, awaiting);
                    // What arrived behind the CONNECT is read now, as the driver does.
                    self.client.fresh = true;
                    // Redeliver what the previous connection left in flight under the same ids
                    // (MQTT-4.4.0-1): a released QoS 2 message as PUBREL, the rest as PUBLISH
                    // with DUP.
                    let inflight = std::mem::take(&mut self.broker.session().inflight);
                    for (h, (p, pid)) in inflight {
                        if self.broker.session().released.contains(&pid.get()) {
                            self.server.resend_release(pid, h);
                        } else {
                            self.server.resend(pid, p.clone(), h);
                        }
                        self.broker.session().inflight.insert(h, (p, pid));
                    }
                }
                Event::Publish { token, publish } => {
                    if b.denied(&publish.topic) {
                        if let Some(t) = token {
                            self.server.handle_stored(t, Stored::NotAuthorized);
                        }
                    } else if b.fail_stores {
                        if let Some(t) = token {
                            self.server.handle_stored(t, Stored::Failed);
                        }
                    } else {
                        match token {
                            Some(t) if b.manual_stores => b.pending.push((t, publish)),
                            Some(t) => {
                                b.log.push(publish);
                                self.server.handle_stored(t, Stored::Durable);
                            }
                            None => b.log.push(publish),
                        }
                    }
                }
                Event::Qos2Received(pid) => {
                    b.session().awaiting_release.insert(pid.get());
                }
                Event::Qos2Released(pid) => {
                    b.session().awaiting_release.remove(&pid.get());
                }
                Event::Subscribe(request) => {
                    let mut outcomes = Vec::new();
                    for f in request.filters {
                        let (SubscriptionFilter::Plain(filter) | SubscriptionFilter::Shared { filter, .. }) = &f.filter;
                        if b.deny_prefix.is_some_and(|d| filter.as_str().starts_with(d)) {
                            outcomes.push(Subscribed::NotAuthorized);
                        } else if b.fail_subscribes {
                            outcomes.push(Subscribed::Failed);
                        } else {
                            let existed = match f.filter {
                                SubscriptionFilter::Plain(filter) => b
                                    .session()
                                    .subscriptions
                                    .insert(filter.as_str().to_owned(), f.options.qos)
                                    .is_some(),
                                SubscriptionFilter::Shared { key, .. } => !b.session().shared.insert(key),
                            };
                            outcomes.push(Subscribed::Granted { existed });
                        }
                    }
                    self.server.handle_subscribed(request.token, outcomes);
                }
                Event::Unsubscribe(request) => {
                    let s = b.session();
                    let existed: Vec<bool> = request
                        .filters
                        .into_iter()
                        .map(|f| match f {
                            UnsubscribeFilter::Plain(filter) => s.subscriptions.remove(filter.as_str()).is_some(),
                            UnsubscribeFilter::Shared(key) => s.shared.remove(&key),
                        })
                        .collect();
                    self.server.handle_unsubscribed(request.token, existed);
                }
                Event::Retained { filter, qos, subscription_id } => {
                    let matching: Vec<Publish> = b
                        .retained
                        .iter()
                        .filter(|m| silt_types::filter_matches(filter.as_str(), &m.topic))
                        .cloned()
                        .collect();
                    for mut m in matching {
                        m.qos = m.qos.min(qos);
                        m.retain = true;
                        m.properties.subscription_identifiers = subscription_id.into_iter().collect();
                        b.next_handle += 1;
                        b.backlog.push_front((b.next_handle, m));
                    }
                }
                Event::Delivered { id, data, .. } => {
                    b.session().inflight.remove(&data);
                    b.session().released.remove(&id.get());
                    b.settled.push(data);
                }
                Event::OutboundReleased(id) => {
                    b.session().released.insert(id.get());
                }
                Event::SessionExpiry(secs) => b.session().expiry = secs,
                Event::Undelivered(h) => b.undelivered.push(h),
                Event::Closed { reason, will } => {
                    if b.session().expiry == 0 {
                        b.sessions.remove(&b.client_id);
                    }
                    b.closed = Some((reason, will));
                }
            }
        }
        any
    }
}
