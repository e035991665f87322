//! What the admin API asks of the broker: sessions as operators see them, kicking a client,
//! ending an offline session.
//!
//! Backlogs read the index: they are counted off the runtime and without any session lock
//! held, from cursors copied out first ([`SessionView::backlog`], [`Broker::backlogs`]).

use std::time::Duration;

use silt_storage::Storage;

use super::Broker;
use crate::session::{BacklogCursor, SessionRef, backlog};

/// One session's state copied out for the admin API.
#[derive(Clone, Debug)]
pub struct SessionView {
    pub client_id: String,
    pub online: bool,
    /// Topic filters, shared ones as `$share/{group}/{filter}`.
    pub subscriptions: Vec<String>,
    cursors: Vec<BacklogCursor>,
}

impl SessionView {
    /// Messages waiting on the session's own subscriptions. Blocking (reads the index).
    pub fn backlog(&self, storage: &Storage) -> u64 {
        backlog(storage, &self.cursors)
    }
}

/// Why [`Broker::delete_session`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteRefused {
    NotFound,
    /// Connected, and `force` was not given.
    Online,
    /// Kicked with `force`, but its connection had not let go after a few seconds.
    StillOnline,
}

/// How long a forced delete waits for the kicked connection to close.
const KICK_WAIT: Duration = Duration::from_secs(5);

impl Broker {
    /// Every session (or the one of `only`), by client id.
    pub async fn session_views(&self, only: Option<&str>) -> Vec<SessionView> {
        let sessions: Vec<_> = {
            let st = self.state();
            let mut v: Vec<_> = st
                .sessions
                .iter()
                .filter(|(id, _)| only.is_none_or(|o| o == id.as_ref()))
                .map(|(id, s)| (id.clone(), st.owners.contains_key(id), s.clone()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let mut out = Vec::with_capacity(sessions.len());
        for (client_id, online, s) in sessions {
            let g = s.lock().await;
            let mut subscriptions: Vec<String> = g.subs.subs.keys().map(|f| f.to_string()).collect();
            subscriptions.extend(g.shared.keys().cloned());
            out.push(SessionView {
                client_id: client_id.to_string(),
                online,
                subscriptions,
                cursors: g.backlog_cursors(),
            });
        }
        out
    }

    /// Closes the connection of `client_id` (MQTT 5.0: DISCONNECT with Administrative action,
    /// 0x98); its session stays if it is persistent, and a will is published as on any
    /// server-side close. False when no connection has that client id.
    pub fn disconnect_client(&self, client_id: &str) -> bool {
        let st = self.state();
        match st.owners.get(client_id) {
            Some(owner) => {
                owner.signal.kick(crate::router::Kick::Operator);
                true
            }
            None => false,
        }
    }

    fn online(&self, client_id: &str) -> bool {
        self.state().owners.contains_key(client_id)
    }

    /// Ends the session of `client_id` as a clean-start CONNECT would: its subscriptions and
    /// backlog are dropped, a persistent one gets its tombstone. An online session is refused
    /// unless `force`, which disconnects it first. `Ok(true)` when it was disconnected.
    pub async fn delete_session(&self, client_id: &str, force: bool) -> Result<bool, DeleteRefused> {
        let mut kicked = false;
        if self.online(client_id) {
            if !force {
                return Err(DeleteRefused::Online);
            }
            self.disconnect_client(client_id);
            kicked = true;
            let deadline = tokio::time::Instant::now() + KICK_WAIT;
            // The connection persists the session as it closes; ending it before then would
            // let that snapshot bring it back.
            while self.online(client_id) {
                if tokio::time::Instant::now() >= deadline {
                    return Err(DeleteRefused::StillOnline);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let session = {
            let mut st = self.state();
            if st.owners.contains_key(client_id) {
                // Connected again meanwhile: a new owner.
                return Err(DeleteRefused::Online);
            }
            // Out of the map first, and marked as ending: a CONNECT from now on waits for the
            // tombstone, then starts a new session.
            let session = st.sessions.remove(client_id).ok_or(DeleteRefused::NotFound)?;
            st.ending.insert(client_id.to_owned());
            session
        };
        // Unmarked however this future ends (also when the gRPC caller goes away mid-way).
        struct Unmark<'a>(&'a Broker, &'a str);
        impl Drop for Unmark<'_> {
            fn drop(&mut self) {
                self.0.state().ending.remove(self.1);
            }
        }
        let _unmark = Unmark(self, client_id);
        self.end_session(&session).await;
        Ok(kicked)
    }
}

/// Backlogs for `$SYS`, the metrics and the status page.
impl Broker {
    /// `(sessions, total, largest)` of the backlogs `$SYS` last published (refreshed every
    /// `sys_interval_secs`; `sessions` counts those with a figure, i.e. that had a backlog):
    /// cheap, for scrapes.
    pub fn backlog_summary(&self) -> (usize, u64, u64) {
        let last = self.sys_backlogs.lock().expect("invariant: lock not poisoned");
        (last.len(), last.values().sum(), last.values().copied().max().unwrap_or(0))
    }

    /// The `n` sessions with the most messages waiting, most first (client id, backlog), as
    /// `$SYS` last published them: cheap, for the status page.
    pub fn largest_backlogs(&self, n: usize) -> Vec<(String, u64)> {
        let last = self.sys_backlogs.lock().expect("invariant: lock not poisoned");
        let mut all: Vec<(String, u64)> = last.iter().map(|(k, v)| (k.clone(), *v)).collect();
        drop(last);
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// Messages waiting per session (client id, backlog), for `$SYS`. The cursors are copied
    /// under each session's lock (memory only); the index is read for all of them at once on
    /// the blocking pool, so neither a runtime thread nor a session waits on RocksDB. `None`
    /// when the count could not run (the runtime shutting down).
    pub async fn backlogs(&self) -> Option<Vec<(String, u64)>> {
        let sessions: Vec<(String, SessionRef)> =
            self.state().sessions.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let mut cursors = Vec::with_capacity(sessions.len());
        for (id, s) in sessions {
            cursors.push((id, s.lock().await.backlog_cursors()));
        }
        let storage = self.storage.clone();
        let counted = tokio::task::spawn_blocking(move || {
            cursors.into_iter().map(|(id, c)| (id, backlog(&storage, &c))).collect()
        })
        .await;
        counted.map_err(|e| tracing::warn!(error = %e, "counting session backlogs failed")).ok()
    }
}
