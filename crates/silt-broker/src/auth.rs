//! Authentication (username/password against a file of argon2 hashes) and topic ACLs.
//!
//! Password file: one `username:PHC-string` per line (`$argon2id$...`), written by
//! `silt passwd FILE USER`. ACL file: the mosquitto format users already know:
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
//! Anonymous clients (no username) are accepted per `allow_anonymous`: by default only from
//! loopback addresses. Passwords are never logged.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use serde::{Deserialize, Serialize};
use silt_types::filter_matches;

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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// File of `username:argon2-hash` lines; unset: usernames are not checked.
    pub password_file: Option<PathBuf>,
    /// mosquitto-style ACL file; unset: every client may publish and subscribe everywhere.
    pub acl_file: Option<PathBuf>,
    pub allow_anonymous: AnonymousPolicy,
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

#[derive(Debug, Default)]
struct Acl {
    anonymous: Vec<Rule>,
    users: HashMap<String, Vec<Rule>>,
    everyone: Vec<Rule>,
}

/// Why a CONNECT is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    BadCredentials,
    NotAuthorized,
}

#[derive(Debug, Default)]
pub struct Auth {
    passwords: Option<HashMap<String, String>>,
    acl: Option<Acl>,
    anonymous: AnonymousPolicy,
}

impl Auth {
    /// Loads the configured files; errors name the file and line.
    pub fn load(cfg: &AuthConfig) -> Result<Auth, String> {
        let passwords = cfg.password_file.as_deref().map(load_passwords).transpose()?;
        let acl = cfg.acl_file.as_deref().map(load_acl).transpose()?;
        Ok(Auth { passwords, acl, anonymous: cfg.allow_anonymous })
    }

    /// Whether authenticating `username` runs an argon2 verification (slow on purpose).
    pub fn verifies_password(&self, username: Option<&str>) -> bool {
        username.is_some() && self.passwords.is_some()
    }

    pub fn has_acl(&self) -> bool {
        self.acl.is_some()
    }

    /// Checks a CONNECT's credentials. CPU-heavy when a password is verified (argon2): call it
    /// off the async runtime.
    pub fn authenticate(
        &self,
        username: Option<&str>,
        password: Option<&[u8]>,
        peer: SocketAddr,
    ) -> Result<(), AuthError> {
        let Some(user) = username else {
            return match self.anonymous {
                AnonymousPolicy::Always => Ok(()),
                AnonymousPolicy::Loopback if peer.ip().is_loopback() => Ok(()),
                _ => Err(AuthError::NotAuthorized),
            };
        };
        let Some(passwords) = &self.passwords else {
            // No password file: a username is a name, not a credential.
            return match self.anonymous {
                AnonymousPolicy::Always => Ok(()),
                AnonymousPolicy::Loopback if peer.ip().is_loopback() => Ok(()),
                _ => Err(AuthError::NotAuthorized),
            };
        };
        let (Some(phc), Some(password)) = (passwords.get(user), password) else {
            return Err(AuthError::BadCredentials);
        };
        let parsed = PasswordHash::new(phc).map_err(|_| AuthError::BadCredentials)?;
        argon2::Argon2::default().verify_password(password, &parsed).map_err(|_| AuthError::BadCredentials)
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
        let own = match user {
            Some(u) => acl.users.get(u).map(Vec::as_slice).unwrap_or_default(),
            None => acl.anonymous.as_slice(),
        };
        let mut granted = false;
        for rule in own.iter().chain(&acl.everyone) {
            let pattern = if rule.substitute {
                rule.pattern.replace("%u", user.unwrap_or("")).replace("%c", client_id)
            } else {
                rule.pattern.clone()
            };
            if !hit(&pattern) {
                continue;
            }
            match (rule.grant, access) {
                (Grant::Deny, _) => return false,
                (Grant::ReadWrite, _) | (Grant::Read, Access::Read) | (Grant::Write, Access::Write) => granted = true,
                _ => {}
            }
        }
        granted
    }
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

fn load_passwords(path: &Path) -> Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    for (i, line) in read(path)?.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (user, phc) = line
            .split_once(':')
            .filter(|(u, p)| !u.is_empty() && PasswordHash::new(p).is_ok())
            .ok_or_else(|| format!("{}:{}: expected `username:argon2-hash`", path.display(), i + 1))?;
        out.insert(user.to_owned(), phc.to_owned());
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
        Auth::load(&AuthConfig { acl_file: Some(p), ..AuthConfig::default() }).unwrap()
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

    #[test]
    fn coverage_of_filters() {
        assert!(covered_by("a/+/c", "a/#"));
        assert!(covered_by("a/b", "a/+"));
        assert!(!covered_by("a/#", "a/+"));
        assert!(!covered_by("a/+", "a/b"));
        assert!(covered_by("a", "a/#"));
        assert!(!covered_by("$SYS/x", "#"));
    }

    #[test]
    fn passwords_verify_against_argon2_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("passwd");
        std::fs::write(&p, format!("alice:{}\n", hash_password("s3cret").unwrap())).unwrap();
        let a = Auth::load(&AuthConfig { password_file: Some(p), ..AuthConfig::default() }).unwrap();
        let peer: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert_eq!(a.authenticate(Some("alice"), Some(b"s3cret"), peer), Ok(()));
        assert_eq!(a.authenticate(Some("alice"), Some(b"nope"), peer), Err(AuthError::BadCredentials));
        assert_eq!(a.authenticate(Some("mallory"), Some(b"s3cret"), peer), Err(AuthError::BadCredentials));
        assert_eq!(a.authenticate(None, None, peer), Err(AuthError::NotAuthorized));
        assert_eq!(a.authenticate(None, None, "127.0.0.1:1".parse().unwrap()), Ok(()));
    }

    #[test]
    fn malformed_files_are_refused_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("acl");
        std::fs::write(&p, "user a\ntopic sometimes x\n").unwrap();
        let err = Auth::load(&AuthConfig { acl_file: Some(p), ..AuthConfig::default() }).unwrap_err();
        assert!(err.contains("acl:2"), "{err}");
    }
}
