//! One MQTT connection's I/O: the tokio driver of a sans-I/O [`silt_mqtt::server::Connection`]
//! (the "core"). The driver reads bytes into the core, executes the core's requests against
//! the broker and the session (credentials, ACLs, stores, subscriptions, settling cursors),
//! feeds the answers back, writes what the core transmits and sleeps until its deadline.
//! Every protocol decision — what to acknowledge and when, flow control, keep alive, reason
//! codes — is the core's; policy, sessions and storage are the broker's.
//!
//! Inbound QoS 1/2 publishes are pipelined: each is handed to the log in arrival order and its
//! PUBACK/PUBREC goes out, in the same order, when the log reports it durable. Outbound
//! delivery is pull-based: a wake-up from the router (or an acknowledgement freeing the window)
//! makes the connection pull from its session's cursors; a subscriber that stops reading stops
//! the pulls, so its backlog stays in the log and not in memory.
//!
//! An idle connection rests: once a commit interval passes quietly with nothing in flight and
//! nothing to do, the connection is kept in a small form ([`Resting`]: its socket, its session
//! and what the protocol must remember) and its working state and loop are given back; its
//! next bytes, wake-up or kick, its keep alive deadline or the server's shutdown bring it back.
//! Most of an IoT broker's connections are idle most of the time, so this form is what they
//! cost.
//!
//! Modules: this one runs the handshake, the loop and the close; `inbound` executes the
//! core's requests about what the client sent; `outbound` pushes deliveries and settles them;
//! `rest` parks an idle connection and wakes it.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use silt_mqtt::server::{self, Close, Credentials, DelayedWill, Event, OpenRequest, Refusal, Settings, Stored, Token};
use silt_mqtt::{PacketId, PublishProperties, PublishView, QoS, Will};
use silt_storage::Appended;
use silt_types::Timestamp;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::admission::{Admission, OpenSlot, PendingSlot};
use crate::auth::{Access, AuthError};
use crate::broker::{Broker, ConnId, GroupRef, Kick, SessionRef, Signal};
use crate::config::MqttConfig;
use crate::message::Message;
use crate::session::OutboundQos2;
use silt_dataset::AckFuture;
use silt_dataset::log_limit::{self, LogLimit};

mod inbound;
mod outbound;
mod rest;

pub(crate) use rest::Task;

/// How long a client has to send CONNECT.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The read buffer a connection starts with, for its CONNECT; freed once the packets that came
/// with it are handled. Not of the size class of the task every connection keeps (256 bytes, see
/// `the_connection_future_stays_small`; it was 512 when this was chosen): a buffer freed from
/// that class leaves a hole beside each idle connection's task that the allocator cannot return
/// (measured, BENCHMARKS.md: 0.38 KiB of RSS per idle connection). Freed memory of a size class
/// no idle connection keeps goes back whole.
const HANDSHAKE_BUFFER: usize = 1024;
/// Most messages pulled per wake-up before the loop services the socket again.
const PULL_BATCH: usize = 256;
/// Most publishes of one read handed to the log as one batch, and their bytes (a lone
/// publish goes alone at any size; see [`Group`]).
const GROUP_RECORDS: usize = 512;
const GROUP_BYTES: usize = 256 << 10;
/// What a record's batch may add beside it, counted against the group's bytes: a retained
/// message's pointer, a new stream's registration.
const GROUP_RECORD_OVERHEAD: usize = 256;

/// The tokens a store answers: one per QoS 1/2 publish of its group, none for QoS 0 ones.
type Tokens = smallvec::SmallVec<[Token; 4]>;

/// Publishes read together (one read from the socket), handed to the log as one batch when
/// the read's packets are done: one append, one acknowledgement and one index round for a
/// client's burst instead of one each. A batch is acknowledged as a whole, so a group keeps to
/// one tiering decision (a memory-tier publish never waits for an fsync, nor a local-ack one
/// for an upload, because of its neighbours) and every PUBACK of the group waits for the same
/// fsync the first would have; a group never waits for more input.
#[derive(Default)]
struct Group {
    tier: silt_dataset::TierDecision,
    records: Vec<silt_storage::Record>,
    tokens: Tokens,
    bytes: usize,
    /// Whether any publish waits for its acknowledgement (QoS 1/2).
    acked: bool,
    received: Option<std::time::Instant>,
    /// The client id as the records' publisher header: one copy for every record.
    publisher: Option<bytes::Bytes>,
}

