//! Latency histograms and the figures the summary reports from them.

use std::time::Duration;

use serde::Serialize;

/// A latency histogram in the style of HdrHistogram: exact below 256 µs,
/// above that 128 buckets per power of two, so a percentile is reported
/// at most 1/128 (0.8 %) above the true value and never below it. Memory
/// is bounded (at most 7,424 counters) however many values are recorded.
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    min: u64,
    max: u64,
    sum: u128,
}

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let shift = (63 - v.leading_zeros()) - SUB_BITS;
        let top = v >> shift;
        (SUB * (u64::from(shift) + 1) + (top - SUB)) as usize
    }

    /// The largest value that lands in bucket `i`.
    fn highest_in(i: usize) -> u64 {
        let i = i as u64;
        if i < 2 * SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let top = SUB + i % SUB;
        let end = u128::from(top + 1) << shift;
        u64::try_from(end - 1).unwrap_or(u64::MAX)
    }

    /// Records one value (microseconds).
    pub fn record(&mut self, v: u64) {
        let i = Self::index(v);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        if self.total == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.total += 1;
        self.sum += u128::from(v);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The nearest-rank percentile `p` (0 < p <= 100): the smallest
    /// recorded value that at least `p` % of all values do not exceed, up
    /// to the bucket resolution; `None` when nothing was recorded.
    pub fn percentile(&self, p: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = nearest_rank(p, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::highest_in(i).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }

    pub(super) fn latency(&self) -> Latency {
        let p = |q| self.percentile(q).map(ms);
        Latency {
            count: self.count(),
            min_ms: (self.total > 0).then(|| ms(self.min)),
            mean_ms: (self.total > 0).then(|| {
                let mean_us = self.sum as f64 / self.total as f64;
                mean_us.round() / 1000.0
            }),
            p50_ms: p(50.0),
            p90_ms: p(90.0),
            p99_ms: p(99.0),
            max_ms: (self.total > 0).then(|| ms(self.max)),
        }
    }
}

/// The 1-based nearest rank of percentile `p` among `total` values:
/// ceil(p/100 * total), in integers (to a millionth of a percent) so that
/// p99.9 of 1,000 values is the 999th, not the 1,000th through a rounding
/// error.
pub(super) fn nearest_rank(p: f64, total: u64) -> u64 {
    let per_hundred_million = (p.clamp(0.0, 100.0) * 1_000_000.0).round() as u128;
    let rank = (per_hundred_million * u128::from(total)).div_ceil(100_000_000);
    (rank as u64).clamp(1, total.max(1))
}

/// Microseconds as milliseconds with microsecond precision.
pub(super) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Latency figures in milliseconds.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Latency {
    pub count: u64,
    pub min_ms: Option<f64>,
    pub mean_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

pub(super) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn histogram_buckets_are_contiguous() {
        let mut last = None;
        for v in (0..5000u64).chain([1 << 20, (1 << 20) + 1, u64::MAX / 2, u64::MAX]) {
            let i = Histogram::index(v);
            assert!(Histogram::highest_in(i) >= v, "{v} above bucket {i}");
            if i > 0 {
                assert!(
                    Histogram::highest_in(i - 1) < v,
                    "{v} fits bucket {}",
                    i - 1
                );
            }
            if let Some(l) = last {
                assert!(i >= l);
            }
            last = Some(i);
        }
        assert_eq!(Histogram::index(u64::MAX), 7423);
    }

    /// Nearest-rank percentile of sorted values.
    fn exact(sorted: &[u64], p: f64) -> u64 {
        sorted[nearest_rank(p, sorted.len() as u64) as usize - 1]
    }

    #[test]
    fn percentiles_match_exact_within_resolution() {
        let mut rng = rand::rng();
        for n in [1usize, 2, 3, 10, 99, 100, 101, 1000, 54_321] {
            let mut values: Vec<u64> = (0..n)
                .map(|_| {
                    // Latencies from microseconds to tens of seconds.
                    let exp = rng.random_range(0.0..25.0f64);
                    2f64.powf(exp) as u64
                })
                .collect();
            let mut h = Histogram::default();
            for &v in &values {
                h.record(v);
            }
            values.sort_unstable();
            assert_eq!(h.count(), n as u64);
            for p in [0.1, 1.0, 50.0, 90.0, 99.0, 99.9, 100.0] {
                let want = exact(&values, p);
                let got = h.percentile(p).unwrap();
                assert!(got >= want, "n={n} p{p}: {got} < exact {want}");
                assert!(
                    got as f64 <= want as f64 * (1.0 + 1.0 / 128.0),
                    "n={n} p{p}: {got} too far above exact {want}"
                );
            }
            assert_eq!(h.percentile(100.0), Some(values[n - 1]));
            let l = h.latency();
            assert_eq!(l.max_ms, Some(ms(values[n - 1])));
            assert_eq!(l.min_ms, Some(ms(values[0])));
        }
    }

    #[test]
    fn nearest_ranks() {
        assert_eq!(nearest_rank(50.0, 4), 2);
        assert_eq!(nearest_rank(99.9, 1000), 999);
        assert_eq!(nearest_rank(99.0, 100), 99);
        assert_eq!(nearest_rank(99.0, 101), 100);
        assert_eq!(nearest_rank(100.0, 7), 7);
        assert_eq!(nearest_rank(0.0, 7), 1);
        assert_eq!(nearest_rank(0.001, 1_000_000), 10);
    }

    #[test]
    fn percentiles_small_cases() {
        let mut h = Histogram::default();
        assert_eq!(h.percentile(50.0), None);
        assert_eq!(h.latency().count, 0);
        assert_eq!(h.latency().p99_ms, None);
        // 1..=100 µs: exact in this range; nearest rank.
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.percentile(50.0), Some(50));
        assert_eq!(h.percentile(90.0), Some(90));
        assert_eq!(h.percentile(99.0), Some(99));
        assert_eq!(h.percentile(99.5), Some(100));
        assert_eq!(h.percentile(100.0), Some(100));
        assert_eq!(h.percentile(0.5), Some(1));
        let l = h.latency();
        assert_eq!(l.mean_ms, Some(0.051)); // 50.5 µs
                                            // One slow outlier among fast values shows only at the top.
        let mut h = Histogram::default();
        for _ in 0..999 {
            h.record(1_000);
        }
        h.record(5_000_000);
        // The bucket of 1000 µs holds 1000..=1003.
        assert_eq!(h.percentile(99.0), Some(1_003));
        assert_eq!(h.percentile(99.9), Some(1_003));
        assert_eq!(h.percentile(100.0), Some(5_000_000));
    }
}
