//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side, sans-I/O: the
//! Kafka listener's SASL exchange (and any protocol's) feeds it the client's messages.
//!
//! What the password file keeps per mechanism is what RFC 5802 §3 says a server keeps:
//! `StoredKey = H(HMAC(SaltedPassword, "Client Key"))` and
//! `ServerKey = HMAC(SaltedPassword, "Server Key")`, with the salt and iteration count. Neither
//! lets anyone log in: a stolen file allows only offline guessing at PBKDF2's cost. The
//! password line reads `user:ARGON2-PHC:scram-sha-256=ITER,SALT,STOREDKEY,SERVERKEY:...`
//! (base64), written by `silt passwd`.
//!
//! Hand-written on `ring` (already in the tree for rustls): the SCRAM crates keep the salted
//! password itself, which is as good as the password for SCRAM, and channel binding is not
//! needed here (TLS is terminated by the listener; clients offer `n,,` or `y,,`).
//!
//! An unknown user (or one without a credential for the mechanism) gets a made-up salt
//! derived from a per-process secret, stable per name, and always fails at the proof: the
//! exchange looks the same as for a known user with a wrong password. Passwords are used as
//! their UTF-8 bytes, without SASLprep, as Kafka's own clients and broker do.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use ring::{digest, hmac, pbkdf2, rand};
use std::num::NonZeroU32;

/// Iterations `silt passwd` uses (RFC 7677 asks for at least 4096; Kafka's default is 4096).
pub const DEFAULT_ITERATIONS: u32 = 8192;
/// Iterations accepted in a password file (a client spends this much per login).
const MIN_ITERATIONS: u32 = 4096;
const MAX_ITERATIONS: u32 = 1 << 20;
/// The longest client message accepted (a client-first or client-final message).
pub const MAX_MESSAGE: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mechanism {
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::ScramSha256, Mechanism::ScramSha512];

    /// The SASL mechanism name.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The field name in the password file.
    fn field(self) -> &'static str {
        match self {
            Mechanism::ScramSha256 => "scram-sha-256",
            Mechanism::ScramSha512 => "scram-sha-512",
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::ScramSha256 => &digest::SHA256,
            Mechanism::ScramSha512 => &digest::SHA512,
        }
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Mechanism::ScramSha256 => hmac::HMAC_SHA256,
            Mechanism::ScramSha512 => hmac::HMAC_SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::ScramSha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::ScramSha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    fn len(self) -> usize {
        self.digest().output_len()
    }

    fn mac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        hmac::sign(&hmac::Key::new(self.hmac(), key), data).as_ref().to_vec()
    }
}

/// What the server keeps of a password for one mechanism.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub mechanism: Mechanism,
    iterations: u32,
    salt: Vec<u8>,
    stored_key: Vec<u8>,
    server_key: Vec<u8>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("mechanism", &self.mechanism).field("iterations", &self.iterations).finish()
    }
}

impl Credential {
    /// A credential for `password` with a fresh random salt.
    pub fn new(mechanism: Mechanism, password: &[u8], iterations: u32) -> Credential {
        let mut salt = vec![0u8; 24];
        rand::SecureRandom::fill(&rand::SystemRandom::new(), &mut salt).expect("invariant: the OS has randomness");
        Credential::with_salt(mechanism, password, salt, iterations)
    }

    fn with_salt(mechanism: Mechanism, password: &[u8], salt: Vec<u8>, iterations: u32) -> Credential {
        let mut salted = vec![0u8; mechanism.len()];
        let n = NonZeroU32::new(iterations.max(1)).expect("invariant: at least one");
        pbkdf2::derive(mechanism.pbkdf2(), n, &salt, password, &mut salted);
        let client_key = mechanism.mac(&salted, b"Client Key");
        let stored_key = digest::digest(mechanism.digest(), &client_key).as_ref().to_vec();
        let server_key = mechanism.mac(&salted, b"Server Key");
        Credential { mechanism, iterations, salt, stored_key, server_key }
    }

