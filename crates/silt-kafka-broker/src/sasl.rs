//! Who a Kafka connection is: SASL (SaslHandshake v1, then SaslAuthenticate: KIP-152) against
//! the users of `mqtt.auth.password_file`, or anonymous where `mqtt.auth.allow_anonymous`
//! lets the peer be.
//!
//! - With a password file, PLAIN (argon2, on the bounded verifier pool) and SCRAM-SHA-256/512
//!   ([`silt_auth::scram`], the proof paced on the same pool) are offered, as
//!   `kafka.sasl_mechanisms` allows. Without one, no mechanism is: a client configured for SASL
//!   gets UNSUPPORTED_SASL_MECHANISM, with the empty list of what is enabled.
//! - A connection that may not be anonymous is served ApiVersions and SASL only, with frames of
//!   at most [`PRE_AUTH_MAX_FRAME`] bytes, for `kafka.auth_timeout_ms`; anything else closes
//!   it. One that may be anonymous can still authenticate, as its first act.
//! - A failed authentication is answered SASL_AUTHENTICATION_FAILED and the connection closed,
//!   as Kafka does; the reason is logged, the password never.
//!
//! After SaslHandshake v0 (clients before Kafka 1.0) the mechanism's messages come as raw
//! frames, without a request header, and are answered the same way ([`Session::raw`]); a
//! failure then just closes the connection, as Kafka does.

use std::net::SocketAddr;

use bytes::Bytes;
use silt_auth::scram::{Exchange, Mechanism};
use silt_auth::{Auth, AuthError};
use silt_kafka::kafka_protocol::ResponseError;
use silt_kafka::kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use silt_kafka::kafka_protocol::protocol::StrBytes;

use crate::config::KafkaConfig;

/// The largest frame read before a connection has authenticated (SASL messages and
/// ApiVersions are small; Kafka's own limit for SASL is 512 KiB).
pub const PRE_AUTH_MAX_FRAME: usize = 64 * 1024;

enum State {
    /// Must authenticate before anything but ApiVersions and SASL.
    Required,
    /// May stay anonymous; SASL is still possible while `served` is false.
    Anonymous { served: bool },
    /// Handshake done: the mechanism's first message is expected.
    Handshaken(Mech),
    /// SCRAM's client-final message is expected.
    Scram(Exchange),
    /// Authenticated by SASL.
    Done,
    /// An exchange failed or went out of order: nothing more is served.
    Failed,
}

#[derive(Clone, Copy)]
enum Mech {
    Plain,
    Scram(Mechanism),
}

/// A connection's authentication.
pub struct Session {
    state: State,
    /// The handshake was v0: SASL messages come as raw frames.
    raw: bool,
    /// The authenticated user; `None`: anonymous (or not yet authenticated).
    pub user: Option<String>,
}

/// What a SASL request leads to.
pub struct Answer<R> {
    pub response: R,
    /// Close the connection after the response, for this reason.
    pub close: Option<String>,
}

impl Session {
    pub fn new(auth: &Auth, peer: SocketAddr) -> Session {
        let state = if auth.allows_anonymous(peer) { State::Anonymous { served: false } } else { State::Required };
        Session { state, raw: false, user: None }
    }

    /// Whether the next frame is a raw SASL message (after a v0 handshake), not a request.
    pub fn raw(&self) -> bool {
        self.raw && matches!(self.state, State::Handshaken(_) | State::Scram(_))
    }

    /// Whether requests other than ApiVersions and SASL may be served.
    pub fn authenticated(&self) -> bool {
        matches!(self.state, State::Anonymous { .. } | State::Done)
    }

    /// The largest frame to read now.
    pub fn max_frame(&self, config: &KafkaConfig) -> usize {
        if self.authenticated() { config.max_request_bytes } else { PRE_AUTH_MAX_FRAME.min(config.max_request_bytes) }
    }

