//! What the admin API asks of the broker: sessions as operators see them, kicking a client,
//! ending an offline session.
//!
//! Backlogs read the index: [`SessionView::backlog`] is blocking and runs without any session
//! lock held (the view copies the cursors out first).

use std::time::Duration;

use silt_storage::{QueueName, Storage};

use super::Broker;

/// One session's state copied out for the admin API.
#[derive(Clone, Debug)]
pub struct SessionView {
    pub client_id: String,
    pub online: bool,
    /// Topic filters, shared ones as `$share/{group}/{filter}`.
    pub subscriptions: Vec<String>,
    cursors: Vec<(QueueName, u64)>,
}

impl SessionView {
    /// Messages waiting on the session's own subscriptions. Blocking (reads the index).
    pub fn backlog(&self, storage: &Storage) -> u64 {
        self.cursors
            .iter()
            .filter_map(|(queue, cursor)| {
                let id = storage.queue_id(queue).ok().flatten()?;
                let (_, next) = storage.queue_bounds(id).ok()?;
                Some(next.get().saturating_sub(*cursor))
            })
            .sum()
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
                .filter(|(id, _)| only.is_none_or(|o| o == id.as_str()))
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
            let cursors = g.subs.subs.values().map(|s| (s.queue.clone(), s.state.cursor)).collect();
            out.push(SessionView { client_id, online, subscriptions, cursors });
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
                owner.by_operator.store(true, std::sync::atomic::Ordering::Release);
                owner.kick.notify_one();
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
