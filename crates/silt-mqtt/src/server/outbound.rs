//! PUBLISH to the client and its acknowledgements: the in-flight window (the client's
//! Receive Maximum, capped by ours), packet ids, the client's Maximum Packet Size, topic
//! aliases, and QoS 2 messages resent under their original ids after a reconnect.
//!
//! What to send, and when, is the driver's: it offers a message only while
//! [`Connection::send_room`] allows one.

use crate::flow::PubRecOutcome;
use crate::packet::{Packet, PubResponse, Publish, PublishView};
use crate::properties::PublishProperties;
use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

use super::{Connection, Event, Phase, Sent};

impl<T> Connection<T> {
    /// How many more QoS 1/2 messages may be sent now (QoS 0 needs no room).
    pub fn send_room(&self) -> usize {
        if matches!(self.phase, Phase::Open) { self.inflight.room() } else { 0 }
    }

    /// Offers an application message to the client. `data` comes back with
    /// [`Event::Delivered`] once the client completes it (QoS 1/2), or at once if it cannot be
    /// sent. The driver sets QoS, retain, DUP and (MQTT 5.0) the properties; the connection
    /// assigns the packet id and the topic alias.
    pub fn send(&mut self, publish: PublishView<'_>, data: T) -> Sent<T> {
        let acknowledged = publish.qos != QoS::AtMostOnce;
        if !matches!(self.phase, Phase::Open) || (acknowledged && self.inflight.room() == 0) {
            return Sent::NoRoom(data);
        }
        // Encoded once, as it goes out (id and topic alias in place), and measured against the
        // client's Maximum Packet Size as encoded: a packet that does not fit is taken back, and
        // neither its id nor a new alias is used.
        let id = acknowledged.then(|| self.inflight.free_id());
        let mut out = PublishView { packet_id: id, ..publish };
        let mut new_alias = None;
        let aliased: PublishProperties;
        if self.version.is_v5() {
            let (alias, send_topic) = self.outbound_aliases.lookup(publish.topic);
            if alias != publish.properties.topic_alias {
                // Copied only when the alias changes them; a copy of an empty set (most
                // messages carry none) allocates nothing.
                aliased = PublishProperties { topic_alias: alias, ..publish.properties.clone() };
                out.properties = &aliased;
            }
            match alias {
                Some(a) if send_topic => new_alias = Some(a),
                Some(_) => out.topic = "",
                None => {}
            }
        }
        let qos = publish.qos;
        let start = self.transmit.len();
        let fits = out.encode(self.version, &mut self.transmit).is_ok()
            && (self.transmit.len() - start) as u64 <= u64::from(self.client_max_packet);
        if !fits {
            self.transmit.truncate(start);
            return Sent::TooLarge(data);
        }
        if let Some(a) = new_alias {
            self.outbound_aliases.define(publish.topic, a);
        }
        if let Some(id) = id {
            self.inflight.send_as(id, qos, data);
        }
        Sent::Queued(id)
    }

    /// Sends again, with DUP, a message a previous connection of the session left in flight
    /// under `id`: unacknowledged QoS 1/2 PUBLISHes are resent under their original ids
    /// (MQTT-4.4.0-1; the client may have a QoS 2 message already).
    pub fn resend(&mut self, id: PacketId, mut publish: Publish, data: T) {
        if !matches!(self.phase, Phase::Open) || publish.qos == QoS::AtMostOnce {
            return;
        }
        publish.dup = true;
        publish.packet_id = Some(id);
        self.inflight.restore(id, publish.qos, data);
        self.queue(&Packet::Publish(publish));
    }

    /// Sends PUBREL again for a QoS 2 message a previous connection of the session had
    /// released (PUBREC seen): the client completes it with PUBCOMP.
    pub fn resend_release(&mut self, id: PacketId, data: T) {
        if !matches!(self.phase, Phase::Open) {
            return;
        }
        self.inflight.restore_released(id, data);
        self.queue(&Packet::PubRel(PubResponse::new(id)));
    }

    pub(super) fn on_puback(&mut self, r: PubResponse) {
        if let Some(data) = self.inflight.on_puback(r.packet_id) {
            self.events.push_back(Event::Delivered { id: r.packet_id, qos: QoS::AtLeastOnce, data });
        }
    }

    pub(super) fn on_pubrec(&mut self, r: PubResponse) {
        match self.inflight.on_pubrec(r.packet_id, r.reason_code) {
            PubRecOutcome::Release => {
                self.events.push_back(Event::OutboundReleased(r.packet_id));
                self.queue(&Packet::PubRel(PubResponse::new(r.packet_id)));
            }
            PubRecOutcome::Refused(data) => {
                self.events.push_back(Event::Delivered { id: r.packet_id, qos: QoS::ExactlyOnce, data })
            }
            PubRecOutcome::Unknown => {
                let mut rel = PubResponse::new(r.packet_id);
                rel.reason_code = ReasonCode::PacketIdentifierNotFound;
                self.queue(&Packet::PubRel(rel));
            }
        }
    }

    pub(super) fn on_pubcomp(&mut self, r: PubResponse) {
        if let Some(data) = self.inflight.on_pubcomp(r.packet_id) {
            self.events.push_back(Event::Delivered { id: r.packet_id, qos: QoS::ExactlyOnce, data });
        }
    }
}
