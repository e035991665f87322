//! A client made of the workspace's MQTT codec over a blocking TCP socket: every packet as the
//! test writes it, every answer as the broker sends it (reason codes, properties, nothing
//! hidden by a client library).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use silt_mqtt::{
    ConnAck, Connect, ConnectProperties, Packet, PacketId, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode,
    Subscribe, SubscribeProperties, Subscription, SubscriptionOptions, Unsubscribe,
};

pub fn pid(n: u16) -> PacketId {
    PacketId::new(n).unwrap()
}

pub struct Raw {
    pub s: TcpStream,
    pub buf: BytesMut,
    pub version: ProtocolVersion,
    /// Packets read while waiting for another one (a PUBLISH that came before a PUBACK).
    pub held: std::collections::VecDeque<Packet>,
}

impl Raw {
    /// An MQTT 5.0 client with a persistent session (1 h) unless `clean`; panics unless the
    /// CONNACK accepts. Returns whether a session was present.
    pub fn connect(port: u16, id: &str, clean: bool) -> (Raw, bool) {
        Self::connect_with(port, id, clean, ConnectProperties::default())
    }

    pub fn connect_with(port: u16, id: &str, clean: bool, props: ConnectProperties) -> (Raw, bool) {
        let mut c = Connect::new(ProtocolVersion::V5, id, 60);
        c.clean_start = clean;
        c.properties = ConnectProperties { session_expiry_interval: Some(3600), ..props };
        let (raw, ack) = Self::handshake(port, c);
        let ack = ack.unwrap_or_else(|| panic!("no CONNACK"));
        assert!(!ack.reason_code.is_error(), "CONNACK {:?}", ack.reason_code);
        (raw, ack.session_present)
    }

    /// A TCP connection to the broker on `port`, from the loopback address `from` (any of
    /// 127.0.0.0/8) when given.
    pub fn open(port: u16, from: Option<[u8; 4]>, version: ProtocolVersion) -> Raw {
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        let s = match from {
            None => TcpStream::connect(to).unwrap(),
            Some(ip) => {
                let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
                sock.bind(&SocketAddr::from((ip, 0)).into()).unwrap();
                sock.connect(&to.into()).unwrap();
                sock.into()
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Raw { s, buf: BytesMut::new(), version, held: Default::default() }
    }

    /// Sends `connect` on a new connection and returns the CONNACK, if one came.
    pub fn handshake(port: u16, connect: Connect) -> (Raw, Option<ConnAck>) {
        let mut raw = Raw::open(port, None, connect.protocol_version);
        let ack = raw.send_connect(connect);
        (raw, ack)
    }

    pub fn send_connect(&mut self, connect: Connect) -> Option<ConnAck> {
        self.version = connect.protocol_version;
        self.send(Packet::Connect(Box::new(connect)));
        match self.recv() {
            Some(Packet::ConnAck(a)) => Some(*a),
            _ => None,
        }
    }

    pub fn send(&mut self, p: Packet) {
        let mut out = BytesMut::new();
        p.encode(self.version, &mut out).unwrap();
        self.s.write_all(&out).unwrap();
    }

    /// The next packet, or None on timeout/close.
    pub fn recv(&mut self) -> Option<Packet> {
        if let Some(p) = self.held.pop_front() {
            return Some(p);
        }
        loop {
            if let Some(p) = silt_mqtt::decode(&mut self.buf, self.version, 1 << 20).unwrap() {
                return Some(p);
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn recv_publish(&mut self) -> Publish {
        loop {
            match self.recv() {
                Some(Packet::Publish(p)) => return p,
                Some(_) => {}
                None => panic!("no PUBLISH arrived"),
            }
        }
    }

    /// Subscribes to one filter; returns the SUBACK's reason code.
    pub fn subscribe(&mut self, filter: &str, qos: QoS) -> ReasonCode {
        self.send(Packet::Subscribe(Subscribe {
            packet_id: pid(1),
            subscriptions: vec![Subscription {
                filter: filter.into(),
                options: SubscriptionOptions { qos, ..SubscriptionOptions::default() },
            }],
            properties: SubscribeProperties::default(),
        }));
        match self.recv() {
            Some(Packet::SubAck(a)) => a.reason_codes[0],
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    /// Unsubscribes from one filter; returns the UNSUBACK's reason code.
    pub fn unsubscribe(&mut self, filter: &str) -> ReasonCode {
        self.send(Packet::Unsubscribe(Unsubscribe {
            packet_id: pid(2),
            filters: vec![filter.into()],
            properties: Default::default(),
        }));
        match self.recv() {
            Some(Packet::UnsubAck(a)) => a.reason_codes[0],
            other => panic!("expected UNSUBACK, got {other:?}"),
        }
    }

    /// Publishes at QoS 1 and returns the PUBACK's reason code (None: the connection closed).
    pub fn publish_qos1(&mut self, topic: &str, id: u16, payload: &'static [u8], retain: bool) -> Option<ReasonCode> {
        let mut p = Publish::new(topic, payload);
        p.qos = QoS::AtLeastOnce;
        p.retain = retain;
        p.packet_id = Some(pid(id));
        self.send(Packet::Publish(p));
        let mut other = Vec::new();
        let code = loop {
            match self.recv() {
                Some(Packet::PubAck(r)) if r.packet_id == pid(id) => break Some(r.reason_code),
                Some(p) => other.push(p),
                None => break None,
            }
        };
        self.held.extend(other);
        code
    }

    /// Publishes at QoS 2 and completes the exchange.
    pub fn publish_qos2(&mut self, topic: &str, id: u16, payload: &'static [u8]) {
        let mut p = Publish::new(topic, payload);
        p.qos = QoS::ExactlyOnce;
        p.packet_id = Some(pid(id));
        self.send(Packet::Publish(p));
        assert!(matches!(self.recv(), Some(Packet::PubRec(_))));
        self.send(Packet::PubRel(PubResponse::new(pid(id))));
        assert!(matches!(self.recv(), Some(Packet::PubComp(_))));
    }

    /// Receives a QoS 2 PUBLISH and completes it; returns its payload.
    pub fn complete_qos2(&mut self) -> Vec<u8> {
        let p = self.recv_publish();
        let id = p.packet_id.unwrap();
        self.send(Packet::PubRec(PubResponse::new(id)));
        match self.recv() {
            Some(Packet::PubRel(r)) if r.packet_id == id => {}
            Some(Packet::Publish(other)) => panic!("another PUBLISH before the PUBREL: {:?}", other.payload),
            other => panic!("expected PUBREL {id:?}, got {other:?}"),
        }
        self.send(Packet::PubComp(PubResponse::new(id)));
        p.payload.to_vec()
    }

    /// Whether any PUBLISH arrives within `ms` milliseconds.
    pub fn quiet_for(&mut self, ms: u64) -> bool {
        self.s.set_read_timeout(Some(Duration::from_millis(ms))).unwrap();
        let got = loop {
            match self.recv() {
                Some(Packet::Publish(p)) => break Some(p),
                Some(_) => {}
                None => break None,
            }
        };
        self.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        got.is_none()
    }

    /// The DISCONNECT's reason code, if the broker sends one before closing.
    pub fn disconnect_reason(&mut self) -> Option<ReasonCode> {
        loop {
            if let Packet::Disconnect(d) = self.recv()? {
                return Some(d.reason_code);
            }
        }
    }
}
