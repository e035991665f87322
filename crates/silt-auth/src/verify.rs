//! Password verification, bounded: argon2 is slow and memory-hard on purpose (19 MiB and tens
//! of milliseconds per attempt with the default parameters), so work a client can trigger
//! before it has authenticated must be capped, or a burst of wrong passwords takes the
//! broker's memory and every legitimate CONNECT with it.
//!
//! - A fixed pool of `verify_threads` threads, each with its own argon2 memory, allocated
//!   once and reused: memory is `threads × m_cost` whatever the load.
//! - Attempts queue per peer (an IPv4 address, an IPv6 /64) and are served round-robin across
//!   peers, so one peer's burst delays others by at most one verification each. A peer may
//!   queue `PER_PEER_QUEUE` attempts and everyone together `verify_queue`; beyond that, and for
//!   attempts that waited longer than `verify_timeout_ms`, the answer is "busy" at once
//!   (CONNACK 0x89 / 3), which costs nothing.
//! - After a failure a peer's next attempt waits (100 ms, doubling per failure, at most 5 s);
//!   a success clears it.
//! - A successful verification is remembered for `verified_cache_secs` as a keyed BLAKE2b
//!   digest of the password, so a reconnecting device does not pay argon2 again (reconnect
//!   storms after an outage); a wrong password is never cached and always costs a full
//!   verification.
//! - An unknown user is verified against a dummy hash with the default parameters, so it
//!   takes as long as a wrong password for a known one and reveals nothing.
//!
//! - Other credential checks (a SCRAM proof, [`Verifier::check`]) take the same queues and
//!   backoff: cheap in themselves, they would otherwise let a client guess as fast as it can
//!   reconnect.
//!
//! Not guaranteed: fairness between clients behind one address (a NAT); they share a queue.
//! Hand-written because no crate offers a bounded, peer-fair verifier around argon2.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::PasswordHash;
use argon2::{Algorithm, Argon2, Block, Params, Version};
use blake2::digest::Mac;
use bytes::Bytes;
use tokio::sync::oneshot;

/// Attempts one peer may have waiting.
const PER_PEER_QUEUE: usize = 8;
/// Peers whose failures are remembered at most (beyond, expired ones are forgotten first).
const MAX_TRACKED_PEERS: usize = 65_536;
/// Successful verifications remembered at most.
const MAX_CACHED: usize = 100_000;
/// Largest argon2 memory cost accepted in a password file (KiB): 256 MiB per verifier thread.
pub const MAX_M_COST_KIB: u32 = 256 * 1024;

/// How a verification ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    Invalid,
    /// Not attempted: the queue is full or the attempt waited too long.
    Busy,
}

/// A password hash from the password file, parsed once.
#[derive(Clone, Debug)]
pub struct StoredHash {
    algorithm: Algorithm,
    version: Version,
    params: Params,
    salt: Vec<u8>,
    hash: Vec<u8>,
}

impl StoredHash {
    /// Parses a PHC string (`$argon2id$v=19$m=...,t=...,p=...$salt$hash`).
    pub fn parse(phc: &str) -> Result<StoredHash, String> {
        let h = PasswordHash::new(phc).map_err(|e| e.to_string())?;
        let algorithm = Algorithm::try_from(h.algorithm).map_err(|e| e.to_string())?;
        let version = h.version.map_or(Ok(Version::default()), Version::try_from).map_err(|e| e.to_string())?;
        let params = Params::try_from(&h).map_err(|e| e.to_string())?;
        if params.m_cost() > MAX_M_COST_KIB {
            return Err(format!(
                "argon2 memory cost {} KiB is above the limit of {MAX_M_COST_KIB} KiB",
                params.m_cost()
            ));
        }
        let mut buf = [0u8; 64];
        let salt = h.salt.ok_or("no salt")?.decode_b64(&mut buf).map_err(|e| e.to_string())?.to_vec();
        let hash = h.hash.ok_or("no hash")?.as_bytes().to_vec();
        Ok(StoredHash { algorithm, version, params, salt, hash })
    }

