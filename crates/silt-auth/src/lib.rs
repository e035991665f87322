//! Who may connect and what they may do, for every protocol Silt serves (MQTT and Kafka
//! share one password file and one ACL): authentication (username/password against a file
//! of argon2 hashes) and topic ACLs; TLS server configs in [`tls`].
//!
//! Password file: one `username:PHC-string` per line (`$argon2id$...`), written by
//! `silt passwd FILE USER`, optionally followed by `:scram-sha-256=...:scram-sha-512=...`
//! (the SCRAM credentials of [`scram`], which `silt passwd` writes too; a user without them
//! can log in by password but not by SCRAM). ACL file: the mosquitto format users already know:
//!
//! ```text
//! # comments and blank lines are ignored
//! # before any `user` line: rules for anonymous clients
//! topic read public/#
//! user alice
//! topic readwrite alice/#
//! topic deny alice/secret/#
//! # `pattern` rules apply to everyone; %u = username, %c = client id
//! pattern write devices/%c/#
//! ```
//!
//! `read` covers subscribing (and receiving), `write` covers publishing and wills. With an ACL
//! file, access is denied unless a rule grants it, and a matching `deny` rule always wins. A
//! subscription must lie inside a granted pattern (`a/+/c` inside `a/#`); messages whose topic
//! falls under a `deny` rule are not delivered even to a broader subscription.
//!
//! A `pattern` rule never grants through a substituted value that contains `+`, `#` or `/`:
//! a client id of `#` would otherwise turn `devices/%c/#` into `devices/#/#`-like wildcards
//! and reach every device (mosquitto's CVE-2017-7650). Such a `deny` rule still denies.
//!
//! A session belongs to the user who created it: with a password file, another user
//! connecting with its client id is refused (CONNACK 0x87) unless a `takeover` rule in that
//! user's block names the client id (`takeover sensor-17`, or a prefix: `takeover sensor-*`,
//! or `takeover *`).
//!
//! Kafka clients (the same users, the same topic rules, applied to the MQTT topic of each
//! record) also need, with an ACL file, a rule naming each consumer group they use
//! (`group analytics`, `group etl-*`, `group *`) and each transactional id
//! (`transactional_id orders-*`), in their `user` block or, for anonymous clients, before any
//! `user` line.
//!
//! Anonymous clients (no username) are accepted per `allow_anonymous`: by default only from
//! loopback addresses. An ACL file without a password file is refused at start-up unless
//! `allow_unauthenticated_usernames = true` says that usernames are claims, not identities.
//! Passwords are verified by a bounded pool ([`verify`]). Passwords are never logged.

pub mod scram;
pub mod tls;
pub mod verify;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use argon2::password_hash::{PasswordHasher, SaltString};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use silt_types::filter_matches;

use self::verify::{StoredHash, Verdict, Verifier, VerifyLimits};

/// Who may connect without a username.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnonymousPolicy {
    /// Clients on a loopback address (the default).
    #[default]
    Loopback,
    Always,
    Never,
}

/// The `[mqtt.auth]` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// File of `username:argon2-hash` lines; unset: usernames are not checked.
    pub password_file: Option<PathBuf>,
    /// mosquitto-style ACL file; unset: every client may publish and subscribe everywhere.
    pub acl_file: Option<PathBuf>,
    pub allow_anonymous: AnonymousPolicy,
    /// With an ACL file but no password file, usernames are claims anyone can make: refused
    /// unless this says so.
    pub allow_unauthenticated_usernames: bool,
    /// Threads verifying passwords (each holds argon2's memory, 19 MiB by default).
    pub verify_threads: usize,
    /// Verifications waiting at most, across clients; more are answered "server busy".
    pub verify_queue: usize,
    /// How long a verification may wait for a thread (ms) before "server busy".
    pub verify_timeout_ms: u64,
    /// How long a successful verification is remembered (s), so a reconnect skips argon2;
    /// 0: never.
    pub verified_cache_secs: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            password_file: None,
            acl_file: None,
            allow_anonymous: AnonymousPolicy::default(),
            allow_unauthenticated_usernames: false,
            verify_threads: 2,
            verify_queue: 256,
            verify_timeout_ms: 3000,
            verified_cache_secs: 600,
        }
    }
}

