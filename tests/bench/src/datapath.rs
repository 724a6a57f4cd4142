//! Rows 8 and 10, pod change to data path: readiness flips timed until the
//! traffic through a ClusterIP shows them, through kube-proxy (row 8) or
//! Cilium's socket LB (row 10), for a native and a portwise Service.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use portwise_tests::{
    GROUP_KEY, Metrics, NATIVE_MANAGER, TestNs,
    cilium::{CILIUM_NODE, CiliumAgent},
    consumers::{KubeProxy, NameServer, PROXY_NODE, ProxyMode, cluster_ip, expect_answers},
    pod, service,
};
use serde_json::json;

use crate::Bench;
use crate::audit::Requests;
use crate::objects::{
    APP_LABEL, Kind, PORTWISE_MANAGER, TARGET_PORT, expected_of, groups, portwise_config,
};
use crate::prober::{FLIP_GAP, ProbeFrom, Prober, Reach};
use crate::process::{Controller, spawn_portwise, stop_portwise};
use crate::profile::{Reconciled, reconcile_of};
use crate::stats::ms;
use crate::tracker::Tracker;

/// One row-8 flip, in milliseconds from just before the status PATCH was
/// sent.
pub(crate) struct Flip {
    pub(crate) ready: bool,
    /// The PATCH returned.
    pub(crate) patch: f64,
    /// The bench's own watch saw the Service's slices right.
    pub(crate) slice: f64,
    /// The first probe after which every probe met the new rules.
    pub(crate) routed: f64,
    /// From the last probe that met the old rules to `routed`: the rules
    /// changed in between.
    pub(crate) bracket: f64,
    /// Probes out of order: neither state, or the new one before the last
    /// old one (a probe delayed past [`DROPPED_AFTER`], for instance).
    pub(crate) anomalies: usize,
}

/// One Service of row 8 and how to flip it.
pub(crate) struct DpSide<'a> {
    pub(crate) client: &'static str,
    pub(crate) ns: &'a TestNs,
    pub(crate) tracker: &'a Tracker,
    pub(crate) service: String,
    pub(crate) addr: SocketAddr,
    pub(crate) victim: String,
    pub(crate) victim_ip: String,
    pub(crate) all: BTreeSet<String>,
    /// What a connection meets while the victim is no member: kube-proxy
    /// drops the SYN (a `Local` Service without a local endpoint); Cilium's
    /// socket LB fails the `connect` itself.
    pub(crate) gone: &'static [Reach],
    pub(crate) from: ProbeFrom,
}

/// Flips the victim's readiness and times it: the slice by the bench's
/// watch, the data path by connections through the ClusterIP.
pub(crate) async fn datapath_flip(side: &DpSide<'_>, ready: bool) -> Result<Flip> {
    let (old, new): (&[Reach], &[Reach]) = if ready {
        (side.gone, &[Reach::Victim])
    } else {
        (&[Reach::Victim], side.gone)
    };
    let prober = Prober::start(side.addr, &side.victim, &side.from)?;
    // The old rules must hold when the flip starts.
    prober
        .settled(old, Instant::now(), Duration::from_secs(30))
        .await
        .with_context(|| format!("{}: before the flip", side.client))?;
    let mut want = side.all.clone();
    if !ready {
        want.remove(&side.victim_ip);
    }
    side.tracker.expect(&side.service, want);
    let t0 = Instant::now();
    side.ns.set_ready(&side.victim, ready).await?;
    let patched = Instant::now();
    let (slice, routed) = tokio::join!(
        side.tracker
            .service_converged(&side.service, Duration::from_secs(60)),
        prober.settled(new, t0, Duration::from_secs(60)),
    );
    let log = prober.finish().await;
    let slice = slice.with_context(|| format!("{}: the slice", side.client))?;
    routed.with_context(|| format!("{}: the data path", side.client))?;
    let last_old = log
        .iter()
        .filter(|(_, r)| old.contains(r))
        .map(|p| p.0)
        .max();
    let first_new = log
        .iter()
        .filter(|(at, r)| new.contains(r) && last_old.is_none_or(|l| *at > l))
        .map(|p| p.0)
        .min()
        .context("no probe met the new rules")?;
    if first_new <= t0 {
        bail!("{}: the new rules answered before the flip", side.client);
    }
    let anomalies = log
        .iter()
        .filter(|(at, r)| {
            (!old.contains(r) && !new.contains(r))
                || (new.contains(r) && last_old.is_some_and(|l| *at < l))
        })
        .count();
    let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1000.0;
    Ok(Flip {
        ready,
        patch: ms(patched),
        slice: ms(slice),
        routed: ms(first_new),
        bracket: last_old
            .map(|l| first_new.saturating_duration_since(l).as_secs_f64() * 1000.0)
            .unwrap_or(f64::NAN),
        anomalies,
    })
}

