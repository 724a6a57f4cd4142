//! What portwise's reconciles cost, from its `/metrics`: the histograms
//! `portwise_reconcile_phase_duration_seconds{phase}` (trigger, queue,
//! judge, plan, write, finish) and `portwise_reconcile_duration_seconds`.
//!
//! Two scrapes bracket what the bench wants measured; their difference
//! ([`Phases::since`]) holds the reconciles in between. Over a cold start
//! that gives each phase's mean exactly and the reconcile time's
//! percentiles as Prometheus estimates them from the buckets
//! ([`bucket_quantile`]). Around one pod flip it gives that flip's own
//! reconcile exactly ([`Phases::one`]), as long as no other reconcile ran
//! in the window, which is what the flip rows and row 3's reconcile cost
//! need (every phase observed once per reconcile; no per-Service series,
//! which would not scale).

use std::collections::BTreeMap;

use anyhow::Result;
use portwise_tests::{Metrics, Portwise};

use crate::stats::{ms, pct};

const PHASE: &str = "portwise_reconcile_phase_duration_seconds";
const DURATION: &str = "portwise_reconcile_duration_seconds";

/// One reconcile's phases (the controller's `Profile`), times in ms.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reconciled {
    /// NaN when no pod change asked for the reconcile.
    pub(crate) trigger: f64,
    pub(crate) queue: f64,
    pub(crate) judge: f64,
    pub(crate) plan: f64,
    pub(crate) write: f64,
    pub(crate) finish: f64,
    /// judge + plan + write + finish: the reconcile's own time, not its
    /// wait for a turn.
    pub(crate) total: f64,
}

/// The reconcile histograms of one scrape, or the difference of two.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Phases {
    /// (count, sum in seconds) per phase.
    phases: BTreeMap<String, (f64, f64)>,
    /// `portwise_reconcile_duration_seconds`: (upper bound, cumulative
    /// count) per bucket, by bound.
    buckets: Vec<(f64, f64)>,
}

impl Phases {
    pub(crate) fn of(m: &Metrics) -> Self {
        let mut phases = BTreeMap::<String, (f64, f64)>::new();
        for s in &m.0 {
            let Some(phase) = s.labels.get("phase") else {
                continue;
            };
            let entry = phases.entry(phase.clone()).or_default();
            if s.name == format!("{PHASE}_count") {
                entry.0 += s.value;
            } else if s.name == format!("{PHASE}_sum") {
                entry.1 += s.value;
            }
        }
        let mut buckets: Vec<(f64, f64)> = m
            .select(&format!("{DURATION}_bucket"), &[])
            .filter_map(|s| Some((s.labels.get("le")?.parse::<f64>().ok()?, s.value)))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Phases { phases, buckets }
    }

    pub(crate) async fn scrape(pw: &Portwise) -> Result<Self> {
        Ok(Self::of(&pw.scrape().await?))
    }

    /// What was observed after `earlier` (a scrape of the same process).
    pub(crate) fn since(&self, earlier: &Phases) -> Phases {
        let phases = self
            .phases
            .iter()
            .map(|(k, &(n, s))| {
                let (n0, s0) = earlier.phases.get(k).copied().unwrap_or_default();
                (k.clone(), (n - n0, s - s0))
            })
            .collect();
        let buckets = self
            .buckets
            .iter()
            .map(|&(le, n)| {
                let n0 = earlier
                    .buckets
                    .iter()
                    .find(|b| b.0 == le)
                    .map_or(0.0, |b| b.1);
                (le, n - n0)
            })
            .collect();
        Phases { phases, buckets }
    }

    fn count(&self, phase: &str) -> f64 {
        self.phases.get(phase).map_or(0.0, |p| p.0)
    }

    /// The phase's mean in ms (NaN when none was observed).
    fn mean_ms(&self, phase: &str) -> f64 {
        match self.phases.get(phase) {
            Some(&(n, s)) if n > 0.0 => 1000.0 * s / n,
            _ => f64::NAN,
        }
    }

    /// Reconciles served: each observes `finish` last, once.
    pub(crate) fn reconciles(&self) -> f64 {
        self.count("finish")
    }

    /// The one reconcile of a difference that holds exactly one; `None`
    /// when it holds none or several (they cannot be told apart).
    pub(crate) fn one(&self) -> Option<Reconciled> {
        if self.reconciles() != 1.0
            || ["queue", "judge", "plan", "write"]
                .iter()
                .any(|p| self.count(p) != 1.0)
        {
            return None;
        }
        let judge = self.mean_ms("judge");
        let plan = self.mean_ms("plan");
        let write = self.mean_ms("write");
        let finish = self.mean_ms("finish");
        Some(Reconciled {
            trigger: if self.count("trigger") == 1.0 {
                self.mean_ms("trigger")
            } else {
                f64::NAN
            },
            queue: self.mean_ms("queue"),
            judge,
            plan,
            write,
            finish,
            total: judge + plan + write + finish,
        })
    }