impl AuthConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.acl_file.is_some() && self.password_file.is_none() && !self.allow_unauthenticated_usernames {
            return Err("mqtt.auth.acl_file: set without mqtt.auth.password_file, so any client could claim any \
                        username and its rules; set a password_file, or allow_unauthenticated_usernames = true"
                .into());
        }
        if self.verify_threads == 0 || self.verify_threads > 64 {
            return Err("mqtt.auth.verify_threads: must be between 1 and 64".into());
        }
        if self.verify_queue == 0 {
            return Err("mqtt.auth.verify_queue: must be at least 1".into());
        }
        if self.verify_timeout_ms == 0 {
            return Err("mqtt.auth.verify_timeout_ms: must be greater than 0".into());
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grant {
    Read,
    Write,
    ReadWrite,
    Deny,
}

#[derive(Clone, Debug)]
struct Rule {
    grant: Grant,
    pattern: String,
    /// `pattern` lines substitute %u and %c.
    substitute: bool,
}

/// Directives that name things rather than topics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Named {
    Takeover,
    Group,
    TransactionalId,
}

/// How much of a Kafka topic (an MQTT topic's first level, with everything below it) a
/// client may read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Every topic in it: no record needs checking.
    All,
    /// Some topics in it, maybe: each record is checked by its MQTT topic.
    Some,
    /// None of it.
    None,
}

#[derive(Debug, Default)]
struct Acl {
    anonymous: Vec<Rule>,
    users: HashMap<String, Vec<Rule>>,
    everyone: Vec<Rule>,
    /// Names (exact, or a prefix ending in `*`) per directive and user (`None`: anonymous):
    /// client ids whose sessions a user may take over, Kafka groups and transactional ids.
    named: HashMap<(Named, Option<String>), Vec<String>>,
}

/// Why a CONNECT is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    BadCredentials,
    NotAuthorized,
    /// The password could not be checked now (the verifiers are saturated).
    Busy,
}

/// A user of the password file.
struct User {
    hash: Arc<StoredHash>,
    scram: Vec<scram::Credential>,
}

pub struct Auth {
    passwords: Option<HashMap<String, User>>,
    /// What made-up SCRAM credentials of unknown users derive from.
    secret: [u8; 32],
    /// What unknown users are verified against, so they take as long as known ones.
    dummy: Arc<StoredHash>,
    verifier: Option<Verifier>,
    acl: Option<Acl>,
    anonymous: AnonymousPolicy,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("users", &self.passwords.as_ref().map(HashMap::len))
            .field("acl", &self.acl.is_some())
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

impl Auth {
    /// Loads the configured files; errors name the file and line. Starts the password
    /// verifiers when there is a password file.
    pub fn load(cfg: &AuthConfig) -> Result<Auth, String> {
        cfg.validate()?;
        let passwords = cfg.password_file.as_deref().map(load_passwords).transpose()?;
        let acl = cfg.acl_file.as_deref().map(load_acl).transpose()?;
        if acl.is_some() && passwords.is_none() {
            tracing::warn!(
                "mqtt.auth: an ACL file without a password file (allow_unauthenticated_usernames = true): \
                 usernames are not verified, and any client may claim any user's rules"
            );
        }
        let verifier = passwords.as_ref().map(|_| {
            Verifier::start(VerifyLimits {
                threads: cfg.verify_threads,
                queue: cfg.verify_queue,
                timeout: Duration::from_millis(cfg.verify_timeout_ms),
                cache_for: Duration::from_secs(cfg.verified_cache_secs),
            })
        });
        let dummy = Arc::new(if passwords.is_some() { StoredHash::dummy() } else { placeholder_hash() });
        Ok(Auth { passwords, secret: random_secret(), dummy, verifier, acl, anonymous: cfg.allow_anonymous })
    }

    /// No password file, no ACL, loopback-only anonymous access: what `silt serve` runs with
    /// by default.
    pub fn open() -> Auth {
        Auth {
            passwords: None,
            secret: random_secret(),
            dummy: Arc::new(placeholder_hash()),
            verifier: None,
            acl: None,
            anonymous: AnonymousPolicy::default(),
        }
    }

