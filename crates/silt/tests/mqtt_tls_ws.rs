//! MQTT over TLS, WebSocket and WebSocket over TLS against a running `silt serve`, with real
//! clients: mosquitto_pub/mosquitto_sub over TLS, and a tokio-tungstenite client sending MQTT
//! bytes from the workspace codec over WebSocket. The certificate is made at test time.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use common::{Certs, Silt, certs};
use futures_util::{SinkExt, StreamExt};
use silt_mqtt::{
    Connect, Packet, PacketId, ProtocolVersion, Publish, QoS, ReasonCode, Subscribe, Subscription, SubscriptionOptions,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

const WAIT: Duration = Duration::from_secs(30);
const V5: ProtocolVersion = ProtocolVersion::V5;

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

fn start(data: &Path, certs: &Certs) -> Silt {
    common::start_all_listeners(data, certs, &[])
}

// ---- mosquitto clients -------------------------------------------------------------------

fn mosquitto_args(port: u16, cafile: Option<&Path>) -> Vec<String> {
    let mut args = vec!["-h".into(), "127.0.0.1".into(), "-p".into(), port.to_string(), "-V".into(), "mqttv311".into()];
    if let Some(ca) = cafile {
        args.extend(["--cafile".into(), path_str(ca).to_owned()]);
    }
    args
}

fn mosquitto_pub(port: u16, cafile: Option<&Path>, topic: &str, payload: &str) {
    let out = Command::new("mosquitto_pub")
        .args(mosquitto_args(port, cafile))
        .args(["-q", "1", "-t", topic, "-m", payload])
        .output()
        .expect("mosquitto_pub is installed by scripts/test.sh");
    assert!(out.status.success(), "mosquitto_pub: {}", String::from_utf8_lossy(&out.stderr));
}

/// A mosquitto_sub for one message that has received its SUBACK.
struct Sub {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

fn mosquitto_sub(port: u16, cafile: Option<&Path>, topic: &str) -> Sub {
    // stdbuf: line-buffered stdout, so the SUBACK line (from -d) arrives when it happens.
    let mut child = Command::new("stdbuf")
        .args(["-oL", "mosquitto_sub", "-d", "-q", "1", "-C", "1", "-W", "30", "-t", topic])
        .args(mosquitto_args(port, cafile))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub is installed by scripts/test.sh");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let sub = Sub { child, lines };
    loop {
        let line = sub.lines.recv_timeout(WAIT).expect("mosquitto_sub never got its SUBACK");
        if line.contains("received SUBACK") {
            return sub;
        }
    }
}

impl Sub {
    fn expect(self, payload: &str) {
        let mut seen = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(WAIT) {
            if line == payload {
                return;
            }
            seen.push(line);
        }
        panic!("mosquitto_sub did not receive {payload:?}; output: {seen:#?}");
    }
}

impl Drop for Sub {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- an MQTT client over WebSocket ---------------------------------------------------------

fn tls_connector(der: &CertificateDer<'static>) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(Arc::new(common::client_tls_config(der)))
}

/// The WebSocket upgrade on `stream`, offering `protocol` (if any) on `path`.
async fn ws_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    port: u16,
    path: &str,
    protocol: Option<&'static str>,
) -> Result<WsMqtt<S>, tungstenite::Error> {
    let mut req = format!("ws://localhost:{port}{path}").into_client_request().unwrap();
    if let Some(p) = protocol {
        req.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static(p));
    }
    let (ws, resp) = tokio_tungstenite::client_async(req, stream).await?;
    assert_eq!(resp.headers().get("sec-websocket-protocol").map(|v| v.as_bytes()), Some(&b"mqtt"[..]));
    Ok(WsMqtt { ws, inbuf: BytesMut::new() })
}

struct WsMqtt<S> {
    ws: WebSocketStream<S>,
    inbuf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsMqtt<S> {
    async fn send_bytes(&mut self, bytes: &[u8]) {
        self.ws.send(Message::Binary(bytes::Bytes::copy_from_slice(bytes))).await.unwrap();
    }

    async fn send(&mut self, packets: &[Packet]) {
        let mut out = BytesMut::new();
        for p in packets {
            p.encode(V5, &mut out).unwrap();
        }
        self.send_bytes(&out).await;
    }

    async fn recv(&mut self) -> Packet {
        let next = async {
            loop {
                if let Some(p) = silt_mqtt::decode(&mut self.inbuf, V5, 1 << 20).unwrap() {
                    return p;
                }
                match self.ws.next().await.expect("WebSocket closed").unwrap() {
                    Message::Binary(b) => self.inbuf.extend_from_slice(&b),
                    Message::Ping(_) | Message::Pong(_) => {}
                    other => panic!("unexpected WebSocket message {other:?}"),
                }
            }
        };
        tokio::time::timeout(WAIT, next).await.expect("no MQTT packet within 30 s")
    }

    /// CONNECT, cut across two WebSocket messages; the second also carries `then`.
    async fn connect(&mut self, client_id: &str, then: &[Packet]) {
        let mut out = BytesMut::new();
        Packet::from(Connect::new(V5, client_id, 30)).encode(V5, &mut out).unwrap();
        for p in then {
            p.encode(V5, &mut out).unwrap();
        }
        self.send_bytes(&out[..3]).await;
        self.send_bytes(&out[3..]).await;
        match self.recv().await {
            Packet::ConnAck(ack) => assert_eq!(ack.reason_code, ReasonCode::Success),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }
}

fn subscribe(filter: &str) -> Packet {
    Packet::Subscribe(Subscribe {
        packet_id: PacketId::new(1).unwrap(),
        subscriptions: vec![Subscription {
            filter: filter.into(),
            options: SubscriptionOptions { qos: QoS::AtLeastOnce, ..Default::default() },
        }],
        properties: Default::default(),
    })
}

fn expect_publish(p: Packet, topic: &str, payload: &[u8]) {
    match p {
        Packet::Publish(p) => {
            assert_eq!(p.topic, topic);
            assert_eq!(&p.payload[..], payload);
        }
        other => panic!("expected PUBLISH, got {other:?}"),
    }
}

/// Reads until the peer closes; false if it is still open after 15 s.
fn closed_by_peer(s: &mut std::net::TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

// ---- tests -------------------------------------------------------------------------------

#[test]
fn tls_and_tcp_clients_exchange_messages_both_ways() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let silt = start(data.path(), &certs);
    let (tcp, tls) = (silt.port, silt.listener_port("tls"));

    let sub = mosquitto_sub(tcp, None, "tls/in");
    mosquitto_pub(tls, Some(&certs.cert), "tls/in", "sent over TLS");
    sub.expect("sent over TLS");

    let sub = mosquitto_sub(tls, Some(&certs.cert), "tls/out");
    mosquitto_pub(tcp, None, "tls/out", "sent over TCP");
    sub.expect("sent over TCP");

    silt.stop();
}

#[tokio::test]
async fn websocket_subscriber_receives_a_tcp_publish() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let silt = start(data.path(), &certs);
    let port = silt.listener_port("ws");

    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut client = ws_handshake(tcp, port, "/mqtt", Some("mqtt")).await.unwrap();
    // SUBSCRIBE shares a WebSocket message with the end of the CONNECT.
    client.connect("ws-sub", &[subscribe("ws/#")]).await;
    assert!(matches!(client.recv().await, Packet::SubAck(a) if a.reason_codes == [ReasonCode::GrantedQoS1]));

    mosquitto_pub(silt.port, None, "ws/news", "from TCP");
    expect_publish(client.recv().await, "ws/news", b"from TCP");

    // Two packets in one WebSocket message: PINGREQ and a QoS 0 PUBLISH to itself.
    client.send(&[Packet::PingReq, Packet::Publish(Publish::new("ws/self", &b"loop"[..]))]).await;
    let (a, b) = (client.recv().await, client.recv().await);
    let (pong, publish) = if a == Packet::PingResp { (a, b) } else { (b, a) };
    assert_eq!(pong, Packet::PingResp);
    expect_publish(publish, "ws/self", b"loop");
    silt.stop();
}

#[tokio::test]
async fn websocket_over_tls_publish_reaches_a_tcp_subscriber() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let silt = start_wss(data.path(), &certs);
    let sub = mosquitto_sub(silt.port, None, "wss/in");
    let mut client = wss_client(&silt, &certs).await;
    client.connect("wss-pub", &[]).await;
    let mut publish = Publish::new("wss/in", &b"over wss"[..]);
    publish.qos = QoS::AtLeastOnce;
    publish.packet_id = PacketId::new(7);
    client.send(&[Packet::Publish(publish)]).await;
    match client.recv().await {
        Packet::PubAck(ack) => assert_eq!(ack.packet_id, PacketId::new(7).unwrap()),
        other => panic!("expected PUBACK, got {other:?}"),
    }
    let sub_done = tokio::task::spawn_blocking(move || sub.expect("over wss"));
    sub_done.await.unwrap();
    silt.stop();
}

/// A WebSocket-over-TLS connection that rests while idle (its TLS and WebSocket state kept
/// with its socket) is woken by a delivery and reads its next packet.
#[tokio::test]
async fn an_idle_websocket_over_tls_connection_rests_and_wakes() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let silt = start_wss(data.path(), &certs);
    let mut client = wss_client(&silt, &certs).await;
    client.connect("wss-rest", &[subscribe("wss-rest/#")]).await;
    assert!(matches!(client.recv().await, Packet::SubAck(a) if a.reason_codes == [ReasonCode::GrantedQoS1]));
    let resting = || silt.metric("silt_connections_resting{protocol=\"mqtt\"}");
    let deadline = std::time::Instant::now() + WAIT;
    while resting() < 1.0 {
        assert!(std::time::Instant::now() < deadline, "the idle connection never rested");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    mosquitto_pub(silt.port, None, "wss-rest/news", "while resting");
    expect_publish(client.recv().await, "wss-rest/news", b"while resting");
    client.send(&[Packet::PingReq]).await;
    assert_eq!(client.recv().await, Packet::PingResp);
    silt.stop();
}

/// `silt serve` with a WebSocket-over-TLS listener, from the keys of `[mqtt.websocket_tls]` in
/// a config file rather than the flags.
fn start_wss(data: &Path, certs: &Certs) -> Silt {
    let config = data.join("silt.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt.websocket_tls]\nlisten = \"127.0.0.1:0\"\npath = \"/mqtt\"\ncert_file = {:?}\nkey_file = {:?}\n",
            path_str(&certs.cert),
            path_str(&certs.key)
        ),
    )
    .unwrap();
    Silt::start_with(&data.join("data"), &["--config", path_str(&config)])
}