    /// A hash of a random password with the default parameters: what an unknown user is
    /// checked against.
    pub fn dummy() -> StoredHash {
        let mut pw = [0u8; 16];
        argon2::password_hash::rand_core::RngCore::fill_bytes(&mut argon2::password_hash::rand_core::OsRng, &mut pw);
        let phc = super::hash_password(&hex(&pw)).expect("invariant: hashing with the default parameters works");
        StoredHash::parse(&phc).expect("invariant: our own hash parses")
    }

    /// Whether `password` matches, using `memory` for argon2's blocks.
    fn verify(&self, password: &[u8], memory: &mut Vec<Block>) -> bool {
        let need = self.params.block_count();
        if memory.len() < need {
            memory.resize(need, Block::default());
        }
        let mut out = vec![0u8; self.hash.len()];
        let argon = Argon2::new(self.algorithm, self.version, self.params.clone());
        argon.hash_password_into_with_memory(password, &self.salt, &mut out, &mut memory[..need]).is_ok()
            && constant_time_eq(&out, &self.hash)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `[mqtt.auth]` limits of the verifier.
#[derive(Clone, Copy, Debug)]
pub struct VerifyLimits {
    pub threads: usize,
    pub queue: usize,
    pub timeout: Duration,
    pub cache_for: Duration,
}

/// Which queue a peer's attempts join: its IPv4 address, or its IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PeerKey {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl PeerKey {
    fn of(peer: SocketAddr) -> PeerKey {
        match peer.ip() {
            IpAddr::V4(a) => PeerKey::V4(a.octets()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => PeerKey::V4(v4.octets()),
                None => PeerKey::V6(a.octets()[..8].try_into().expect("invariant: 8 of 16 bytes")),
            },
        }
    }
}

/// What an attempt checks.
enum Work {
    /// A password against its argon2 hash.
    Password {
        hash: Arc<StoredHash>,
        /// The user, if known: a success is cached under it.
        user: Option<String>,
        password: Bytes,
    },
    /// Any other check of a credential (a SCRAM proof): cheap itself, but paced like a
    /// password, so guessing online is as slow.
    Check(Box<dyn FnOnce() -> bool + Send>),
}

struct Job {
    work: Work,
    queued_at: Instant,
    reply: oneshot::Sender<Verdict>,
}

struct Backoff {
    failures: u32,
    until: Instant,
}

#[derive(Default)]
struct Sched {
    queues: HashMap<PeerKey, VecDeque<Job>>,
    /// Peers with waiting attempts, in serving order.
    ring: VecDeque<PeerKey>,
    queued: usize,
    backoff: HashMap<PeerKey, Backoff>,
    shutdown: bool,
}

impl Sched {
    /// The next attempt to run: the first peer in the ring that is not backing off. Else the
    /// earliest moment one will be due.
    fn next(&mut self, now: Instant) -> Result<(PeerKey, Job), Option<Instant>> {
        let mut earliest: Option<Instant> = None;
        for _ in 0..self.ring.len() {
            let key = self.ring.pop_front().expect("invariant: counted");
            if let Some(b) = self.backoff.get(&key).filter(|b| b.until > now) {
                earliest = Some(earliest.map_or(b.until, |e| e.min(b.until)));
                self.ring.push_back(key);
                continue;
            }
            let queue = self.queues.get_mut(&key).expect("invariant: ring peers have a queue");
            let job = queue.pop_front().expect("invariant: ring peers have a job");
            if queue.is_empty() {
                self.queues.remove(&key);
            } else {
                self.ring.push_back(key);
            }
            self.queued -= 1;
            return Ok((key, job));
        }
        Err(earliest)
    }