/// The data path a flip row times: kube-proxy (row 8), or Cilium's
/// socket LB (row 10).
#[derive(Clone, Copy)]
pub(crate) enum DataPath<'a> {
    KubeProxy(&'a KubeProxy),
    Cilium(&'a CiliumAgent),
}

impl DataPath<'_> {
    /// The Node whose pods the data path routes to (`internalTrafficPolicy:
    /// Local`).
    pub(crate) fn node(self) -> &'static str {
        match self {
            DataPath::KubeProxy(_) => PROXY_NODE,
            DataPath::Cilium(_) => CILIUM_NODE,
        }
    }
    pub(crate) fn probe_from(self) -> ProbeFrom {
        match self {
            DataPath::KubeProxy(_) => ProbeFrom::Bench,
            DataPath::Cilium(agent) => ProbeFrom::Cgroup(agent.cgroup().to_path_buf()),
        }
    }
    /// What a connection meets while the Service has no local member.
    pub(crate) fn gone(self) -> &'static [Reach] {
        match self {
            DataPath::KubeProxy(_) => &[Reach::Dropped],
            // Socket LB decides at `connect()`: no SYN is sent, the call
            // fails; which errno is Cilium's business, not the bench's.
            DataPath::Cilium(_) => &[Reach::Refused, Reach::Dropped, Reach::Failed],
        }
    }
    pub(crate) async fn expect_answers(self, addr: SocketAddr, pods: &[&str]) -> Result<()> {
        let within = Duration::from_secs(60);
        match self {
            DataPath::KubeProxy(_) => expect_answers(addr, pods, within).await.map(drop),
            DataPath::Cilium(agent) => agent.expect_answers(addr, pods, within).await.map(drop),
        }
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            DataPath::KubeProxy(_) => "kube-proxy",
            DataPath::Cilium(_) => "Cilium",
        }
    }
}

/// What a flip row measured, for its report.
pub(crate) struct FlipRun {
    /// Native's flips, then portwise's.
    pub(crate) results: [Vec<Flip>; 2],
    pub(crate) requests: Requests,
    pub(crate) services: usize,
    /// kube-proxy's IPv4 syncs during the flips, and their seconds (row 8).
    pub(crate) syncs: Option<(f64, f64)>,
    /// portwise's reconcile of each of its flips (from its metrics; a flip
    /// that shared its window with a resync is left out).
    pub(crate) profile: Vec<Reconciled>,
}

impl Bench {
    /// Row 8: from a pod's readiness flip to kube-proxy routing by it, one
    /// kube-proxy for a native and a portwise Service of the same shape.
    pub(crate) async fn datapath(&mut self) -> Result<()> {
        let flips = self.knobs.datapath_flips.max(2);
        let per = self.knobs.pods_per_service.max(2);
        eprintln!(
            "bench: row 8: kube-proxy (nftables), two Services × {per} pods, {flips} flips each"
        );
        // kube-proxy first: it creates its Node, and the native controller
        // leaves out a pod whose Node it does not know.
        let proxy = KubeProxy::start(self.cp, ProxyMode::Nftables).await?;
        let mut runs = Vec::new();
        for run in 1..=self.knobs.datapath_runs {
            eprintln!("bench: row 8 run {run} of {}", self.knobs.datapath_runs);
            match self
                .flip_row(DataPath::KubeProxy(&proxy), flips, per, run)
                .await
            {
                Ok(r) => runs.push(r),
                Err(e) => {
                    eprintln!("bench: row 8: kube-proxy's log ends:\n{}", proxy.log_tail());
                    return Err(e);
                }
            }
        }
        self.datapath_report(flips, per, &runs);
        Ok(())
    }