    pub fn has_acl(&self) -> bool {
        self.acl.is_some()
    }

    /// Whether usernames are verified (a password file is set): only then does a session
    /// belong to a user.
    pub fn usernames_verified(&self) -> bool {
        self.passwords.is_some()
    }

    /// Checks a CONNECT's credentials. A password is verified on the bounded pool of
    /// [`verify`]: this never blocks the caller's thread.
    pub async fn authenticate(
        &self,
        username: Option<&str>,
        password: Option<&Bytes>,
        peer: SocketAddr,
    ) -> Result<(), AuthError> {
        let anonymous = || match self.anonymous {
            AnonymousPolicy::Always => Ok(()),
            AnonymousPolicy::Loopback if peer.ip().is_loopback() => Ok(()),
            _ => Err(AuthError::NotAuthorized),
        };
        let Some(user) = username else { return anonymous() };
        // No password file: a username is a name, not a credential.
        let (Some(passwords), Some(verifier)) = (&self.passwords, &self.verifier) else { return anonymous() };
        // An unknown user, or no password, costs as much as a wrong password.
        let (hash, known) = match (passwords.get(user), password) {
            (Some(u), Some(_)) => (u.hash.clone(), Some(user)),
            _ => (self.dummy.clone(), None),
        };
        let password = password.cloned().unwrap_or_default();
        match verifier.verify(hash, known, password, peer).await {
            Verdict::Valid => Ok(()),
            Verdict::Invalid => Err(AuthError::BadCredentials),
            Verdict::Busy => Err(AuthError::Busy),
        }
    }

    /// Whether a client at `peer` may go without credentials.
    pub fn allows_anonymous(&self, peer: SocketAddr) -> bool {
        match self.anonymous {
            AnonymousPolicy::Always => true,
            AnonymousPolicy::Loopback => peer.ip().is_loopback(),
            AnonymousPolicy::Never => false,
        }
    }

    /// Finishes a SCRAM exchange with the client-final message `msg`, the proof checked on
    /// the verifier pool under `peer`'s pacing. The user and the server-final message.
    pub async fn scram_finish(
        &self,
        mut exchange: scram::Exchange,
        msg: Bytes,
        peer: SocketAddr,
    ) -> Result<(String, Vec<u8>), AuthError> {
        let Some(verifier) = &self.verifier else { return Err(AuthError::BadCredentials) };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let check = move || {
            let done = exchange.finish(&msg);
            let ok = done.is_ok();
            let _ = tx.send(done);
            ok
        };
        match verifier.check(check, peer).await {
            Verdict::Valid => rx.try_recv().ok().and_then(Result::ok).ok_or(AuthError::BadCredentials),
            Verdict::Invalid => Err(AuthError::BadCredentials),
            Verdict::Busy => Err(AuthError::Busy),
        }
    }

    /// May `user` take over the session of `client_id` that another user created?
    pub fn allows_takeover(&self, user: Option<&str>, client_id: &str) -> bool {
        user.is_some() && self.acl.is_some() && self.names(Named::Takeover, user, client_id)
    }

    /// May `user` use the Kafka consumer group `group`? Without an ACL file, anyone may.
    pub fn allows_group(&self, user: Option<&str>, group: &str) -> bool {
        self.acl.is_none() || self.names(Named::Group, user, group)
    }

    /// May `user` use the Kafka transactional id `id`? Without an ACL file, anyone may.
    pub fn allows_transactional_id(&self, user: Option<&str>, id: &str) -> bool {
        self.acl.is_none() || self.names(Named::TransactionalId, user, id)
    }

    fn names(&self, kind: Named, user: Option<&str>, name: &str) -> bool {
        let Some(acl) = &self.acl else { return false };
        acl.named.get(&(kind, user.map(str::to_owned))).is_some_and(|names| {
            names.iter().any(|n| match n.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => n == name,
            })
        })
    }

