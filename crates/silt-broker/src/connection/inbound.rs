//! The core's requests about what the client sent, executed against the broker: stores
//! (after the write ACL), the session's record of QoS 2 ids, subscriptions (plain and
//! shared, after the read ACL) and unsubscriptions, retained messages owed, the session
//! expiry set on DISCONNECT.

use bytes::Bytes;
use silt_mqtt::server::{
    Stored, SubscribeRequest, Subscribed, SubscriptionFilter, UnsubscribeFilter, UnsubscribeRequest,
};
use silt_mqtt::{Publish, QoS};

use super::*;
use crate::session::{Settles, SharedMembership, SubscriptionState};

impl<S> Conn<S>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    /// Executes the core's requests, feeding the answers back, until it has none.
    pub(super) async fn run_events(&mut self) {
        self.run_events_grouped().await;
        self.submit_group().await;
    }

    /// [`Self::run_events`], leaving the last publishes in the group for more of the same read
    /// to join (the caller submits it).
    pub(super) async fn run_events_grouped(&mut self) {
        // QoS 1 acknowledgements of the session's own deliveries, settled together: a
        // subscriber that keeps up acknowledges a batch per read, and each settle alone would
        // take the session's lock.
        let mut acked: Vec<(PacketId, Settles)> = Vec::new();
        while let Some(event) = self.core.poll_event() {
            let event = match event {
                Event::Delivered { id, qos: QoS::AtLeastOnce, data } if data.group.is_none() => {
                    acked.push((id, data.settles));
                    continue;
                }
                event => event,
            };
            if !matches!(event, Event::Publish { .. }) {
                // Whatever else the client sent is executed after the publishes and
                // acknowledgements before it, as it was sent.
                self.submit_group().await;
                self.acknowledged(&mut acked).await;
            }
            match event {
                Event::Publish { token, publish } => self.store(token, publish).await,
                Event::Qos2Received(id) => {
                    self.session.lock().await.inbound_qos2.modify(|ids| ids.insert(id.get()));
                }
                Event::Qos2Released(id) => {
                    self.session.lock().await.inbound_qos2.modify(|ids| ids.remove(&id.get()));
                }
                // Boxed: rare and deep (filter registration, a durable snapshot), they would
                // otherwise set the size of every connection's future.
                Event::Subscribe(request) => Box::pin(self.subscribe(request)).await,
                Event::Unsubscribe(request) => Box::pin(self.unsubscribe(request)).await,
                Event::Retained { filter, qos, subscription_id } => {
                    for m in self.broker.retained_for(&filter).await {
                        self.retained_queue.push_back((m, qos, subscription_id));
                    }
                }
                Event::Delivered { id, qos, data } => self.completed(id, qos, data).await,
                Event::OutboundReleased(id) => Box::pin(self.released(id)).await,
                Event::SessionExpiry(secs) => self.session.lock().await.expiry_secs = secs,
                Event::Undelivered(f) => {
                    // A shared group's QoS 1 message this member never acknowledged goes to
                    // another member; its QoS 2 ones stay with the session, to be completed
                    // with this member (MQTT-4.8.2-4). The session's own are sent again from
                    // its records and cursors on the next connection.
                    if let Some(group) = f.group {
                        let mut g = group.lock().await;
                        if !self.session.lock().await.holds_shared(&g.key, &f.settles) {
                            g.subs.release(&f.settles);
                            self.broker.wake_group(&g.key);
                        }
                    }
                }
                Event::Closed { reason, will } => self.closed = Some(Box::new((reason, will))),
                Event::Authenticate(_) | Event::Open(_) => {} // the handshake's, answered in `accept`
            }
        }
        self.acknowledged(&mut acked).await;
    }

    /// Adds a publish to the group bound for the log (see [`Group`]); its answer is awaited in
    /// `stores`.
    async fn store(&mut self, token: Option<Token>, p: Publish) {
        if let (Some(token), Some(id), QoS::ExactlyOnce) = (token, p.packet_id, p.qos)
            && self.session.lock().await.inbound_qos2.contains(&id.get())
        {
            // Already stored by the connection this one took over, which acknowledged it after
            // the core was given the session's ids: durable already, never stored twice.
            self.core.handle_stored(token, Stored::Durable);
            return;
        }
        let denied = p.topic.starts_with("$SYS") // the broker's statistics are its own
            || !self.broker.auth.allows_topic(self.username.as_deref(), self.wake.client_id(), Access::Write, &p.topic);
        if denied {
            tracing::debug!(client_id = %self.wake.client_id(), topic = %p.topic, "publish not authorized");
            if let Some(token) = token {
                self.core.handle_stored(token, Stored::NotAuthorized);
            }
            return;
        }
        let tier = self.broker.appender().decide(&p.topic);
        // The publisher header's value is shared by the group's records, not copied for each.
        let publisher = self
            .group
            .as_ref()
            .and_then(|g| g.publisher.clone())
            .unwrap_or_else(|| Bytes::copy_from_slice(self.wake.client_id().as_bytes()));
        let props = p.properties.into_inner();
        let message = Message {
            topic: p.topic,
            payload: p.payload,
            qos: p.qos.as_u8(),
            retain: p.retain,
            utf8_payload: props.payload_format_indicator.unwrap_or(false),
            expiry: props.message_expiry_interval,
            content_type: props.content_type,
            response_topic: props.response_topic,
            correlation_data: props.correlation_data,
            user_properties: props.user_properties,
            publisher: Some(publisher.clone()),
            timestamp: Timestamp::now(),
        };
        let record = message.into_record();
        let bytes = record.encoded_len() + GROUP_RECORD_OVERHEAD;
        let limit = GROUP_BYTES.min(self.broker.storage.config().max_batch_bytes as usize / 2);
        if self.group.as_ref().is_some_and(|g| {
            !g.records.is_empty() && (g.records.len() >= GROUP_RECORDS || g.bytes + bytes > limit || g.tier != tier)
        }) {
            self.submit_group().await;
        }
        let g = self.group.get_or_insert_default();
        g.publisher.get_or_insert(publisher);
        g.tier = tier;
        g.received.get_or_insert_with(std::time::Instant::now);
        g.records.push(record);
        g.bytes += bytes;
        g.acked |= token.is_some();
        g.tokens.extend(token);
    }

    /// Hands the group's publishes to the log as one batch.
    pub(super) async fn submit_group(&mut self) {
        let Some(g) = self.group.as_mut().filter(|g| !g.records.is_empty()) else { return };
        let records = std::mem::take(&mut g.records);
        let tokens = std::mem::take(&mut g.tokens);
        let received = g.received.take().expect("invariant: set with the first record");
        let acked = std::mem::take(&mut g.acked);
        g.bytes = 0;
        match self.broker.submit_records(records, acked, g.tier).await {
            // QoS 0 too: nobody waits for its durability, but its append finishes when it is
            // answered, and answers come in order, so it waits in line (no task of its own).
            Ok(ack) => self.stores.push_back((tokens, ack, received)),
            Err(e) => {
                tracing::warn!(client_id = %self.wake.client_id(), error = %e, "publish could not be stored");
                for token in tokens {
                    self.core.handle_stored(token, Stored::Failed);
                }
            }
        }
    }

    async fn subscribe(&mut self, request: SubscribeRequest) {
        let sub_id = request.subscription_id;
        let mut outcomes = Vec::with_capacity(request.filters.len());
        {
            let mut session = self.session.lock().await;
            for f in request.filters {
                let o = f.options;
                let (SubscriptionFilter::Plain(filter) | SubscriptionFilter::Shared { filter, .. }) = &f.filter;
                if !self.broker.auth.allows_subscribe(self.username.as_deref(), self.wake.client_id(), filter.as_str())
                {
                    tracing::debug!(client_id = %self.wake.client_id(), filter = %filter, "subscribe not authorized");
                    outcomes.push(Subscribed::NotAuthorized);
                    continue;
                }
                // A new filter beyond the session's quota is refused; replacing one it holds
                // is not (the count does not grow).
                let new = match &f.filter {
                    SubscriptionFilter::Shared { key, .. } => !session.shared.contains_key(key.as_str()),
                    SubscriptionFilter::Plain(filter) => !session.subs.subs.contains_key(filter.as_str()),
                };
                if new
                    && session.subs.subs.len() + session.shared.len()
                        >= self.broker.config.max_subscriptions_per_session
                {
                    tracing::debug!(client_id = %self.wake.client_id(), filter = %filter, "subscribe over mqtt.max_subscriptions_per_session");
                    outcomes.push(Subscribed::QuotaExceeded);
                    continue;
                }
                let outcome = match f.filter {
                    SubscriptionFilter::Shared { key, .. } => {
                        let membership =
                            SharedMembership { key: key.clone(), qos: o.qos.as_u8(), subscription_id: sub_id };
                        self.broker
                            .subscribe_shared(self.conn_id, &self.wake, &mut session, &key, membership)
                            .await
                            .map(|()| false)
                    }
                    SubscriptionFilter::Plain(filter) => {
                        let existed = session.subs.subs.contains_key(filter.as_str());
                        let state = SubscriptionState {
                            filter: filter.as_str().into(),
                            qos: o.qos.as_u8(),
                            no_local: o.no_local,
                            retain_as_published: o.retain_as_published,
                            subscription_id: sub_id,
                            cursor: 0,
                            sent: 0,
                            settled: Box::default(),
                        };
                        self.broker
                            .subscribe(self.conn_id, &self.wake, &mut session, &filter, state)
                            .await
                            .map(|()| existed)
                    }
                };
                outcomes.push(match outcome {
                    Ok(existed) => Subscribed::Granted { existed },
                    Err(e) => {
                        tracing::warn!(client_id = %self.wake.client_id(), error = %e, "subscribe failed");
                        Subscribed::Failed
                    }
                });
            }
        }
        if let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.wake.client_id(), error = %e, "session snapshot after SUBSCRIBE failed");
        }
        self.core.handle_subscribed(request.token, outcomes);
        self.want_pull = true;
    }

    async fn unsubscribe(&mut self, request: UnsubscribeRequest) {
        let mut existed = Vec::with_capacity(request.filters.len());
        {
            let mut session = self.session.lock().await;
            for f in request.filters {
                existed.push(match f {
                    UnsubscribeFilter::Shared(key) => {
                        self.broker.unsubscribe_shared(self.conn_id, &mut session, &key).await
                    }
                    UnsubscribeFilter::Plain(filter) => {
                        self.broker.unsubscribe(self.conn_id, &mut session, &filter).await
                    }
                });
            }
        }
        if let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.wake.client_id(), error = %e, "session snapshot after UNSUBSCRIBE failed");
        }
        self.core.handle_unsubscribed(request.token, existed);
    }
}