    fn record(&mut self, key: PeerKey, ok: bool, now: Instant) {
        if ok {
            self.backoff.remove(&key);
            return;
        }
        if self.backoff.len() >= MAX_TRACKED_PEERS && !self.backoff.contains_key(&key) {
            self.backoff.retain(|_, b| b.until > now);
            if self.backoff.len() >= MAX_TRACKED_PEERS {
                self.backoff.clear();
            }
        }
        let b = self.backoff.entry(key).or_insert(Backoff { failures: 0, until: now });
        b.failures = b.failures.saturating_add(1);
        let delay = Duration::from_millis(100).saturating_mul(1 << (b.failures - 1).min(6)).min(Duration::from_secs(5));
        b.until = now + delay;
    }
}

struct Shared {
    sched: Mutex<Sched>,
    ready: Condvar,
    limits: VerifyLimits,
    /// Successful verifications: user → keyed digest of the password, and when.
    cache: Mutex<lru::LruCache<String, ([u8; 32], Instant)>>,
    cache_key: [u8; 32],
    /// Argon2 verifications run.
    runs: AtomicU64,
}

impl Shared {
    fn digest(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let mut mac = <blake2::Blake2bMac<blake2::digest::consts::U32> as Mac>::new_from_slice(&self.cache_key)
            .expect("invariant: a 32-byte key is valid");
        Mac::update(&mut mac, &(user.len() as u64).to_le_bytes());
        Mac::update(&mut mac, user.as_bytes());
        Mac::update(&mut mac, password);
        mac.finalize().into_bytes().into()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sched> {
        self.sched.lock().expect("invariant: lock not poisoned")
    }
}

/// The verifier pool. Dropping it stops its threads once they finish their current attempt.
pub struct Verifier {
    shared: Arc<Shared>,
}

impl Verifier {
    pub fn start(limits: VerifyLimits) -> Verifier {
        let mut cache_key = [0u8; 32];
        argon2::password_hash::rand_core::RngCore::fill_bytes(
            &mut argon2::password_hash::rand_core::OsRng,
            &mut cache_key,
        );
        let cache = silt_types::lru::growing(NonZeroUsize::new(MAX_CACHED).expect("invariant: not zero"));
        let shared = Arc::new(Shared {
            sched: Mutex::new(Sched::default()),
            ready: Condvar::new(),
            limits,
            cache: Mutex::new(cache),
            cache_key,
            runs: AtomicU64::new(0),
        });
        for i in 0..limits.threads {
            let s = shared.clone();
            let spawned = std::thread::Builder::new().name(format!("silt-auth-{i}")).spawn(move || worker(&s));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "a password verifier thread could not start");
            }
        }
        Verifier { shared }
    }

    /// Checks `password` against `hash` for a client at `peer`; `user` is `None` for an
    /// unknown user (then `hash` is the dummy). Never blocks the caller's thread.
    pub async fn verify(
        &self,
        hash: Arc<StoredHash>,
        user: Option<&str>,
        password: Bytes,
        peer: SocketAddr,
    ) -> Verdict {
        let s = &self.shared;
        if let Some(user) = user
            && !s.limits.cache_for.is_zero()
        {
            let digest = s.digest(user, &password);
            let mut cache = s.cache.lock().expect("invariant: lock not poisoned");
            if let Some((d, at)) = cache.get(user)
                && at.elapsed() < s.limits.cache_for
                && constant_time_eq(d, &digest)
            {
                return Verdict::Valid;
            }
        }
        self.submit(Work::Password { hash, user: user.map(str::to_owned), password }, peer).await
    }

    /// Runs `check` on the pool under `peer`'s queue and backoff, like a password: what a
    /// client may try as often as it connects is paced the same whatever the mechanism.
    pub async fn check(&self, check: impl FnOnce() -> bool + Send + 'static, peer: SocketAddr) -> Verdict {
        self.submit(Work::Check(Box::new(check)), peer).await
    }

    async fn submit(&self, work: Work, peer: SocketAddr) -> Verdict {
        let s = &self.shared;
        let (reply, answer) = oneshot::channel();
        let job = Job { work, queued_at: Instant::now(), reply };
        {
            let key = PeerKey::of(peer);
            let mut sched = s.lock();
            let mine = sched.queues.get(&key).map_or(0, VecDeque::len);
            if sched.queued >= s.limits.queue || mine >= PER_PEER_QUEUE || s.limits.threads == 0 {
                return Verdict::Busy;
            }
            if mine == 0 {
                sched.ring.push_back(key);
            }
            sched.queues.entry(key).or_default().push_back(job);
            sched.queued += 1;
        }
        s.ready.notify_one();
        match tokio::time::timeout(s.limits.timeout, answer).await {
            Ok(Ok(v)) => v,
            _ => Verdict::Busy,
        }
    }

    /// Attempts waiting now.
    pub fn queued(&self) -> usize {
        self.shared.lock().queued
    }

