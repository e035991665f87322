//! A minimal MQTT client: one tokio `TcpStream`, two buffers, and the `silt-mqtt` codec.
//!
//! It holds no task, no channel and no timer of its own, so an idle connection costs a socket
//! and a few hundred bytes; the scenario that owns it decides when to read and write.
//! Publishers encode one PUBLISH once ([`PublishTemplate`]) and patch the packet identifier
//! and the payload header per message, which keeps the generator's CPU out of the figures it
//! measures. Not handled: QoS 2, topic aliases, AUTH, or anything a benchmark peer can skip.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::BytesMut;
use silt_mqtt::{
    ConnAck, Connect, Disconnect, Packet, PacketId, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode, Subscribe,
    Subscription, SubscriptionOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::payload::Stamp;

/// Largest packet accepted from the broker.
const MAX_PACKET: u32 = 1 << 20;

/// How a client connects.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    pub client_id: String,
    pub version: ProtocolVersion,
    pub clean_start: bool,
    /// Seconds; the scenarios keep it longer than any run so no PINGREQ is needed.
    pub keep_alive: u16,
    /// MQTT 5 Session Expiry Interval; ignored by 3.x (whose persistence is `!clean_start`).
    pub session_expiry: Option<u32>,
    /// Initial read buffer capacity in bytes (small for idle connections).
    pub read_buffer: usize,
    /// A filter [`connect_many`] subscribes to (QoS 1) right after the CONNACK, timed with it.
    pub subscribe: Option<String>,
}

impl ConnectOptions {
    pub fn new(client_id: impl Into<String>, version: ProtocolVersion) -> Self {
        Self {
            client_id: client_id.into(),
            version,
            clean_start: true,
            keep_alive: 600,
            session_expiry: None,
            read_buffer: 16 * 1024,
            subscribe: None,
        }
    }
}

pub struct Client {
    stream: TcpStream,
    version: ProtocolVersion,
    inbuf: BytesMut,
    out: BytesMut,
    read_chunk: usize,
}

impl Client {
    /// Opens a TCP connection, sends CONNECT and waits for a successful CONNACK.
    pub async fn connect(addr: SocketAddr, opts: &ConnectOptions) -> anyhow::Result<(Self, ConnAck)> {
        let stream = TcpStream::connect(addr).await.with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true)?;
        let mut client = Client {
            stream,
            version: opts.version,
            inbuf: BytesMut::with_capacity(opts.read_buffer),
            out: BytesMut::with_capacity(256),
            read_chunk: opts.read_buffer.max(256),
        };
        let mut connect = Connect::new(opts.version, opts.client_id.clone(), opts.keep_alive);
        connect.clean_start = opts.clean_start;
        if opts.version.is_v5() {
            connect.properties.session_expiry_interval = opts.session_expiry;
        }
        client.queue(&connect.into())?;
        client.flush().await?;
        match client.recv().await? {
            Packet::ConnAck(ack) if ack.reason_code == ReasonCode::Success => Ok((client, *ack)),
            Packet::ConnAck(ack) => bail!("CONNACK refused {}: {:?}", opts.client_id, ack.reason_code),
            other => bail!("expected CONNACK, got {}", other.packet_type()),
        }
    }

    /// Encodes `packet` into the output buffer; [`Client::flush`] sends it.
    pub fn queue(&mut self, packet: &Packet) -> anyhow::Result<()> {
        packet.encode(self.version, &mut self.out).context("encode")
    }

    /// Queues a PUBACK for `id`.
    pub fn queue_puback(&mut self, id: PacketId) -> anyhow::Result<()> {
        self.queue(&Packet::PubAck(PubResponse::new(id)))
    }

    /// Appends one message from `template` to the output buffer.
    pub fn queue_publish(&mut self, template: &PublishTemplate, packet_id: Option<PacketId>, stamp: &Stamp) {
        template.write(&mut self.out, packet_id, stamp);
    }

    pub async fn flush(&mut self) -> std::io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.out.clear();
        }
        Ok(())
    }

    /// Reads whatever the socket has; `Ok(false)` when the broker closed the connection.
    pub async fn fill(&mut self) -> std::io::Result<bool> {
        if self.inbuf.capacity() - self.inbuf.len() < self.read_chunk / 2 {
            self.inbuf.reserve(self.read_chunk);
        }
        Ok(self.stream.read_buf(&mut self.inbuf).await? > 0)
    }

    /// The next whole packet already read, if any.
    pub fn try_next(&mut self) -> anyhow::Result<Option<Packet>> {
        silt_mqtt::decode(&mut self.inbuf, self.version, MAX_PACKET).context("decode")
    }

    /// Waits for the next packet.
    pub async fn recv(&mut self) -> anyhow::Result<Packet> {
        loop {
            if let Some(p) = self.try_next()? {
                return Ok(p);
            }
            if !self.fill().await? {
                bail!("connection closed by the broker");
            }
        }
    }

    /// Subscribes to one filter and waits for a granting SUBACK.
    pub async fn subscribe(&mut self, filter: &str, qos: QoS) -> anyhow::Result<()> {
        let packet_id = PacketId::new(1).expect("invariant: 1 is not 0");
        let subscribe = Subscribe {
            packet_id,
            subscriptions: vec![Subscription {
                filter: filter.to_owned(),
                options: SubscriptionOptions { qos, ..SubscriptionOptions::default() },
            }],
            properties: Default::default(),
        };
        self.queue(&subscribe.into())?;
        self.flush().await?;
        loop {
            match self.recv().await? {
                Packet::SubAck(ack) if ack.packet_id == packet_id => {
                    return match ack.reason_codes.first() {
                        Some(code) if code.as_u8() < 0x80 => Ok(()),
                        code => bail!("SUBSCRIBE {filter} refused: {code:?}"),
                    };
                }
                Packet::Publish(p) if p.qos == QoS::AtLeastOnce => {
                    // A resumed session may deliver before the SUBACK; the scenario does not
                    // count these, but the broker must not wait for them.
                    if let Some(id) = p.packet_id {
                        self.queue_puback(id)?;
                        self.flush().await?;
                    }
                }
                _ => {}
            }
        }
    }

    /// Sends DISCONNECT and closes the socket (errors ignored: the peer may be gone).
    pub async fn disconnect(mut self) {
        if self.queue(&Disconnect::default().into()).is_ok() {
            let _ = self.flush().await;
        }
        let _ = self.stream.shutdown().await;
    }
}