    /// The reconciles of a difference: each phase's mean exactly, p50 and
    /// p99 of the reconcile time estimated from the buckets.
    pub(crate) fn stats(&self) -> ReconcileStats {
        let phase = |p: &str| self.mean_ms(p);
        let (judge, plan, write, finish) = (
            phase("judge"),
            phase("plan"),
            phase("write"),
            phase("finish"),
        );
        ReconcileStats {
            n: self.reconciles() as usize,
            mean: judge + plan + write + finish,
            p50: 1000.0 * bucket_quantile(&self.buckets, 0.5),
            p99: 1000.0 * bucket_quantile(&self.buckets, 0.99),
            queue: phase("queue"),
            judge,
            plan,
            write,
            finish,
        }
    }
}

/// Runs `flip` (something that makes portwise reconcile `service` of
/// `namespace` once, and waits for its slices) and returns what it
/// returned with that reconcile, read from the metrics around it: `None`
/// when another reconcile (a resync) shared the window, or none finished
/// within 5 s.
pub(crate) async fn reconcile_of<T>(
    pw: &Portwise,
    namespace: &str,
    service: &str,
    flip: impl Future<Output = Result<T>>,
) -> Result<(T, Option<Reconciled>)> {
    let labels = [("namespace", namespace), ("service", service)];
    let synced = |m: &Metrics| m.sum("portwise_service_synced_timestamp_seconds", &labels);
    let m0 = pw.scrape().await?;
    let (p0, s0) = (Phases::of(&m0), synced(&m0));
    let out = flip.await?;
    // The Service's sync is stamped just before its reconcile's phases are
    // observed: wait for both, then a moment for the phases to land.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let m = pw.scrape().await?;
        if synced(&m) != s0 && Phases::of(&m).since(&p0).reconciles() >= 1.0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            return Ok((out, None));
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let one = Phases::scrape(pw).await?.since(&p0).one();
    Ok((out, one))
}

/// The `q` quantile of a histogram's cumulative buckets (upper bound,
/// count), as Prometheus' `histogram_quantile` estimates it: linear within
/// the bucket it falls in, the lowest bucket starting at 0, and the
/// highest finite bound when it falls in `+Inf`. NaN without observations.
pub(crate) fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = buckets.last() else {
        return f64::NAN;
    };
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= rank {
            if le.is_infinite() {
                return lower;
            }
            let within = n - below;
            return if within > 0.0 {
                lower + (le - lower) * (rank - below) / within
            } else {
                le
            };
        }
        (lower, below) = (le, n);
    }
    lower
}

/// Mean and percentiles of some reconciles, and the mean of each phase.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReconcileStats {
    pub(crate) n: usize,
    pub(crate) mean: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) queue: f64,
    pub(crate) judge: f64,
    pub(crate) plan: f64,
    pub(crate) write: f64,
    pub(crate) finish: f64,
}

impl ReconcileStats {
    pub(crate) fn of(rs: &[Reconciled]) -> Self {
        let mean = |f: fn(&Reconciled) -> f64| {
            if rs.is_empty() {
                f64::NAN
            } else {
                rs.iter().map(f).sum::<f64>() / rs.len() as f64
            }
        };
        let totals: Vec<f64> = rs.iter().map(|r| r.total).collect();
        ReconcileStats {
            n: rs.len(),
            mean: mean(|r| r.total),
            p50: pct(&totals, 0.5),
            p99: pct(&totals, 0.99),
            queue: mean(|r| r.queue),
            judge: mean(|r| r.judge),
            plan: mean(|r| r.plan),
            write: mean(|r| r.write),
            finish: mean(|r| r.finish),
        }
    }

