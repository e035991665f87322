//! SUBSCRIBE and UNSUBSCRIBE: filters checked, shared subscriptions recognised, the broker
//! asked about the rest, and its answers turned into SUBACK / UNSUBACK reason codes for the
//! client's version (MQTT 3.1.1 knows only "granted QoS n" and failure 0x80).

use silt_types::TopicFilter;

use crate::packet::{Packet, RetainHandling, SubAck, Subscribe, UnsubAck, Unsubscribe};
use crate::properties::AckProperties;
use crate::reason::ReasonCode;
use crate::types::{PacketId, QoS};

use super::{
    Close, Connection, Event, SubscribeFilter, SubscribeRequest, Subscribed, SubscriptionFilter, Token,
    UnsubscribeFilter, UnsubscribeRequest,
};

/// A SUBSCRIBE awaiting the broker.
pub(super) struct PendingSubscribe {
    token: Token,
    packet_id: PacketId,
    subscription_id: Option<u32>,
    /// One per filter of the packet, in order.
    slots: Vec<SubscribeSlot>,
}

enum SubscribeSlot {
    /// Answered without the broker.
    Decided(ReasonCode),
    /// Asked; `retained` names a plain filter whose retained messages may be owed.
    Asked { qos: QoS, retain_handling: RetainHandling, retained: Option<TopicFilter> },
}

/// An UNSUBSCRIBE awaiting the broker: one slot per filter, `None` where the broker answers.
pub(super) struct PendingUnsubscribe {
    token: Token,
    packet_id: PacketId,
    slots: Vec<Option<ReasonCode>>,
}

impl<T> Connection<T> {
    pub(super) fn on_subscribe(&mut self, s: Subscribe) {
        let sub_id = s.properties.subscription_identifier;
        if sub_id == Some(0) {
            return self.close(Close::Error(ReasonCode::ProtocolError, "subscription identifier 0"));
        }
        let v5 = self.version.is_v5();
        let invalid = if v5 { ReasonCode::TopicFilterInvalid } else { ReasonCode::UnspecifiedError };
        let mut slots = Vec::with_capacity(s.subscriptions.len());
        let mut filters = Vec::with_capacity(s.subscriptions.len());
        for sub in s.subscriptions {
            let mut options = sub.options;
            if !v5 {
                // Reserved bits before 5.0 (the codec reads them as unset; never trust that).
                options.no_local = false;
                options.retain_as_published = false;
            }
            if self.too_deep(&sub.filter) {
                // Counted on the whole string: a shared subscription's filter is shallower.
                slots.push(SubscribeSlot::Decided(invalid));
                continue;
            }
            let filter = if sub.filter.starts_with("$share/") {
                let Some(filter) = parse_shared(&sub.filter) else {
                    slots.push(SubscribeSlot::Decided(invalid));
                    continue;
                };
                if options.no_local {
                    // MQTT-3.8.3-4: a Protocol Error, which closes the connection (0x82 is no
                    // SUBACK code). Nothing of the packet is applied.
                    return self.close(Close::Error(ReasonCode::ProtocolError, "no local on a shared subscription"));
                }
                SubscriptionFilter::Shared { key: sub.filter, filter }
            } else {
                match TopicFilter::new(sub.filter) {
                    Ok(f) => SubscriptionFilter::Plain(f),
                    Err(_) => {
                        slots.push(SubscribeSlot::Decided(invalid));
                        continue;
                    }
                }
            };
            let retained = match &filter {
                SubscriptionFilter::Plain(f) => Some(f.clone()),
                SubscriptionFilter::Shared { .. } => None,
            };
            slots.push(SubscribeSlot::Asked { qos: options.qos, retain_handling: options.retain_handling, retained });
            filters.push(SubscribeFilter { filter, options });
        }
        let token = self.token();
        self.subscribes.push(PendingSubscribe { token, packet_id: s.packet_id, subscription_id: sub_id, slots });
        self.events.push_back(Event::Subscribe(SubscribeRequest { token, subscription_id: sub_id, filters }));
    }

