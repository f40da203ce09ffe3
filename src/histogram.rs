//! A fixed-memory histogram of recent values (µs, or requests per batch) for AI.INFO's and INFO's percentiles:
//! log-linear buckets (exact below 16, then 4 per power of two: a percentile is within 12.5% of the value),
//! counted in two one-minute windows, so a percentile covers the last one to two minutes. Recording is a few
//! relaxed atomic adds, with no lock and no allocation; a reader may see a window being cleared, which only
//! loses the samples recorded in that instant.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::LazyLock;
use std::time::Instant;

const EXACT: usize = 16;
const SUB: usize = 4;
/// Buckets up to 2^44 (about 200 days in µs); larger values land in the last one.
const OCTAVES: usize = 40;
const BUCKETS: usize = EXACT + OCTAVES * SUB;
/// Seconds per window.
pub const WINDOW_SECS: u64 = 60;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The window `now` falls in (counted from the module's start).
pub fn window_of(now: Instant) -> u64 {
    now.saturating_duration_since(*EPOCH).as_secs() / WINDOW_SECS + 1
}

/// The current window.
pub fn window_now() -> u64 {
    window_of(Instant::now())
}

/// Whole seconds since the module's start.
pub fn seconds() -> u64 {
    EPOCH.elapsed().as_secs()
}

fn bucket(v: u64) -> usize {
    if v < EXACT as u64 {
        return v as usize;
    }
    let octave = 63 - v.leading_zeros() as usize; // >= 4
    let sub = ((v >> (octave - 2)) & (SUB as u64 - 1)) as usize;
    (EXACT + (octave - 4) * SUB + sub).min(BUCKETS - 1)
}

/// The middle of bucket `b` (its value below 16).
fn value(b: usize) -> u64 {
    if b < EXACT {
        return b as u64;
    }
    let octave = (b - EXACT) / SUB + 4;
    let sub = ((b - EXACT) % SUB) as u64;
    let width = 1u64 << (octave - 2);
    (1u64 << octave) + sub * width + width / 2
}

pub struct Histogram {
    counts: [[AtomicU32; BUCKETS]; 2],
    /// The window whose counts are in `counts[window % 2]` (0: nothing recorded yet).
    window: AtomicU64,
    /// Since the last reset: the sum of all values and their number.
    pub total: AtomicU64,
    pub count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
            window: AtomicU64::new(0),
            total: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Histogram {{ count: {}, total: {} }}", self.count.load(Relaxed), self.total.load(Relaxed))
    }
}

impl Histogram {
    /// Records `v` in window `w` (`window_of` the time it was taken).
    pub fn record(&self, v: u64, w: u64) {
        let cur = self.window.load(Relaxed);
        if w > cur && self.window.compare_exchange(cur, w, Relaxed, Relaxed).is_ok() {
            // This thread moved the histogram on: the slot of `w` holds window w - 2 (or older), and when more
            // than one window passed, the other slot is stale too.
            clear(&self.counts[(w % 2) as usize]);
            if w > cur + 1 {
                clear(&self.counts[((w + 1) % 2) as usize]);
            }
        }
        // A late sample of an older window is counted in the newer one: close enough.
        let slot = self.window.load(Relaxed) % 2;
        self.counts[slot as usize][bucket(v)].fetch_add(1, Relaxed);
        self.total.fetch_add(v, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// The `q`-quantile (0..=1) of the values of the last one to two windows, as of window `now`; 0 without any.
    pub fn quantile(&self, q: f64, now: u64) -> u64 {
        let cur = self.window.load(Relaxed);
        let mut merged = [0u64; BUCKETS];
        let mut n = 0u64;
        for (w, slot) in [(cur, cur % 2), (cur.wrapping_sub(1), (cur + 1) % 2)] {
            if cur == 0 || w == 0 || w + 1 < now {
                continue;
            }
            for (m, c) in merged.iter_mut().zip(&self.counts[slot as usize]) {
                let c = c.load(Relaxed) as u64;
                *m += c;
                n += c;
            }
        }
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (b, &c) in merged.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return value(b);
            }
        }
        value(BUCKETS - 1)
    }

    pub fn reset(&self) {
        for slot in &self.counts {
            clear(slot);
        }
        self.window.store(0, Relaxed);
        self.total.store(0, Relaxed);
        self.count.store(0, Relaxed);
    }
}

fn clear(counts: &[AtomicU32; BUCKETS]) {
    for c in counts {
        c.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_close() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 30, 1 << 40, u64::MAX]) {
            let b = bucket(v);
            assert!(b >= last, "bucket order at {v}");
            last = b;
            if v < (1 << 44) {
                let mid = value(b) as f64;
                assert!((mid - v as f64).abs() <= 0.125 * v as f64 + 0.5, "{v} -> {mid}");
            }
        }
    }

    #[test]
    fn quantiles_of_the_recent_windows() {
        let h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v, 5);
        }
        let p50 = h.quantile(0.5, 5);
        let p99 = h.quantile(0.99, 5);
        assert!((440..=560).contains(&p50), "{p50}");
        assert!((870..=1120).contains(&p99), "{p99}");
        assert_eq!((h.count.load(Relaxed), h.total.load(Relaxed)), (1000, 500_500));
        // The next window still sees the previous one; two windows later it is gone.
        h.record(10_000, 6);
        assert!(h.quantile(0.5, 6) >= 440);
        assert_eq!(h.quantile(0.5, 8), 0);
        h.record(7, 8);
        assert_eq!(h.quantile(0.99, 8), 7, "windows 5 and 6 were cleared");
        h.reset();
        assert_eq!((h.quantile(0.5, 8), h.count.load(Relaxed)), (0, 0));
    }
}
