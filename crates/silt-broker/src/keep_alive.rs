//! The keep alive deadlines of resting connections, in one ordered map per broker, woken by one
//! task at each whole second. A resting connection's task then holds no timer of its own:
//! tokio's `Sleep` is 112 bytes, and without it the task of an idle connection fits tokio's
//! next smaller cell (384 bytes then, not 512; see `the_connection_future_stays_small`). An entry
//! here is a key and a pointer (about 40 bytes with the map's nodes).
//!
//! Hand-written: tokio's timer is per future (the thing saved here), and `tokio-util`'s
//! `DelayQueue` is one owner's queue of `Sleep`-sized slots behind its own `&mut` API, not a
//! map many tasks add to and take from. A deadline is kept to the whole second after it:
//! keep alive is counted in seconds and closed at one and a half times the interval, so a
//! connection woken up to a second late is within what MQTT asks.
//!
//! A woken connection looks at its own deadline (its protocol core's) and acts on it; a wake
//! before the deadline, or for a connection that has woken since, does nothing but a pull.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::router::{ConnId, Signal};

#[derive(Default)]
pub(crate) struct KeepAlive {
    /// (whole seconds since `epoch` at or after the deadline, connection) → its signal.
    deadlines: Mutex<BTreeMap<(u64, ConnId), Arc<Signal>>>,
    epoch: OnceLock<Instant>,
    /// The task that wakes connections whose deadline passed, started by the first rest.
    driver: OnceLock<()>,
}

impl KeepAlive {
    /// `deadline` as the whole second it is kept to.
    fn second(&self, deadline: Instant) -> u64 {
        let since = deadline.saturating_duration_since(*self.epoch.get_or_init(Instant::now));
        since.as_secs() + u64::from(since.subsec_nanos() > 0)
    }

    /// Wakes `signal` once `deadline` has passed, unless [`KeepAlive::cancel`] comes first.
    /// Starts the task that does so on the first call (from within the runtime).
    pub(crate) fn watch(self: &Arc<Self>, deadline: Instant, conn: ConnId, signal: &Arc<Signal>) {
        let second = self.second(deadline);
        self.deadlines.lock().expect("invariant: lock not poisoned").insert((second, conn), signal.clone());
        self.driver.get_or_init(|| {
            tokio::spawn(drive(Arc::downgrade(self)));
        });
    }

    /// Forgets the deadline `watch` was given for `conn`.
    pub(crate) fn cancel(&self, deadline: Instant, conn: ConnId) {
        let second = self.second(deadline);
        self.deadlines.lock().expect("invariant: lock not poisoned").remove(&(second, conn));
    }

    /// Wakes (and forgets) every connection whose deadline has passed by `now`: those kept to
    /// a whole second `now` has reached.
    fn expire(&self, now: Instant) {
        let now = now.saturating_duration_since(*self.epoch.get_or_init(Instant::now)).as_secs();
        let due = {
            let mut deadlines = self.deadlines.lock().expect("invariant: lock not poisoned");
            let later = deadlines.split_off(&(now + 1, 0));
            std::mem::replace(&mut *deadlines, later)
        };
        for signal in due.into_values() {
            signal.wake();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.deadlines.lock().expect("invariant: lock not poisoned").len()
    }
}

/// Expires deadlines at each whole second, until the broker is gone.
async fn drive(keep_alive: Weak<KeepAlive>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(k) = keep_alive.upgrade() else { return };
        k.expire(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(signal: &Signal) -> bool {
        signal.poll_woken(&mut std::task::Context::from_waker(std::task::Waker::noop())).is_ready()
    }

    #[tokio::test]
    async fn a_deadline_wakes_its_connection_within_the_second_after_it_unless_cancelled() {
        let k = Arc::new(KeepAlive::default());
        let (a, b) = (Arc::new(Signal::default()), Arc::new(Signal::default()));
        let start = Instant::now();
        k.watch(start + Duration::from_millis(1500), 1, &a);
        k.watch(start + Duration::from_millis(1500), 2, &b);
        k.cancel(start + Duration::from_millis(1500), 2);
        assert_eq!(k.len(), 1);
        tokio::time::sleep(Duration::from_millis(1400)).await;
        assert!(!woken(&a), "woken before its deadline");
        tokio::time::sleep(Duration::from_millis(2600)).await;
        assert!(woken(&a), "not woken within the second after its deadline");
        assert!(!woken(&b), "a cancelled deadline woke its connection");
        assert_eq!(k.len(), 0, "an expired deadline is forgotten");
    }
}
