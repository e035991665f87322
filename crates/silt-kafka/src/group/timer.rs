//! The coordinator's deadlines in one ordered index, so that the next one is found without
//! looking at every group. Each owner (a group's join or sync phase, a member's session) keeps
//! the instant it scheduled and removes exactly that entry when it reschedules or goes away:
//! the index holds one entry per live deadline, never stale ones.

use std::collections::BTreeSet;
use std::time::Instant;

use kafka_protocol::protocol::StrBytes;

/// What a deadline is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Timer {
    /// Offset retention and removal of empty groups without offsets.
    Cleanup,
    /// The end of a group's join phase (initial delay or rebalance timeout).
    Join(StrBytes),
    /// The end of a group's wait for SyncGroups.
    Sync(StrBytes),
    /// A member's (or pending member's) session: group, member.
    Heartbeat(StrBytes, StrBytes),
}

#[derive(Debug, Default)]
pub(super) struct Timers(BTreeSet<(Instant, Timer)>);

impl Timers {
    pub(super) fn next(&self) -> Option<Instant> {
        self.0.first().map(|(at, _)| *at)
    }

    pub(super) fn schedule(&mut self, at: Instant, timer: Timer) {
        self.0.insert((at, timer));
    }

    pub(super) fn cancel(&mut self, at: Instant, timer: Timer) {
        let removed = self.0.remove(&(at, timer));
        debug_assert!(removed, "invariant: a deadline is cancelled once, by its owner");
    }

    /// Moves the deadline in `slot` to `at`.
    pub(super) fn reschedule(&mut self, slot: &mut Option<Instant>, at: Instant, timer: Timer) {
        if let Some(old) = slot.replace(at) {
            self.cancel(old, timer.clone());
        }
        self.schedule(at, timer);
    }

    /// Removes the deadline in `slot`, if any.
    pub(super) fn clear(&mut self, slot: &mut Option<Instant>, timer: Timer) {
        if let Some(old) = slot.take() {
            self.cancel(old, timer);
        }
    }

    /// The earliest deadline due at `now`, taken out of the index. Its owner still holds the
    /// instant and must forget it.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        if self.next()? > now {
            return None;
        }
        self.0.pop_first().map(|(_, timer)| timer)
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }
}
