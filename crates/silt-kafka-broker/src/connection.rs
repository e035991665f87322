//! One Kafka connection: frames in, responses out, one request at a time and in order (as a
//! Kafka broker serves a connection: a fetch that waits holds the requests behind it, which
//! is why clients fetch on connections of their own).
//!
//! A frame larger than `kafka.max_request_bytes`, an unknown API key, an unsupported version
//! (but ApiVersions) or a body that does not decode closes the connection, with a log line
//! naming the peer, the client id when known, and the reason (rate-limited: a peer can repeat
//! it at will). Nothing of another connection is touched.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use silt_dataset::log_limit::{self, LogLimit};
use silt_kafka::codec::{decode_request, encode_response, take_frame};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use crate::apis::{self, Ctx, Outcome};
use crate::node::Kafka;

static CLOSED: LogLimit = LogLimit::new(log_limit::EVERY);

fn closing(peer: SocketAddr, client: &str, why: &dyn std::fmt::Display) {
    if let Some(suppressed) = CLOSED.check() {
        tracing::warn!(%peer, client_id = %client, reason = %why, suppressed, "kafka connection closed");
    }
}

pub async fn serve<S>(kafka: Arc<Kafka>, stream: S, peer: SocketAddr, mut shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(1024);
    let max = kafka.config.max_request_bytes;
    loop {
        loop {
            let frame = match take_frame(&mut buf, max) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return closing(peer, "", &e),
            };
            let req = match decode_request(frame) {
                Ok(r) => r,
                Err(e) => return closing(peer, "", &e),
            };
            let (key, version, correlation) = (req.key, req.version, req.correlation_id());
            let ctx = Ctx { peer, client_id: req.client_id().to_owned() };
            let outcome = tokio::select! {
                o = apis::handle(&kafka, &ctx, req) => o,
                _ = shutdown.changed() => return,
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
                Outcome::Close(why) => return closing(peer, &ctx.client_id, &why),
            }
        }
        // Give a burst's buffer back once it is drained: an idle connection costs little.
        if buf.is_empty() && buf.capacity() > 1 << 20 {
            buf = BytesMut::with_capacity(1024);
        }
        if buf.capacity() == buf.len() {
            buf.reserve(buf.len().max(1024));
        }
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            _ = shutdown.changed() => {
                let _ = wr.shutdown().await;
                return;
            }
        }
    }
}