    /// Before a request that is neither ApiVersions nor SASL: may it be served?
    pub fn admit(&mut self) -> Result<(), &'static str> {
        match &mut self.state {
            State::Anonymous { served } => {
                *served = true;
                Ok(())
            }
            State::Done => Ok(()),
            State::Required => Err("authentication required (SASL) before any request but ApiVersions"),
            State::Handshaken(_) | State::Scram(_) => Err("a request in the middle of a SASL exchange"),
            State::Failed => Err("authentication failed"),
        }
    }

    /// The mechanisms this listener offers.
    fn enabled(auth: &Auth, config: &KafkaConfig) -> Vec<String> {
        if !auth.usernames_verified() {
            return Vec::new();
        }
        config.sasl_mechanisms.clone()
    }

    pub fn handshake(
        &mut self,
        auth: &Auth,
        config: &KafkaConfig,
        req: &SaslHandshakeRequest,
        version: i16,
    ) -> Answer<SaslHandshakeResponse> {
        self.raw = version == 0;
        let enabled = Self::enabled(auth, config);
        let mut response = SaslHandshakeResponse::default()
            .with_mechanisms(enabled.iter().map(|m| StrBytes::from_string(m.clone())).collect());
        let may_start = matches!(self.state, State::Required | State::Anonymous { served: false });
        if !may_start {
            self.state = State::Failed;
            response.error_code = ResponseError::IllegalSaslState.code();
            return Answer { response, close: Some("SaslHandshake out of order".into()) };
        }
        let asked = req.mechanism.as_str();
        let mech = match (enabled.iter().any(|m| m == asked), asked) {
            (true, "PLAIN") => Some(Mech::Plain),
            (true, other) => Mechanism::from_name(other).map(Mech::Scram),
            (false, _) => None,
        };
        match mech {
            Some(m) => {
                self.state = State::Handshaken(m);
                Answer { response, close: None }
            }
            None => {
                self.state = State::Failed;
                response.error_code = ResponseError::UnsupportedSaslMechanism.code();
                Answer { response, close: Some(format!("SASL mechanism {asked:?} is not enabled")) }
            }
        }
    }

    pub async fn authenticate(
        &mut self,
        auth: &Auth,
        req: SaslAuthenticateRequest,
        peer: SocketAddr,
    ) -> Answer<SaslAuthenticateResponse> {
        let fail = |code: ResponseError, message: String| Answer {
            response: SaslAuthenticateResponse::default()
                .with_error_code(code.code())
                .with_error_message(Some(StrBytes::from_string(message.clone()))),
            close: Some(message),
        };
        let ok = |bytes: Vec<u8>| Answer {
            response: SaslAuthenticateResponse::default().with_auth_bytes(Bytes::from(bytes)),
            close: None,
        };
        match std::mem::replace(&mut self.state, State::Failed) {
            State::Handshaken(Mech::Plain) => {
                let Some((user, password)) = plain(&req.auth_bytes) else {
                    return fail(ResponseError::SaslAuthenticationFailed, "malformed SASL/PLAIN message".into());
                };
                match auth.authenticate(Some(&user), Some(&password), peer).await {
                    Ok(()) => {
                        tracing::debug!(%peer, user, "kafka client authenticated (PLAIN)");
                        self.user = Some(user);
                        self.state = State::Done;
                        ok(Vec::new())
                    }
                    Err(e) => refused(fail, e, &user, "PLAIN"),
                }
            }
            State::Handshaken(Mech::Scram(m)) => {
                let mut exchange = Exchange::new(m);
                match exchange.first(&req.auth_bytes, auth) {
                    Ok(server_first) => {
                        self.state = State::Scram(exchange);
                        ok(server_first)
                    }
                    Err(e) => fail(ResponseError::SaslAuthenticationFailed, format!("{}: {e}", m.name())),
                }
            }
            State::Scram(exchange) => {
                let m = exchange.mechanism();
                match auth.scram_finish(exchange, req.auth_bytes, peer).await {
                    Ok((user, server_final)) => {
                        tracing::debug!(%peer, user, mechanism = m.name(), "kafka client authenticated");
                        self.user = Some(user);
                        self.state = State::Done;
                        ok(server_final)
                    }
                    Err(e) => refused(fail, e, "", m.name()),
                }
            }
            _ => fail(ResponseError::IllegalSaslState, "SaslAuthenticate without a SaslHandshake".into()),
        }
    }
}

fn refused<R>(
    fail: impl Fn(ResponseError, String) -> Answer<R>,
    e: AuthError,
    user: &str,
    mechanism: &str,
) -> Answer<R> {
    let who = if user.is_empty() { String::new() } else { format!(" for {user:?}") };
    match e {
        AuthError::Busy => {
            fail(ResponseError::SaslAuthenticationFailed, "the broker is busy verifying credentials; try again".into())
        }
        AuthError::BadCredentials | AuthError::NotAuthorized => fail(
            ResponseError::SaslAuthenticationFailed,
            format!("authentication failed{who}: invalid credentials with SASL mechanism {mechanism}"),
        ),
    }
}

/// A SASL/PLAIN message (RFC 4616): `authzid NUL authcid NUL passwd`; the authzid must be
/// empty or the user itself.
fn plain(msg: &[u8]) -> Option<(String, Bytes)> {
    let mut parts = msg.split(|&b| b == 0);
    let (authzid, user, password) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || user.is_empty() || (!authzid.is_empty() && authzid != user) {
        return None;
    }
    let user = std::str::from_utf8(user).ok()?.to_owned();
    Some((user, Bytes::copy_from_slice(password)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_messages_name_one_user() {
        assert_eq!(plain(b"\0alice\0pw"), Some(("alice".into(), Bytes::from_static(b"pw"))));
        assert_eq!(plain(b"alice\0alice\0pw").map(|p| p.0), Some("alice".into()));
        assert_eq!(plain(b"bob\0alice\0pw"), None, "acting for another user");
        assert_eq!(plain(b"\0\0pw"), None);
        assert_eq!(plain(b"\0alice"), None);
        assert_eq!(plain(b"\0alice\0pw\0more"), None);
    }
}
