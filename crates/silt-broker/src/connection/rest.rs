//! Resting: an idle connection kept in the little it must remember (its socket, its session,
//! the parked protocol core) until it has work again; see the parent module.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use silt_mqtt::server::{self, Close};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;

use super::{Conn, Core, settings};
use crate::broker::{Broker, ConnId, SessionRef, Signal};

/// An idle connection, kept in what it must remember while it waits for its next work: 256
/// bytes where its working form is 728, and a wait far smaller than the loop it serves in
/// (BENCHMARKS.md: about 0.7 KiB less per idle connection). See [`Conn::park`] and
/// [`Resting::rest`].
pub(super) struct Resting<S> {
    broker: Arc<Broker>,
    io: S,
    core: server::Parked,
    peer: SocketAddr,
    client_id: crate::session::ClientId,
    username: Option<String>,
    session: SessionRef,
    conn_id: ConnId,
    wake: Arc<Signal>,
    shutdown: watch::Receiver<bool>,
    _open: OwnedSemaphorePermit,
}

/// What ended a rest.
enum Woken {
    Shutdown,
    Read(std::io::Result<usize>),
    /// Messages to pull, or a kick.
    Signal,
    /// The keep alive deadline.
    Timeout,
}

impl<S> Resting<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Waits for the connection's next work (bytes from the client, messages to pull, a kick,
    /// keep alive running out, the server shutting down) and returns the connection in its
    /// working form with that work to do.
    async fn rest(mut self) -> Box<Conn<S>> {
        self.broker.stats.resting.fetch_add(1, Ordering::Relaxed);
        let mut inbuf = BytesMut::new();
        let deadline = self.core.poll_timeout().map(Instant::from_std);
        let woken = tokio::select! {
            biased;
            _ = self.shutdown.changed() => Woken::Shutdown,
            read = self.io.read_buf(&mut inbuf) => Woken::Read(read),
            _ = self.wake.notified() => Woken::Signal,
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => Woken::Timeout,
        };
        self.broker.stats.resting.fetch_sub(1, Ordering::Relaxed);
        let mut conn = Box::new(self.resume(inbuf));
        match woken {
            Woken::Shutdown => conn.core.close(Close::Shutdown),
            Woken::Read(Ok(0) | Err(_)) => conn.core.close(Close::Lost),
            Woken::Read(Ok(n)) => {
                conn.broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
            }
            Woken::Signal => conn.want_pull = true,
            Woken::Timeout => conn.core.handle_timeout(Instant::now().into_std()),
        }
        conn
    }

    /// The working form again, with what the rest read.
    fn resume(self, inbuf: BytesMut) -> Conn<S> {
        let Resting { broker, io, core, peer, client_id, username, session, conn_id, wake, shutdown, _open } = self;
        let core = Core::unpark(core, settings(&broker.config));
        Conn {
            broker,
            io,
            inbuf_released: inbuf.capacity() == 0,
            inbuf,
            core,
            peer,
            client_id,
            username,
            session,
            conn_id,
            wake,
            shutdown,
            stores: VecDeque::new(),
            group: None,
            retained_queue: VecDeque::new(),
            want_pull: false,
            sent: 0,
            qos2_unpersisted: Vec::new(),
            closed: None,
            _open,
        }
    }
}

/// Rests `conn` if it is at rest ([`Conn::park`]), until it has work; otherwise gives it back
/// at once. A plain function, so that no moved-out binding of the resting form is kept beside
/// the rest's own future (the future of `run` keeps every local that lives across an await).
pub(super) fn idle<S>(conn: Box<Conn<S>>) -> impl Future<Output = Box<Conn<S>>> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    use futures_util::future::Either;
    match conn.park() {
        Ok(resting) => Either::Left(resting.rest()),
        Err(working) => Either::Right(std::future::ready(working)),
    }
}

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Whether the connection has nothing in flight and nothing to do, here or in its core.
    pub(super) fn at_rest(&self) -> bool {
        self.core.is_at_rest()
            && self.stores.is_empty()
            && self.group.as_ref().is_none_or(|g| g.records.is_empty())
            && self.retained_queue.is_empty()
            && !self.want_pull
            && self.sent == 0
            && self.qos2_unpersisted.is_empty()
            && self.inbuf.is_empty()
            && self.closed.is_none()
            && self.wake.kicked().is_none()
    }

    /// The connection in its resting form, if it is at rest ([`Conn::at_rest`]); otherwise
    /// itself back.
    pub(super) fn park(self: Box<Self>) -> Result<Resting<S>, Box<Self>> {
        if !self.at_rest() {
            return Err(self);
        }
        // Every field named: one added to the connection must be decided on here.
        let Conn {
            broker,
            io,
            inbuf: _,
            inbuf_released: _,
            core,
            peer,
            client_id,
            username,
            session,
            conn_id,
            wake,
            shutdown,
            stores: _,
            group: _,
            retained_queue: _,
            want_pull: _,
            sent: _,
            qos2_unpersisted: _,
            closed: _,
            _open,
        } = *self;
        let Ok(core) = core.park() else { unreachable!("invariant: the core is at rest (checked above)") };
        Ok(Resting { broker, io, core, peer, client_id, username, session, conn_id, wake, shutdown, _open })
    }
}