/// An outbound QoS 1/2 message waiting for the client: what its completion settles.
struct Inflight {
    settles: crate::session::Settles,
    /// The shared group the message came from (its cursor settles it), if any.
    group: Option<GroupRef>,
}

type Core = server::Connection<Inflight>;

/// The core's last event: why it closed, and the will to publish.
type Closed = (Close, Option<DelayedWill>);

/// A connection's admission: the pending slot it holds until its CONNECT is answered, and
/// the pool its open slot comes from.
pub(crate) struct Admitted {
    pub slot: PendingSlot,
    pub admission: Arc<Admission>,
}

/// Serves one connection: the handshake, then the connection until it closes (resting while
/// it is idle), then the close.
///
/// A plain function returning the future: an `async fn`'s arguments stay in its future for
/// its whole life, and every connection would keep its socket, address and admission twice.
/// Here they go into the boxed handshake at once.
pub(crate) fn run<S>(
    broker: Arc<Broker>,
    stream: S,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    admitted: Admitted,
) -> Task<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Given back once the handshake has emptied it: an idle connection should cost little;
    // buffers grow with traffic.
    let inbuf = BytesMut::with_capacity(HANDSHAKE_BUFFER);
    let core = Core::new(Instant::now().into_std(), settings(&broker.config), rand_u64());
    // The handshake is boxed, as is a working connection with the loop it serves in: the
    // task every connection keeps is its resting form ([`Task`]).
    Task::Accepting(Box::pin(Conn::accept(broker, stream, inbuf, core, peer, shutdown, admitted)))
}

/// The client's username, if it gave one: a pointer to the boxed name, one word where
/// `Option<Box<str>>` is two and `String` three. Every connection's task keeps it, resting
/// ones too; only a client that gives a name pays the second allocation.
struct Username(Option<Box<Box<str>>>);

impl Username {
    fn as_deref(&self) -> Option<&str> {
        self.0.as_deref().map(|name| &**name)
    }
}

/// Why [`Conn::serve`] returned.
pub(crate) enum Served {
    Closed,
    /// A quiet commit interval passed with nothing in flight: the connection may rest.
    Idle,
}

/// The core's settings from the `[mqtt]` table.
fn settings(cfg: &MqttConfig) -> Settings {
    Settings {
        max_packet_size: cfg.max_packet_size,
        receive_maximum: cfg.receive_maximum,
        max_inflight: cfg.max_inflight,
        topic_alias_maximum: cfg.topic_alias_maximum,
        server_keep_alive: cfg.server_keep_alive_secs,
        max_session_expiry: cfg.max_session_expiry_secs,
        connect_timeout: CONNECT_TIMEOUT,
        max_connect_size: cfg.connect_limit(),
        max_topic_levels: cfg.max_topic_levels,
    }
}

