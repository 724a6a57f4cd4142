//! Row 3's second part, reconcile cost: what one reconcile costs portwise
//! at 10 and at 1000 pods, per phase, from its metrics around each flip.

use std::{collections::BTreeSet, fmt::Write as _, time::Duration};

use anyhow::{Context, Result};

use crate::objects::{Group, groups};
use crate::profile::{ReconcileStats, Reconciled, reconcile_of};
use crate::report::Goal;
use crate::stats::ms;
use crate::{Bench, Pair};

impl Bench {
    /// Row 3's second part: what one reconcile costs at 10 and at 1000
    /// pods, unloaded. One pod of a 10-pod Service (row 1's first) and one
    /// of the 1000-pod one flip readiness `reconcile_flips` times each, one
    /// at a time, each waited for in the slices; portwise's reconcile
    /// histograms, scraped around each flip, give that flip's reconcile
    /// and its phases ([`reconcile_of`]).
    pub(crate) async fn reconcile_costs(&mut self, pair: &mut Pair, big: &Group) -> Result<()> {
        let flips = self.knobs.reconcile_flips;
        if flips == 0 {
            return Ok(());
        }
        let k = &self.knobs;
        let stride = k.services * k.pods_per_service + k.big_pods + 500;
        let small = groups("s", 1, k.pods_per_service, stride).remove(0);
        eprintln!(
            "bench: row 3 reconciles: {flips} flips at {} and at {} pods",
            small.pods.len(),
            big.pods.len()
        );
        let ns = pair.portwise_ns.name().to_string();
        let mut measured: [Vec<Reconciled>; 2] = [Vec::new(), Vec::new()];
        let mut shared = 0;
        for (g, group) in [&small, big].into_iter().enumerate() {
            // What the slices hold now (row 3's first part left one pod of
            // the big Service NotReady); the victim is one of those.
            let all: BTreeSet<String> = pair
                .portwise_tracker
                .state
                .lock()
                .unwrap()
                .expected
                .get(&group.service)
                .cloned()
                .context("the Service is not tracked")?;
            let (victim, ip) = group
                .pods
                .iter()
                .find(|(_, ip)| all.contains(&ip.to_string()))
                .context("no Ready pod to flip")?;
            for i in 0..flips {
                let ready = i % 2 == 1;
                let mut want = all.clone();
                if !ready {
                    want.remove(&ip.to_string());
                }
                pair.portwise_tracker.expect(&group.service, want);
                let flip = async {
                    pair.portwise_ns.set_ready(victim, ready).await?;
                    pair.portwise_tracker
                        .service_converged(&group.service, Duration::from_secs(60))
                        .await
                };
                match reconcile_of(&pair.portwise, &ns, &group.service, flip).await? {
                    (_, Some(r)) => measured[g].push(r),
                    (_, None) => shared += 1,
                }
                // Apart, so that each flip is a reconcile of its own.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Leave it Ready, as found.
            if flips % 2 == 1 {
                pair.portwise_tracker.expect(&group.service, all.clone());
                pair.portwise_ns.set_ready(victim, true).await?;
                pair.portwise_tracker
                    .service_converged(&group.service, Duration::from_secs(60))
                    .await?;
            }
        }
        if shared > 0 {
            eprintln!(
                "bench:   {shared} flips shared their window with another reconcile; not counted"
            );
        }
        let label = "3 reconcile cost (one pod flips readiness; portwise's metrics)";
        let mut detail = format!(
            "Each reconcile of row 3's second part: one pod flips readiness {flips} times in a Service of 10 and in one of 1000 pods, one flip at a time (each waited for in the slices, 100 ms apart), on an otherwise idle controller (row 1's portwise). Times from portwise's `portwise_reconcile_phase_duration_seconds` histograms, scraped before and after each flip (a flip whose window held another reconcile, a resync, is not counted): the reconcile's own time (not its wait for a slot) and its phases: judge (read the caches, decide, run the checkers: podReady here), plan, write (the update of one slice: a PUT with its resourceVersion), finish (metrics and what follows the writes).\n\n| pods | reconciles | mean | p50 | p99 | mean per phase (ms) |\n|---|---|---|---|---|---|\n"
        );
        for (group, rs) in [&small, big].into_iter().zip(&measured) {
            let st = ReconcileStats::of(rs);
            let pods = group.pods.len();
            self.report.row(
                label,
                &format!("reconcile time at {pods} pods, mean / p99 (of {})", st.n),
                format!("{} / {}", ms(st.mean), ms(st.p99)),
                "n/a".into(),
                None,
                Goal::None,
            );
            let _ = writeln!(
                detail,
                "| {pods} | {} | {} | {} | {} | {} |",
                st.n,
                ms(st.mean),
                ms(st.p50),
                ms(st.p99),
                st.phases()
            );
        }
        self.report.section(
            "Row 3: what one reconcile costs at 10 and 1000 pods",
            detail,
        );
        self.write_verbs().await
    }
}
