//! What the coordinator remembers of machines between heartbeats, and the
//! coordinator's own stalls, which are not held against them.
//!
//! A machine is judged silent when the coordinator has not heard from it
//! for longer than its heartbeat timeout. If the coordinator itself stood
//! still for part of that time (its runtime starved by a burst of work, the
//! process paused, the host's clock stepped forward), heartbeats may have
//! been sent and waited unread: that time is the coordinator's silence, not
//! the machine's. [`StallClock`] records such stalls from the lateness of a
//! short periodic tick on the same runtime that answers machines, and
//! [`StallClock::excused`] says how much of a machine's silence they cover;
//! a stall still under way (no tick for too long) counts too, so a
//! reconcile running on another thread during the stall excuses it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

/// What the coordinator remembers of a machine between heartbeats without
/// writing it: a heartbeat that changes nothing costs no durable write.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    pub last_seen: OffsetDateTime,
}

/// How often the stall clock ticks.
pub const TICK: Duration = Duration::from_millis(250);

/// How late a tick may be before the time is counted as a stall: the
/// runtime's ordinary scheduling jitter under load stays below it.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(1);

/// How many stalls are remembered; older ones fall out. A heartbeat
/// timeout spans few of them in any coordinator that still works.
const REMEMBERED: usize = 64;

/// One stall: when it began (the tick that did not come) and how long it
/// lasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub from: OffsetDateTime,
    pub until: OffsetDateTime,
}

#[derive(Debug)]
struct Inner {
    last_tick: Option<OffsetDateTime>,
    stalls: VecDeque<Stall>,
}

/// The coordinator's stalls; see the module documentation.
#[derive(Debug)]
pub struct StallClock {
    inner: Mutex<Inner>,
}

impl Default for StallClock {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                last_tick: None,
                stalls: VecDeque::with_capacity(REMEMBERED),
            }),
        }
    }
}

/// The part of `[a_from, a_until]` that `[b_from, b_until]` covers.
fn overlap(
    a_from: OffsetDateTime,
    a_until: OffsetDateTime,
    b_from: OffsetDateTime,
    b_until: OffsetDateTime,
) -> time::Duration {
    let from = a_from.max(b_from);
    let until = a_until.min(b_until);
    (until - from).max(time::Duration::ZERO)
}

impl StallClock {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("stall clock lock")
    }

    /// Records a tick at `now`; returns the stall it ends, if the tick came
    /// later than its period plus [`STALL_THRESHOLD`].
    pub fn tick(&self, now: OffsetDateTime) -> Option<Stall> {
        let mut inner = self.lock();
        let last = inner.last_tick.replace(now);
        let from = last? + TICK;
        if now - from <= STALL_THRESHOLD {
            return None;
        }
        let stall = Stall { from, until: now };
        if inner.stalls.len() == REMEMBERED {
            inner.stalls.pop_front();
        }
        inner.stalls.push_back(stall);
        Some(stall)
    }

    /// How much of the time from `since` until `now` the coordinator was
    /// stalled: the stalls recorded, and one under way when the last tick
    /// is overdue.
    pub fn excused(&self, since: OffsetDateTime, now: OffsetDateTime) -> time::Duration {
        let inner = self.lock();
        let recorded: time::Duration = inner
            .stalls
            .iter()
            .rev()
            .take_while(|s| s.until > since)
            .map(|s| overlap(since, now, s.from, s.until))
            .sum();
        let ongoing = inner
            .last_tick
            .map(|t| t + TICK)
            .filter(|from| now - *from > STALL_THRESHOLD)
            .map_or(time::Duration::ZERO, |from| overlap(since, now, from, now));
        recorded + ongoing
    }

    /// `last_seen` moved forward by the stalls since it (never past
    /// `now`): the time to judge a machine's silence from.
    pub fn judged_last_seen(
        &self,
        last_seen: OffsetDateTime,
        now: OffsetDateTime,
    ) -> OffsetDateTime {
        (last_seen + self.excused(last_seen, now)).min(now.max(last_seen))
    }
}

/// The `stall-clock` task: ticks every [`TICK`] on the runtime that
/// answers machines, and logs each stall it sees end.
pub struct Ticker(pub Arc<StallClock>);

impl crate::tasks::BackgroundTask for Ticker {
    async fn activate(&mut self, _: crate::tasks::Wake) -> crate::tasks::Outcome {
        if let Some(s) = self.0.tick(drover_common::now()) {
            let stalled = s.until - s.from;
            tracing::warn!(
                stalled_ms = stalled.whole_milliseconds() as u64,
                "the coordinator stalled; machines' silence during it is not held against them"
            );
        }
        crate::tasks::Outcome::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::milliseconds(ms)
    }

    #[test]
    fn ticks_on_time_excuse_nothing() {
        let c = StallClock::default();
        for i in 0..20 {
            assert_eq!(c.tick(at(i * 250 + (i % 3) * 100)), None);
        }
        assert_eq!(c.excused(at(0), at(5_000)), time::Duration::ZERO);
        assert_eq!(c.judged_last_seen(at(1_000), at(5_000)), at(1_000));
    }

    #[test]
    fn a_late_tick_excuses_the_stall_it_ends_and_only_the_part_after_a_heartbeat() {
        let c = StallClock::default();
        c.tick(at(0));
        c.tick(at(250));
        // Nothing ran from 500 ms (the tick due) until 10.5 s.
        let stall = c.tick(at(10_500)).expect("a stall");
        assert_eq!(
            stall,
            Stall {
                from: at(500),
                until: at(10_500)
            }
        );
        // Silent since before the stall: all 10 s of it are excused.
        assert_eq!(c.excused(at(0), at(11_000)), time::Duration::seconds(10));
        assert_eq!(c.judged_last_seen(at(0), at(11_000)), at(10_000));
        // Heard from during the stall: only the rest of it.
        assert_eq!(c.excused(at(8_500), at(11_000)), time::Duration::seconds(2));
        // Heard from after it: nothing.
        assert_eq!(c.excused(at(10_600), at(11_000)), time::Duration::ZERO);
    }

    #[test]
    fn a_stall_under_way_is_excused_before_the_next_tick_comes() {
        let c = StallClock::default();
        c.tick(at(0));
        // Within the threshold: nothing yet.
        assert_eq!(c.excused(at(0), at(1_000)), time::Duration::ZERO);
        // No tick for 30 s: a reconcile on another thread sees the stall.
        assert_eq!(
            c.excused(at(0), at(30_000)),
            time::Duration::milliseconds(29_750)
        );
        // A stall never moves a machine's last heartbeat past now.
        assert!(c.judged_last_seen(at(0), at(30_000)) <= at(30_000));
    }

    #[test]
    fn only_the_latest_stalls_are_remembered() {
        let c = StallClock::default();
        let mut t = 0;
        c.tick(at(t));
        for _ in 0..(REMEMBERED + 10) {
            t += 5_000;
            assert!(c.tick(at(t)).is_some());
        }
        assert_eq!(c.lock().stalls.len(), REMEMBERED);
        // Each stall is 4.75 s of every 5 s.
        let since = at(t - 10_000);
        assert_eq!(c.excused(since, at(t)), time::Duration::milliseconds(9_500));
    }
}