pub(crate) struct Conn<S> {
    broker: Arc<Broker>,
    /// The client's byte stream, whole: it is read only while nothing is being written (the
    /// loop writes, then waits), so it needs no split into halves (an allocation and a lock
    /// taken on every read and write).
    io: S,
    inbuf: BytesMut,
    /// The read buffer was given back while the connection sat idle: the next read takes the
    /// 64 bytes `read_buf` reserves, and the buffer grows again from what arrives.
    inbuf_released: bool,
    core: Core,
    username: Username,
    session: SessionRef,
    conn_id: ConnId,
    /// New messages to pull, or a kick (a takeover, an operator's close, the server's
    /// shutdown: [`Broker::kick_all`], and see [`Conn::accept`]).
    wake: Arc<Signal>,
    /// Inbound publishes handed to the log, oldest first, with when each arrived: a QoS 1/2
    /// one (with its token) awaits durability for its acknowledgement; a QoS 0 one (no token)
    /// only for the work its append finishes (a retained pointer, a stream's registration).
    stores: VecDeque<(Tokens, AckFuture, std::time::Instant)>,
    /// Publishes not yet handed to the log (see [`Group`]); boxed, and given back when idle.
    group: Option<Box<Group>>,
    /// Retained messages owed to new subscriptions (message, granted QoS, subscription id).
    retained_queue: VecDeque<(Message, silt_mqtt::QoS, Option<u32>)>,
    want_pull: bool,
    /// Messages queued for the client since the last write, added to the broker's count there
    /// (one shared addition per write, not per message).
    sent: u32,
    /// QoS 2 deliveries queued but not yet persisted: written before the PUBLISH leaves.
    qos2_unpersisted: Vec<OutboundQos2>,
    /// Boxed: set once, at the close; every connection keeps the field.
    closed: Option<Box<Closed>>,
    /// The connection's open slot (`mqtt.max_connections`), held for its life.
    _open: OpenSlot,
}

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Runs the handshake: reads the CONNECT into the core and answers its requests
    /// (credentials, then the session) until it accepts or refuses.
    #[allow(clippy::too_many_arguments)]
    async fn accept(
        broker: Arc<Broker>,
        mut io: S,
        mut inbuf: BytesMut,
        mut core: Core,
        peer: SocketAddr,
        mut shutdown: watch::Receiver<bool>,
        admitted: Admitted,
    ) -> Option<Self> {
        static REFUSED: LogLimit = LogLimit::new(log_limit::EVERY);
        let mut username = None;
        loop {
            while core.handle_input(Instant::now().into_std(), &mut inbuf) {}
            while let Some(event) = core.poll_event() {
                match event {
                    Event::Authenticate(credentials) => {
                        username = credentials.username.as_deref().map(Box::from);
                        admitted.slot.waiting();
                        let verdict = authenticate(&broker, credentials, peer).await;
                        if let Err(refusal) = verdict
                            && let Some(suppressed) = REFUSED.check()
                        {
                            tracing::info!(%peer, user = ?username, reason = ?refusal, suppressed,
                                "connection refused (one line per 10 s; `suppressed` counts those left out)");
                        }
                        core.handle_authenticated(verdict);
                    }
                    Event::Open(request) => {
                        let OpenRequest { client_id, clean_start, session_expiry, will_topic } = *request;
                        if let Some(topic) = &will_topic
                            && !broker.auth.allows_topic(username.as_deref(), &client_id, Access::Write, topic)
                        {
                            tracing::info!(%peer, client_id = %client_id, "will topic not authorized");
                            core.refuse(Refusal::NotAuthorized);
                            continue;
                        }
                        let Some(open) = admitted.admission.open() else {
                            static FULL: LogLimit = LogLimit::new(log_limit::EVERY);
                            if let Some(suppressed) = FULL.check() {
                                tracing::warn!(%peer, limit = broker.config.max_connections, suppressed,
                                    "mqtt.max_connections reached; CONNECT refused with quota exceeded");
                            }
                            core.refuse(Refusal::QuotaExceeded);
                            continue;
                        };
                        let connected =
                            match broker.connect(&client_id, username.as_deref(), clean_start, session_expiry).await {
                                Ok(c) => c,
                                Err(crate::broker::ConnectRefused::NotOwner) => {
                                    tracing::info!(%peer, client_id = %client_id, user = ?username,
                                        "connection refused: the session belongs to another user");
                                    core.refuse(Refusal::NotAuthorized);
                                    continue;
                                }
                            };
                        // Only once the session is this client's: another user's refused
                        // CONNECT must not cancel the owner's will.
                        broker.cancel_will(&client_id);
                        let wake = connected.signal;
                        // The server's shutdown reaches a connection as a kick of its signal
                        // (`Broker::kick_all`, sent once the accept loop saw the shutdown): a
                        // working or resting connection keeps no receiver of its own. This one
                        // was registered (in `connect`) before this look, so a shutdown it does
                        // not see here kicks it later.
                        if *shutdown.borrow() || shutdown.has_changed().is_err() {
                            wake.kick(Kick::Shutdown);
                        }
                        {
                            let s = connected.session.lock().await;
                            let awaiting_release = s.inbound_qos2.iter().filter_map(|&id| PacketId::new(id));
                            core.accept(Instant::now().into_std(), connected.session_present, awaiting_release);
                            broker.route_all(connected.conn, &wake, &s);
                        }
                        let mut conn = Conn {
                            broker,
                            io,
                            inbuf,
                            inbuf_released: false,
                            core,
                            username: Username(username.map(Box::new)),
                            session: connected.session,
                            conn_id: connected.conn,
                            wake,
                            stores: VecDeque::new(),
                            group: None,
                            retained_queue: VecDeque::new(),
                            want_pull: true,
                            sent: 0,
                            qos2_unpersisted: Vec::new(),
                            closed: None,
                            _open: open,
                        };
                        drop(admitted);
                        if conn.flush().await.is_err() {
                            conn.broker.disconnect(conn.conn_id, &conn.session).await;
                            return None;
                        }
                        tracing::debug!(client_id = %conn.wake.client_id(), %peer, version = %conn.core.version(),
                            present = connected.session_present, "client connected");
                        conn.restore_inflight().await;
                        return Some(conn);
                    }
                    Event::Closed { reason, .. } => {
                        tracing::debug!(%peer, reason = ?reason, "CONNECT refused");
                        if let Some(refusal) = core.poll_transmit() {
                            let _ = io.write_all(&refusal).await;
                            let _ = io.flush().await;
                        }
                        return None;
                    }
                    _ => {} // nothing else comes before the CONNACK
                }
            }
            let deadline = core.poll_timeout().map(Instant::from_std);
            tokio::select! {
                read = io.read_buf(&mut inbuf) => match read {
                    Ok(n) if n > 0 => {}
                    _ => core.close(Close::Lost),
                },
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    core.handle_timeout(Instant::now().into_std());
                }
                _ = admitted.slot.evicted() => {
                    // Its pending slot went to a newer connection (see `admission`).
                    tracing::debug!(%peer, "connection evicted before its CONNECT completed");
                    return None;
                }
                _ = shutdown.changed() => return None,
            }
        }
    }

    /// Serves the connection until it closes, or until a quiet commit interval finds it with
    /// nothing in flight and nothing to do ([`Served::Idle`]: it may rest); gives it back.
    ///
    /// Not an `async fn`: that keeps its argument twice, as the argument and as the binding its
    /// body moves it to (the connection's 640 bytes again in the box every wake-up allocates).
    /// The block captures the connection once.
    fn serve(self) -> impl Future<Output = (Self, Served)> + Send {
        let mut conn = self;
        async move {
            let served = conn.serve_until_idle().await;
            (conn, served)
        }
    }

    async fn serve_until_idle(&mut self) -> Served {
        // Cursors are committed (and an idle connection's buffers given back) one interval
        // after activity, and once more after a quiet interval; then the timer rests until the
        // connection does something again, so an idle connection is never woken for nothing.
        // One deadline serves both this and the core's timers: an idle connection keeps one
        // timer, not two.
        let commit_every = Duration::from_millis(self.broker.config.cursor_commit_ms);
        let mut next_commit = Some(Instant::now() + commit_every);
        let mut active = false;
        // The steps between waits (reading packets, executing their requests, delivering) are
        // boxed: their futures are large, and inline they would set the size of the future
        // every idle connection keeps; boxed, they cost an allocation per wake-up.
        // Packets that arrived with the CONNECT (one TCP segment, one WebSocket message) are
        // already buffered: handle them now, not when the next bytes happen to arrive.
        Box::pin(self.read_packets()).await;
        self.release_idle_buffers();
        while self.core.is_open() {
            if let Some(kick) = self.wake.kicked() {
                self.core.close(match kick {
                    Kick::Operator => {
                        Close::Error(silt_mqtt::ReasonCode::AdministrativeAction, "disconnected by an operator")
                    }
                    Kick::TakenOver => Close::TakenOver,
                    Kick::Shutdown => Close::Shutdown,
                });
                break;
            }
            if self.want_pull || !self.retained_queue.is_empty() {
                Box::pin(self.deliver()).await;
            }
            if !self.core.is_open() {
                break;
            }
            if !self.qos2_unpersisted.is_empty() {
                let qos2 = {
                    let mut s = self.session.lock().await;
                    let mut qos2 = false;
                    for o in self.qos2_unpersisted.drain(..) {
                        qos2 |= o.qos == 2;
                        s.outbound_qos2.insert(o);
                    }
                    // QoS 1 ids ride with the next cursor commit; QoS 2 ones go now.
                    s.dirty = true;
                    qos2
                };
                if qos2 && let Err(e) = self.broker.persist(&self.session).await {
                    // Without the record, a restart could resend these as new messages.
                    tracing::warn!(client_id = %self.wake.client_id(), error = %e, "QoS 2 state not persisted");
                    self.core.close(Close::Error(
                        silt_mqtt::ReasonCode::UnspecifiedError,
                        "the session's QoS 2 state could not be stored",
                    ));
                    break;
                }
            }
            if self.flush().await.is_err() {
                self.core.close(Close::Lost);
                break;
            }
            // Quiet since the last commit (the timer rests): the connection may rest too.
            if next_commit.is_none() && self.at_rest() {
                return Served::Idle;
            }
            let core_deadline = self.core.poll_timeout().map(Instant::from_std);
            let deadline = match (core_deadline, next_commit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let has_pending = !self.stores.is_empty();
            // More to deliver right now (a full batch was pulled, or the window freed up): go
            // round again instead of waiting for a wake-up. A QoS 0 subscriber sends nothing
            // back, so nothing else would wake it.
            let more = self.want_pull && self.core.send_room() > 0;
            // Grow the read buffer only when a read filled it: a busy connection doubles it
            // towards its packet sizes; an idle one has given it back.
            if self.inbuf.capacity() == self.inbuf.len() && !self.inbuf_released {
                self.inbuf.reserve(self.inbuf.len().max(512));
            }
            let mut ticked = false;
            tokio::select! {
                biased;
                ack = async { (&mut self.stores.front_mut().expect("invariant: guarded").1).await }, if has_pending => {
                    self.stored(ack);
                    self.stored_ready();
                    if self.core.has_event() {
                        Box::pin(self.run_events()).await;
                    }
                }
                read = self.io.read_buf(&mut self.inbuf) => match read {
                    Ok(0) | Err(_) => self.core.close(Close::Lost),
                    Ok(n) => {
                        self.inbuf_released = false;
                        self.broker.stats.bytes_received.fetch_add(n as u64, Ordering::Relaxed);
                        Box::pin(self.read_packets()).await;
                    }
                },
                _ = self.wake.notified() => self.want_pull = true,
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                    let now = Instant::now();
                    if core_deadline.is_some_and(|d| d <= now) {
                        self.core.handle_timeout(now.into_std());
                        if self.core.has_event() {
                            Box::pin(self.run_events()).await;
                        }
                    }
                    if next_commit.is_some_and(|d| d <= now) {
                        ticked = true;
                        // Also the moment to give back the buffers and queues of an idle
                        // connection.
                        self.core.shrink_idle();
                        self.release_idle_buffers();
                        // A shared group's cursor can move through other members: keep
                        // committing while the session is in one.
                        let shared = Box::pin(self.commit_cursors()).await;
                        next_commit = (active || shared).then(|| now + commit_every);
                        active = false;
                    }
                }
                // Last, so that under continuous delivery the branches above still get their turn.
                _ = std::future::ready(()), if more => {}
            }
            if !ticked {
                active = true;
                next_commit.get_or_insert_with(|| Instant::now() + commit_every);
            }
        }
        Served::Closed
    }

    /// Gives back the read buffer and the store queue when they hold nothing: an idle
    /// connection should cost little.
    fn release_idle_buffers(&mut self) {
        if self.inbuf.is_empty() && self.inbuf.capacity() > 0 {
            self.inbuf = BytesMut::new();
            self.inbuf_released = true;
        }
        if self.stores.is_empty() && self.stores.capacity() > 0 {
            self.stores = VecDeque::new();
        }
        if self.group.as_ref().is_some_and(|g| g.records.is_empty()) {
            self.group = None;
        }
    }

    /// Feeds the core every whole packet buffered, executing the requests of each; the
    /// publishes among them go to the log together once all are read.
    async fn read_packets(&mut self) {
        let now = Instant::now().into_std();
        while self.core.handle_input(now, &mut self.inbuf) {
            self.run_events_grouped().await;
        }
        self.submit_group().await;
    }

    /// Answers the oldest store with its append's outcome.
    fn stored(&mut self, ack: silt_storage::Result<Appended>) {
        let (tokens, _, received) = self.stores.pop_front().expect("invariant: a store was pending");
        if tokens.is_empty() {
            return; // QoS 0: nothing to acknowledge
        }
        if ack.is_ok() {
            self.broker.stats.ack_latency.observe_n(received.elapsed(), tokens.len() as u64);
        }
        let stored = self.durable(ack);
        for token in tokens {
            self.core.handle_stored(token, stored);
        }
    }

    /// Answers every further store already answered by the log: a group commit answers many
    /// at once, and their acknowledgements then leave in one write, not one each.
    fn stored_ready(&mut self) {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        while let Some((_, next, _)) = self.stores.front_mut()
            && let std::task::Poll::Ready(ack) = next.as_mut().poll(&mut cx)
        {
            self.stored(ack);
        }
    }

    /// What a store's durability means for the client.
    fn durable(&self, result: silt_storage::Result<Appended>) -> Stored {
        match result {
            Ok(_) => Stored::Durable,
            Err(e) => {
                tracing::warn!(client_id = %self.wake.client_id(), error = %e, "publish not durable");
                Stored::Failed
            }
        }
    }

    /// Persists the session's and its shared groups' cursors if they moved. Returns whether
    /// the session is in a shared group.
    async fn commit_cursors(&mut self) -> bool {
        let (dirty, keys) = {
            let s = self.session.lock().await;
            (s.dirty, s.shared.keys().cloned().collect::<Vec<_>>())
        };
        if dirty && let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.wake.client_id(), error = %e, "cursor commit failed");
        }
        for key in &keys {
            if let Some(g) = self.broker.group(key)
                && g.lock().await.dirty
                && let Err(e) = self.broker.persist_group(&g).await
            {
                tracing::warn!(client_id = %self.wake.client_id(), error = %e, "shared cursor commit failed");
            }
        }
        !keys.is_empty()
    }

    /// Writes what the core has queued for the client.
    async fn flush(&mut self) -> std::io::Result<()> {
        if self.sent > 0 {
            self.broker.stats.messages_sent.fetch_add(u64::from(std::mem::take(&mut self.sent)), Ordering::Relaxed);
        }
        let Some(bytes) = self.core.poll_transmit() else { return Ok(()) };
        self.io.write_all(&bytes).await?;
        self.io.flush().await?;
        self.broker.stats.bytes_sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Ends a connection the core has closed: the stores already handed to the log are still
    /// acknowledged if they become durable, then the core's last packets leave, the session is
    /// released and the will scheduled.
    async fn finish(mut self) {
        while let Some((_, ack, _)) = self.stores.front_mut() {
            let result = ack.await;
            self.stored(result);
        }
        self.run_events().await;
        let _ = self.flush().await;
        let _ = self.io.shutdown().await;
        self.broker.disconnect(self.conn_id, &self.session).await;
        let (reason, will) = self.closed.take().map(|c| *c).unzip();
        if let Some(DelayedWill { will, delay }) = will.flatten() {
            self.broker.schedule_will(self.wake.client_id(), will_message(*will, self.wake.client_id()), delay);
        }
        tracing::debug!(client_id = %self.wake.client_id(), reason = ?reason, "client disconnected");
    }
}

