//! rumqttc, in both protocol versions, over every listener Silt offers (TCP, TLS, WebSocket on
//! `/mqtt`, WebSocket over TLS) and against passwords and ACLs: the refusals arrive as the
//! codes each version defines. The certificate is made at test time.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Silt;
use rumqttc::{TlsConfiguration, Transport};
use tokio_rustls::rustls;

const WAIT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A client configuration that trusts exactly the test certificate.
fn tls(der: &rustls::pki_types::CertificateDer<'static>) -> TlsConfiguration {
    TlsConfiguration::Rustls(Arc::new(common::client_tls_config(der)))
}

/// How a client reaches the broker: host (a URL for WebSocket), port, transport.
#[derive(Clone)]
struct Route {
    name: &'static str,
    host: String,
    port: u16,
    transport: Transport,
}

fn routes(silt: &Silt, der: &rustls::pki_types::CertificateDer<'static>) -> Vec<Route> {
    let (ws, wss) = (silt.listener_port("ws"), silt.listener_port("wss"));
    vec![
        Route { name: "tcp", host: "127.0.0.1".into(), port: silt.port, transport: Transport::Tcp },
        Route {
            name: "tls",
            host: "localhost".into(),
            port: silt.listener_port("tls"),
            transport: Transport::Tls(tls(der)),
        },
        Route { name: "ws", host: format!("ws://127.0.0.1:{ws}/mqtt"), port: ws, transport: Transport::Ws },
        Route {
            name: "wss",
            host: format!("wss://localhost:{wss}/mqtt"),
            port: wss,
            transport: Transport::Wss(tls(der)),
        },
    ]
}

/// The same client code for both protocol versions: rumqttc has a module per version, with
/// types of the same names.
macro_rules! rumqttc_version {
    ($name:ident, $label:literal, $prefix:literal, { $($imports:item)* }) => {
        mod $name {
            use super::*;
            $($imports)*

            pub fn client(route: &Route, id: &str, creds: Option<(&str, &str)>) -> (AsyncClient, EventLoop) {
                let mut o = MqttOptions::new(format!("{}-{id}", $prefix), route.host.clone(), route.port);
                o.set_keep_alive(Duration::from_secs(30));
                o.set_transport(route.transport.clone());
                if let Some((u, p)) = creds {
                    o.set_credentials(u, p);
                }
                AsyncClient::new(o, 10)
            }

            /// Polls until `pick` returns something; panics on a connection error or after `WAIT`.
            pub async fn until<T>(ev: &mut EventLoop, mut pick: impl FnMut(&Event) -> Option<T>) -> T {
                tokio::time::timeout(WAIT, async {
                    loop {
                        let e = ev.poll().await.expect("connection");
                        if let Some(t) = pick(&e) {
                            return t;
                        }
                    }
                })
                .await
                .expect("timed out")
            }

            /// Subscribes on one connection, publishes QoS 1 on another, checks the delivery.
            pub async fn round_trip(route: &Route) {
                let filter = format!("rt/{}/#", $prefix);
                let (sub, mut sev) = client(route, &format!("sub-{}", route.name), None);
                sub.subscribe(filter.as_str(), QoS::AtLeastOnce).await.unwrap();
                until(&mut sev, |e| matches!(e, Event::Incoming(Packet::SubAck(_))).then_some(())).await;
                let (publisher, mut pev) = client(route, &format!("pub-{}", route.name), None);
                let payload = format!("over {} in {}", route.name, $label);
                publisher.publish(format!("rt/{}/x", $prefix), QoS::AtLeastOnce, false, payload.clone()).await.unwrap();
                until(&mut pev, |e| matches!(e, Event::Incoming(Packet::PubAck(_))).then_some(())).await;
                let got = until(&mut sev, |e| match e {
                    Event::Incoming(Packet::Publish(p)) => Some(p.payload.clone()),
                    _ => None,
                })
                .await;
                assert_eq!(got, payload.as_bytes(), "{}", route.name);
            }

            /// The CONNACK refusal a connection with `creds` gets.
            pub async fn refused(route: &Route, creds: (&str, &str)) -> ConnectReturnCode {
                let (_c, mut ev) = client(route, "refused", Some(creds));
                match tokio::time::timeout(WAIT, ev.poll()).await.expect("an answer") {
                    Err(ConnectionError::ConnectionRefused(code)) => code,
                    other => panic!("expected a refused connection, got {other:?}"),
                }
            }
        }
    };
}

