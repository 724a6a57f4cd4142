//! Statistics and the table's number formats: ratios, medians,
//! nearest-rank percentiles, and the bootstrap interval of a ratio.

use std::time::Duration;

/// `a ÷ b`, none when `b` is not positive (nothing to compare with).
pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}

/// A duration as the table shows it: seconds, one decimal.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The middle of `xs` (the upper one of an even count), 0 when empty.
pub(crate) fn median_of(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Nearest-rank percentile (`p` in 0..=1) of `xs`.
pub(crate) fn pct(xs: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Bootstrap rounds behind [`ratio_interval`]: enough that its 2.5th and
/// 97.5th percentiles move by less than the table's two decimals.
pub(crate) const BOOTSTRAP_ROUNDS: usize = 4000;

/// The 95 % interval of a flip row's ratio: portwise ÷ native of the
/// median over runs of each run's `p` percentile, the table's own figure.
/// A bootstrap: each round resamples every run's flip pairs (a portwise
/// flip and the native flip of the same turn, which met the machine in the
/// same state) with replacement and computes the ratio again. It says how
/// far the ratio moves from the flips' own spread alone, so a ratio past
/// its goal can be told from one that noise puts there. A fixed seed: the
/// same flips give the same interval.
pub(crate) fn ratio_interval(
    runs: &[Vec<(f64, f64)>],
    p: f64,
    rounds: usize,
) -> Option<(f64, f64)> {
    if runs.is_empty() || runs.iter().any(|r| r.is_empty()) {
        return None;
    }
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut ratios = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for pairs in runs {
            let (pw, nat): (Vec<f64>, Vec<f64>) = (0..pairs.len())
                .map(|_| pairs[rng.usize(..pairs.len())])
                .unzip();
            a.push(pct(&pw, p));
            b.push(pct(&nat, p));
        }
        ratios.extend(ratio(median_of(&a), median_of(&b)));
    }
    (ratios.len() == rounds).then(|| (pct(&ratios, 0.025), pct(&ratios, 0.975)))
}

/// Milliseconds as the table shows them: one decimal below 10 ms, none
/// above; a dash for no figure (NaN).
pub(crate) fn ms(x: f64) -> String {
    if x.is_nan() {
        "—".into()
    } else if x.abs() < 10.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.0} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs whose two sides come from the same spread, in `runs` runs of
    /// `n`: one side's order shuffled, so pairs are no copies.
    fn same_spread(runs: usize, n: usize, scale: f64) -> Vec<Vec<(f64, f64)>> {
        let mut rng = fastrand::Rng::with_seed(7);
        (0..runs)
            .map(|_| {
                (0..n)
                    .map(|_| {
                        let x = 50.0 + 20.0 * rng.f64();
                        let y = 50.0 + 20.0 * rng.f64();
                        (x * scale, y)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_interval_spans_parity_when_both_sides_share_a_spread() {
        let (lo, hi) = ratio_interval(&same_spread(3, 100, 1.0), 0.5, 2000).unwrap();
        assert!(lo < 1.0 && hi > 1.0, "{lo}–{hi}");
        assert!(hi - lo < 0.2, "{lo}–{hi}: too wide for 300 pairs");
    }

    #[test]
    fn the_interval_excludes_parity_when_one_side_is_slower() {
        let (lo, hi) = ratio_interval(&same_spread(3, 100, 1.3), 0.5, 2000).unwrap();
        assert!(lo > 1.0, "{lo}–{hi}");
        assert!(lo < 1.3 && hi > 1.2, "{lo}–{hi}");
    }

    #[test]
    fn percentiles_are_nearest_rank_and_skip_missing_figures() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&xs, 0.5), 50.0);
        assert_eq!(pct(&xs, 0.99), 99.0);
        assert_eq!(pct(&xs, 1.0), 100.0);
        assert_eq!(pct(&xs, 0.0), 1.0);
        assert_eq!(pct(&[3.0, f64::NAN, 1.0, 2.0], 0.5), 2.0);
        assert!(pct(&[], 0.5).is_nan());
        assert!(pct(&[f64::NAN], 0.5).is_nan());
        // Of 50 figures, p99 is the largest.
        let fifty: Vec<f64> = (1..=50).map(f64::from).collect();
        assert_eq!(pct(&fifty, 0.99), 50.0);
    }

    #[test]
    fn the_median_is_the_middle_or_the_upper_middle() {
        assert_eq!(median_of(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_of(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median_of(&[]), 0.0);
    }

    #[test]
    fn ratios_need_a_positive_divisor() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(3.0, 0.0), None);
        assert_eq!(ratio(3.0, -1.0), None);
    }

    #[test]
    fn figures_are_formatted_as_the_table_shows_them() {
        assert_eq!(ms(f64::NAN), "—");
        assert_eq!(ms(0.04), "0.0 ms");
        assert_eq!(ms(9.94), "9.9 ms");
        assert_eq!(ms(12.6), "13 ms");
        assert_eq!(ms(1234.4), "1234 ms");
        assert_eq!(secs(Duration::from_millis(12_345)), "12.3 s");
    }

    #[test]
    fn no_interval_without_flips() {
        assert_eq!(ratio_interval(&[], 0.5, 10), None);
        assert_eq!(ratio_interval(&[vec![]], 0.5, 10), None);
    }
}
