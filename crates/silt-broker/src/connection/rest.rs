//! Resting: an idle connection kept in the little it must remember (its socket, its session,
//! the parked protocol core) until it has work again; see the parent module.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::BytesMut;
use silt_mqtt::server::{self, Close};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;

use super::{Conn, Core, settings};
use crate::broker::{Broker, ConnId, SessionRef, Signal};

/// An idle connection, kept in what it must remember while it waits for its next work: 248
/// bytes where its working form is 728, and a wait far smaller than the loop it serves in
/// (BENCHMARKS.md: about 0.7 KiB less per idle connection). See [`Conn::park`] and
/// [`Resting::rest`].
pub(super) struct Resting<S> {
    broker: Arc<Broker>,
    io: S,
    core: server::Parked,
    peer: SocketAddr,
    client_id: crate::session::ClientId,
    username: Option<Box<str>>,
    session: SessionRef,
    conn_id: ConnId,
    wake: Arc<Signal>,
    shutdown: watch::Receiver<bool>,
    _open: OwnedSemaphorePermit,
}

/// What ended a rest.
enum Woken {
    /// Bytes from the client.
    Read(BytesMut),
    /// The client's end of the stream, or an error reading it.
    Lost,
    /// Messages to pull, a kick (a takeover, an operator's close, the server's shutdown), or
    /// the keep alive deadline ([`KeepAlive`](crate::keep_alive::KeepAlive)).
    Signal,
}

/// How many bytes a rest reads when the client sends again: enough for the usual next packet
/// (a PINGREQ, a small PUBLISH); more is read by the working loop. Read into the poll's stack,
/// not into a buffer every resting connection would keep.
const WAKING_READ: usize = 256;

/// A rest: what every idle connection's task holds. One poll over its two sources of work
/// instead of a `select!` of their futures or an `async fn` (which would keep the resting form
/// twice, its argument and the binding its body moves it to): a read and a signal need no
/// state between polls. Keep alive's deadline wakes the signal too, from the broker's
/// [`KeepAlive`](crate::keep_alive::KeepAlive), so no rest holds a timer.
pub(super) struct Rest<S> {
    resting: Option<Resting<S>>,
}

impl<S> Future for Rest<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    type Output = Conn<S>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Conn<S>> {
        let resting = self.resting.as_mut().expect("invariant: a rest is not polled after it ended");
        let mut buf = [0u8; WAKING_READ];
        let mut read = ReadBuf::new(&mut buf);
        let woken = if let Poll::Ready(r) = Pin::new(&mut resting.io).poll_read(cx, &mut read) {
            match r {
                Ok(()) if !read.filled().is_empty() => Woken::Read(BytesMut::from(read.filled())),
                _ => Woken::Lost,
            }
        } else if resting.wake.poll_woken(cx).is_ready() {
            Woken::Signal
        } else {
            return Poll::Pending;
        };
        let resting = self.resting.take().expect("invariant: checked above");
        Poll::Ready(resting.wake(woken))
    }
}

impl<S> Resting<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Waits for the connection's next work (bytes from the client, messages to pull, a kick,
    /// keep alive running out) and returns the connection in its working form with that work
    /// to do. The server's shutdown arrives as a kick ([`Broker::kick_all`]).
    pub(super) fn rest(self) -> Rest<S> {
        self.broker.stats.resting.fetch_add(1, Ordering::Relaxed);
        if let Some(deadline) = self.deadline() {
            self.broker.keep_alive.watch(deadline, self.conn_id, &self.wake);
        }
        Rest { resting: Some(self) }
    }

    /// The protocol's next deadline (keep alive's), unchanged while the connection rests.
    fn deadline(&self) -> Option<Instant> {
        self.core.poll_timeout().map(Instant::from_std)
    }

    /// The working form, with the work that ended the rest.
    fn wake(self, mut woken: Woken) -> Conn<S> {
        self.broker.stats.resting.fetch_sub(1, Ordering::Relaxed);
        let deadline = self.deadline();
        if let Some(deadline) = deadline {
            self.broker.keep_alive.cancel(deadline, self.conn_id);
        }
        let inbuf = match &mut woken {
            Woken::Read(read) => std::mem::take(read),
            _ => BytesMut::new(),
        };
        let mut conn = self.resume(inbuf);
        match woken {
            Woken::Read(_) => {
                conn.broker.stats.bytes_received.fetch_add(conn.inbuf.len() as u64, Ordering::Relaxed);
            }
            Woken::Lost => conn.core.close(Close::Lost),
            Woken::Signal => {
                conn.want_pull = true;
                let now = Instant::now();
                if deadline.is_some_and(|d| d <= now) {
                    conn.core.handle_timeout(now.into_std());
                }
            }
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

/// The connection's next turn of work: at once if it has work ([`Conn::at_rest`] says no),
/// else once its rest ends. The loop it serves in is boxed together with it: one allocation
/// while working, none while resting. A plain function, so that no binding of the connection
/// lives beside the rest's own future (the future of `run` keeps every local that lives across
/// an await), and so that every turn's loop is one type.
pub(super) fn next<S>(
    conn: Conn<S>,
) -> impl Future<Output = Pin<Box<impl Future<Output = (Conn<S>, super::Served)> + Send>>> + Send
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    use futures_util::FutureExt;
    use futures_util::future::Either;
    match conn.park() {
        Ok(resting) => Either::Left(resting.rest().map(|conn| Box::pin(conn.serve()))),
        Err(working) => Either::Right(std::future::ready(Box::pin(working.serve()))),
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
            // The shutdown reaches a resting connection only through its signal, as a kick
            // (`Broker::kick_all`); one that began before that kick could reach it must close.
            && !*self.shutdown.borrow()
            && self.shutdown.has_changed().is_ok()
    }

    /// The connection in its resting form, if it is at rest ([`Conn::at_rest`]); otherwise
    /// itself back.
    // The connection moves by value either way: boxing it is the allocation per wake-up this
    // form avoids.
    #[allow(clippy::result_large_err)]
    pub(super) fn park(self) -> Result<Resting<S>, Self> {
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
        } = self;
        let Ok(core) = core.park() else { unreachable!("invariant: the core is at rest (checked above)") };
        Ok(Resting { broker, io, core, peer, client_id, username, session, conn_id, wake, shutdown, _open })
    }
}