/// A client on the WebSocket-over-TLS listener, upgraded, before its CONNECT.
async fn wss_client(silt: &Silt, certs: &Certs) -> WsMqtt<tokio_rustls::client::TlsStream<TcpStream>> {
    let port = silt.listener_port("wss");
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let tls = tls_connector(&certs.der).connect(ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    ws_handshake(tls, port, "/mqtt", Some("mqtt")).await.unwrap()
}

#[tokio::test]
async fn websocket_upgrade_needs_the_mqtt_path_and_subprotocol() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let silt = start(data.path(), &certs);
    let port = silt.listener_port("ws");

    let status = |r: Result<WsMqtt<TcpStream>, tungstenite::Error>| match r {
        Err(tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
        Ok(_) => panic!("the upgrade was accepted"),
    };
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert_eq!(status(ws_handshake(tcp, port, "/other", Some("mqtt")).await), 404);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert_eq!(status(ws_handshake(tcp, port, "/mqtt", None).await), 400);
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert_eq!(status(ws_handshake(tcp, port, "/mqtt", Some("chat")).await), 400);

    // The listener still upgrades a proper request.
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut client = ws_handshake(tcp, port, "/mqtt", Some("mqtt")).await.unwrap();
    client.connect("ws-after-refusals", &[]).await;
    silt.stop();
}

#[test]
fn failed_handshakes_drop_only_their_own_connection() {
    let certs = certs();
    let data = tempfile::tempdir().unwrap();
    let silt = start(data.path(), &certs);
    let (tls, ws) = (silt.listener_port("tls"), silt.listener_port("ws"));

    // A client that never says anything holds a connection but not the listener.
    let _silent = std::net::TcpStream::connect(("127.0.0.1", tls)).unwrap();
    // A plaintext MQTT CONNECT where a TLS ClientHello belongs.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", tls)).unwrap();
    plain.write_all(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c").unwrap();
    assert!(closed_by_peer(&mut plain), "the TLS listener kept a non-TLS client");
    // Garbage where an HTTP upgrade belongs.
    let mut junk = std::net::TcpStream::connect(("127.0.0.1", ws)).unwrap();
    junk.write_all(b"\x16\x03\x01 not http at all\r\n\r\n").unwrap();
    assert!(closed_by_peer(&mut junk), "the WebSocket listener kept a non-HTTP client");

    let sub = mosquitto_sub(tls, Some(&certs.cert), "after/garbage");
    mosquitto_pub(silt.port, None, "after/garbage", "still serving");
    sub.expect("still serving");
    silt.stop();
}

#[test]
fn unreadable_certificate_fails_start_up_naming_the_key() {
    let data = tempfile::tempdir().unwrap();
    let missing = data.path().join("missing.pem");
    let out = Command::new(env!("CARGO_BIN_EXE_silt"))
        .args(["serve", "--mqtt", "127.0.0.1:0", "--mqtt-tls", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("data"))
        .args(["--tls-cert", path_str(&missing), "--tls-key", path_str(&missing)])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("mqtt.tls.cert_file") && stderr.contains("missing.pem"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_silt"))
        .args(["serve", "--mqtt", "127.0.0.1:0", "--mqtt-tls", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("mqtt.tls.cert_file: required"), "{stderr}");
}