    /// "judge 0.1 / plan 0.0 / write 12 / finish 0.0 ms"
    pub(crate) fn phases(&self) -> String {
        format!(
            "judge {} / plan {} / write {} / finish {}",
            ms(self.judge),
            ms(self.plan),
            ms(self.write),
            ms(self.finish)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scrape as portwise's encoder writes it: the phase histograms
    /// (count, sum in seconds) and the reconcile time's cumulative buckets.
    fn scrape(phases: &[(&str, f64, f64)], buckets: &[(&str, f64)]) -> Metrics {
        let mut text = String::from("# TYPE portwise_reconcile_phase_duration_seconds histogram\n");
        for (phase, n, sum) in phases {
            text += &format!("{PHASE}_sum{{phase=\"{phase}\"}} {sum}\n");
            text += &format!("{PHASE}_count{{phase=\"{phase}\"}} {n}\n");
            text += &format!("{PHASE}_bucket{{le=\"+Inf\",phase=\"{phase}\"}} {n}\n");
        }
        for (le, n) in buckets {
            text += &format!("{DURATION}_bucket{{le=\"{le}\"}} {n}\n");
        }
        text += "# EOF\n";
        Metrics::parse(&text)
    }

    const ALL: [&str; 6] = ["trigger", "queue", "judge", "plan", "write", "finish"];

    #[test]
    fn one_reconcile_between_two_scrapes_is_read_exactly() {
        let before = scrape(
            &ALL.map(|p| (p, 10.0, 1.0)),
            &[("0.001", 4.0), ("0.002", 10.0), ("+Inf", 10.0)],
        );
        let after = scrape(
            &[
                ("trigger", 11.0, 1.0005),
                ("queue", 11.0, 1.0001),
                ("judge", 11.0, 1.002),
                ("plan", 11.0, 1.0003),
                ("write", 11.0, 1.012),
                ("finish", 11.0, 1.0004),
            ],
            &[("0.001", 4.0), ("0.002", 10.0), ("+Inf", 11.0)],
        );
        let r = Phases::of(&after)
            .since(&Phases::of(&before))
            .one()
            .unwrap();
        let near = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(near(r.trigger, 0.5), "{r:?}");
        assert!(near(r.queue, 0.1), "{r:?}");
        assert!(near(r.judge, 2.0), "{r:?}");
        assert!(near(r.plan, 0.3), "{r:?}");
        assert!(near(r.write, 12.0), "{r:?}");
        assert!(near(r.finish, 0.4), "{r:?}");
        // The reconcile's own time: not its trigger or its wait in the queue.
        assert!(near(r.total, 14.7), "{r:?}");
    }

    #[test]
    fn a_reconcile_no_pod_change_asked_for_has_no_trigger() {
        let before = scrape(&ALL.map(|p| (p, 0.0, 0.0)), &[]);
        let after = scrape(
            &ALL.map(|p| {
                if p == "trigger" {
                    (p, 0.0, 0.0)
                } else {
                    (p, 1.0, 0.001)
                }
            }),
            &[],
        );
        let r = Phases::of(&after)
            .since(&Phases::of(&before))
            .one()
            .unwrap();
        assert!(r.trigger.is_nan(), "{r:?}");
        assert!((r.judge - 1.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn two_reconciles_or_none_cannot_be_told_apart() {
        let before = scrape(&ALL.map(|p| (p, 5.0, 1.0)), &[]);
        let two = scrape(&ALL.map(|p| (p, 7.0, 1.5)), &[]);
        assert!(Phases::of(&two).since(&Phases::of(&before)).one().is_none());
        assert!(
            Phases::of(&before)
                .since(&Phases::of(&before))
                .one()
                .is_none()
        );
        // Nor a scrape caught halfway through one reconcile's phases.
        let half = scrape(
            &ALL.map(|p| {
                if p == "finish" {
                    (p, 5.0, 1.0)
                } else {
                    (p, 6.0, 1.1)
                }
            }),
            &[],
        );
        assert!(
            Phases::of(&half)
                .since(&Phases::of(&before))
                .one()
                .is_none()
        );
    }

    #[test]
    fn a_cold_start_has_exact_phase_means_and_estimated_percentiles() {
        // 100 reconciles: 50 of up to 1 ms, 40 more up to 2 ms, 10 up to 4 ms.
        let m = scrape(
            &[
                ("queue", 100.0, 1.0),
                ("judge", 100.0, 0.05),
                ("plan", 100.0, 0.01),
                ("write", 100.0, 0.1),
                ("finish", 100.0, 0.02),
            ],
            &[
                ("0.001", 50.0),
                ("0.002", 90.0),
                ("0.004", 100.0),
                ("+Inf", 100.0),
            ],
        );
        let st = Phases::of(&m).stats();
        assert_eq!(st.n, 100);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(st.queue, 10.0), "{st:?}");
        assert!(near(st.judge, 0.5), "{st:?}");
        assert!(near(st.write, 1.0), "{st:?}");
        assert!(near(st.mean, 0.5 + 0.1 + 1.0 + 0.2), "{st:?}");
        assert!(near(st.p50, 1.0), "{st:?}");
        assert!(near(st.p99, 2.0 + 2.0 * 0.9), "{st:?}");
    }

    #[test]
    fn bucket_quantiles_interpolate_as_prometheus_does() {
        let b = [(0.1, 10.0), (0.2, 30.0), (0.4, 40.0), (f64::INFINITY, 40.0)];
        assert!((bucket_quantile(&b, 0.25) - 0.1).abs() < 1e-12);
        assert!((bucket_quantile(&b, 0.5) - 0.15).abs() < 1e-12);
        assert!((bucket_quantile(&b, 0.125) - 0.05).abs() < 1e-12);
        // Past the last finite bound: that bound.
        let over = [(0.1, 1.0), (f64::INFINITY, 10.0)];
        assert_eq!(bucket_quantile(&over, 0.99), 0.1);
        assert!(bucket_quantile(&[], 0.5).is_nan());
        assert!(bucket_quantile(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5).is_nan());
    }
}