    /// How much under the topic level `root` (a Kafka topic: one level, no wildcards) `user`
    /// may read or write.
    pub fn reach(&self, user: Option<&str>, client_id: &str, access: Access, root: &str) -> Reach {
        let Some(acl) = &self.acl else { return Reach::All };
        let (mut covered, mut touched, mut denied) = (false, false, false);
        for (grant, pattern) in effective_rules(acl, user, client_id) {
            let (first, rest) = pattern.split_once('/').map_or((pattern.as_ref(), None), |(f, r)| (f, Some(r)));
            let hits = first == "#" || first == "+" || first == root;
            if !hits {
                continue;
            }
            let whole = first == "#" || rest == Some("#");
            match (grant, access) {
                (Grant::Deny, _) => denied = true,
                (Grant::ReadWrite, _) | (Grant::Read, Access::Read) | (Grant::Write, Access::Write) => {
                    touched = true;
                    covered |= whole;
                }
                _ => {}
            }
        }
        match (covered && !denied, touched) {
            (true, _) => Reach::All,
            (false, true) => Reach::Some,
            (false, false) => Reach::None,
        }
    }

    /// May `user`/`client_id` publish to (`Write`) or receive from (`Read`) topic `name`?
    pub fn allows_topic(&self, user: Option<&str>, client_id: &str, access: Access, name: &str) -> bool {
        self.decide(user, client_id, access, |pattern| filter_matches(pattern, name))
    }

    /// May `user`/`client_id` subscribe to `filter`? It must lie inside a granted pattern.
    pub fn allows_subscribe(&self, user: Option<&str>, client_id: &str, filter: &str) -> bool {
        self.decide(user, client_id, Access::Read, |pattern| covered_by(filter, pattern))
    }

    fn decide(&self, user: Option<&str>, client_id: &str, access: Access, hit: impl Fn(&str) -> bool) -> bool {
        let Some(acl) = &self.acl else { return true };
        let mut granted = false;
        for (grant, pattern) in effective_rules(acl, user, client_id) {
            if !hit(&pattern) {
                continue;
            }
            match (grant, access) {
                (Grant::Deny, _) => return false,
                (Grant::ReadWrite, _) | (Grant::Read, Access::Read) | (Grant::Write, Access::Write) => granted = true,
                _ => {}
            }
        }
        granted
    }
}