rumqttc_version!(v4, "3.1.1", "v4", {
    use rumqttc::{AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, MqttOptions, Packet, QoS};
});

rumqttc_version!(v5, "5.0", "v5", {
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet};
    use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
});

/// With valid credentials (MQTT 5.0): a SUBSCRIBE and a PUBLISH outside the ACL get 0x87, with a
/// Reason String; what the ACL allows goes through on the same connection.
async fn acl_refusals_v5(route: &Route) {
    use rumqttc::v5::Event;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, SubscribeReasonCode};
    let (c, mut ev) = v5::client(route, "acl", Some(("sensor", "hunter2")));
    c.subscribe("private/#", QoS::AtLeastOnce).await.unwrap();
    let suback = |e: &Event| match e {
        Event::Incoming(Packet::SubAck(a)) => Some(a.return_codes.clone()),
        _ => None,
    };
    assert_eq!(v5::until(&mut ev, suback).await, [SubscribeReasonCode::NotAuthorized]);
    c.publish("private/x", QoS::AtLeastOnce, false, "no").await.unwrap();
    let (reason, why) = v5::until(&mut ev, |e| match e {
        Event::Incoming(Packet::PubAck(a)) => {
            Some((a.reason, a.properties.as_ref().and_then(|p| p.reason_string.clone())))
        }
        _ => None,
    })
    .await;
    assert_eq!(reason, PubAckReason::NotAuthorized);
    assert_eq!(why.as_deref(), Some("not authorized to publish to this topic"));
    c.subscribe("telemetry/#", QoS::AtLeastOnce).await.unwrap();
    assert_eq!(v5::until(&mut ev, suback).await, [SubscribeReasonCode::Success(QoS::AtLeastOnce)]);
    c.publish("telemetry/t", QoS::AtLeastOnce, false, "yes").await.unwrap();
    let got = v5::until(&mut ev, |e| match e {
        Event::Incoming(Packet::Publish(p)) => Some(p.payload.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&got[..], b"yes");
}

#[test]
fn rumqttc_exchanges_messages_over_tcp_tls_ws_and_wss_in_both_versions() {
    let data = tempfile::tempdir().unwrap();
    let certs = common::certs();
    let silt = common::start_all_listeners(data.path(), &certs, &[]);
    runtime().block_on(async {
        for route in routes(&silt, &certs.der) {
            v4::round_trip(&route).await;
            v5::round_trip(&route).await;
        }
    });
    silt.stop();
}

#[test]
fn rumqttc_is_refused_with_each_versions_codes_for_passwords_and_acls() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::sensor_auth_config(dir.path());
    let certs = common::certs();
    let silt = common::start_all_listeners(&dir.path().join("data"), &certs, &["--config", cfg.to_str().unwrap()]);
    runtime().block_on(async {
        // Over a plain and an encrypted transport: the refusals do not depend on it.
        for route in routes(&silt, &certs.der).into_iter().filter(|r| r.name == "tcp" || r.name == "wss") {
            assert_eq!(
                v4::refused(&route, ("sensor", "wrong")).await,
                rumqttc::ConnectReturnCode::BadUserNamePassword,
                "{}",
                route.name
            );
            assert_eq!(
                v5::refused(&route, ("nobody", "x")).await,
                rumqttc::v5::mqttbytes::v5::ConnectReturnCode::BadUserNamePassword,
                "{}",
                route.name
            );
            acl_refusals_v5(&route).await;
        }
    });
    silt.stop();
}
