//! MQTT transports beside plain TCP: TLS, WebSocket (`/mqtt`, subprotocol `mqtt`) and WebSocket
//! over TLS. Each turns an accepted TCP stream into a byte stream for `connection::run`, which
//! neither knows nor cares how the bytes travel.
//!
//! Why each crate:
//! - `tokio-rustls` (rustls with the `ring` provider, `tls12` on for older clients): TLS in Rust
//!   with no OpenSSL and no cmake/C++ build (aws-lc-rs would need one). rustls re-exports
//!   `rustls-pki-types`, whose `PemObject` reads PEM files, so `rustls-pemfile` is not needed.
//! - `tokio-tungstenite` (only `handshake`): the HTTP upgrade and RFC 6455 framing (masking,
//!   fragments, ping/pong, close); no client, URL or TLS features.
//! - `futures-util` (`sink`): the `Stream`/`Sink` traits that the WebSocket stream implements;
//!   already in `tokio-tungstenite`'s tree.
//!
//! Invariants: a failed or slow TLS handshake or WebSocket upgrade ends only that connection,
//! after at most [`HANDSHAKE_TIMEOUT`]; the handshake runs on the connection's own task while it
//! holds a connection permit, so the accept loop never waits on a peer. MQTT packets may span
//! WebSocket messages or share one: the adapter is a byte stream, not a packet stream.
//!
//! Not provided: client certificate authentication, ALPN, `X-Forwarded-For` (the peer address
//! is the TCP peer's, which is what the loopback rule of authentication sees).

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header::SEC_WEBSOCKET_PROTOCOL};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::config::MqttConfig;

/// Longest a TLS handshake plus WebSocket upgrade may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest WebSocket frame the broker sends: a big batch of packets goes out as several
/// frames, so a client's frame-size limit is not what bounds the broker's batch size.
const MAX_OUT_FRAME: usize = 64 * 1024;
/// WebSocket subprotocols accepted, in order of preference: `mqtt` (MQTT 3.1.1 and 5.0) and
/// `mqttv3.1` (what MQTT 3.1 clients offer).
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

/// A listener could not be set up. The message names the config key.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("{key}: {detail}")]
    Config { key: String, detail: String },
    #[error("{key} {addr}: {source}")]
    Bind { key: String, addr: String, source: io::Error },
}

/// How bytes travel on a listener.
#[derive(Clone)]
pub enum Transport {
    Tcp,
    Tls(TlsAcceptor),
    Ws(Arc<WsSettings>),
    Wss(TlsAcceptor, Arc<WsSettings>),
}

impl Transport {
    /// The listener's kind as logged: `tcp`, `tls`, `ws` or `wss`.
    pub fn kind(&self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Tls(_) => "tls",
            Transport::Ws(_) => "ws",
            Transport::Wss(..) => "wss",
        }
    }
}

/// What a WebSocket upgrade accepts.
pub struct WsSettings {
    path: String,
    config: WebSocketConfig,
}

impl WsSettings {
    /// `path` is the only request path upgraded; messages are limited to one MQTT packet of
    /// `max_packet_size` plus its fixed header.
    pub fn new(path: &str, max_packet_size: u32) -> Self {
        let max = max_packet_size as usize + 5;
        let config = WebSocketConfig::default().max_message_size(Some(max)).max_frame_size(Some(max));
        Self { path: path.to_owned(), config }
    }
}

/// A bound listener and its transport.
pub struct Listener {
    pub(crate) tcp: TcpListener,
    pub(crate) transport: Transport,
}

impl Listener {
    pub fn new(tcp: TcpListener, transport: Transport) -> Self {
        Self { tcp, transport }
    }

