//! Resting: an idle connection kept in the little it must remember (its socket, its session,
//! the parked protocol core) until it has work again; see the parent module.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use bytes::BytesMut;
use silt_mqtt::server::{self, Close};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::{Conn, Core, Served, settings};
use crate::admission::OpenSlot;
use crate::broker::{Broker, ConnId, SessionRef, Signal};

/// An idle connection, kept in what it must remember while it waits for its next work: 152
/// bytes where its working form is 640, and a wait far smaller than the loop it serves in
/// (BENCHMARKS.md: about 0.7 KiB less per idle connection). See [`Conn::park`] and
/// [`Resting::rest`]. No field of the working form that can be found elsewhere is kept: the
/// client id is the signal's, the peer's address was logged at the CONNECT, and the server's
/// shutdown comes as a kick.
pub(crate) struct Resting<S> {
    broker: Arc<Broker>,
    io: S,
    core: server::Parked,
    username: super::Username,
    session: SessionRef,
    conn_id: ConnId,
    wake: Arc<Signal>,
    _open: OpenSlot,
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

/// A connection's task, written out as the states it moves through instead of an `async`
/// block over combinators, so that the future every connection keeps is its resting form and
/// little more: the block kept a tag per layer, 24 bytes on every idle connection (see
/// `the_connection_future_stays_small`). Only [`Task::Resting`] is inline; the other states,
/// short or busy, are boxed.
pub(crate) enum Task<S> {
    /// The handshake: the transport's bytes up to the CONNECT's answer.
    Accepting(Pin<Box<dyn Future<Output = Option<Conn<S>>> + Send>>),
    /// At rest, waiting for its next work.
    Resting(Resting<S>),
    /// Working: the connection inside the loop it serves in, one allocation per wake-up.
    Working(Pin<Box<dyn Future<Output = (Conn<S>, Served)> + Send>>),
    /// Closing ([`Conn::finish`]).
    Finishing(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// A connection over another transport than the task's (TLS, WebSocket): its handshake
    /// and its whole life in one box, so that plain TCP connections' tasks don't carry them
    /// ([`crate::server::serve_one`]).
    Other(Pin<Box<dyn Future<Output = ()> + Send>>),
    Done,
}

impl<S> Task<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// The connection's next turn of work: at once if it has work ([`Conn::at_rest`] says
    /// no), else a rest until it has.
    fn next(conn: Conn<S>) -> Self {
        match conn.park() {
            Ok(resting) => Task::Resting(resting.rest()),
            Err(working) => Task::Working(Box::pin(working.serve())),
        }
    }
}

impl<S> Future for Task<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let task = self.get_mut();
        loop {
            let next = match task {
                Task::Accepting(accept) => match ready!(accept.as_mut().poll(cx)) {
                    Some(conn) => Task::next(conn),
                    None => Task::Done,
                },
                Task::Resting(resting) => {
                    let woken = ready!(resting.poll_woken(cx));
                    let Task::Resting(resting) = std::mem::replace(task, Task::Done) else {
                        unreachable!("invariant: matched above")
                    };
                    Task::Working(Box::pin(resting.wake(woken).serve()))
                }
                Task::Working(serving) => match ready!(serving.as_mut().poll(cx)) {
                    (conn, Served::Idle) => Task::next(conn),
                    (conn, Served::Closed) => Task::Finishing(Box::pin(conn.finish())),
                },
                Task::Finishing(done) | Task::Other(done) => {
                    ready!(done.as_mut().poll(cx));
                    Task::Done
                }
                Task::Done => return Poll::Ready(()),
            };
            *task = next;
        }
    }
}

impl<S> Resting<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Begins the rest: keep alive's deadline goes to the broker's watch
    /// ([`KeepAlive`](crate::keep_alive::KeepAlive)), so no rest holds a timer. The server's
    /// shutdown arrives as a kick ([`Broker::kick_all`]).
    fn rest(self) -> Self {
        self.broker.stats.resting.fetch_add(1, Ordering::Relaxed);
        if let Some(deadline) = self.deadline() {
            self.broker.keep_alive.watch(deadline, self.conn_id, &self.wake);
        }
        self
    }

    /// What ends the rest, once something does: bytes from the client (read into the poll's
    /// stack, not into a buffer every resting connection would keep), the end of its stream,
    /// or the signal. One poll over both sources of work: they need no state between polls.
    fn poll_woken(&mut self, cx: &mut Context<'_>) -> Poll<Woken> {
        let mut buf = [0u8; WAKING_READ];
        let mut read = ReadBuf::new(&mut buf);
        if let Poll::Ready(r) = Pin::new(&mut self.io).poll_read(cx, &mut read) {
            return Poll::Ready(match r {
                Ok(()) if !read.filled().is_empty() => Woken::Read(BytesMut::from(read.filled())),
                _ => Woken::Lost,
            });
        }
        if self.wake.poll_woken(cx).is_ready() {
            return Poll::Ready(Woken::Signal);
        }
        Poll::Pending
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
        let Resting { broker, io, core, username, session, conn_id, wake, _open } = self;
        let core = Core::unpark(core, settings(&broker.config));
        Conn {
            broker,
            io,
            inbuf_released: inbuf.capacity() == 0,
            inbuf,
            core,
            username,
            session,
            conn_id,
            wake,
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
            username,
            session,
            conn_id,
            wake,
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
        Ok(Resting { broker, io, core, username, session, conn_id, wake, _open })
    }
}