    /// Made-up, per-name stable keys that no proof matches: what an unknown user meets.
    fn dummy(mechanism: Mechanism, user: &str, secret: &[u8]) -> Credential {
        let derive = |what: &str, len: usize| {
            let mut tag = mechanism.mac(secret, format!("{what}\0{}\0{user}", mechanism.name()).as_bytes());
            tag.truncate(len);
            tag
        };
        Credential {
            mechanism,
            iterations: DEFAULT_ITERATIONS,
            salt: derive("salt", 24),
            stored_key: derive("stored", mechanism.len()),
            server_key: derive("server", mechanism.len()),
        }
    }

    /// The password-file field: `scram-sha-256=ITER,SALT,STOREDKEY,SERVERKEY`.
    pub fn encode(&self) -> String {
        format!(
            "{}={},{},{},{}",
            self.mechanism.field(),
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(&self.stored_key),
            B64.encode(&self.server_key)
        )
    }

    /// Parses a field written by [`Credential::encode`].
    pub fn decode(field: &str) -> Result<Credential, String> {
        let (name, rest) = field.split_once('=').ok_or("expected `scram-sha-256=ITER,SALT,STOREDKEY,SERVERKEY`")?;
        let mechanism = Mechanism::ALL
            .into_iter()
            .find(|m| m.field() == name)
            .ok_or_else(|| format!("unknown credential {name:?} (scram-sha-256 or scram-sha-512)"))?;
        let parts: Vec<&str> = rest.split(',').collect();
        let [iterations, salt, stored, server] = parts.as_slice() else {
            return Err(format!("{name}: expected ITER,SALT,STOREDKEY,SERVERKEY"));
        };
        let iterations: u32 = iterations.parse().map_err(|_| format!("{name}: iteration count {iterations:?}"))?;
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(format!("{name}: iteration count {iterations} not in {MIN_ITERATIONS}..={MAX_ITERATIONS}"));
        }
        let b = |what: &str, s: &str| B64.decode(s).map_err(|e| format!("{name}: {what}: {e}"));
        let (salt, stored_key, server_key) = (b("salt", salt)?, b("stored key", stored)?, b("server key", server)?);
        if salt.is_empty() || stored_key.len() != mechanism.len() || server_key.len() != mechanism.len() {
            return Err(format!("{name}: key or salt of the wrong length"));
        }
        Ok(Credential { mechanism, iterations, salt, stored_key, server_key })
    }
}

/// Why an exchange failed. The message is for the server's log and the client's error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("SCRAM extensions (delegation tokens) are not supported")]
    Extensions,
    #[error("the authorization id differs from the username")]
    Authzid,
    #[error("invalid credentials")]
    Invalid,
    #[error("the exchange is over")]
    Finished,
}

/// Looks up the credential of a user; `None`: unknown user, or none for the mechanism.
pub trait Credentials {
    fn credential(&self, mechanism: Mechanism, user: &str) -> Option<Credential>;
    /// The per-process secret that made-up credentials derive from.
    fn secret(&self) -> &[u8];
}

enum State {
    First,
    Final {
        user: String,
        known: bool,
        credential: Credential,
        gs2_header: String,
        nonce: String,
        /// client-first-bare "," server-first: the head of the AuthMessage.
        messages: String,
    },
    Done,
}

/// The server side of one SCRAM exchange: [`Exchange::first`], then [`Exchange::finish`].
pub struct Exchange {
    mechanism: Mechanism,
    state: State,
}

