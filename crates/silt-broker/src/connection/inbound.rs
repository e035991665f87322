//! Packets from the client: PUBLISH (with its durable acknowledgement), PUBREL, SUBSCRIBE
//! (plain and shared), UNSUBSCRIBE, and the dispatch of every packet type.

use super::*;

impl<R, W> Conn<R, W>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send,
{
    pub(super) async fn handle(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(p) => self.on_publish(p).await,
            Packet::PubAck(r) => {
                if let Some(f) = self.inflight.on_puback(r.packet_id) {
                    self.completed(r.packet_id, QoS::AtLeastOnce, f).await;
                }
                Ok(())
            }
            Packet::PubRec(r) => {
                match self.inflight.on_pubrec(r.packet_id, r.reason_code) {
                    PubRecOutcome::Release => self.queue(&Packet::PubRel(PubResponse::new(r.packet_id))),
                    PubRecOutcome::Refused(f) => self.completed(r.packet_id, QoS::ExactlyOnce, f).await,
                    PubRecOutcome::Unknown => {
                        let mut rel = PubResponse::new(r.packet_id);
                        rel.reason_code = ReasonCode::PacketIdentifierNotFound;
                        self.queue(&Packet::PubRel(rel));
                    }
                }
                Ok(())
            }
            Packet::PubComp(r) => {
                if let Some(f) = self.inflight.on_pubcomp(r.packet_id) {
                    self.completed(r.packet_id, QoS::ExactlyOnce, f).await;
                }
                Ok(())
            }
            Packet::PubRel(r) => {
                let known = self.session.lock().await.inbound_qos2.remove(&r.packet_id.get());
                let mut comp = PubResponse::new(r.packet_id);
                if !known {
                    comp.reason_code = ReasonCode::PacketIdentifierNotFound;
                }
                self.queue(&Packet::PubComp(comp));
                Ok(())
            }
            // Boxed: rare and deep (filter registration, a durable snapshot), they would
            // otherwise set the size of every connection's future.
            Packet::Subscribe(s) => Box::pin(self.on_subscribe(s)).await,
            Packet::Unsubscribe(u) => {
                Box::pin(self.on_unsubscribe(u)).await;
                Ok(())
            }
            Packet::PingReq => {
                self.queue(&Packet::PingResp);
                Ok(())
            }
            Packet::Disconnect(d) => {
                if self.version.is_v5()
                    && let Some(e) = d.properties.session_expiry_interval
                {
                    if self.session_expiry == 0 && e > 0 {
                        return Err(Close::Violation(ReasonCode::ProtocolError));
                    }
                    self.session_expiry = e.min(self.broker.config.max_session_expiry_secs);
                    self.session.lock().await.expiry_secs = self.session_expiry;
                }
                Err(Close::Client { will: d.reason_code == ReasonCode::DisconnectWithWillMessage })
            }
            Packet::Auth(_) => Err(Close::Violation(ReasonCode::BadAuthenticationMethod)),
            Packet::Connect(_) => Err(Close::Violation(ReasonCode::ProtocolError)),
            Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                Err(Close::Violation(ReasonCode::ProtocolError))
            }
        }
    }

    pub(super) async fn on_publish(&mut self, p: Publish) -> Result<(), Close> {
        let topic = self.topic_aliases_in.resolve(p.properties.topic_alias, &p.topic).map_err(Close::Violation)?;
        if TopicName::new(topic.clone()).is_err() {
            return Err(Close::Violation(ReasonCode::TopicNameInvalid));
        }
        if p.qos != QoS::AtMostOnce {
            let waiting = self.pending_in.len() + self.session.lock().await.inbound_qos2.len();
            if waiting >= usize::from(self.broker.config.receive_maximum) {
                return Err(Close::Violation(ReasonCode::ReceiveMaximumExceeded));
            }
        }
        let packet_id = p.packet_id;
        if p.qos == QoS::ExactlyOnce
            && let Some(id) = packet_id
            && self.session.lock().await.inbound_qos2.contains(&id.get())
        {
            // A resend of a QoS 2 message already stored: acknowledge, never store twice.
            self.queue(&Packet::PubRec(PubResponse::new(id)));
            return Ok(());
        }
        let denied = topic.starts_with("$SYS") // the broker's statistics are its own
            || !self.broker.auth.allows_topic(self.username.as_deref(), &self.client_id, Access::Write, &topic);
        if denied {
            tracing::debug!(client_id = %self.client_id, topic = %topic, "publish not authorized");
            // MQTT 3.1.1 cannot say no: the message is acknowledged and dropped, as mosquitto does.
            if let Some(id) = packet_id {
                let mut r = PubResponse::new(id);
                r.reason_code = ReasonCode::NotAuthorized;
                let ack = if p.qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) };
                self.queue(&ack);
            }
            return Ok(());
        }
        let message = Message {
            topic,
            payload: p.payload,
            qos: p.qos.as_u8(),
            retain: p.retain,
            utf8_payload: p.properties.payload_format_indicator.unwrap_or(false),
            expiry: p.properties.message_expiry_interval,
            content_type: p.properties.content_type,
            response_topic: p.properties.response_topic,
            correlation_data: p.properties.correlation_data,
            user_properties: p.properties.user_properties,
            publisher: Some(self.client_id.clone()),
            timestamp: Timestamp::now(),
        };
        let ack = match self.broker.submit(&message).await {
            Ok(ack) => ack,
            Err(e) => {
                tracing::warn!(client_id = %self.client_id, error = %e, "publish could not be stored");
                return match packet_id {
                    Some(id) if self.version.is_v5() => {
                        let mut r = PubResponse::new(id);
                        r.reason_code = ReasonCode::UnspecifiedError;
                        let ack = if p.qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) };
                        self.queue(&ack);
                        Ok(())
                    }
                    Some(_) => Err(Close::Lost), // 3.1.1 has no negative ack: close, the client resends
                    None => Ok(()),
                };
            }
        };
        match packet_id {
            Some(id) if p.qos != QoS::AtMostOnce => {
                self.pending_in.push_back(PendingIn { packet_id: id, qos: p.qos, ack })
            }
            // QoS 0: nobody waits for the log; the append still happens in order.
            _ => {
                tokio::spawn(async move {
                    let _ = ack.await;
                });
            }
        }
        Ok(())
    }

    pub(super) async fn acknowledge_publish(
        &mut self,
        packet_id: PacketId,
        qos: QoS,
        result: silt_storage::Result<Appended>,
    ) -> Result<(), Close> {
        let mut r = PubResponse::new(packet_id);
        if let Err(e) = result {
            tracing::warn!(client_id = %self.client_id, error = %e, "publish not durable");
            if !self.version.is_v5() {
                return Err(Close::Lost);
            }
            r.reason_code = ReasonCode::UnspecifiedError;
        } else if qos == QoS::ExactlyOnce {
            self.session.lock().await.inbound_qos2.insert(packet_id.get());
        }
        let packet = if qos == QoS::ExactlyOnce { Packet::PubRec(r) } else { Packet::PubAck(r) };
        self.queue(&packet);
        Ok(())
    }

    pub(super) async fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let sub_id = s.properties.subscription_identifier;
        if sub_id == Some(0) {
            return Err(Close::Violation(ReasonCode::ProtocolError));
        }
        let mut codes = Vec::with_capacity(s.subscriptions.len());
        let mut retained = Vec::new();
        {
            let session_ref = self.session.clone();
            let mut session = session_ref.lock().await;
            for sub in &s.subscriptions {
                if sub.filter.starts_with("$share/") {
                    codes.push(
                        self.subscribe_shared(&mut session, &sub.filter, sub.options.qos, sub_id, sub.options.no_local)
                            .await,
                    );
                    continue;
                }
                let filter = match TopicFilter::new(sub.filter.clone()) {
                    Ok(f) => f,
                    Err(_) => {
                        codes.push(if self.version.is_v5() {
                            ReasonCode::TopicFilterInvalid
                        } else {
                            ReasonCode::UnspecifiedError
                        });
                        continue;
                    }
                };
                if !self.broker.auth.allows_subscribe(self.username.as_deref(), &self.client_id, filter.as_str()) {
                    tracing::debug!(client_id = %self.client_id, filter = %filter, "subscribe not authorized");
                    codes.push(if self.version.is_v5() {
                        ReasonCode::NotAuthorized
                    } else {
                        ReasonCode::UnspecifiedError
                    });
                    continue;
                }
                let existed = session.subs.subs.contains_key(filter.as_str());
                let o = sub.options;
                let state = SubscriptionState {
                    filter: filter.as_str().to_owned(),
                    qos: o.qos.as_u8(),
                    no_local: o.no_local && self.version.is_v5(),
                    retain_as_published: o.retain_as_published && self.version.is_v5(),
                    subscription_id: sub_id,
                    cursor: 0,
                    sent: 0,
                };
                match self.broker.subscribe(self.conn_id, &self.wake, &mut session, &filter, state).await {
                    Ok(()) => {
                        codes.push(match o.qos {
                            QoS::AtMostOnce => ReasonCode::Success,
                            QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
                            QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
                        });
                        let send_retained = match o.retain_handling {
                            RetainHandling::SendAtSubscribe => true,
                            RetainHandling::SendAtSubscribeIfNew => !existed,
                            RetainHandling::DoNotSend => false,
                        };
                        if send_retained || !self.version.is_v5() {
                            retained.push((filter, o.qos));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(client_id = %self.client_id, error = %e, "subscribe failed");
                        codes.push(ReasonCode::UnspecifiedError);
                    }
                }
            }
        }
        if let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.client_id, error = %e, "session snapshot after SUBSCRIBE failed");
        }
        self.queue(&Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            properties: AckProperties::default(),
        }));
        for (filter, qos) in retained {
            for m in self.broker.retained_for(&filter) {
                self.retained_queue.push_back((m, qos, sub_id));
            }
        }
        self.want_pull = true;
        Ok(())
    }

    /// One `$share/{group}/{filter}` entry of a SUBSCRIBE; returns its reason code.
    pub(super) async fn subscribe_shared(
        &mut self,
        session: &mut crate::broker::Session,
        key: &str,
        qos: QoS,
        sub_id: Option<u32>,
        no_local: bool,
    ) -> ReasonCode {
        let invalid = if self.version.is_v5() { ReasonCode::TopicFilterInvalid } else { ReasonCode::UnspecifiedError };
        let Some((_, filter)) = parse_shared(key) else { return invalid };
        if no_local && self.version.is_v5() {
            return ReasonCode::ProtocolError; // [MQTT-3.8.3-4]: no-local on a shared subscription
        }
        if !self.broker.auth.allows_subscribe(self.username.as_deref(), &self.client_id, filter.as_str()) {
            return if self.version.is_v5() { ReasonCode::NotAuthorized } else { ReasonCode::UnspecifiedError };
        }
        let membership = SharedMembership { key: key.to_owned(), qos: qos.as_u8(), subscription_id: sub_id };
        match self.broker.subscribe_shared(self.conn_id, &self.wake, session, key, membership).await {
            Ok(()) => match qos {
                QoS::AtMostOnce => ReasonCode::Success,
                QoS::AtLeastOnce => ReasonCode::GrantedQoS1,
                QoS::ExactlyOnce => ReasonCode::GrantedQoS2,
            },
            Err(e) => {
                tracing::warn!(client_id = %self.client_id, error = %e, "shared subscribe failed");
                ReasonCode::UnspecifiedError
            }
        }
    }

    pub(super) async fn on_unsubscribe(&mut self, u: Unsubscribe) {
        let mut codes = Vec::with_capacity(u.filters.len());
        {
            let mut session = self.session.lock().await;
            for f in &u.filters {
                if f.starts_with("$share/") {
                    let gone = self.broker.unsubscribe_shared(self.conn_id, &mut session, f).await;
                    codes.push(if gone { ReasonCode::Success } else { ReasonCode::NoSubscriptionExisted });
                    continue;
                }
                let code = match TopicFilter::new(f.clone()) {
                    Ok(filter) => {
                        if self.broker.unsubscribe(self.conn_id, &mut session, &filter).await {
                            ReasonCode::Success
                        } else {
                            ReasonCode::NoSubscriptionExisted
                        }
                    }
                    Err(_) => ReasonCode::TopicFilterInvalid,
                };
                codes.push(code);
            }
        }
        if let Err(e) = self.broker.persist(&self.session).await {
            tracing::warn!(client_id = %self.client_id, error = %e, "session snapshot after UNSUBSCRIBE failed");
        }
        self.queue(&Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            properties: AckProperties::default(),
        }));
    }
}
