//! PUBLISH and PUBREL from the client: topic aliases resolved, Receive Maximum enforced,
//! QoS 1/2 messages handed to the broker and acknowledged in arrival order once stored, a
//! resent QoS 2 message that awaits PUBREL acknowledged again without storing it twice.

use crate::packet::{Packet, PubResponse, Publish};
use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

use super::{Close, Connection, Event, Phase, Stored, Token, valid_topic_name};

/// An inbound QoS 1/2 PUBLISH handed to the broker under `token`, not yet acknowledged;
/// `durable` once the broker stored it.
pub(super) struct PendingStore {
    token: Token,
    id: PacketId,
    qos: QoS,
    durable: bool,
}

impl<T> Connection<T> {
    pub(super) fn on_publish(&mut self, mut p: Publish) {
        if let Err(code) = self.inbound_aliases.resolve(p.properties.topic_alias, &mut p.topic) {
            return self.close(Close::Error(code));
        }
        if !valid_topic_name(&p.topic) {
            return self.close(Close::Error(ReasonCode::TopicNameInvalid));
        }
        let Some(id) = p.packet_id.filter(|_| p.qos != QoS::AtMostOnce) else {
            // QoS 0: nobody waits for the store.
            self.events.push_back(Event::Publish { token: None, publish: p });
            return;
        };
        if self.stores.len() + self.awaiting_release.len() >= usize::from(self.settings.receive_maximum) {
            return self.close(Close::Error(ReasonCode::ReceiveMaximumExceeded));
        }
        if p.qos == QoS::ExactlyOnce && self.awaiting_release.contains(&id.get()) {
            // A resend of a QoS 2 message already stored: acknowledge, never store twice.
            return self.queue(&Packet::PubRec(PubResponse::new(id)));
        }
        let token = self.token();
        self.stores.push_back(PendingStore { token, id, qos: p.qos, durable: false });
        self.events.push_back(Event::Publish { token: Some(token), publish: p });
    }

    /// The broker's answer to the [`Event::Publish`] with `token`. Acknowledgements of stored
    /// messages leave in the order the PUBLISHes arrived, so this one may wait for earlier
    /// ones; a refusal is answered at once.
    pub fn handle_stored(&mut self, token: Token, stored: Stored) {
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        let Some(at) = self.stores.iter().position(|s| s.token == token && !s.durable) else { return };
        let code = match stored {
            Stored::Durable => {
                self.stores[at].durable = true;
                self.flush_acks();
                return self.finish_closing();
            }
            Stored::NotAuthorized => ReasonCode::NotAuthorized,
            Stored::Failed => ReasonCode::UnspecifiedError,
        };
        let PendingStore { id, qos, .. } = self.stores.remove(at).expect("invariant: found above");
        if stored == Stored::Failed && !self.version.is_v5() {
            // 3.1.1 has no negative acknowledgement: close, the client resends.
            self.close(Close::Lost);
        } else {
            self.queue(&ack(id, qos, code));
        }
        self.flush_acks();
        self.finish_closing();
    }

    /// Sends the acknowledgements now due: stored messages at the front of the arrival order.
    fn flush_acks(&mut self) {
        while self.stores.front().is_some_and(|s| s.durable) {
            let PendingStore { id, qos, .. } = self.stores.pop_front().expect("invariant: front exists");
            if qos == QoS::ExactlyOnce && self.awaiting_release.insert(id.get()) {
                self.events.push_back(Event::Qos2Received(id));
            }
            self.queue(&ack(id, qos, ReasonCode::Success));
        }
    }

    pub(super) fn on_pubrel(&mut self, r: PubResponse) {
        let mut comp = PubResponse::new(r.packet_id);
        if self.awaiting_release.remove(&r.packet_id.get()) {
            self.events.push_back(Event::Qos2Released(r.packet_id));
        } else {
            comp.reason_code = ReasonCode::PacketIdentifierNotFound;
        }
        self.queue(&Packet::PubComp(comp));
    }
}

/// PUBACK (QoS 1) or PUBREC (QoS 2) with `code`.
fn ack(id: PacketId, qos: QoS, code: ReasonCode) -> Packet {
    let mut r = PubResponse::new(id);
    r.reason_code = code;
    if qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) }
}
