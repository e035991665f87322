//! rumqttc, in both protocol versions, over every listener Silt offers (TCP, TLS, WebSocket on
//! `/mqtt`, WebSocket over TLS) and against passwords and ACLs: the refusals arrive as the
//! codes each version defines. The certificate is made at test time.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::Silt;
use rumqttc::{TlsConfiguration, Transport};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

const WAIT: Duration = Duration::from_secs(20);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A client configuration that trusts exactly the test certificate.
fn tls(der: &rustls::pki_types::CertificateDer<'static>) -> TlsConfiguration {
    let mut roots = RootCertStore::empty();
    roots.add(der.clone()).unwrap();
    let config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConfiguration::Rustls(Arc::new(config))
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

mod v4 {
    use super::*;
    use rumqttc::{AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, MqttOptions, Packet, QoS};

    pub fn client(route: &Route, id: &str, creds: Option<(&str, &str)>) -> (AsyncClient, EventLoop) {
        let mut o = MqttOptions::new(id, route.host.clone(), route.port);
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

    /// Subscribes on one connection, publishes QoS 1 on another, and checks the delivery.
    pub async fn round_trip(route: &Route) {
        let (sub, mut sev) = client(route, &format!("v4-sub-{}", route.name), None);
        sub.subscribe("rt/#", QoS::AtLeastOnce).await.unwrap();
        until(&mut sev, |e| matches!(e, Event::Incoming(Packet::SubAck(_))).then_some(())).await;
        let (publisher, mut pev) = client(route, &format!("v4-pub-{}", route.name), None);
        let payload = format!("over {} in 3.1.1", route.name);
        publisher.publish("rt/x", QoS::AtLeastOnce, false, payload.clone()).await.unwrap();
        until(&mut pev, |e| matches!(e, Event::Incoming(Packet::PubAck(_))).then_some(())).await;
        let got = until(&mut sev, |e| match e {
            Event::Incoming(Packet::Publish(p)) => Some(p.payload.clone()),
            _ => None,
        })
        .await;
        assert_eq!(got, payload.as_bytes(), "{}", route.name);
    }

    pub async fn refused(route: &Route, creds: (&str, &str)) -> ConnectReturnCode {
        let (_c, mut ev) = client(route, "v4-refused", Some(creds));
        match tokio::time::timeout(WAIT, ev.poll()).await.expect("an answer") {
            Err(ConnectionError::ConnectionRefused(code)) => code,
            other => panic!("expected a refused connection, got {other:?}"),
        }
    }
}

mod v5 {
    use super::*;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, Packet, PubAckReason, SubscribeReasonCode};
    use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};

    pub fn client(route: &Route, id: &str, creds: Option<(&str, &str)>) -> (AsyncClient, EventLoop) {
        let mut o = MqttOptions::new(id, route.host.clone(), route.port);
        o.set_keep_alive(Duration::from_secs(30));
        o.set_transport(route.transport.clone());
        if let Some((u, p)) = creds {
            o.set_credentials(u, p);
        }
        AsyncClient::new(o, 10)
    }

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

    pub async fn round_trip(route: &Route) {
        let (sub, mut sev) = client(route, &format!("v5-sub-{}", route.name), None);
        sub.subscribe("rt5/#", QoS::AtLeastOnce).await.unwrap();
        until(&mut sev, |e| matches!(e, Event::Incoming(Packet::SubAck(_))).then_some(())).await;
        let (publisher, mut pev) = client(route, &format!("v5-pub-{}", route.name), None);
        let payload = format!("over {} in 5.0", route.name);
        publisher.publish("rt5/x", QoS::AtLeastOnce, false, payload.clone()).await.unwrap();
        until(&mut pev, |e| matches!(e, Event::Incoming(Packet::PubAck(_))).then_some(())).await;
        let got = until(&mut sev, |e| match e {
            Event::Incoming(Packet::Publish(p)) => Some(p.payload.clone()),
            _ => None,
        })
        .await;
        assert_eq!(got, payload.as_bytes(), "{}", route.name);
    }

    pub async fn refused(route: &Route, creds: (&str, &str)) -> ConnectReturnCode {
        let (_c, mut ev) = client(route, "v5-refused", Some(creds));
        match tokio::time::timeout(WAIT, ev.poll()).await.expect("an answer") {
            Err(ConnectionError::ConnectionRefused(code)) => code,
            other => panic!("expected a refused connection, got {other:?}"),
        }
    }

    /// With valid credentials: a SUBSCRIBE and a PUBLISH outside the ACL get 0x87, with a
    /// Reason String; what the ACL allows goes through on the same connection.
    pub async fn acl_refusals(route: &Route) {
        let (c, mut ev) = client(route, "v5-acl", Some(("sensor", "hunter2")));
        c.subscribe("private/#", QoS::AtLeastOnce).await.unwrap();
        let codes = until(&mut ev, |e| match e {
            Event::Incoming(Packet::SubAck(a)) => Some(a.return_codes.clone()),
            _ => None,
        })
        .await;
        assert_eq!(codes, [SubscribeReasonCode::NotAuthorized]);
        c.publish("private/x", QoS::AtLeastOnce, false, "no").await.unwrap();
        let (reason, why) = until(&mut ev, |e| match e {
            Event::Incoming(Packet::PubAck(a)) => {
                Some((a.reason, a.properties.as_ref().and_then(|p| p.reason_string.clone())))
            }
            _ => None,
        })
        .await;
        assert_eq!(reason, PubAckReason::NotAuthorized);
        assert_eq!(why.as_deref(), Some("not authorized to publish to this topic"));
        c.subscribe("telemetry/#", QoS::AtLeastOnce).await.unwrap();
        let codes = until(&mut ev, |e| match e {
            Event::Incoming(Packet::SubAck(a)) => Some(a.return_codes.clone()),
            _ => None,
        })
        .await;
        assert_eq!(codes, [SubscribeReasonCode::Success(QoS::AtLeastOnce)]);
        c.publish("telemetry/t", QoS::AtLeastOnce, false, "yes").await.unwrap();
        let got = until(&mut ev, |e| match e {
            Event::Incoming(Packet::Publish(p)) => Some(p.payload.clone()),
            _ => None,
        })
        .await;
        assert_eq!(&got[..], b"yes");
    }
}

