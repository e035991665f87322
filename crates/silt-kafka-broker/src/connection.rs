//! One Kafka connection: frames in, responses out, one request at a time and in order (as a
//! Kafka broker serves a connection: a fetch that waits holds the requests behind it, which
//! is why clients fetch on connections of their own).
//!
//! A frame larger than `kafka.max_request_bytes` (before authentication:
//! [`crate::sasl::PRE_AUTH_MAX_FRAME`]), an unknown API key, an unsupported version (but
//! ApiVersions), a body that does not decode, a request before a required authentication or a
//! failed one closes the connection, with a log line naming the peer, the client id when known,
//! and the reason (rate-limited: a peer can repeat it at will). So does silence: no
//! authentication within `kafka.auth_timeout_ms` where one is required, or no request for
//! `kafka.connections_max_idle_ms`. Nothing of another connection is touched.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use silt_dataset::log_limit::{self, LogLimit};
use silt_kafka::codec::{Body, decode_request, encode_response, take_frame};
use silt_kafka::kafka_protocol::messages::{RequestKind, ResponseKind, SaslAuthenticateRequest};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

use crate::apis::{self, Ctx, Outcome};
use crate::node::Kafka;
use crate::sasl::Session;

static CLOSED: LogLimit = LogLimit::new(log_limit::EVERY);

fn closing(peer: SocketAddr, client: &str, why: &dyn std::fmt::Display) {
    if let Some(suppressed) = CLOSED.check() {
        tracing::warn!(%peer, client_id = %client, reason = %why, suppressed, "kafka connection closed");
    }
}

/// Serves one connection; `tls` says which listener it came by (what Metadata names).
pub async fn serve<S>(kafka: Arc<Kafka>, stream: S, peer: SocketAddr, tls: bool, mut shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(1024);
    let mut session = Session::new(&kafka.auth, peer);
    let auth_deadline = Instant::now() + Duration::from_millis(kafka.config.auth_timeout_ms);
    let idle = Duration::from_millis(kafka.config.connections_max_idle_ms);
    let mut last_request = Instant::now();
    let mut client_id = String::new();
    loop {
        loop {
            let frame = match take_frame(&mut buf, session.max_frame(&kafka.config)) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(silt_kafka::codec::FrameError::TooLarge { size, max }) if !session.authenticated() => {
                    let why = format!("frame of {size} bytes before authentication (at most {max} until SASL is done)");
                    return closing(peer, &client_id, &why);
                }
                Err(e) => return closing(peer, &client_id, &e),
            };
            last_request = Instant::now();
            if session.raw() {
                // A raw SASL message after a v0 handshake; answered raw, or the connection
                // closed on failure.
                let req = SaslAuthenticateRequest::default().with_auth_bytes(frame);
                let a = tokio::select! {
                    a = session.authenticate(&kafka.auth, req, peer) => a,
                    _ = shutdown.changed() => return,
                };
                if let Some(why) = a.close {
                    return closing(peer, &client_id, &why);
                }
                let token = a.response.auth_bytes;
                let mut out = BytesMut::with_capacity(4 + token.len());
                out.extend_from_slice(&(token.len() as u32).to_be_bytes());
                out.extend_from_slice(&token);
                if wr.write_all(&out).await.is_err() {
                    return;
                }
                continue;
            }
            let req = match decode_request(frame) {
                Ok(r) => r,
                Err(e) => return closing(peer, &client_id, &e),
            };
            // An ApiVersions request of a version not spoken is answered in v0 (the client
            // reads the versions there and asks again).
            let answer_version = if req.body == Body::UnsupportedApiVersions { 0 } else { req.version };
            let (key, version, correlation) = (req.key, answer_version, req.correlation_id());
            req.client_id().clone_into(&mut client_id);
            let (outcome, close) = match req.body {
                Body::Decoded(body) => match *body {
                    RequestKind::SaslHandshake(r) => {
                        let a = session.handshake(&kafka.auth, &kafka.config, &r, version);
                        (Outcome::Respond(Box::new(ResponseKind::SaslHandshake(a.response))), a.close)
                    }
                    RequestKind::SaslAuthenticate(r) => {
                        let a = tokio::select! {
                            a = session.authenticate(&kafka.auth, r, peer) => a,
                            _ = shutdown.changed() => return,
                        };
                        (Outcome::Respond(Box::new(ResponseKind::SaslAuthenticate(a.response))), a.close)
                    }
                    RequestKind::ApiVersions(_) => (apis::api_versions(0), None),
                    body => {
                        if let Err(why) = session.admit() {
                            return closing(peer, &client_id, &why);
                        }
                        let ctx = Ctx { peer, client_id: client_id.clone(), user: session.user.clone(), tls };
                        let req = silt_kafka::codec::Request { body: Body::Decoded(Box::new(body)), ..req };
                        let outcome = tokio::select! {
                            o = apis::handle(&kafka, &ctx, req) => o,
                            _ = shutdown.changed() => return,
                        };
                        (outcome, None)
                    }
                },
                Body::UnsupportedApiVersions => {
                    (apis::api_versions(silt_kafka::kafka_protocol::ResponseError::UnsupportedVersion.code()), None)
                }
            };
            match outcome {
                Outcome::Respond(body) => {
                    let bytes = match encode_response(key, version, correlation, &body) {
                        Ok(b) => b,
                        Err(e) => {
                            tracing::error!(%peer, ?key, version, error = %e, "a kafka response failed to encode");
                            return;
                        }
                    };
                    if wr.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                Outcome::Silent => {}
                Outcome::Close(why) => return closing(peer, &client_id, &why),
            }
            if let Some(why) = close {
                let _ = wr.flush().await;
                return closing(peer, &client_id, &why);
            }
        }
        // Give a burst's buffer back once it is drained: an idle connection costs little.
        if buf.is_empty() && buf.capacity() > 1 << 20 {
            buf = BytesMut::with_capacity(1024);
        }
        if buf.capacity() == buf.len() {
            buf.reserve(buf.len().max(1024));
        }
        let (deadline, why) = if session.authenticated() || last_request + idle < auth_deadline {
            (last_request + idle, "idle for kafka.connections_max_idle_ms")
        } else {
            (auth_deadline, "not authenticated within kafka.auth_timeout_ms")
        };
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            _ = tokio::time::sleep_until(deadline) => return closing(peer, &client_id, &why),
            _ = shutdown.changed() => {
                let _ = wr.shutdown().await;
                return;
            }
        }
    }
}
