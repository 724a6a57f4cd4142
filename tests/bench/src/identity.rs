//! Row 17, one replica (issue 49): `--shards 1`, the default, is the
//! controller from before sharding, request for request.
//!
//! The same namespace is synced cold, then left quiet, by the release
//! binary built from the last commit before sharding (`BENCH_BEFORE_BIN`)
//! and by this build, each as rows 1 and 2 run it (no leader election) and
//! as an elected replica (`--leader-elect`), each from no slice. The audit
//! log counts each run's requests per verb and resource.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, api::ListParams};
use portwise_tests::{GROUP_KEY, MANAGED_BY_LABEL, Portwise, TestNs};

use crate::Bench;
use crate::audit::Requests;
use crate::knobs::env_usize;
use crate::objects::{Kind, create_groups, endpoints_of, groups};
use crate::process::{Controller, release_bin, stop_portwise};
use crate::report::Goal;
use crate::stats::secs;

const MANAGER: &str = "portwise-identity";

/// Requests per (verb, resource) of portwise in a window.
type Counts = BTreeMap<(String, String), u64>;

fn counts(r: &Requests) -> Counts {
    r.of("portwise")
}

/// The counts that must be equal: everything but Leases and Events, whose
/// numbers follow the clock (a renewal every retry period).
fn timeless(c: &Counts) -> Counts {
    c.iter()
        .filter(|((_, r), _)| r != "leases" && r != "events")
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

fn text(c: &Counts) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|((v, r), n)| format!("{v} {r} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Bench {
    pub(crate) async fn one_replica(&mut self) -> Result<()> {
        let before = std::env::var_os("BENCH_BEFORE_BIN")
            .map(PathBuf::from)
            .filter(|p| p.is_file())
            .context(
                "BENCH_BEFORE_BIN must name a release portwise built from the last commit before \
                 sharding (68a3ee0; docs/benchmarks.md, row 17, says how)",
            )?;
        let services = env_usize("BENCH_IDENTITY_SERVICES", 200);
        let per = 10;
        let quiet = Duration::from_secs(env_usize("BENCH_IDENTITY_QUIET_SECS", 30) as u64);
        let ns = TestNs::new(self.cp, "bench-identity").await?;
        self.ensure_nodes(&ns).await?;
        let gs = groups("i", services, per, 45_000);
        create_groups(
            &ns,
            Kind::Portwise,
            &gs,
            &self.nodes,
            self.knobs.setup_concurrency,
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let config = format!(
            "managedBy: {MANAGER}\nserviceKey: {{annotation: {GROUP_KEY}}}\nmembership: podReady\n"
        );
        let audit = self.bcp.audit();
        let selector = format!("{MANAGED_BY_LABEL}={MANAGER}");
        let mut results = Vec::new();
        for elect in [false, true] {
            for (who, bin) in [
                ("before sharding", before.clone()),
                ("this build", release_bin()?),
            ] {
                let api: Api<EndpointSlice> = ns.api();
                api.delete_collection(
                    &Default::default(),
                    &ListParams::default().labels(&selector),
                )
                .await?;
                tokio::time::sleep(Duration::from_secs(3)).await;
                let tag = format!(
                    "identity-{}-{}",
                    if elect { "elected" } else { "sole" },
                    who.replace(' ', "-")
                );
                let mut args: Vec<String> = Vec::new();
                if elect {
                    args.extend(
                        [
                            "--leader-elect",
                            "--lease-namespace",
                            ns.name(),
                            "--lease-name",
                            &tag,
                            "--identity",
                            &tag,
                        ]
                        .map(String::from),
                    );
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let a0 = audit.offset();
                let t0 = std::time::Instant::now();
                let mut pw = Portwise::builder(self.cp)
                    .name(&format!("portwise-{tag}"))
                    .dir(&self.work)
                    .bin(&bin)
                    .namespaces(&[ns.name()])
                    .config(&config)
                    .args(&args)
                    .log_filter("info")
                    .quiet()
                    .start()
                    .await?;
                let res = async {
                    loop {
                        pw.check_alive()?;
                        if endpoints_of(&ns, &selector).await? == services * per {
                            break;
                        }
                        if t0.elapsed() > Duration::from_secs(300) {
                            bail!("{who} did not publish every Service within 300 s");
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    let took = t0.elapsed();
                    // Requests still in flight land in the cold window.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    let a1 = audit.offset();
                    tokio::time::sleep(quiet).await;
                    let a2 = audit.offset();
                    anyhow::Ok((took, a1, a2))
                }
                .await;
                stop_portwise(&mut pw).await;
                let (took, a1, a2) = res?;
                let cold = counts(&audit.between(a0, a1)?);
                let steady = counts(&audit.between(a1, a2)?);
                eprintln!(
                    "bench:   {who}{}: published in {}; cold {}; quiet {}",
                    if elect { ", --leader-elect" } else { "" },
                    secs(took),
                    text(&cold),
                    text(&steady)
                );
                results.push((elect, who, cold, steady));
            }
        }
        drop(ns);
        self.protocol.push(format!(
            "- Row 17 (one replica) setup (not counted): one namespace `bench-identity-*` with {services} Services × {per} Ready pods (group annotation, `membership: podReady`). Each run starts from no slice: the release binary built from 68a3ee0 (the last commit before sharding, `BENCH_BEFORE_BIN`) and this build, each without leader election (as rows 1 and 2 run) and with `--leader-elect` (`--shards 1`, the default); published, then {} quiet. Requests per verb and resource from the audit log, the cold window ending 2 s after the last slice showed."
            , secs(quiet)
        ));
        let label = "17 one replica (--shards 1 against the build before sharding)";
        for pair in results.chunks(2) {
            let [(elect, _, cold_b, quiet_b), (_, _, cold_n, quiet_n)] = pair else {
                continue;
            };
            let mode = if *elect {
                "--leader-elect"
            } else {
                "no leader election (rows 1 and 2)"
            };
            let same_cold = timeless(cold_b) == timeless(cold_n);
            self.report.row(
                label,
                &format!("{mode}: cold sync, requests per verb and resource but Leases and Events (this build, portwise column; before sharding, native column)"),
                text(&timeless(cold_n)),
                text(&timeless(cold_b)),
                None,
                Goal::Stated("the same", same_cold),
            );
            let writes = |c: &Counts| -> u64 {
                c.iter()
                    .filter(|((v, r), _)| {
                        crate::audit::WRITE_VERBS.contains(&v.as_str())
                            && (r == "endpointslices" || r == "endpoints")
                    })
                    .map(|(_, n)| n)
                    .sum()
            };
            let (wn, wb) = (writes(quiet_n), writes(quiet_b));
            self.report.row(
                label,
                &format!(
                    "{mode}: quiet {}, every request (slice or Endpoints writes: {wn} and {wb})",
                    secs(quiet)
                ),
                text(quiet_n),
                text(quiet_b),
                None,
                Goal::Stated(
                    "0 writes; the same",
                    wn == 0 && timeless(quiet_n) == timeless(quiet_b),
                ),
            );
        }
        Ok(())
    }
}