/// Checks a CONNECT's credentials; a password is verified on the auth module's bounded pool
/// of threads, never on the runtime's.
async fn authenticate(broker: &Broker, c: Credentials, peer: SocketAddr) -> Result<(), Refusal> {
    let verdict = broker.auth.authenticate(c.username.as_deref(), c.password.as_ref(), peer).await;
    verdict.map_err(|e| match e {
        AuthError::BadCredentials => Refusal::BadCredentials,
        AuthError::NotAuthorized => Refusal::NotAuthorized,
        AuthError::Busy => Refusal::ServerBusy,
    })
}

/// The will of `client_id` as a message published now.
fn will_message(w: Will, client_id: &str) -> Message {
    Message {
        topic: w.topic,
        payload: w.payload,
        qos: w.qos.as_u8(),
        retain: w.retain,
        utf8_payload: w.properties.payload_format_indicator.unwrap_or(false),
        expiry: w.properties.message_expiry_interval,
        content_type: w.properties.content_type,
        response_topic: w.properties.response_topic,
        correlation_data: w.properties.correlation_data,
        user_properties: w.properties.user_properties,
        publisher: Some(bytes::Bytes::copy_from_slice(client_id.as_bytes())),
        timestamp: Timestamp::now(),
    }
}

/// An outgoing PUBLISH of `m`, borrowing its topic and payload: one message shared by many
/// subscribers is encoded for each without a copy of either.
fn view<'a>(m: &'a Message, qos: QoS, retain: bool, dup: bool, properties: &'a PublishProperties) -> PublishView<'a> {
    PublishView { dup, qos, retain, topic: &m.topic, packet_id: None, properties, payload: &m.payload }
}