/// One connection attempt of [`connect_many`].
pub struct Attempt {
    pub result: anyhow::Result<(Client, ConnAck)>,
    /// TCP connect to CONNACK.
    pub took: Duration,
}

/// Connects one client per options, at most `concurrency` handshakes at a time; results come
/// back in the order of `options`.
pub async fn connect_many(
    addr: SocketAddr,
    options: impl IntoIterator<Item = ConnectOptions>,
    concurrency: usize,
) -> Vec<Attempt> {
    let limit = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut tasks = JoinSet::new();
    for (i, opts) in options.into_iter().enumerate() {
        let permit = limit.clone().acquire_owned().await.expect("invariant: the semaphore is never closed");
        tasks.spawn(async move {
            let start = Instant::now();
            let mut result = Client::connect(addr, &opts).await;
            if let (Ok((client, _)), Some(filter)) = (&mut result, &opts.subscribe)
                && let Err(e) = client.subscribe(filter, QoS::AtLeastOnce).await
            {
                result = Err(e);
            }
            drop(permit);
            (i, Attempt { result, took: start.elapsed() })
        });
    }
    let mut out = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(done) => out.push(done),
            Err(e) => out.push((usize::MAX, Attempt { result: Err(e.into()), took: Duration::ZERO })),
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, a)| a).collect()
}

/// A PUBLISH encoded once; each message copies it and patches the packet identifier and the
/// payload header. The payload is always last in a PUBLISH, and the packet identifier comes
/// right before it (3.x) or before the one-byte empty property block (5.0).
pub struct PublishTemplate {
    frame: Vec<u8>,
    packet_id_at: Option<usize>,
    payload_at: usize,
}

impl PublishTemplate {
    pub fn new(topic: &str, qos: QoS, payload_len: usize, version: ProtocolVersion) -> anyhow::Result<Self> {
        let mut publish = Publish::new(topic, vec![0u8; payload_len]);
        publish.qos = qos;
        if qos != QoS::AtMostOnce {
            publish.packet_id = PacketId::new(1);
        }
        let mut frame = BytesMut::new();
        Packet::Publish(publish).encode(version, &mut frame).context("encode PUBLISH template")?;
        let payload_at = frame.len() - payload_len;
        let properties_len = usize::from(version.is_v5());
        let packet_id_at = (qos != QoS::AtMostOnce).then(|| payload_at - properties_len - 2);
        Ok(Self { frame: frame.to_vec(), packet_id_at, payload_at })
    }

    pub fn write(&self, out: &mut BytesMut, packet_id: Option<PacketId>, stamp: &Stamp) {
        let start = out.len();
        out.extend_from_slice(&self.frame);
        if let (Some(at), Some(id)) = (self.packet_id_at, packet_id) {
            out[start + at..start + at + 2].copy_from_slice(&id.get().to_be_bytes());
        }
        stamp.write(&mut out[start + self.payload_at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_patches_decode_as_the_intended_publish() {
        for version in [ProtocolVersion::V3_1_1, ProtocolVersion::V5] {
            for qos in [QoS::AtMostOnce, QoS::AtLeastOnce] {
                let t = PublishTemplate::new("bench/7/t", qos, 64, version).expect("template");
                let id = (qos != QoS::AtMostOnce).then(|| PacketId::new(0xBEEF).expect("non-zero"));
                let stamp = Stamp { sent_ns: 42, publisher: 7, seq: 9 };
                let mut out = BytesMut::new();
                t.write(&mut out, id, &stamp);
                t.write(&mut out, id, &Stamp { seq: 10, ..stamp });
                for seq in [9, 10] {
                    let Ok(Some(Packet::Publish(p))) = silt_mqtt::decode(&mut out, version, MAX_PACKET) else {
                        panic!("a PUBLISH for {version} {qos:?}");
                    };
                    assert_eq!((p.topic.as_str(), p.qos, p.packet_id), ("bench/7/t", qos, id));
                    assert_eq!(p.payload.len(), 64);
                    assert_eq!(Stamp::read(&p.payload), Some(Stamp { seq, ..stamp }));
                }
                assert!(out.is_empty());
            }
        }
    }
}