impl Exchange {
    pub fn new(mechanism: Mechanism) -> Exchange {
        Exchange { mechanism, state: State::First }
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// Takes the client-first message; returns the server-first message.
    pub fn first(&mut self, msg: &[u8], users: &dyn Credentials) -> Result<Vec<u8>, ScramError> {
        let mut nonce = [0u8; 24];
        rand::SecureRandom::fill(&rand::SystemRandom::new(), &mut nonce).map_err(|_| ScramError::Invalid)?;
        self.first_with_nonce(msg, users, &B64.encode(nonce))
    }

    fn first_with_nonce(&mut self, msg: &[u8], users: &dyn Credentials, s_nonce: &str) -> Result<Vec<u8>, ScramError> {
        if !matches!(self.state, State::First) {
            return Err(ScramError::Finished);
        }
        self.state = State::Done;
        let msg = text(msg)?;
        // gs2-header: cbind-flag "," [authzid] ","
        let mut parts = msg.splitn(3, ',');
        let (flag, authzid, bare) = match (parts.next(), parts.next(), parts.next()) {
            (Some(f), Some(a), Some(b)) => (f, a, b),
            _ => return Err(ScramError::Malformed("client-first: no gs2 header")),
        };
        match flag {
            "n" | "y" => {}
            f if f.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed("client-first: channel binding flag")),
        }
        let mut attrs = bare.split(',');
        let mut first = attrs.next().ok_or(ScramError::Malformed("client-first: empty"))?;
        if first.starts_with("m=") {
            return Err(ScramError::Extensions);
        }
        let user = match first.strip_prefix("n=") {
            Some(u) => unescape(u)?,
            None => return Err(ScramError::Malformed("client-first: no username")),
        };
        first = attrs.next().ok_or(ScramError::Malformed("client-first: no nonce"))?;
        let c_nonce = first.strip_prefix("r=").ok_or(ScramError::Malformed("client-first: no nonce"))?;
        if c_nonce.is_empty() || !c_nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',') {
            return Err(ScramError::Malformed("client-first: nonce"));
        }
        // Kafka's `tokenauth=true` (delegation tokens), or any other extension.
        if attrs.next().is_some() {
            return Err(ScramError::Extensions);
        }
        match authzid {
            "" => {}
            a => match a.strip_prefix("a=").map(unescape) {
                Some(Ok(a)) if a == user => {}
                Some(Ok(_)) => return Err(ScramError::Authzid),
                _ => return Err(ScramError::Malformed("client-first: authzid")),
            },
        }
        let found = users.credential(self.mechanism, &user);
        let known = found.is_some();
        let credential = found.unwrap_or_else(|| Credential::dummy(self.mechanism, &user, users.secret()));
        let nonce = format!("{c_nonce}{s_nonce}");
        let server_first = format!("r={nonce},s={},i={}", B64.encode(&credential.salt), credential.iterations);
        let gs2_header = format!("{flag},{authzid},");
        let messages = format!("{bare},{server_first}");
        self.state = State::Final { user, known, credential, gs2_header, nonce, messages };
        Ok(server_first.into_bytes())
    }

    /// Takes the client-final message; returns the user and the server-final message if the
    /// proof is right.
    pub fn finish(&mut self, msg: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
        let State::Final { user, known, credential, gs2_header, nonce, messages } =
            std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(ScramError::Finished);
        };
        let msg = text(msg)?;
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or(ScramError::Malformed("client-final: no proof"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs.next().and_then(|c| c.strip_prefix("c=")).ok_or(ScramError::Malformed("client-final"))?;
        if B64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
            return Err(ScramError::Malformed("client-final: channel binding differs from the gs2 header"));
        }
        let r = attrs.next().and_then(|r| r.strip_prefix("r=")).ok_or(ScramError::Malformed("client-final"))?;
        // Kafka's broker accepts a nonce that merely ends with the one it sent: librdkafka
        // before 2.x's fix repeats the client's part ("r=" client + client + server), and the
        // Debian kcat still ships one of those. The server's fresh part must be there either way.
        if !r.ends_with(&nonce) {
            return Err(ScramError::Invalid);
        }
        let proof = B64.decode(proof).map_err(|_| ScramError::Malformed("client-final: proof"))?;
        let m = self.mechanism;
        if proof.len() != m.len() {
            return Err(ScramError::Invalid);
        }
        let auth_message = format!("{messages},{without_proof}");
        let signature = m.mac(&credential.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let stored = digest::digest(m.digest(), &client_key);
        let matches = ring_eq(stored.as_ref(), &credential.stored_key);
        if !(matches && known) {
            return Err(ScramError::Invalid);
        }
        let server_signature = m.mac(&credential.server_key, auth_message.as_bytes());
        Ok((user, format!("v={}", B64.encode(server_signature)).into_bytes()))
    }
}

