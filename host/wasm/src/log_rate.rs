//! How many of a module's log lines reach portwise's log.
//!
//! The per-call cap bounds one call; a module called a thousand times a
//! second could still write tens of thousands of lines a second into
//! portwise's log, burying every other tenant's lines and the controller's
//! own, and costing the cluster's log pipeline. So each module has one
//! token bucket, shared by all its instances: [`RATE`] lines a second on
//! average, bursts of up to [`BURST`]. Lines past it are dropped and
//! counted (`portwise_guest_log_lines_dropped_total`), and one warning per
//! module at most every [`NOTICE_EVERY`] says how many went.
//!
//! The clock is passed in, so the rules are tested without waiting.

use std::{
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Lines a second a module may log on average (the `log` import and its
/// stdout and stderr together).
pub const RATE: u32 = 20;
/// Lines a module may log at once after a quiet spell.
pub const BURST: u32 = 200;
/// At most one "dropping" warning per module this often.
pub const NOTICE_EVERY: Duration = Duration::from_secs(10);

/// What to do with one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    Write,
    Drop,
    /// Drop it, and warn that `.0` lines (this one included) were dropped
    /// since the last warning.
    DropAndWarn(u64),
}

/// One module's bucket. Starts full.
#[derive(Debug, Default)]
pub(crate) struct LogRate {
    bucket: Mutex<Bucket>,
    dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct Bucket {
    /// Lines owed to the bucket: BURST minus what is left. Zero is full.
    spent: f64,
    /// When `spent` was last brought up to date; `None`: never used.
    at: Option<Instant>,
    warned: Option<Instant>,
    dropped_since_warning: u64,
}

impl LogRate {
    pub(crate) fn admit(&self, now: Instant) -> Admit {
        let mut b = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = b.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * f64::from(RATE);
            b.spent = (b.spent - refill).max(0.0);
        }
        b.at = Some(now);
        if b.spent + 1.0 <= f64::from(BURST) {
            b.spent += 1.0;
            return Admit::Write;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        b.dropped_since_warning += 1;
        if b.warned
            .is_some_and(|w| now.saturating_duration_since(w) < NOTICE_EVERY)
        {
            return Admit::Drop;
        }
        b.warned = Some(now);
        Admit::DropAndWarn(std::mem::take(&mut b.dropped_since_warning))
    }

    /// Lines dropped since the process started.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(rate: &LogRate, n: u32, now: Instant) -> (u32, u32) {
        let mut written = 0;
        let mut dropped = 0;
        for _ in 0..n {
            match rate.admit(now) {
                Admit::Write => written += 1,
                Admit::Drop | Admit::DropAndWarn(_) => dropped += 1,
            }
        }
        (written, dropped)
    }

    #[test]
    fn a_burst_passes_and_the_rest_is_dropped_and_counted() {
        let rate = LogRate::default();
        let t0 = Instant::now();
        assert_eq!(count(&rate, BURST + 50, t0), (BURST, 50));
        assert_eq!(rate.dropped(), 50);
    }

    #[test]
    fn the_bucket_refills_at_the_rate() {
        let rate = LogRate::default();
        let t0 = Instant::now();
        count(&rate, BURST, t0);
        assert_eq!(count(&rate, 1, t0), (0, 1), "empty");
        // Two seconds later: 2 × RATE lines, no more.
        let (written, _) = count(&rate, 3 * RATE, t0 + Duration::from_secs(2));
        assert_eq!(written, 2 * RATE);
    }

    #[test]
    fn a_flood_warns_once_per_interval_with_the_count() {
        let rate = LogRate::default();
        let t0 = Instant::now();
        count(&rate, BURST, t0);
        assert_eq!(rate.admit(t0), Admit::DropAndWarn(1));
        assert_eq!(count(&rate, 99, t0 + Duration::from_millis(10)), (0, 99));
        // Within the interval nothing warns; after it, the count since the
        // last warning comes out once (refill spent first).
        let later = t0 + NOTICE_EVERY;
        let mut warned = Vec::new();
        for _ in 0..(RATE * 10 + 1) {
            if let Admit::DropAndWarn(n) = rate.admit(later) {
                warned.push(n);
            }
        }
        assert_eq!(warned, vec![100]);
    }
}
