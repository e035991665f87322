//! Packets to the client: retained messages owed to new subscriptions, pulls from the
//! session's and shared groups' cursors within the core's window, completions that settle
//! cursors, and QoS 2 deliveries restored after a restart. Packet ids, topic aliases and the
//! client's Maximum Packet Size are the core's.

use silt_mqtt::server::Sent;
use silt_mqtt::{Publish, QoS};

use super::*;
use crate::session::{Settles, SharedMembership};

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Resends the QoS 1/2 deliveries a previous connection (or broker) left incomplete, under
    /// their original packet ids (a released QoS 2 one as PUBREL), and holds their offsets so
    /// they are not sent again as new.
    pub(super) async fn restore_inflight(&mut self) {
        let restored: Vec<OutboundQos2> = {
            let mut s = self.session.lock().await;
            let list: Vec<OutboundQos2> = s.outbound_in_order();
            for o in list.iter().filter(|o| o.group.is_none()) {
                s.subs.hold(&o.settles, o.entry());
            }
            list
        };
        // The records to resend, read off the runtime (as many as the window holds: the core
        // keeps each in memory until acknowledged anyway).
        let wanted: Vec<silt_storage::IndexEntry> =
            restored.iter().filter(|o| !(o.qos == 2 && o.released)).map(OutboundQos2::entry).collect();
        let storage = self.broker.storage.clone();
        let records: std::collections::HashMap<silt_types::LogPosition, silt_storage::Record> = if wanted.is_empty() {
            Default::default() // the usual connect: no hand-off to the blocking pool
        } else {
            tokio::task::spawn_blocking(move || {
                wanted.iter().filter_map(|e| Some((e.position, storage.read_record(e).ok()?))).collect()
            })
            .await
            .unwrap_or_default()
        };
        for o in restored {
            let Some(id) = PacketId::new(o.packet_id) else { continue };
            // A shared group's delivery is completed with this member; the group holds its
            // offsets meanwhile (from the disconnect, or since start-up after a restart).
            let group = match &o.group {
                None => None,
                Some(key) => match self.broker.group(key) {
                    Some(g) => {
                        g.lock().await.subs.hold(&o.settles, o.entry());
                        Some(g)
                    }
                    None => {
                        // The group ended (its last member left): nothing to settle.
                        self.session.lock().await.outbound_qos2.remove(o.packet_id);
                        continue;
                    }
                },
            };
            let data = Inflight { settles: o.settles.clone(), group };
            if o.qos == 2 && o.released {
                self.core.resend_release(id, data);
                continue;
            }
            let Some(record) = records.get(&o.entry().position).cloned() else {
                tracing::warn!(client_id = %self.wake.client_id(), packet_id = o.packet_id, "in-flight message unreadable");
                self.session.lock().await.outbound_qos2.remove(o.packet_id);
                match data.group {
                    Some(g) => g.lock().await.subs.settle(&data.settles),
                    None => self.settle_now(data.settles),
                }
                continue;
            };
            let m = Message::from_record(record);
            if !self.may_receive(&m.topic) {
                // The session changed hands (an ACL `takeover`) to a user who may not read it.
                self.session.lock().await.outbound_qos2.remove(o.packet_id);
                match data.group {
                    Some(g) => g.lock().await.subs.settle(&data.settles),
                    None => self.settle_now(data.settles),
                }
                continue;
            }
            let mut p = Publish::new(m.topic.clone(), m.payload.clone());
            p.qos = if o.qos == 1 { QoS::AtLeastOnce } else { QoS::ExactlyOnce };
            if self.core.version().is_v5() {
                p.properties = publish_properties(&m, o.subscription_ids.clone(), Timestamp::now()).into();
            }
            self.core.resend(id, p, data);
        }
    }

    /// Records that the PUBREL of outbound QoS 2 message `id` is going out, so a reconnect or
    /// a restart resends the PUBREL and never the PUBLISH (MQTT 4.3.3).
    pub(super) async fn released(&mut self, id: PacketId) {
        let changed = match self.session.lock().await.outbound_qos2.get_mut(id.get()) {
            Some(o) if !o.released => {
                o.released = true;
                true
            }
            _ => false, // a shared-group delivery, or recorded already
        };
        if changed && let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.wake.client_id(), error = %e, "QoS 2 release not persisted");
        }
    }

    /// Settles an outbound message the client completed: PUBACK (QoS 1), PUBCOMP or an error
    /// PUBREC (QoS 2).
    pub(super) async fn completed(&mut self, id: PacketId, qos: QoS, f: Inflight) {
        if let Some(group) = &f.group {
            let mut g = group.lock().await;
            g.subs.settle(&f.settles);
            g.dirty = true;
        }
        {
            let mut s = self.session.lock().await;
            let own = if f.group.is_none() { &f.settles[..] } else { &[] };
            completed_own(&mut s, id, own);
        }
        self.want_pull = true;
        if qos == QoS::ExactlyOnce {
            // Record the completion now rather than at the next cursor commit: a restart must
            // not resend a QoS 2 message the client has completed (it would be new to it).
            // A shared group's is recorded in the group's cursor too, in the same batch.
            if let Err(e) = Box::pin(self.broker.persist_with_group(&self.session, f.group.as_ref())).await {
                tracing::warn!(client_id = %self.wake.client_id(), error = %e, "QoS 2 completion not persisted");
            }
        }
    }

    /// Settles QoS 1 deliveries of the session's own subscriptions that the client
    /// acknowledged ([`Self::completed`]'s common case), all under one lock of the session.
    pub(super) async fn acknowledged(&mut self, acked: &mut Vec<(PacketId, Settles)>) {
        if acked.is_empty() {
            return;
        }
        let mut s = self.session.lock().await;
        for (id, settles) in acked.drain(..) {
            completed_own(&mut s, id, &settles);
        }
        drop(s);
        self.want_pull = true;
    }

    /// Pushes retained messages owed to new subscriptions, then pulls from the cursors, within
    /// the window. A failed read closes the connection.
    pub(super) async fn deliver(&mut self) {
        let now = Timestamp::now();
        while let Some((m, granted, sub_id)) = self.retained_queue.front().cloned() {
            let qos = QoS::from_u8(m.qos.min(granted.as_u8())).unwrap_or_default();
            if qos != QoS::AtMostOnce && self.core.send_room() == 0 {
                return;
            }
            self.retained_queue.pop_front();
            if m.remaining_expiry(now) == Some(0) {
                continue;
            }
            self.send_message(&m, qos, true, false, sub_id.into_iter().collect(), Settles::new(), None, now);
        }
        if !self.want_pull {
            return;
        }
        let room = self.core.send_room().min(PULL_BATCH);
        if room == 0 {
            return;
        }
        // The session's shared-group memberships, read under the lock its own pull takes.
        let mut memberships: Vec<SharedMembership> = Vec::new();
        let read_memberships = |s: &crate::session::Session| {
            memberships.clear();
            memberships.extend(s.shared.values().cloned());
        };
        let (batch, unread) = match pull(
            &self.broker,
            &self.session,
            (session_parts, read_memberships),
            Some(self.conn_id),
            self.wake.client_id(),
            now,
            room,
        )
        .await
        {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(client_id = %self.wake.client_id(), error = %e, "delivery read failed");
                self.core.close(Close::Error(
                    silt_mqtt::ReasonCode::UnspecifiedError,
                    "messages for this session could not be read",
                ));
                return;
            }
        };
        self.want_pull = batch.len() == room || unread;
        let mut room = room - batch.len();
        for o in batch {
            let qos = QoS::from_u8(o.qos).unwrap_or_default();
            self.send_message(&o.message, qos, o.retain, o.dup, o.subscription_ids, o.settles, Some(o.entry), now);
        }
        // Shared groups: whichever member pulls first gets the message.
        for m in memberships {
            if room == 0 {
                self.want_pull = true;
                break;
            }
            let Some(group) = self.broker.group(&m.key) else { continue };
            let batch = match pull(&self.broker, &group, (group_parts, |_: &_| {}), None, "", now, room).await {
                Ok((b, unread)) => {
                    self.want_pull |= unread;
                    b
                }
                Err(e) => {
                    tracing::warn!(client_id = %self.wake.client_id(), error = %e, "shared delivery read failed");
                    continue;
                }
            };
            if batch.len() == room {
                self.want_pull = true;
            }
            room -= batch.len();
            for o in batch {
                let qos = QoS::from_u8(o.qos.min(m.qos)).unwrap_or_default();
                let ids = m.subscription_id.into_iter().collect();
                if qos == QoS::AtMostOnce {
                    group.lock().await.subs.settle(&o.settles);
                    self.send_message(&o.message, qos, false, false, ids, Settles::new(), None, now);
                } else {
                    self.send_shared(&o, qos, ids, (&m.key, &group), now);
                }
            }
        }
    }

    /// Sends a QoS 1/2 message from a shared group; its acknowledgement settles the group. A
    /// QoS 2 one is recorded with the session like its own, so that it is completed with this
    /// member only.
    pub(super) fn send_shared(
        &mut self,
        o: &crate::session::Outgoing,
        qos: QoS,
        ids: Vec<u32>,
        (key, group): (&str, &GroupRef),
        now: Timestamp,
    ) {
        let m = &o.message;
        if !self.may_receive(&m.topic) {
            // Settled in the group like a delivery: no member may read what the ACL denies
            // this one, and handing it on would make it someone else's choice.
            let (group, settles) = (group.clone(), o.settles.clone());
            tokio::spawn(async move { group.lock().await.subs.settle(&settles) });
            return;
        }
        let props = self.publish_properties(m, || ids.clone(), now);
        let p = view(m, qos, false, o.dup, &props);
        match self.core.send(p, Inflight { settles: o.settles.clone(), group: Some(group.clone()) }) {
            Sent::Queued(id) => {
                if let (Some(id), QoS::ExactlyOnce) = (id, qos) {
                    self.qos2_unpersisted.push(OutboundQos2 {
                        packet_id: id.get(),
                        qos: 2,
                        released: false,
                        position: o.entry.position.get(),
                        size: o.entry.size,
                        timestamp: o.entry.timestamp.get(),
                        settles: o.settles.clone(),
                        subscription_ids: ids,
                        group: Some(key.to_owned()),
                    });
                }
                self.sent += 1;
            }
            Sent::TooLarge(f) => {
                let group = group.clone();
                tokio::spawn(async move { group.lock().await.subs.settle(&f.settles) });
            }
            Sent::NoRoom(f) => {
                let group = group.clone();
                tokio::spawn(async move { group.lock().await.subs.release(&f.settles) });
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_message(
        &mut self,
        m: &Message,
        qos: QoS,
        retain: bool,
        dup: bool,
        subscription_ids: Vec<u32>,
        settles: Settles,
        entry: Option<silt_storage::IndexEntry>,
        now: Timestamp,
    ) {
        if !self.may_receive(&m.topic) {
            self.settle_now(settles);
            return;
        }
        // What the session's record of a QoS 1/2 delivery needs, taken before the message is
        // handed over.
        let tracked = (qos != QoS::AtMostOnce)
            .then_some(entry)
            .flatten()
            .map(|entry| (entry, settles.clone(), subscription_ids.clone()));
        let props = self.publish_properties(m, || subscription_ids, now);
        match self.core.send(view(m, qos, retain, dup, &props), Inflight { settles, group: None }) {
            Sent::Queued(id) => {
                if let (Some(id), Some((entry, settles, subscription_ids))) = (id, tracked) {
                    self.qos2_unpersisted.push(OutboundQos2 {
                        packet_id: id.get(),
                        qos: qos.as_u8(),
                        released: false,
                        position: entry.position.get(),
                        size: entry.size,
                        timestamp: entry.timestamp.get(),
                        settles,
                        subscription_ids,
                        group: None,
                    });
                }
                self.sent += 1;
            }
            Sent::TooLarge(f) => {
                // The client could not accept it: the spec says discard, as if delivered.
                tracing::debug!(client_id = %self.wake.client_id(), "message larger than the client's maximum packet size dropped");
                self.settle_now(f.settles);
            }
            Sent::NoRoom(f) => {
                // Not reached (pulls stay within the window): back to the cursor if it were.
                let session = self.session.clone();
                tokio::spawn(async move { session.lock().await.subs.release(&f.settles) });
            }
        }
    }

    /// The read ACL, checked the same way on every path a message takes to this client:
    /// plain and shared subscriptions at every QoS, retained messages, resent deliveries.
    pub(super) fn may_receive(&self, topic: &str) -> bool {
        !self.broker.auth.has_acl()
            || self.broker.auth.allows_topic(self.username.as_deref(), self.wake.client_id(), Access::Read, topic)
    }

    /// Settles a message that will not be sent (denied by an ACL, too large for the client).
    pub(super) fn settle_now(&self, settles: Settles) {
        if !settles.is_empty() {
            let session = self.session.clone();
            tokio::spawn(async move { session.lock().await.subs.settle(&settles) });
        }
    }
}

/// Forgets the session's record of a delivery the client completed, and settles it in the
/// session's own subscriptions (`settles` is empty for a shared group's, which its group
/// settles).
fn completed_own(s: &mut crate::session::Session, id: PacketId, settles: &[(Arc<str>, silt_types::Offset)]) {
    if s.outbound_qos2.remove(id.get()).is_some() {
        s.dirty = true;
    }
    if !settles.is_empty() {
        s.subs.settle(settles);
        s.dirty = true;
    }
}

/// A session's subscriptions, cursors-moved flag and attached connection.
fn session_parts(s: &mut crate::session::Session) -> Parts<'_> {
    let conn = s.conn();
    (&mut s.subs, &mut s.dirty, conn)
}

/// A shared group's (attached to no connection).
fn group_parts(g: &mut crate::session::SharedGroup) -> Parts<'_> {
    (&mut g.subs, &mut g.dirty, None)
}