    /// The broker's answers to the [`Event::Subscribe`] with `token`, one per filter of the
    /// request, in order. Queues the SUBACK, then asks for the retained messages owed.
    pub fn handle_subscribed(&mut self, token: Token, outcomes: impl IntoIterator<Item = Subscribed>) {
        let Some(at) = self.subscribes.iter().position(|p| p.token == token) else { return };
        let pending = self.subscribes.swap_remove(at);
        if self.subscribes.is_empty() {
            // A connection subscribes once or a few times, then idles: its room goes back.
            self.subscribes = Vec::new();
        }
        let v5 = self.version.is_v5();
        let mut outcomes = outcomes.into_iter();
        let mut codes = Vec::with_capacity(pending.slots.len());
        let mut retained = Vec::new();
        for slot in pending.slots {
            let code = match slot {
                SubscribeSlot::Decided(code) => code,
                SubscribeSlot::Asked { qos, retain_handling, retained: filter } => match outcomes.next() {
                    Some(Subscribed::Granted { existed }) => {
                        let send = match retain_handling {
                            RetainHandling::SendAtSubscribe => true,
                            RetainHandling::SendAtSubscribeIfNew => !existed,
                            RetainHandling::DoNotSend => false,
                        };
                        if let Some(filter) = filter
                            && (send || !v5)
                        {
                            retained.push(Event::Retained { filter, qos, subscription_id: pending.subscription_id });
                        }
                        granted(qos)
                    }
                    Some(Subscribed::NotAuthorized) if v5 => ReasonCode::NotAuthorized,
                    Some(Subscribed::QuotaExceeded) if v5 => ReasonCode::QuotaExceeded,
                    Some(Subscribed::NotAuthorized | Subscribed::QuotaExceeded | Subscribed::Failed) | None => {
                        ReasonCode::UnspecifiedError
                    }
                },
            };
            codes.push(code);
        }
        self.queue(&Packet::SubAck(SubAck {
            packet_id: pending.packet_id,
            reason_codes: codes,
            properties: AckProperties::default(),
        }));
        self.events.extend(retained);
    }

    pub(super) fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut slots = Vec::with_capacity(u.filters.len());
        let mut filters = Vec::with_capacity(u.filters.len());
        for f in u.filters {
            if f.starts_with("$share/") {
                filters.push(UnsubscribeFilter::Shared(f));
                slots.push(None);
                continue;
            }
            match TopicFilter::new(f) {
                Ok(filter) => {
                    filters.push(UnsubscribeFilter::Plain(filter));
                    slots.push(None);
                }
                Err(_) => slots.push(Some(ReasonCode::TopicFilterInvalid)),
            }
        }
        let token = self.token();
        self.unsubscribes.push(PendingUnsubscribe { token, packet_id: u.packet_id, slots });
        self.events.push_back(Event::Unsubscribe(UnsubscribeRequest { token, filters }));
    }

    /// The broker's answers to the [`Event::Unsubscribe`] with `token`: whether each filter of
    /// the request was subscribed, in order. Queues the UNSUBACK.
    pub fn handle_unsubscribed(&mut self, token: Token, existed: impl IntoIterator<Item = bool>) {
        let Some(at) = self.unsubscribes.iter().position(|p| p.token == token) else { return };
        let pending = self.unsubscribes.swap_remove(at);
        if self.unsubscribes.is_empty() {
            self.unsubscribes = Vec::new();
        }
        let mut existed = existed.into_iter();
        let codes = pending
            .slots
            .into_iter()
            .map(|slot| match slot {
                Some(code) => code,
                None if existed.next() == Some(true) => ReasonCode::Success,
                None => ReasonCode::NoSubscriptionExisted,
            })
            .collect();
        self.queue(&Packet::UnsubAck(UnsubAck {
            packet_id: pending.packet_id,
            reason_codes: codes,
            properties: AckProperties::default(),
        }));
    }
}

fn granted(qos: QoS) -> ReasonCode {
    match qos {
        QoS::AtMostOnce => ReasonCode::Success,
        QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
        QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
    }
}

/// The filter of `$share/{group}/{filter}`, if the group is a non-empty name without
/// wildcards and the filter is valid (MQTT 5.0 §4.8.2).
fn parse_shared(key: &str) -> Option<TopicFilter> {
    let (group, filter) = key.strip_prefix("$share/")?.split_once('/')?;
    if group.is_empty() || group.contains(['+', '#']) {
        return None;
    }
    TopicFilter::new(filter).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_subscriptions_need_a_group_and_a_filter() {
        assert_eq!(parse_shared("$share/g/a/+").map(|f| f.as_str().to_owned()), Some("a/+".to_owned()));
        for bad in ["$share/g", "$share//a", "$share/g+/a", "$share/g/a#", "$share/g/"] {
            assert_eq!(parse_shared(bad), None, "{bad}");
        }
    }
}