fn ring_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn text(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.len() > MAX_MESSAGE {
        return Err(ScramError::Malformed("message too long"));
    }
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))
}

/// A saslname: `=2C` is `,` and `=3D` is `=`; any other `=` is malformed.
fn unescape(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("username escape")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("empty username"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct One(Option<Credential>);

    impl Credentials for One {
        fn credential(&self, m: Mechanism, user: &str) -> Option<Credential> {
            self.0.clone().filter(|c| c.mechanism == m && user == "user")
        }
        fn secret(&self) -> &[u8] {
            b"test secret"
        }
    }

    /// RFC 7677 §3's example exchange, byte for byte.
    #[test]
    fn the_rfc_7677_exchange() {
        let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let users = One(Some(Credential::with_salt(Mechanism::ScramSha256, b"pencil", salt, 4096)));
        let mut x = Exchange::new(Mechanism::ScramSha256);
        let first = x.first_with_nonce(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO", &users, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
        assert_eq!(
            String::from_utf8(first.unwrap()).unwrap(),
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let (user, last) = x
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(user, "user");
        assert_eq!(String::from_utf8(last).unwrap(), "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    /// A client as RFC 5802 §3 computes its proof.
    fn client_final(m: Mechanism, password: &str, client_first_bare: &str, server_first: &str) -> String {
        let nonce = server_first.split(',').next().unwrap().strip_prefix("r=").unwrap();
        signed_final(m, password, client_first_bare, server_first, nonce)
    }

    fn login(users: &One, m: Mechanism, name: &str, password: &str) -> Result<String, ScramError> {
        let bare = format!("n={name},r=abcdefghijkl");
        let mut x = Exchange::new(m);
        let server_first = String::from_utf8(x.first(format!("n,,{bare}").as_bytes(), users)?).unwrap();
        x.finish(client_final(m, password, &bare, &server_first).as_bytes()).map(|(u, _)| u)
    }

    #[test]
    fn both_mechanisms_accept_the_password_and_refuse_others_and_unknown_users() {
        for m in Mechanism::ALL {
            let users = One(Some(Credential::new(m, "s3cret".as_bytes(), MIN_ITERATIONS)));
            assert_eq!(login(&users, m, "user", "s3cret").as_deref(), Ok("user"), "{m:?}");
            assert_eq!(login(&users, m, "user", "s3creT"), Err(ScramError::Invalid));
            assert_eq!(login(&users, m, "mallory", "s3cret"), Err(ScramError::Invalid));
        }
        let only256 = One(Some(Credential::new(Mechanism::ScramSha256, b"s3cret", MIN_ITERATIONS)));
        assert_eq!(login(&only256, Mechanism::ScramSha512, "user", "s3cret"), Err(ScramError::Invalid));
    }

    #[test]
    fn an_unknown_user_gets_a_stable_made_up_salt() {
        let users = One(None);
        let salt = |name: &str| {
            let mut x = Exchange::new(Mechanism::ScramSha256);
            let first = x.first(format!("n,,n={name},r=abc").as_bytes(), &users).unwrap();
            String::from_utf8(first).unwrap().split(',').nth(1).unwrap().to_owned()
        };
        assert_eq!(salt("ghost"), salt("ghost"));
        assert_ne!(salt("ghost"), salt("ghoul"));
    }

    #[test]
    fn credentials_survive_the_password_file_and_bad_fields_are_named() {
        let c = Credential::new(Mechanism::ScramSha512, b"pw", DEFAULT_ITERATIONS);
        assert_eq!(Credential::decode(&c.encode()), Ok(c));
        assert!(Credential::decode("scram-sha-1=4096,a,b,c").unwrap_err().contains("unknown"));
        assert!(Credential::decode("scram-sha-256=10,YQ==,YQ==,YQ==").unwrap_err().contains("iteration"));
        assert!(Credential::decode("scram-sha-256=4096,YQ==,YQ==,YQ==").unwrap_err().contains("length"));
    }

    #[test]
    fn malformed_and_unsupported_first_messages_are_refused() {
        let users = One(None);
        let first = |m: &str| Exchange::new(Mechanism::ScramSha256).first(m.as_bytes(), &users).map(|_| ());
        assert_eq!(first("p=tls-unique,,n=user,r=abc"), Err(ScramError::ChannelBinding));
        assert_eq!(first("n,,n=user,r=abc,tokenauth=true"), Err(ScramError::Extensions));
        assert_eq!(first("n,,m=ext,n=user,r=abc"), Err(ScramError::Extensions));
        assert_eq!(first("n,a=other,n=user,r=abc"), Err(ScramError::Authzid));
        assert!(first("n,a=user,n=user,r=abc").is_ok());
        assert!(matches!(first("n,,n=us=er,r=abc"), Err(ScramError::Malformed(_))));
        assert!(matches!(first("n,,r=abc"), Err(ScramError::Malformed(_))));
        assert!(matches!(first("garbage"), Err(ScramError::Malformed(_))));
        assert!(matches!(first(&"x".repeat(MAX_MESSAGE + 1)), Err(ScramError::Malformed(_))));
        assert_eq!(unescape("a=2Cb=3Dc"), Ok("a,b=c".to_owned()));
    }

    /// librdkafka 2.0's client-final message repeats the client nonce; Kafka takes it. A nonce
    /// without the server's fresh part at its end is still refused.
    #[test]
    fn a_final_nonce_that_ends_with_the_servers_is_taken_as_kafka_takes_it() {
        let m = Mechanism::ScramSha256;
        let users = One(Some(Credential::new(m, b"pw", MIN_ITERATIONS)));
        let bare = "n=user,r=cnonce";
        let attempt = |r: &dyn Fn(&str) -> String| {
            let mut x = Exchange::new(m);
            let server_first = String::from_utf8(x.first(format!("n,,{bare}").as_bytes(), &users).unwrap()).unwrap();
            let nonce = server_first.split(',').next().unwrap().strip_prefix("r=").unwrap().to_owned();
            x.finish(signed_final(m, "pw", bare, &server_first, &r(&nonce)).as_bytes()).map(|(u, _)| u)
        };
        assert_eq!(attempt(&|n| n.to_owned()).as_deref(), Ok("user"));
        assert_eq!(attempt(&|n| format!("cnonce{n}")).as_deref(), Ok("user"), "librdkafka 2.0");
        assert_eq!(attempt(&|_| "cnonce".to_owned()), Err(ScramError::Invalid), "no server part");
        assert_eq!(attempt(&|n| format!("{n}x")), Err(ScramError::Invalid));
    }

    /// A client-final message with nonce `r`, signed as RFC 5802 says over the messages sent.
    fn signed_final(m: Mechanism, password: &str, bare: &str, server_first: &str, r: &str) -> String {
        let attr = |k: &str| server_first.split(',').find_map(|a| a.strip_prefix(k)).unwrap().to_owned();
        let (salt, iterations): (Vec<u8>, u32) = (B64.decode(attr("s=")).unwrap(), attr("i=").parse().unwrap());
        let mut salted = vec![0u8; m.len()];
        pbkdf2::derive(m.pbkdf2(), NonZeroU32::new(iterations).unwrap(), &salt, password.as_bytes(), &mut salted);
        let client_key = m.mac(&salted, b"Client Key");
        let stored = digest::digest(m.digest(), &client_key);
        let without_proof = format!("c=biws,r={r}");
        let auth = format!("{bare},{server_first},{without_proof}");
        let signature = m.mac(stored.as_ref(), auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", B64.encode(proof))
    }

    #[test]
    fn an_exchange_runs_once() {
        let users = One(Some(Credential::new(Mechanism::ScramSha256, b"pw", MIN_ITERATIONS)));
        let mut x = Exchange::new(Mechanism::ScramSha256);
        x.first(b"n,,n=user,r=abc", &users).unwrap();
        assert_eq!(x.first(b"n,,n=user,r=abc", &users), Err(ScramError::Finished));
        assert!(x.finish(b"c=biws,r=wrong,p=AAAA").is_err());
        assert_eq!(x.finish(b"c=biws,r=wrong,p=AAAA"), Err(ScramError::Finished));
    }
}
