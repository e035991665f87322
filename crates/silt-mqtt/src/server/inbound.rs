//! PUBLISH and PUBREL from the client: topic aliases resolved, Receive Maximum enforced,
//! QoS 1/2 messages handed to the broker and acknowledged in arrival order once it answers,
//! QoS 2 messages stored once however often they are resent.
//!
//! A QoS 2 resend is recognised by its packet id, either still awaiting PUBREL (stored and
//! acknowledged: PUBREC again) or still awaiting the broker (it gets the original's answer
//! when that comes). Neither counts against the Receive Maximum a second time.

use crate::packet::{Packet, PubResponse, Publish};
use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

use super::{Close, Connection, Event, Phase, Stored, Token, valid_topic_name};

/// An inbound QoS 1/2 PUBLISH not yet acknowledged.
pub(super) enum PendingStore {
    /// Handed to the broker under `token`; `answer` once it replied. `repeats` counts resends
    /// of the same QoS 2 message that arrived meanwhile, each owed the same acknowledgement.
    Store { token: Token, id: PacketId, qos: QoS, answer: Option<Stored>, repeats: u16 },
    /// A resend of a QoS 2 message already stored and acknowledged: PUBREC again, in turn,
    /// once more for each of `repeats` further resends that arrived meanwhile (so a client
    /// resending one id in a loop grows a counter, not the queue).
    Resend { id: PacketId, repeats: u16 },
    /// Refused by the connection itself (never handed to the broker): acknowledged with
    /// `code` in turn. A refused QoS 2 message is complete with its PUBREC.
    Refused { id: PacketId, qos: QoS, code: ReasonCode },
}

/// The Reason String of a refusal for a topic with too many levels.
pub(super) const TOO_DEEP: &str = "the topic has more levels than this server accepts (mqtt.max_topic_levels)";

impl<T> Connection<T> {
    pub(super) fn on_publish(&mut self, mut p: Publish) {
        if let Err(code) = self.inbound_aliases.resolve(p.properties.topic_alias, &mut p.topic) {
            return self.close(Close::Error(code, "unknown topic alias, or one above the Topic Alias Maximum"));
        }
        if !valid_topic_name(&p.topic) {
            return self.close(Close::Error(
                ReasonCode::TopicNameInvalid,
                "empty topic name without a topic alias, or a wildcard in it",
            ));
        }
        if !p.properties.subscription_identifiers.is_empty() {
            // MQTT-3.3.4-6: only the server puts Subscription Identifiers on a PUBLISH.
            return self
                .close(Close::Error(ReasonCode::ProtocolError, "a client PUBLISH with a Subscription Identifier"));
        }
        let too_deep = self.too_deep(&p.topic);
        if too_deep && (p.qos == QoS::AtMostOnce || !self.version.is_v5()) {
            // Nothing to answer a QoS 0 message with, and MQTT 3.1.1 has no negative
            // acknowledgement: the connection closes (DISCONNECT 0x90 in 5.0).
            return self.close(Close::Error(ReasonCode::TopicNameInvalid, TOO_DEEP));
        }
        let Some(id) = p.packet_id.filter(|_| p.qos != QoS::AtMostOnce) else {
            // QoS 0: nobody waits for the store.
            self.events.push_back(Event::Publish { token: None, publish: p });
            return;
        };
        // A resend takes no new place in the client's quota: recognised before the Receive
        // Maximum is checked (a client may resend every message it has in flight).
        if p.qos == QoS::ExactlyOnce {
            if self.awaiting_release.contains(&id.get()) {
                let queued = self.stores.iter_mut().find_map(|s| match s {
                    PendingStore::Resend { id: i, repeats } if *i == id => Some(repeats),
                    _ => None,
                });
                match queued {
                    Some(repeats) => *repeats = repeats.saturating_add(1),
                    None => self.stores.push_back(PendingStore::Resend { id, repeats: 0 }),
                }
                return self.flush_acks();
            }
            let pending = self.stores.iter_mut().find_map(|s| match s {
                PendingStore::Store { id: i, qos: QoS::ExactlyOnce, repeats, .. } if *i == id => Some(repeats),
                _ => None,
            });
            if let Some(repeats) = pending {
                *repeats = repeats.saturating_add(1);
                return;
            }
        }
        if usize::from(self.stores_counted) + self.awaiting_release.len() >= usize::from(self.settings.receive_maximum)
        {
            return self.close(Close::Error(
                ReasonCode::ReceiveMaximumExceeded,
                "more QoS 1/2 messages in flight than the server's Receive Maximum",
            ));
        }
        if too_deep {
            // Refused without the broker (PUBACK/PUBREC 0x90), in its turn among the others.
            // Counted like a store: refusals queued behind a slow store must not grow without bound.
            self.stores.push_back(PendingStore::Refused { id, qos: p.qos, code: ReasonCode::TopicNameInvalid });
            self.stores_counted += 1;
            return self.flush_acks();
        }
        let token = self.token();
        self.stores.push_back(PendingStore::Store { token, id, qos: p.qos, answer: None, repeats: 0 });
        self.stores_counted += 1;
        self.events.push_back(Event::Publish { token: Some(token), publish: p });
    }

    /// The broker's answer to the [`Event::Publish`] with `token`. Acknowledgements leave in
    /// the order the PUBLISHes arrived (MQTT §4.6, refusals included), so this one may wait
    /// for earlier ones.
    pub fn handle_stored(&mut self, token: Token, stored: Stored) {
        if matches!(self.phase, Phase::Closed) {
            return;
        }
        let answer = self.stores.iter_mut().find_map(|s| match s {
            PendingStore::Store { token: t, answer, .. } if *t == token => Some(answer),
            _ => None,
        });
        let Some(answer @ None) = answer else { return };
        *answer = Some(stored);
        if stored == Stored::Failed && !self.version.is_v5() {
            // 3.1.1 has no negative acknowledgement: close, the client resends.
            self.close(Close::Lost);
        }
        self.flush_acks();
        self.finish_closing();
    }

    /// Sends the acknowledgements now due: those at the front of the arrival order whose
    /// answer came.
    fn flush_acks(&mut self) {
        loop {
            match self.stores.front() {
                None | Some(PendingStore::Store { answer: None, .. }) => return,
                Some(_) => {}
            }
            match self.stores.pop_front().expect("invariant: front exists") {
                PendingStore::Resend { id, repeats } => {
                    for _ in 0..=repeats {
                        self.queue(&Packet::PubRec(PubResponse::new(id)));
                    }
                }
                PendingStore::Refused { id, qos, code } => {
                    self.stores_counted -= 1;
                    self.queue_explained(&ack(id, qos, code), Some(TOO_DEEP.into()));
                }
                PendingStore::Store { id, qos, answer, repeats, .. } => {
                    self.stores_counted -= 1;
                    let answer = answer.expect("invariant: only answered stores leave");
                    let code = match answer {
                        Stored::Durable => ReasonCode::Success,
                        Stored::NotAuthorized => ReasonCode::NotAuthorized,
                        Stored::Failed if self.version.is_v5() => ReasonCode::UnspecifiedError,
                        Stored::Failed => continue, // 3.1.1: closing, nothing to say
                    };
                    if answer == Stored::Durable && qos == QoS::ExactlyOnce && self.awaiting_release.insert(id.get()) {
                        self.events.push_back(Event::Qos2Received(id));
                    }
                    let ack = ack(id, qos, code);
                    for _ in 0..=repeats {
                        self.queue(&ack);
                    }
                }
            }
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