    /// Row 10: row 8 with Cilium's agent (kube-proxy replacement, socket
    /// LB; tests/src/cilium.rs) as the data path instead of kube-proxy.
    pub(crate) async fn cilium_datapath(&mut self) -> Result<()> {
        let flips = self.knobs.datapath_flips.max(2);
        let per = self.knobs.pods_per_service.max(2);
        eprintln!(
            "bench: row 10: Cilium (socket LB), two Services × {per} pods, {flips} flips each"
        );
        // Like kube-proxy, the agent creates its Node before any pod is
        // placed on it.
        let agent = CiliumAgent::start(self.cp).await?;
        let res = self.flip_row(DataPath::Cilium(&agent), flips, per, 1).await;
        match res {
            Ok(run) => {
                self.cilium_datapath_report(flips, per, &run, agent.ready_after);
                Ok(())
            }
            Err(e) => {
                eprintln!("bench: row 10: the agent's log ends:\n{}", agent.log_tail());
                Err(e)
            }
        }
    }

    /// Rows 8 and 10: a native and a portwise Service of the same shape,
    /// their node-local pod's readiness flipped in turns, each flip timed
    /// until `path` routes by it.
    pub(crate) async fn flip_row(
        &mut self,
        path: DataPath<'_>,
        flips: usize,
        per: usize,
        run: usize,
    ) -> Result<FlipRun> {
        let (native_prefix, portwise_prefix, row_id) = match path {
            DataPath::KubeProxy(_) => ("bench-dp-native", "bench-dp-portwise", "row8"),
            DataPath::Cilium(_) => ("bench-cilium-native", "bench-cilium-portwise", "row10"),
        };
        let native_ns = TestNs::new(self.cp, native_prefix).await?;
        let portwise_ns = TestNs::new(self.cp, portwise_prefix).await?;
        self.ensure_nodes(&native_ns).await?;
        let base = 2
            * (self.knobs.services * self.knobs.pods_per_service + self.knobs.big_pods + 500)
            + self.knobs.probe_pods
            + 200
            // Row 10's pods after row 8's, whose servers are gone but whose
            // pods and slices may still be held.
            + if matches!(path, DataPath::Cilium(_)) { 2 * per } else { 0 };
        let ng = groups("dp", 1, per, base).remove(0);
        let pg = groups("dp", 1, per, base + per).remove(0);
        let mut servers = Vec::new();
        for (ns, kind, g) in [
            (&native_ns, Kind::Native, &ng),
            (&portwise_ns, Kind::Portwise, &pg),
        ] {
            let svc = service(&g.service)
                .port_to("http", 80, json!(TARGET_PORT))
                .internal_traffic_policy("Local");
            let svc = match kind {
                Kind::Native => svc.selector(APP_LABEL, &g.service),
                Kind::Portwise | Kind::Cost => svc.annotation(GROUP_KEY, &g.service),
            };
            ns.create_service(svc).await?;
            for (j, (name, ip)) in g.pods.iter().enumerate() {
                // Pod 0 on the data path's node, the others one per bench
                // Node.
                let node = if j == 0 {
                    path.node().to_string()
                } else {
                    self.nodes[j % self.nodes.len()].clone()
                };
                ns.create_pod(
                    pod(name)
                        .label(APP_LABEL, &g.service)
                        .annotation(GROUP_KEY, &g.service)
                        .node(&node)
                        .ips([ip]),
                )
                .await?;
                servers.push(NameServer::start(name, IpAddr::V4(*ip), TARGET_PORT as u16).await?);
            }
        }
        let native_tracker = Tracker::start(
            &native_ns,
            NATIVE_MANAGER,
            expected_of(std::slice::from_ref(&ng)),
        );
        let portwise_tracker = Tracker::start(
            &portwise_ns,
            PORTWISE_MANAGER,
            expected_of(std::slice::from_ref(&pg)),
        );
        // Both controllers as rows 1 and 3 run them: the controller-manager
        // with its recorded argv, portwise with row 1's config and flags.
        let mut native = self.bcp.spawn_cm(&[])?;
        let mut portwise = spawn_portwise(
            self.cp,
            &self.work,
            &format!("{row_id}-{run}"),
            &portwise_config("", "podReady"),
            &[portwise_ns.name()],
            &[],
        )
        .await?;
        let res = async {
            native_tracker
                .converged(Duration::from_secs(600), &mut native)
                .await?;
            portwise_tracker
                .converged(Duration::from_secs(600), &mut portwise)
                .await?;
            let mut sides = Vec::new();
            for (client, ns, tracker, g) in [
                ("native", &native_ns, &native_tracker, &ng),
                ("portwise", &portwise_ns, &portwise_tracker, &pg),
            ] {
                let addr =
                    SocketAddr::new(cluster_ip(&ns.get_service(&g.service).await?, false)?, 80);
                let (victim, victim_ip) = &g.pods[0];
                // Before any flip: only the data path node's pod answers.
                path.expect_answers(addr, &[victim.as_str()])
                    .await
                    .with_context(|| format!("{client}: routed before the flips"))?;
                sides.push(DpSide {
                    client,
                    ns,
                    tracker,
                    service: g.service.clone(),
                    addr,
                    victim: victim.clone(),
                    victim_ip: victim_ip.to_string(),
                    all: g.pods.iter().map(|(_, ip)| ip.to_string()).collect(),
                    gone: path.gone(),
                    from: path.probe_from(),
                });
            }
            let services = Api::<Service>::all(native_ns.client())
                .list(&Default::default())
                .await?
                .items
                .len();
            let sync_metric = |m: &Metrics, what: &str| {
                m.sum(
                    &format!("kubeproxy_sync_proxy_rules_duration_seconds_{what}"),
                    &[("ip_family", "IPv4")],
                )
            };
            let m0 = match path {
                DataPath::KubeProxy(proxy) => Some(proxy.metrics().await?),
                DataPath::Cilium(_) => None,
            };
            tokio::time::sleep(FLIP_GAP).await;
            let audit = self.bcp.audit();
            let a0 = audit.offset();
            let mut profile = Vec::new();
            let mut results: [Vec<Flip>; 2] = [Vec::new(), Vec::new()];
            for i in 0..flips {
                // unready, ready, unready, …; who goes first alternates
                // every two flips, so each goes first in both directions.
                let ready = i % 2 == 1;
                let order = if (i / 2) % 2 == 0 { [0, 1] } else { [1, 0] };
                for k in order {
                    native.check_alive()?;
                    portwise.check_alive()?;
                    let f = if k == 1 {
                        // portwise's: its reconcile too, from scrapes
                        // around the flip (outside the timed span).
                        let flip = datapath_flip(&sides[k], ready);
                        let (f, r) =
                            reconcile_of(&portwise, portwise_ns.name(), &pg.service, flip).await?;
                        profile.extend(r);
                        f
                    } else {
                        datapath_flip(&sides[k], ready).await?
                    };
                    eprintln!(
                        "bench:   {} {} flip {}/{flips} ({}): slice {}, routed {} (±{})",
                        path.name(),
                        sides[k].client,
                        i + 1,
                        if ready { "ready" } else { "unready" },
                        ms(f.slice),
                        ms(f.routed),
                        ms(f.bracket),
                    );
                    results[k].push(f);
                    tokio::time::sleep(FLIP_GAP + Duration::from_millis(fastrand::u64(0..500)))
                        .await;
                }
            }
            let req = audit.settled_between(a0).await?;
            let syncs = match (path, m0) {
                (DataPath::KubeProxy(proxy), Some(m0)) => {
                    let m1 = proxy.metrics().await?;
                    Some((
                        sync_metric(&m1, "count") - sync_metric(&m0, "count"),
                        sync_metric(&m1, "sum") - sync_metric(&m0, "sum"),
                    ))
                }
                _ => None,
            };
            Ok::<_, anyhow::Error>(FlipRun {
                results,
                requests: req,
                services,
                syncs,
                profile,
            })
        }
        .await;
        stop_portwise(&mut portwise).await;
        native.stop().await;
        drop(servers);
        res
    }
}