    /// Argon2 verifications run so far.
    pub fn verifications(&self) -> u64 {
        self.shared.runs.load(Ordering::Relaxed)
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.ready.notify_all();
    }
}

fn worker(s: &Shared) {
    let mut memory: Vec<Block> = Vec::new();
    loop {
        let (key, job) = {
            let mut sched = s.lock();
            loop {
                if sched.shutdown {
                    return;
                }
                match sched.next(Instant::now()) {
                    Ok(next) => break next,
                    Err(None) => sched = s.ready.wait(sched).expect("invariant: lock not poisoned"),
                    Err(Some(at)) => {
                        let wait = at.saturating_duration_since(Instant::now());
                        sched = s.ready.wait_timeout(sched, wait).expect("invariant: lock not poisoned").0;
                    }
                }
            }
        };
        if job.queued_at.elapsed() > s.limits.timeout || job.reply.is_closed() {
            let _ = job.reply.send(Verdict::Busy);
            continue;
        }
        let ok = match job.work {
            Work::Password { hash, user, password } => {
                let ok = hash.verify(&password, &mut memory) && user.is_some();
                s.runs.fetch_add(1, Ordering::Relaxed);
                if let (true, false, Some(user)) = (ok, s.limits.cache_for.is_zero(), user) {
                    let digest = s.digest(&user, &password);
                    s.cache.lock().expect("invariant: lock not poisoned").put(user, (digest, Instant::now()));
                }
                ok
            }
            Work::Check(check) => check(),
        };
        s.lock().record(key, ok, Instant::now());
        let _ = job.reply.send(if ok { Verdict::Valid } else { Verdict::Invalid });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ipv6_peers_share_a_queue_per_64_and_mapped_ipv4_is_ipv4() {
        assert_eq!(PeerKey::of(peer("[2001:db8::1]:1")), PeerKey::of(peer("[2001:db8::ffff]:2")));
        assert_ne!(PeerKey::of(peer("[2001:db8::1]:1")), PeerKey::of(peer("[2001:db8:0:1::1]:1")));
        assert_eq!(PeerKey::of(peer("[::ffff:10.0.0.1]:1")), PeerKey::of(peer("10.0.0.1:9")));
    }

    #[test]
    fn peers_are_served_round_robin_and_a_failing_peer_backs_off() {
        let mut s = Sched::default();
        let hash = Arc::new(StoredHash::dummy());
        let now = Instant::now();
        let (a, b) = (PeerKey::of(peer("10.0.0.1:1")), PeerKey::of(peer("10.0.0.2:1")));
        let push = |s: &mut Sched, k: PeerKey| {
            let (reply, _) = oneshot::channel();
            let work = Work::Password { hash: hash.clone(), user: None, password: Bytes::new() };
            let job = Job { work, queued_at: now, reply };
            if !s.queues.contains_key(&k) {
                s.ring.push_back(k);
            }
            s.queues.entry(k).or_default().push_back(job);
            s.queued += 1;
        };
        for _ in 0..3 {
            push(&mut s, a);
        }
        push(&mut s, b);
        let order: Vec<PeerKey> = (0..3).map(|_| s.next(now).ok().unwrap().0).collect();
        assert_eq!(order, [a, b, a], "b is served after one of a's, not after all of them");
        s.record(a, false, now);
        match s.next(now) {
            Err(Some(at)) => assert!(at > now, "a backs off after its failure"),
            _ => panic!("a must wait"),
        }
        assert!(s.next(now + Duration::from_secs(1)).is_ok(), "and is served once the backoff passed");
    }

    #[test]
    fn the_dummy_and_stored_hashes_verify_like_argon2_itself() {
        let phc = super::super::hash_password("s3cret").unwrap();
        let h = StoredHash::parse(&phc).unwrap();
        let mut mem = Vec::new();
        assert!(h.verify(b"s3cret", &mut mem));
        assert!(!h.verify(b"s3creT", &mut mem));
        assert!(!StoredHash::dummy().verify(b"s3cret", &mut mem));
        let huge = "$argon2id$v=19$m=1048576,t=2,p=1$c29tZXNhbHQ$RdescudvJCsgt3ub+b+dWRWJTmaaJObG";
        assert!(StoredHash::parse(huge).unwrap_err().contains("memory cost"));
    }
}