    /// Binds every listener the config names: `mqtt.listen`, then `mqtt.tls`,
    /// `mqtt.websocket` and `mqtt.websocket_tls` when set. Certificates are loaded first, so a
    /// bad file fails start-up with the key named, before anything is bound.
    pub async fn bind_all(config: &MqttConfig) -> Result<Vec<Listener>, ListenerError> {
        let mut planned = vec![("mqtt.listen", config.listen.clone(), Transport::Tcp)];
        if let Some(t) = &config.tls {
            let acceptor = tls_acceptor("mqtt.tls", &t.cert_file, &t.key_file)?;
            planned.push(("mqtt.tls.listen", t.listen.clone(), Transport::Tls(acceptor)));
        }
        if let Some(w) = &config.websocket {
            let ws = Arc::new(WsSettings::new(&w.path, config.max_packet_size));
            planned.push(("mqtt.websocket.listen", w.listen.clone(), Transport::Ws(ws)));
        }
        if let Some(w) = &config.websocket_tls {
            let acceptor = tls_acceptor("mqtt.websocket_tls", &w.cert_file, &w.key_file)?;
            let ws = Arc::new(WsSettings::new(&w.path, config.max_packet_size));
            planned.push(("mqtt.websocket_tls.listen", w.listen.clone(), Transport::Wss(acceptor, ws)));
        }
        let mut bound = Vec::with_capacity(planned.len());
        for (key, addr, transport) in planned {
            let tcp = TcpListener::bind(&addr).await.map_err(|source| ListenerError::Bind {
                key: key.into(),
                addr: addr.clone(),
                source,
            })?;
            bound.push(Listener { tcp, transport });
        }
        Ok(bound)
    }

    pub fn kind(&self) -> &'static str {
        self.transport.kind()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// A TLS server config from PEM files (see [`silt_auth::tls::acceptor`]).
pub fn tls_acceptor(key: &str, cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, ListenerError> {
    silt_auth::tls::acceptor(key, cert_file, key_file)
        .map_err(|e| ListenerError::Config { key: e.key, detail: e.detail })
}

/// A byte stream of any transport, boxed so the connection code is compiled once for all the
/// non-TCP transports.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Runs the transport's handshake on an accepted stream (TLS, then the WebSocket upgrade).
/// Errors concern this peer only; the caller bounds the time.
pub(crate) async fn upgrade(transport: &Transport, tcp: TcpStream) -> io::Result<Box<dyn Io>> {
    match transport {
        Transport::Tcp => Ok(Box::new(tcp)),
        Transport::Tls(tls) => Ok(Box::new(tls.accept(tcp).await?)),
        Transport::Ws(ws) => Ok(Box::new(ws_accept(tcp, ws).await?)),
        Transport::Wss(tls, ws) => {
            let stream = tls.accept(tcp).await?;
            Ok(Box::new(ws_accept(stream, ws).await?))
        }
    }
}

/// The server side of the WebSocket upgrade: only `settings.path`, only with an MQTT
/// subprotocol offered, which is echoed back.
async fn ws_accept<S>(stream: S, settings: &WsSettings) -> io::Result<WsIo<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    #[allow(clippy::result_large_err, reason = "the signature of tungstenite's Callback")]
    let check = |req: &Request, mut resp: Response| -> Result<Response, ErrorResponse> {
        if req.uri().path() != settings.path {
            return Err(refusal(StatusCode::NOT_FOUND, "no MQTT endpoint here"));
        }
        let chosen =
            choose_subprotocol(req.headers().get_all(SEC_WEBSOCKET_PROTOCOL).iter().filter_map(|v| v.to_str().ok()));
        let Some(proto) = chosen else {
            return Err(refusal(StatusCode::BAD_REQUEST, "the WebSocket subprotocol \"mqtt\" is required"));
        };
        resp.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(proto));
        Ok(resp)
    };
    let ws = tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(settings.config))
        .await
        .map_err(ws_to_io)?;
    Ok(WsIo { ws, rd: Bytes::new(), eof: false })
}

/// The first of [`SUBPROTOCOLS`] that the client offers in its (comma-separated, possibly
/// repeated) `Sec-WebSocket-Protocol` headers.
fn choose_subprotocol<'a>(offered: impl Iterator<Item = &'a str>) -> Option<&'static str> {
    let offered: Vec<&str> = offered.flat_map(|v| v.split(',')).map(str::trim).collect();
    SUBPROTOCOLS.into_iter().find(|p| offered.contains(p))
}