impl<S> Conn<S> {
    /// The properties of `m` going out on this connection: none before MQTT 5.0 (the
    /// subscription ids are not asked for).
    fn publish_properties(&self, m: &Message, ids: impl FnOnce() -> Vec<u32>, now: Timestamp) -> PublishProperties {
        if self.core.version().is_v5() { publish_properties(m, ids(), now) } else { PublishProperties::default() }
    }
}

/// MQTT 5 properties of an outgoing PUBLISH.
fn publish_properties(m: &Message, subscription_ids: Vec<u32>, now: Timestamp) -> PublishProperties {
    PublishProperties {
        payload_format_indicator: m.utf8_payload.then_some(true),
        message_expiry_interval: m.remaining_expiry(now),
        topic_alias: None,
        response_topic: m.response_topic.clone(),
        correlation_data: m.correlation_data.clone(),
        user_properties: m.user_properties.clone(),
        subscription_identifiers: subscription_ids,
        content_type: m.content_type.clone(),
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(Timestamp::now().get() as u64);
    h.finish()
}

#[cfg(test)]
mod tests {
    /// The future every connection keeps alive for its whole life, the task's own: what an
    /// idle connection costs beside its socket and session. Growing it costs memory on every
    /// idle connection.
    #[test]
    fn the_connection_future_stays_small() {
        fn future_size<A, B, C, D, E, G, F>(_: fn(A, B, C, D, E, G) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        let size = future_size(crate::server::serve_one);
        // 152 bytes today: a connection's resting form ([`super::Task`]: the handshake, the
        // working connection with the loop it serves in and the close are boxed; keep alive's
        // timer is the broker's, `keep_alive`; the client id is in the signal, the open slot
        // one pointer). It is the whole future tokio spawns (no tracker's token around it).
        // tokio's task cell adds 104 bytes at most (header, scheduler, id, the stage's tag,
        // trailer) and is aligned to 128: up to 152 bytes the task is 256, an allocator size
        // class; a little more costs 384 on every idle connection (and `HANDSHAKE_BUFFER` is
        // of another class). It was 280 with an `async` block over combinators and a task
        // tracker, 400 with a timer of its own, 936 with a `select!` of the rest's waits in an
        // `async fn`, 1,568 when a connection kept its working form while idle.
        assert!(size <= 152, "the connection future grew to {size} bytes");
        fn serve_size<S, F>(_: fn(S) -> F) -> usize {
            std::mem::size_of::<F>()
        }
        // The box a connection's every wake-up allocates, the working form and the loop it
        // serves in: 1,240 bytes in a debug build today, 1,976 when `serve` was an `async fn`
        // (which kept the connection twice).
        let serve = serve_size(super::Conn::<tokio::net::TcpStream>::serve);
        assert!(serve <= 1280, "the working connection's future grew to {serve} bytes");
    }
}