type Parts<'a> = (&'a mut crate::session::Subscriptions, &'a mut bool, Option<ConnId>);

/// Pulls up to `room` messages from the subscriptions behind `lock` (a session's or a shared
/// group's), reading what memory does not hold on the blocking pool with the lock released,
/// so a slow disk or object store stalls this delivery only, never a runtime thread or another
/// task waiting for the lock. A connection `me` that is no longer the one attached (taken over
/// while it read) gets nothing. `also` reads what else its caller needs under the same lock.
/// Returns the messages and whether reads were still wanted (pull again soon).
async fn pull<T: Send>(
    broker: &Broker,
    lock: &tokio::sync::Mutex<T>,
    (parts, mut also): (fn(&mut T) -> Parts<'_>, impl FnMut(&T) + Send),
    me: Option<ConnId>,
    client_id: &str,
    now: Timestamp,
    room: usize,
) -> silt_storage::Result<(Vec<crate::session::Outgoing>, bool)> {
    // Reads hand over at most this many times per call: a pull then starts from memory again.
    const READ_ROUNDS: usize = 2;
    let (storage, decoded) = (&broker.storage, &broker.decoded);
    let mut rounds = 0;
    loop {
        let pulled = {
            let mut g = lock.lock().await;
            let (subs, dirty, attached) = parts(&mut g);
            if me.is_some() && attached != me {
                return Ok((Vec::new(), false));
            }
            let p = subs.pull_shared(storage, Some(decoded), client_id, now, room)?;
            *dirty |= !p.out.is_empty();
            also(&g);
            p
        };
        match pulled.reads {
            Some(reads) if pulled.out.is_empty() && rounds < READ_ROUNDS => {
                let st = storage.clone();
                let done = tokio::task::spawn_blocking(move || reads.run(&st))
                    .await
                    .map_err(|_| silt_storage::Error::Closed)??; // a panic, or the runtime shutting down
                parts(&mut *lock.lock().await).0.supply(done);
                rounds += 1;
            }
            reads => return Ok((pulled.out, reads.is_some())),
        }
    }
}