fn refusal(status: StatusCode, why: &str) -> ErrorResponse {
    let mut resp = ErrorResponse::new(Some(why.to_owned()));
    *resp.status_mut() = status;
    resp
}

fn ws_to_io(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        e => io::Error::new(io::ErrorKind::InvalidData, e),
    }
}

/// Binary WebSocket messages as a byte stream. Reads hand out each message's bytes in order;
/// each write goes out as one binary message of at most [`MAX_OUT_FRAME`] bytes. Ping and pong
/// are answered by tungstenite; a close or the end of the stream reads as end-of-file; a text
/// message is an error (MQTT over WebSocket is binary only).
pub(crate) struct WsIo<S> {
    ws: WebSocketStream<S>,
    /// The unread rest of the last binary message.
    rd: Bytes,
    eof: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.rd.is_empty() {
                let n = this.rd.len().min(buf.remaining());
                buf.put_slice(&this.rd.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.rd = data,
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
                Some(Ok(Message::Close(_))) | None => this.eof = true,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text WebSocket message: MQTT needs binary messages",
                    )));
                }
                Some(Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed)) => this.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(ws_to_io(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        ready!(Pin::new(&mut this.ws).poll_ready(cx)).map_err(ws_to_io)?;
        let n = buf.len().min(MAX_OUT_FRAME);
        Pin::new(&mut this.ws).start_send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).map_err(ws_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws).poll_flush(cx).map_err(ws_to_io)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().ws).poll_close(cx).map_err(ws_to_io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_subprotocol_is_chosen_from_a_list() {
        assert_eq!(choose_subprotocol(["chat, mqtt"].into_iter()), Some("mqtt"));
        assert_eq!(choose_subprotocol(["mqttv3.1", "mqtt"].into_iter()), Some("mqtt"));
        assert_eq!(choose_subprotocol(["mqttv3.1"].into_iter()), Some("mqttv3.1"));
        assert_eq!(choose_subprotocol(["chat", "MQTTX"].into_iter()), None);
        assert_eq!(choose_subprotocol(std::iter::empty()), None);
    }

    #[tokio::test]
    async fn packets_may_span_and_share_websocket_messages() {
        use futures_util::{SinkExt, StreamExt};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tungstenite::protocol::Role;

        let connect = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01c\xc0\x00\xc0\x00";
        let big = vec![7u8; 3 * MAX_OUT_FRAME + 10];
        let (client, server) = tokio::io::duplex(1 << 16);
        let config = WsSettings::new("/mqtt", 1 << 20).config;
        let reply = big.clone();
        let server = tokio::spawn(async move {
            let ws = WebSocketStream::from_raw_socket(server, Role::Server, Some(config)).await;
            let mut io = WsIo { ws, rd: Bytes::new(), eof: false };
            let mut got = vec![0; connect.len()];
            io.read_exact(&mut got).await.unwrap();
            io.write_all(&reply).await.unwrap();
            io.shutdown().await.unwrap();
            got
        });
        let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        // A CONNECT cut in two, its second half sharing a message with a PINGREQ's first byte.
        ws.send(Message::Binary(Bytes::copy_from_slice(&connect[..3]))).await.unwrap();
        ws.send(Message::Binary(Bytes::copy_from_slice(&connect[3..16]))).await.unwrap();
        ws.send(Message::Ping(Bytes::new())).await.unwrap();
        ws.send(Message::Binary(Bytes::copy_from_slice(&connect[16..]))).await.unwrap();
        let (mut received, mut messages) = (Vec::new(), 0);
        while let Some(m) = ws.next().await {
            match m.unwrap() {
                Message::Binary(b) => {
                    received.extend_from_slice(&b);
                    messages += 1;
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        assert_eq!(server.await.unwrap(), connect.to_vec());
        assert_eq!(received, big);
        assert_eq!(messages, 4, "writes are cut into frames of at most MAX_OUT_FRAME");
    }
}