/// The rules that apply to `user`/`client_id`, with `%u` and `%c` substituted. A substituted
/// value must never widen a grant: `+`, `#` and `/` in a username or client id would become
/// wildcards or extra levels, so such grants are left out (denials stay).
fn effective_rules<'a>(
    acl: &'a Acl,
    user: Option<&'a str>,
    client_id: &'a str,
) -> impl Iterator<Item = (Grant, std::borrow::Cow<'a, str>)> + 'a {
    let own = match user {
        Some(u) => acl.users.get(u).map(Vec::as_slice).unwrap_or_default(),
        None => acl.anonymous.as_slice(),
    };
    let unsafe_value = |v: &str| v.contains(['+', '#', '/']);
    let unsafe_user = user.is_some_and(unsafe_value);
    let unsafe_client = unsafe_value(client_id);
    own.iter().chain(&acl.everyone).filter_map(move |rule| {
        if !rule.substitute {
            return Some((rule.grant, std::borrow::Cow::Borrowed(rule.pattern.as_str())));
        }
        let widened = (unsafe_user && rule.pattern.contains("%u")) || (unsafe_client && rule.pattern.contains("%c"));
        if widened && rule.grant != Grant::Deny {
            return None;
        }
        let pattern = rule.pattern.replace("%u", user.unwrap_or("")).replace("%c", client_id);
        Some((rule.grant, std::borrow::Cow::Owned(pattern)))
    })
}

/// Is every topic matched by `filter` also matched by `pattern`?
pub fn covered_by(filter: &str, pattern: &str) -> bool {
    let mut f = filter.split('/');
    let mut p = pattern.split('/');
    loop {
        match (p.next(), f.next()) {
            (Some("#"), _) => return !filter.starts_with('$') || !pattern.starts_with('#'),
            (Some("+"), Some(fl)) if fl != "#" => {}
            (Some(pl), Some(fl)) if pl == fl => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A PHC string for `password`, as stored in the password file.
pub fn hash_password(password: &str) -> Result<String, String> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| e.to_string())
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// A stand-in where no password is ever verified (no password file).
fn placeholder_hash() -> StoredHash {
    StoredHash::parse("$argon2id$v=19$m=8,t=1,p=1$c2lsdHNpbHQ$AAAAAAAAAAAAAAAAAAAAAA")
        .expect("invariant: a valid PHC string")
}

impl scram::Credentials for Auth {
    fn credential(&self, mechanism: scram::Mechanism, user: &str) -> Option<scram::Credential> {
        let u = self.passwords.as_ref()?.get(user)?;
        let found = u.scram.iter().find(|c| c.mechanism == mechanism).cloned();
        if found.is_none() {
            static MISSING: silt_types::log_limit::LogLimit =
                silt_types::log_limit::LogLimit::new(silt_types::log_limit::EVERY);
            if let Some(suppressed) = MISSING.check() {
                tracing::warn!(
                    user,
                    mechanism = mechanism.name(),
                    suppressed,
                    "a user without this SCRAM credential tried it; set the password again with `silt passwd`"
                );
            }
        }
        found
    }

    fn secret(&self) -> &[u8] {
        &self.secret
    }
}

fn random_secret() -> [u8; 32] {
    let mut secret = [0u8; 32];
    argon2::password_hash::rand_core::RngCore::fill_bytes(&mut argon2::password_hash::rand_core::OsRng, &mut secret);
    secret
}

/// A password-file line for `user`: the argon2 hash, then a SCRAM credential per mechanism.
pub fn password_line(user: &str, password: &str) -> Result<String, String> {
    let mut line = format!("{user}:{}", hash_password(password)?);
    for m in scram::Mechanism::ALL {
        line.push(':');
        line.push_str(&scram::Credential::new(m, password.as_bytes(), scram::DEFAULT_ITERATIONS).encode());
    }
    Ok(line)
}

fn load_passwords(path: &Path) -> Result<HashMap<String, User>, String> {
    let mut out = HashMap::new();
    for (i, line) in read(path)?.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |why: &str| format!("{}:{}: {why}", path.display(), i + 1);
        let mut fields = line.split(':');
        let (Some(user), Some(phc)) = (fields.next().filter(|u| !u.is_empty()), fields.next()) else {
            return Err(at("expected `username:argon2-hash[:scram-sha-256=...]`"));
        };
        let hash = StoredHash::parse(phc).map_err(|e| at(&format!("not an argon2 hash: {e}")))?;
        let scram = fields.map(scram::Credential::decode).collect::<Result<Vec<_>, _>>().map_err(|e| at(&e))?;
        out.insert(user.to_owned(), User { hash: Arc::new(hash), scram });
    }
    Ok(out)
}

fn load_acl(path: &Path) -> Result<Acl, String> {
    let mut acl = Acl::default();
    let mut current: Option<String> = None;
    for (i, raw) in read(path)?.lines().enumerate() {
        let bad = |why: &str| format!("{}:{}: {why}", path.display(), i + 1);
        // Only whole-line comments: `#` inside a rule is the wildcard.
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let kind = words.next().unwrap_or("");
        match kind {
            "user" => {
                let name = words.next().ok_or_else(|| bad("`user` needs a name"))?;
                current = Some(name.to_owned());
            }
            directive @ ("takeover" | "group" | "transactional_id") => {
                let kind = match directive {
                    "takeover" => Named::Takeover,
                    "group" => Named::Group,
                    _ => Named::TransactionalId,
                };
                let what = if kind == Named::Takeover { "client id" } else { "name" };
                let name = words
                    .next()
                    .ok_or_else(|| bad(&format!("`{directive}` needs a {what}, a prefix ending in `*`, or `*`")))?;
                if name.strip_suffix('*').unwrap_or(name).contains('*') {
                    return Err(bad(&format!("`{directive}`: `*` may only end the {what}")));
                }
                if kind == Named::Takeover && current.is_none() {
                    return Err(bad("`takeover` belongs in a `user` block"));
                }
                acl.named.entry((kind, current.clone())).or_default().push(name.to_owned());
            }
            "topic" | "pattern" => {
                let rest: Vec<&str> = words.collect();
                let (grant, topic) = match rest.as_slice() {
                    [t] => (Grant::ReadWrite, *t),
                    ["read", t] => (Grant::Read, *t),
                    ["write", t] => (Grant::Write, *t),
                    ["readwrite", t] => (Grant::ReadWrite, *t),
                    ["deny", t] => (Grant::Deny, *t),
                    _ => return Err(bad("expected `topic|pattern [read|write|readwrite|deny] TOPIC`")),
                };
                silt_types::TopicFilter::new(topic.replace("%u", "u").replace("%c", "c"))
                    .map_err(|e| bad(&format!("invalid topic {topic:?}: {e}")))?;
                let rule = Rule { grant, pattern: topic.to_owned(), substitute: kind == "pattern" };
                match (kind, &current) {
                    ("pattern", _) => acl.everyone.push(rule),
                    (_, Some(u)) => acl.users.entry(u.clone()).or_default().push(rule),
                    (_, None) => acl.anonymous.push(rule),
                }
            }
            other => return Err(bad(&format!("unknown directive {other:?}"))),
        }
    }
    Ok(acl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(text: &str) -> Auth {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("acl");
        std::fs::write(&p, text).unwrap();
        let cfg = AuthConfig { acl_file: Some(p), allow_unauthenticated_usernames: true, ..AuthConfig::default() };
        Auth::load(&cfg).unwrap()
    }

    #[test]
    fn acl_grants_denies_and_substitutes() {
        let a = acl(
            "topic read public/#\nuser alice\ntopic readwrite alice/#\ntopic deny alice/secret/#\npattern write devices/%c/#\n",
        );
        assert!(a.allows_subscribe(None, "x", "public/+"));
        assert!(!a.allows_topic(None, "x", Access::Write, "public/a"));
        assert!(a.allows_topic(Some("alice"), "c1", Access::Write, "alice/a"));
        assert!(!a.allows_topic(Some("alice"), "c1", Access::Read, "alice/secret/x"), "deny wins");
        assert!(a.allows_topic(Some("bob"), "dev7", Access::Write, "devices/dev7/t"));
        assert!(!a.allows_topic(Some("bob"), "dev7", Access::Write, "devices/dev8/t"));
        assert!(!a.allows_subscribe(Some("alice"), "c1", "#"), "a subscription must lie inside a grant");
    }

    /// mosquitto's CVE-2017-7650: a client id or username of `+`, `#` or with `/` must not
    /// turn a pattern into a wildcard over other devices' topics.
    #[test]
    fn substituted_wildcards_and_separators_grant_nothing() {
        let a = acl("pattern readwrite devices/%c/#\npattern read users/%u/+\npattern deny devices/%c/locked\n");
        for id in ["+", "#", "dev7/../dev8", "a/b"] {
            assert!(!a.allows_topic(None, id, Access::Write, "devices/dev8/cmd"), "client id {id:?}");
            assert!(!a.allows_subscribe(None, id, "devices/+/cmd"), "client id {id:?}");
            assert!(!a.allows_subscribe(None, id, "devices/#"), "client id {id:?}");
        }
        assert!(!a.allows_topic(Some("#"), "c", Access::Read, "users/bob/inbox"));
        assert!(!a.allows_topic(Some("bob/x"), "c", Access::Read, "users/bob/x"));
        assert!(a.allows_topic(Some("bob"), "c", Access::Read, "users/bob/inbox"), "a plain username still works");
        assert!(a.allows_topic(None, "dev8", Access::Write, "devices/dev8/cmd"), "and a plain client id");
        // A deny rule with such a value still denies (it can only deny more).
        let d = acl("topic readwrite devices/#\npattern deny devices/%c/#\n");
        assert!(!d.allows_topic(None, "+", Access::Write, "devices/dev8/cmd"));
    }

    #[test]
    fn reach_says_whether_a_kafka_topic_needs_checking_per_record() {
        let a = acl("topic read public/#\nuser alice\ntopic readwrite alice/#\ntopic deny alice/secret/#\n\
                     topic write plant/line1/#\ntopic read +/status\nuser root\ntopic #\npattern read own/%u/#\n");
        let r = |u: Option<&str>, access, root| a.reach(u, "c", access, root);
        assert_eq!(r(None, Access::Read, "public"), Reach::All);
        assert_eq!(r(None, Access::Write, "public"), Reach::None);
        assert_eq!(r(Some("alice"), Access::Read, "alice"), Reach::Some, "a deny below keeps it per record");
        assert_eq!(r(Some("alice"), Access::Write, "plant"), Reach::Some);
        assert_eq!(r(Some("alice"), Access::Read, "plant"), Reach::Some, "+/status reaches into every topic");
        assert_eq!(r(Some("alice"), Access::Write, "other"), Reach::None);
        assert_eq!(r(Some("alice"), Access::Read, "own"), Reach::Some, "the pattern, substituted");
        assert_eq!(r(Some("root"), Access::Write, "anything"), Reach::All);
        assert_eq!(acl("").reach(None, "c", Access::Read, "x"), Reach::None);
        assert_eq!(Auth::open().reach(None, "c", Access::Read, "x"), Reach::All, "no ACL file");
    }

    #[test]
    fn group_and_transactional_id_rules_name_what_a_kafka_client_may_use() {
        let a = acl("group public-*\nuser alice\ngroup etl\ntransactional_id orders-*\nuser bob\ntopic read x\n");
        assert!(a.allows_group(None, "public-dash"));
        assert!(!a.allows_group(None, "etl"));
        assert!(a.allows_group(Some("alice"), "etl"));
        assert!(!a.allows_group(Some("alice"), "etl2"));
        assert!(!a.allows_group(Some("bob"), "public-dash"), "anonymous rules are not everyone's");
        assert!(a.allows_transactional_id(Some("alice"), "orders-7"));
        assert!(!a.allows_transactional_id(Some("bob"), "orders-7"));
        assert!(Auth::open().allows_group(None, "any") && Auth::open().allows_transactional_id(None, "any"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("acl");
        std::fs::write(&p, "user a\ngroup x*y\n").unwrap();
        let cfg = AuthConfig { acl_file: Some(p), allow_unauthenticated_usernames: true, ..AuthConfig::default() };
        assert!(Auth::load(&cfg).unwrap_err().contains(":2: `group`: `*` may only end"));
    }

    #[test]
    fn takeover_rules_name_client_ids_or_prefixes_per_user() {
        let a = acl("user admin\ntakeover sensor-*\ntakeover gw1\nuser bob\ntopic read x\n");
        assert!(a.allows_takeover(Some("admin"), "sensor-17"));
        assert!(a.allows_takeover(Some("admin"), "gw1"));
        assert!(!a.allows_takeover(Some("admin"), "gw12"));
        assert!(!a.allows_takeover(Some("bob"), "sensor-17"));
        assert!(!a.allows_takeover(None, "sensor-17"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("acl");
        std::fs::write(&p, "takeover *\n").unwrap();
        let cfg = AuthConfig { acl_file: Some(p), allow_unauthenticated_usernames: true, ..AuthConfig::default() };
        assert!(Auth::load(&cfg).unwrap_err().contains("acl:1"));
    }

    #[test]
    fn an_acl_without_a_password_file_is_refused_unless_usernames_are_declared_unverified() {
        let cfg = AuthConfig { acl_file: Some("acl".into()), ..AuthConfig::default() };
        let err = cfg.validate().unwrap_err();
        assert!(err.starts_with("mqtt.auth.acl_file") && err.contains("allow_unauthenticated_usernames"), "{err}");
        assert_eq!(AuthConfig { allow_unauthenticated_usernames: true, ..cfg }.validate(), Ok(()));
    }

    #[test]
    fn coverage_of_filters() {
        assert!(covered_by("a/+/c", "a/#"));
        assert!(covered_by("a/b", "a/+"));
        assert!(!covered_by("a/#", "a/+"));
        assert!(!covered_by("a/+", "a/b"));
        assert!(covered_by("a", "a/#"));
        assert!(!covered_by("$SYS/x", "#"));
    }

    #[tokio::test]
    async fn passwords_verify_against_argon2_hashes_and_unknown_users_cost_a_verification_too() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        std::fs::write(&p, format!("alice:{}\n", hash_password("s3cret").unwrap())).unwrap();
        let cfg = AuthConfig { password_file: Some(p), verified_cache_secs: 0, ..AuthConfig::default() };
        let a = Auth::load(&cfg).unwrap();
        let pw = |s: &'static str| Some(Bytes::from_static(s.as_bytes()));
        let runs = || a.verifier.as_ref().unwrap().verifications();
        let peer = |i: u8| SocketAddr::from(([10, 0, 0, i], 1));
        assert_eq!(a.authenticate(Some("alice"), pw("s3cret").as_ref(), peer(1)).await, Ok(()));
        assert_eq!(runs(), 1);
        assert_eq!(a.authenticate(Some("alice"), pw("nope").as_ref(), peer(2)).await, Err(AuthError::BadCredentials));
        assert_eq!(runs(), 2);
        // An unknown user, and a known one without a password, run argon2 all the same.
        assert_eq!(
            a.authenticate(Some("mallory"), pw("s3cret").as_ref(), peer(3)).await,
            Err(AuthError::BadCredentials)
        );
        assert_eq!(runs(), 3);
        assert_eq!(a.authenticate(Some("alice"), None, peer(4)).await, Err(AuthError::BadCredentials));
        assert_eq!(runs(), 4);
        assert_eq!(a.authenticate(None, None, peer(5)).await, Err(AuthError::NotAuthorized));
        assert_eq!(a.authenticate(None, None, "127.0.0.1:1".parse().unwrap()).await, Ok(()));
    }

    #[tokio::test]
    async fn a_verified_password_is_remembered_and_a_wrong_one_never_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        std::fs::write(&p, format!("alice:{}\n", hash_password("s3cret").unwrap())).unwrap();
        let a = Auth::load(&AuthConfig { password_file: Some(p), ..AuthConfig::default() }).unwrap();
        let runs = || a.verifier.as_ref().unwrap().verifications();
        let peer = SocketAddr::from(([10, 0, 0, 1], 1));
        let good = Some(Bytes::from_static(b"s3cret"));
        let bad = Some(Bytes::from_static(b"s3creT"));
        assert_eq!(a.authenticate(Some("alice"), good.as_ref(), peer).await, Ok(()));
        assert_eq!(a.authenticate(Some("alice"), good.as_ref(), peer).await, Ok(()));
        assert_eq!(runs(), 1, "the reconnect skipped argon2");
        assert_eq!(a.authenticate(Some("alice"), bad.as_ref(), peer).await, Err(AuthError::BadCredentials));
        assert_eq!(a.authenticate(Some("alice"), bad.as_ref(), peer).await, Err(AuthError::BadCredentials));
        assert_eq!(runs(), 3, "every wrong password costs a full verification");
    }

    #[test]
    fn malformed_files_are_refused_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("acl");
        std::fs::write(&p, "user a\ntopic sometimes x\n").unwrap();
        let cfg = AuthConfig { acl_file: Some(p), allow_unauthenticated_usernames: true, ..AuthConfig::default() };
        let err = Auth::load(&cfg).unwrap_err();
        assert!(err.contains("acl:2"), "{err}");
    }

    #[test]
    fn password_lines_carry_scram_credentials_and_older_lines_still_load() {
        use scram::{Credentials, Mechanism};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        let old = format!("old:{}", hash_password("pw").unwrap());
        std::fs::write(&p, format!("{}\n{old}\n", password_line("new", "pw").unwrap())).unwrap();
        let a = Auth::load(&AuthConfig { password_file: Some(p.clone()), ..AuthConfig::default() }).unwrap();
        for m in Mechanism::ALL {
            assert_eq!(a.credential(m, "new").map(|c| c.mechanism), Some(m));
            assert!(a.credential(m, "old").is_none(), "no SCRAM credential: SCRAM fails, PLAIN works");
        }
        std::fs::write(&p, format!("{old}:scram-sha-256=4096,!!,AA==,AA==\n")).unwrap();
        let err = Auth::load(&AuthConfig { password_file: Some(p), ..AuthConfig::default() }).unwrap_err();
        assert!(err.contains("passwd:1: scram-sha-256: salt"), "{err}");
    }
}