fn certificate()
-> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf, rustls::pki_types::CertificateDer<'static>) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    (dir, cert, key, ck.cert.der().clone())
}

fn start(data: &Path, cert: &Path, key: &Path, extra: &[&str]) -> Silt {
    let mut args = vec![
        "--mqtt-tls",
        "127.0.0.1:0",
        "--mqtt-ws",
        "127.0.0.1:0",
        "--mqtt-wss",
        "127.0.0.1:0",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Silt::start_with(data, &args)
}

#[test]
fn rumqttc_exchanges_messages_over_tcp_tls_ws_and_wss_in_both_versions() {
    let data = tempfile::tempdir().unwrap();
    let (_certs, cert, key, der) = certificate();
    let silt = start(data.path(), &cert, &key, &[]);
    runtime().block_on(async {
        for route in routes(&silt, &der) {
            v4::round_trip(&route).await;
            v5::round_trip(&route).await;
        }
    });
    silt.stop();
}

#[test]
fn rumqttc_is_refused_with_each_versions_codes_for_passwords_and_acls() {
    let dir = tempfile::tempdir().unwrap();
    let passwd = dir.path().join("passwd");
    let mut add = std::process::Command::new(env!("CARGO_BIN_EXE_silt"))
        .arg("passwd")
        .arg(&passwd)
        .arg("sensor")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut add.stdin.take().unwrap(), b"hunter2\n").unwrap();
    assert!(add.wait().unwrap().success());
    let acl = dir.path().join("acl");
    std::fs::write(&acl, "user sensor\ntopic readwrite telemetry/#\n").unwrap();
    let cfg = dir.path().join("silt.toml");
    std::fs::write(
        &cfg,
        format!("[mqtt.auth]\npassword_file = {:?}\nacl_file = {:?}\n", passwd.display(), acl.display()),
    )
    .unwrap();
    let (_certs, cert, key, der) = certificate();
    let silt = start(&dir.path().join("data"), &cert, &key, &["--config", cfg.to_str().unwrap()]);
    runtime().block_on(async {
        // Over a plain and an encrypted transport: the refusals do not depend on it.
        for route in routes(&silt, &der).into_iter().filter(|r| r.name == "tcp" || r.name == "wss") {
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
            v5::acl_refusals(&route).await;
        }
    });
    silt.stop();
}
