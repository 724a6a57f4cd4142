//! Row 15, handovers (issue 49): what users of a sharded portwise see while
//! buckets move between replicas, and who wrote when.
//!
//! Replicas of `--shards 16` (each a ServiceAccount of its own with the
//! chart's rights, so the audit log names the writer) share namespaces of
//! one Service each: 6 pods that stay Ready and 2 whose readiness flips 20
//! times a second across the row. One watch on every slice measures each
//! flip's publication (from the request that made it) and whether a pod
//! that stayed Ready was ever missing from its Service's slices; a poll of
//! the bucket Leases every 100 ms records each bucket's holder. In order:
//! - **rebalance**: 1 → 2 → 3 → 4 replicas; each join's moves (holder
//!   changes) against ⌈S/(N+1)⌉;
//! - **crash**: `kill -9` of one of 4; its buckets' flips wait at most
//!   lease + retry (and a publication), the others' keep their latency;
//! - **exclusivity**: one replica leaves and rejoins (SIGTERM, and every
//!   fifth time `kill -9`) until ≥ `BENCH_HANDOVERS` (1000) handovers; then
//!   the audit log is judged by [`portwise_tests::exclusive::check`].
//!
//! Every join and graceful leave is a graceful move: the flips of moving
//! buckets are its publication gap.

use std::{
    collections::{BTreeMap, BTreeSet},
    num::NonZeroU32,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::{coordination::v1::Lease, discovery::v1::EndpointSlice};
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use portwise_core::shard::{Bucket, Shards};
use portwise_tests::{
    ControlPlane, MANAGED_BY_LABEL, TestNs, exclusive,
    faults::Audit,
    partition::{Replica, ring_rights},
};
use tokio::task::JoinHandle;

use crate::Bench;
use crate::knobs::env_usize;
use crate::objects::{COST_KEY, Kind, create_groups, endpoints_of, groups};
use crate::report::Goal;
use crate::stats::{ms, pct};

const MANAGER: &str = "portwise-handover";
const S: u32 = 16;
const LEASE_SECS: u64 = 3;
const LEASE: Duration = Duration::from_secs(LEASE_SECS);
/// `--lease-duration 3s` gives a retry period of 2/15 of it.
const RETRY: Duration = Duration::from_millis(400);
const PODS: usize = 8;
/// The last pods of each Service flip; the others stay Ready throughout.
const FLIPPING: usize = 2;
const FLIPS_PER_SEC: u64 = 20;
const SETTLE: Duration = Duration::from_secs(60);
/// After each join or leave, before the next: a span's flips are judged
/// by its own move (a flip in the last moments of a join, followed at once
/// by a `kill -9`, otherwise waits for that crash's takeover).
const QUIET: Duration = Duration::from_secs(2);

fn shards() -> Shards {
    Shards::new(NonZeroU32::new(S).expect("positive"))
}

/// Per namespace, per slice: its endpoints (pod, ready).
type Slices = BTreeMap<String, BTreeMap<String, Vec<(String, bool)>>>;

/// What the slice watch and the flipper share.
#[derive(Default)]
struct Seen {
    slices: Slices,
    /// Per (namespace, pod): the readiness a flip asked for, and when.
    pending: BTreeMap<(String, String), (bool, Instant)>,
    /// Published flips: namespace, when flipped, how long until published.
    published: Vec<(String, Instant, Duration)>,
    /// Pods that stay Ready, per namespace (checked once armed).
    stable: BTreeMap<String, Vec<String>>,
    armed: bool,
    /// Stable pods missing right now, and every time one went missing.
    missing_now: BTreeSet<(String, String)>,
    missing: Vec<(String, String, Instant)>,
}

impl Seen {
    /// Pods published Ready in `ns`.
    fn ready_in(&self, ns: &str) -> BTreeSet<String> {
        self.slices
            .get(ns)
            .into_iter()
            .flat_map(|s| s.values().flatten())
            .filter(|(_, r)| *r)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// After any change to `ns`'s slices: resolve its flips, and note a
    /// stable pod gone missing.
    fn changed(&mut self, ns: &str) {
        let ready = self.ready_in(ns);
        let now = Instant::now();
        let done: Vec<(String, String)> = self
            .pending
            .iter()
            .filter(|((n, p), (want, _))| n == ns && ready.contains(p) == *want)
            .map(|(k, _)| k.clone())
            .collect();
        for k in done {
            let (_, at) = self.pending.remove(&k).expect("listed above");
            self.published.push((k.0, at, now - at));
        }
        if !self.armed {
            return;
        }
        for p in self.stable.get(ns).into_iter().flatten() {
            let k = (ns.to_string(), p.clone());
            if !ready.contains(p) {
                if self.missing_now.insert(k) {
                    self.missing.push((ns.to_string(), p.clone(), now));
                }
            } else {
                self.missing_now.remove(&k);
            }
        }
    }
}

/// The endpoints of a slice as (pod, ready).
fn endpoints(s: &EndpointSlice) -> Vec<(String, bool)> {
    s.endpoints
        .iter()
        .flatten()
        .filter_map(|e| {
            let pod = e.target_ref.as_ref()?.name.clone()?;
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            Some((pod, ready))
        })
        .collect()
}

/// One watch on every slice of the row's manager, feeding `seen`.
fn watch_slices(client: kube::Client, seen: Arc<Mutex<Seen>>) -> JoinHandle<()> {
    let api: Api<EndpointSlice> = Api::all(client);
    let cfg = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}"));
    tokio::spawn(async move {
        let mut events = watcher(api, cfg).default_backoff().boxed();
        let mut relist: Option<Slices> = None;
        while let Some(ev) = events.next().await {
            let Ok(ev) = ev else { continue };
            let mut s = seen.lock().expect("seen");
            match ev {
                watcher::Event::Init => relist = Some(BTreeMap::new()),
                watcher::Event::InitApply(o) => {
                    if let Some(r) = relist.as_mut() {
                        r.entry(o.namespace().unwrap_or_default())
                            .or_default()
                            .insert(o.name_any(), endpoints(&o));
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(r) = relist.take() {
                        s.slices = r;
                        let nss: Vec<String> = s.slices.keys().cloned().collect();
                        for ns in nss {
                            s.changed(&ns);
                        }
                    }
                }
                watcher::Event::Apply(o) => {
                    let ns = o.namespace().unwrap_or_default();
                    s.slices
                        .entry(ns.clone())
                        .or_default()
                        .insert(o.name_any(), endpoints(&o));
                    s.changed(&ns);
                }
                watcher::Event::Delete(o) => {
                    let ns = o.namespace().unwrap_or_default();
                    if let Some(m) = s.slices.get_mut(&ns) {
                        m.remove(&o.name_any());
                    }
                    s.changed(&ns);
                }
            }
        }
    })
}

/// The bucket Leases' holders, polled every 100 ms.
#[derive(Default)]
struct Holders {
    now: BTreeMap<Bucket, String>,
    /// Every change of a bucket's holder (to another replica; an empty
    /// Lease between them is not a holder): when, which bucket.
    moves: Vec<(Instant, Bucket)>,
}

fn poll_holders(client: kube::Client, holders: Arc<Mutex<Holders>>) -> JoinHandle<Result<()>> {
    let api: Api<Lease> = Api::namespaced(client, "portwise-system");
    tokio::spawn(async move {
        let names: BTreeMap<String, Bucket> = (0..S)
            .map(|b| (format!("portwise-bucket-{b}"), b))
            .collect();
        loop {
            let list = api.list(&Default::default()).await?;
            let now = Instant::now();
            {
                let mut h = holders.lock().expect("holders");
                for l in list {
                    let Some(b) = names.get(&l.name_any()) else {
                        continue;
                    };
                    let holder = l
                        .spec
                        .and_then(|s| s.holder_identity)
                        .filter(|h| !h.is_empty());
                    let Some(holder) = holder else { continue };
                    if h.now.get(b).is_some_and(|old| *old != holder) {
                        h.moves.push((now, *b));
                    }
                    h.now.insert(*b, holder);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Flips a flipping pod's readiness `FLIPS_PER_SEC` times a second (one
/// pending flip per pod at most) until `stop`.
fn flipper(
    nss: Arc<Vec<TestNs>>,
    pods: Arc<Vec<Vec<String>>>,
    seen: Arc<Mutex<Seen>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> JoinHandle<Result<BTreeMap<(String, String), bool>>> {
    tokio::spawn(async move {
        // What each flipping pod was last set to (all start Ready).
        let mut want: BTreeMap<(String, String), bool> = BTreeMap::new();
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / FLIPS_PER_SEC));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while !*stop.borrow() {
            tick.tick().await;
            let i = fastrand::usize(..nss.len());
            let pod = pods[i][PODS - 1 - fastrand::usize(..FLIPPING)].clone();
            let k = (nss[i].name().to_string(), pod.clone());
            let ready = !want.get(&k).copied().unwrap_or(true);
            {
                let mut s = seen.lock().expect("seen");
                if s.pending.contains_key(&k) {
                    continue;
                }
                s.pending.insert(k.clone(), (ready, Instant::now()));
            }
            nss[i].set_ready(&pod, ready).await?;
            want.insert(k, ready);
        }
        Ok(want)
    })
}

/// How buckets moved in a [`Span`].
#[derive(Clone, Copy, PartialEq)]
enum Move {
    /// A replica joined: warm handovers to it.
    Join,
    /// A replica got SIGTERM: it drains, handing its buckets over warm.
    Drain,
    /// `kill -9`: its buckets expire and are taken over cold.
    Crash,
}

/// A span in which buckets moved.
struct Span {
    how: Move,
    from: Instant,
    to: Instant,
}

struct Row {
    cp: &'static ControlPlane,
    /// The bench's work directory: the replicas' logs stay there
    /// (`BENCH_KEEP=1`).
    work: std::path::PathBuf,
    names: Vec<String>,
    holders: Arc<Mutex<Holders>>,
    replicas: Vec<Replica>,
    spans: Vec<Span>,
}

impl Row {
    async fn start(&mut self, i: usize) -> Result<()> {
        if i < self.replicas.len() {
            self.replicas[i].proc.start_again().await?;
            self.replicas[i].proc.wait_ready().await?;
            return Ok(());
        }
        let id = format!("h{i}");
        ring_rights(self.cp, &format!("portwise-{id}")).await?;
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        let work = self.work.clone();
        // `BENCH_LOG`: the replicas' log filter, to tell why a flip was
        // slow (with `BENCH_KEEP=1`, which keeps the logs).
        let log = std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into());
        let r = Replica::start(self.cp, &id, LEASE_SECS, |l| {
            l.dir(&work)
                .namespaces(&names)
                .config(&format!(
                    "managedBy: {MANAGER}\nserviceKey: {{annotation: {COST_KEY}}}\nmembership: podReady\n"
                ))
                .args(&["--shards", &S.to_string()])
                .log_filter(&log)
                .quiet()
        })
        .await?;
        self.replicas.push(r);
        Ok(())
    }

    /// Waits until replicas `live` (`hI`) hold every bucket, balanced.
    async fn balanced(&self, live: &[usize]) -> Result<Instant> {
        let ids: BTreeSet<String> = live.iter().map(|i| format!("h{i}")).collect();
        let n = live.len() as u32;
        let (lo, hi) = (S / n, S.div_ceil(n));
        let t0 = Instant::now();
        loop {
            {
                let h = self.holders.lock().expect("holders");
                let mut per: BTreeMap<&str, u32> = BTreeMap::new();
                let mut all = h.now.len() == S as usize;
                for holder in h.now.values() {
                    // `--identity hI` gets a suffix per process start.
                    let id = holder.split('_').next().unwrap_or_default();
                    all &= ids.contains(id);
                    *per.entry(id).or_default() += 1;
                }
                if all && per.len() == ids.len() && per.values().all(|c| (lo..=hi).contains(c)) {
                    return Ok(Instant::now());
                }
            }
            if t0.elapsed() > SETTLE {
                bail!(
                    "replicas {live:?} not balanced within {SETTLE:?}: holders {:?}",
                    self.holders.lock().expect("holders").now
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn moves_since(&self, t: Instant) -> usize {
        let h = self.holders.lock().expect("holders");
        h.moves.iter().filter(|(at, _)| *at >= t).count()
    }

    /// Joins replica `i` to `live`; returns the moves it caused.
    async fn join(&mut self, i: usize, live: &[usize]) -> Result<usize> {
        let t0 = Instant::now();
        self.start(i).await?;
        let done = self.balanced(live).await?;
        self.spans.push(Span {
            how: Move::Join,
            from: t0,
            to: done,
        });
        let moved = self.moves_since(t0);
        // Before anything else moves: a flip of the span's last moments is
        // published (or not) by this move alone, not by the next one.
        tokio::time::sleep(QUIET).await;
        Ok(moved)
    }

    /// Replica `i` leaves `live` (its remaining set) by SIGTERM, or by
    /// `kill -9` when `crash`.
    async fn leave(&mut self, i: usize, live: &[usize], crash: bool) -> Result<()> {
        let t0 = Instant::now();
        if crash {
            self.replicas[i].proc.kill().await?;
        } else {
            self.replicas[i].proc.stop().await?;
        }
        let done = self.balanced(live).await?;
        self.spans.push(Span {
            how: if crash { Move::Crash } else { Move::Drain },
            from: t0,
            to: done,
        });
        tokio::time::sleep(QUIET).await;
        Ok(())
    }
}

impl Bench {
    pub(crate) async fn handovers(&mut self) -> Result<()> {
        let spaces = env_usize("BENCH_HANDOVER_NAMESPACES", 16);
        let target = env_usize("BENCH_HANDOVERS", 1000);
        eprintln!("bench: row 15 setup: {spaces} namespaces × 1 Service × {PODS} pods");
        let mut nss = Vec::new();
        let mut pods = Vec::new();
        let base = 230_000;
        for i in 0..spaces {
            let ns = TestNs::new(self.cp, "bench-handover").await?;
            if i == 0 {
                self.ensure_nodes(&ns).await?;
            }
            let gs = groups("h", 1, PODS, base + i * PODS);
            create_groups(&ns, Kind::Cost, &gs, &self.nodes, 16).await?;
            pods.push(
                gs[0]
                    .pods
                    .iter()
                    .map(|(p, _)| p.clone())
                    .collect::<Vec<_>>(),
            );
            nss.push(ns);
        }
        let names: Vec<String> = nss.iter().map(|n| n.name().to_string()).collect();
        let audit = Audit::mark(self.cp);
        let seen = Arc::new(Mutex::new(Seen::default()));
        {
            let mut s = seen.lock().expect("seen");
            for (ns, ps) in names.iter().zip(&pods) {
                s.stable.insert(ns.clone(), ps[..PODS - FLIPPING].to_vec());
            }
        }
        let holders = Arc::new(Mutex::new(Holders::default()));
        let client = self.cp.client().await?;
        let watching = watch_slices(client.clone(), seen.clone());
        let polling = poll_holders(client, holders.clone());
        let nss = Arc::new(nss);
        let mut row = Row {
            cp: self.cp,
            work: self.work.clone(),
            names: names.clone(),
            holders: holders.clone(),
            replicas: Vec::new(),
            spans: Vec::new(),
        };
        let res = async {
            row.start(0).await?;
            row.balanced(&[0]).await?;
            // Every Service published in full before anything is judged
            // (by LIST: the watch below is only armed after).
            let t = Instant::now();
            let selector = format!("{MANAGED_BY_LABEL}={MANAGER}");
            for ns in nss.iter() {
                while endpoints_of(ns, &selector).await? != PODS {
                    if t.elapsed() > SETTLE {
                        bail!(
                            "row 15: the first replica did not publish {} within {SETTLE:?}",
                            ns.name()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            // The watch has caught up with that too.
            while names
                .iter()
                .any(|ns| seen.lock().expect("seen").ready_in(ns).len() != PODS)
            {
                if t.elapsed() > SETTLE * 2 {
                    bail!("row 15: the bench's slice watch did not see every Service published");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen.lock().expect("seen").armed = true;
            let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
            let flipping = flipper(nss.clone(), Arc::new(pods.clone()), seen.clone(), stop_rx);

            // Rebalance: 1 → 4.
            let mut joins = Vec::new();
            for i in 1..4usize {
                let live: Vec<usize> = (0..=i).collect();
                let moved = row.join(i, &live).await?;
                eprintln!("bench:   join to {}: {moved} moves", i + 1);
                joins.push((i + 1, moved));
            }
            // Steady: 10 s of flips with 4 replicas and nothing moving.
            let steady_from = Instant::now();
            tokio::time::sleep(Duration::from_secs(10)).await;
            let steady_to = Instant::now();
            // Crash one of 4.
            let victim = 3;
            let dead: BTreeSet<Bucket> = holders
                .lock()
                .expect("holders")
                .now
                .iter()
                .filter(|(_, h)| h.starts_with(&format!("h{victim}_")))
                .map(|(b, _)| *b)
                .collect();
            let killed = Instant::now();
            row.leave(victim, &[0, 1, 2], true).await?;
            // The flips made up to the takeover have landed by now.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let crash_to = Instant::now();
            row.join(victim, &[0, 1, 2, 3]).await?;
            // Exclusivity: one replica leaves and rejoins until enough
            // handovers, with 2 replicas left in the ring.
            row.leave(3, &[0, 1, 2], false).await?;
            row.leave(2, &[0, 1], false).await?;
            let t0 = Instant::now();
            let mut cycles = 0usize;
            while holders.lock().expect("holders").moves.len() < target {
                if t0.elapsed() > Duration::from_secs(1800) {
                    bail!("row 15: fewer than {target} handovers within 30 min");
                }
                cycles += 1;
                row.leave(1, &[0], cycles.is_multiple_of(5)).await?;
                row.join(1, &[0, 1]).await?;
                if cycles.is_multiple_of(10) {
                    eprintln!(
                        "bench:   {cycles} cycles, {} handovers",
                        holders.lock().expect("holders").moves.len()
                    );
                }
            }
            stop_tx.send(true)?;
            let want = flipping.await.context("the flipper panicked")??;
            // Every Service ends with exactly its Ready pods.
            let t = Instant::now();
            loop {
                let wrong: Vec<String> = {
                    let s = seen.lock().expect("seen");
                    names
                        .iter()
                        .zip(&pods)
                        .filter(|(ns, ps)| {
                            let truth: BTreeSet<String> = ps
                                .iter()
                                .filter(|p| {
                                    want.get(&((*ns).clone(), (*p).clone()))
                                        .copied()
                                        .unwrap_or(true)
                                })
                                .cloned()
                                .collect();
                            s.ready_in(ns) != truth
                        })
                        .map(|(ns, _)| ns.clone())
                        .collect()
                };
                if wrong.is_empty() {
                    break;
                }
                if t.elapsed() > SETTLE {
                    bail!("row 15: slices of {wrong:?} are not their Ready pods at the end");
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok((
                joins,
                steady_from,
                steady_to,
                dead,
                killed,
                crash_to,
                cycles,
            ))
        }
        .await;
        for r in &mut row.replicas {
            let _ = r.proc.stop().await;
        }
        watching.abort();
        polling.abort();
        let users: BTreeSet<String> = row.replicas.iter().map(|r| r.user.clone()).collect();
        let (joins, steady_from, steady_to, dead, killed, crash_to, cycles) = res?;
        // The audit log is written after each response: let the last land.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let events = audit.events()?;
        let judged = exclusive::check(
            &events,
            shards(),
            LEASE,
            |b| format!("portwise-bucket-{b}"),
            |u| users.contains(u),
        );

        // Each flip's publication by the apiserver's clock alone: from the
        // flip's request to the first slice write of its namespace received
        // after it. (The bench's own watch sees the same writes, but a
        // watch of its own on two busy cores can lag; this cannot.)
        let (anchor_i, anchor_t) = (Instant::now(), k8s_openapi::jiff::Timestamp::now());
        let at = |t: k8s_openapi::jiff::Timestamp| -> Instant {
            let ago = Duration::try_from(anchor_t.duration_since(t)).unwrap_or_default();
            anchor_i.checked_sub(ago).unwrap_or(anchor_i)
        };
        let ok = |e: &&portwise_tests::faults::AuditEvent| {
            e.code.is_some_and(|c| (200..300).contains(&c))
        };
        let row_ns: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        let mut writes: BTreeMap<&str, Vec<k8s_openapi::jiff::Timestamp>> = BTreeMap::new();
        for e in events.iter().filter(ok) {
            if e.resource == "endpointslices" && e.is_write() && users.contains(&e.user) {
                writes.entry(&e.namespace).or_default().extend(e.received);
            }
        }
        for w in writes.values_mut() {
            w.sort();
        }
        let mut published: Vec<(String, Instant, Duration)> = Vec::new();
        // Per flip (namespace, when): the pod and the apiserver's time, for
        // the slow ones' lines.
        let mut flipped: BTreeMap<(String, Instant), (String, k8s_openapi::jiff::Timestamp)> =
            BTreeMap::new();
        let mut unpublished = 0usize;
        for e in events.iter().filter(ok) {
            if e.resource != "pods"
                || e.subresource != "status"
                || e.verb != "patch"
                || users.contains(&e.user)
                || !row_ns.contains(e.namespace.as_str())
            {
                continue;
            }
            let Some(t) = e.received else { continue };
            let next = writes
                .get(e.namespace.as_str())
                .and_then(|w| w.get(w.partition_point(|x| *x < t)));
            match next {
                Some(w) => {
                    published.push((
                        e.namespace.clone(),
                        at(t),
                        Duration::try_from(w.duration_since(t)).unwrap_or_default(),
                    ));
                    flipped.insert((e.namespace.clone(), at(t)), (e.name.clone(), t));
                }
                None => unpublished += 1,
            }
        }
        let s = seen.lock().expect("seen");
        let watched_worst = s
            .published
            .iter()
            .map(|(_, _, d)| d.as_secs_f64())
            .fold(0.0, f64::max);
        let h = holders.lock().expect("holders");
        let bucket_of = |ns: &str| shards().bucket(ns);
        // Buckets that moved within a span, and the flips of theirs made in it.
        let in_span = |sp: &Span| -> Vec<f64> {
            let moved: BTreeSet<Bucket> = h
                .moves
                .iter()
                .filter(|(at, _)| *at >= sp.from && *at <= sp.to)
                .map(|(_, b)| *b)
                .collect();
            let gaps: Vec<(f64, &String, Instant)> = published
                .iter()
                .filter(|(ns, at, _)| {
                    *at >= sp.from && *at <= sp.to && moved.contains(&bucket_of(ns))
                })
                .map(|(ns, at, d)| (d.as_secs_f64(), ns, *at))
                .collect();
            // The slow ones, with the moves of their bucket, to tell why.
            for (d, ns, at) in gaps.iter().filter(|(d, _, _)| *d > 1.0) {
                let b = bucket_of(ns);
                let moves: Vec<String> = h
                    .moves
                    .iter()
                    .filter(|(m, mb)| {
                        *mb == b && *m >= sp.from && *m <= sp.to + Duration::from_secs(5)
                    })
                    .map(|(m, _)| format!("{:+.2}s", m.duration_since(*at).as_secs_f64()))
                    .collect();
                let (pod, when) = flipped
                    .get(&((*ns).clone(), *at))
                    .map(|(p, t)| (p.as_str(), t.to_string()))
                    .unwrap_or(("?", String::new()));
                eprintln!(
                    "bench:   slow flip of {ns}/{pod} at {when} in bucket {b}: {d:.2}s, {:.2}s into a {} span of {:.2}s; the bucket moved at {moves:?} from the flip",
                    at.duration_since(sp.from).as_secs_f64(),
                    match sp.how {
                        Move::Join => "join",
                        Move::Drain => "drain",
                        Move::Crash => "crash",
                    },
                    sp.to.duration_since(sp.from).as_secs_f64()
                );
            }
            gaps.into_iter().map(|(d, _, _)| d).collect()
        };
        let of = |how: Move| -> Vec<f64> {
            row.spans
                .iter()
                .filter(|sp| sp.how == how)
                .flat_map(in_span)
                .collect()
        };
        let (joins_gap, drains_gap) = (of(Move::Join), of(Move::Drain));
        let steady: Vec<f64> = published
            .iter()
            .filter(|(_, at, _)| *at >= steady_from && *at <= steady_to)
            .map(|(_, _, d)| d.as_secs_f64())
            .collect();
        let (crash_dead, crash_other): (Vec<_>, Vec<_>) = published
            .iter()
            .filter(|(_, at, _)| *at >= killed && *at <= crash_to)
            .partition(|(ns, _, _)| dead.contains(&bucket_of(ns)));
        let crash_dead: Vec<f64> = crash_dead.iter().map(|(_, _, d)| d.as_secs_f64()).collect();
        let crash_other: Vec<f64> = crash_other
            .iter()
            .map(|(_, _, d)| d.as_secs_f64())
            .collect();
        let flips = published.len() + unpublished;
        let missing = s.missing.len();
        let handovers = h.moves.len();
        drop((s, h));
        drop(nss);

        self.protocol.push(format!(
            "- Row 15 (handovers): {spaces} namespaces `bench-handover-*`, each one Service of {PODS} Ready pods, {FLIPPING} of which flip readiness ({FLIPS_PER_SEC} flips a second across the row, one pending per pod); replicas of `--shards {S} --lease-duration {LEASE_SECS}s` (retry {} ms), each a ServiceAccount with the chart's rights behind a route of its own. Each flip's publication is timed by the audit log alone, from the flip's request to the first slice write of its namespace received after it; a watch on every slice notes any pod that stayed Ready missing from its Service's slices; the bucket Leases are polled every 100 ms for their holders (a move: a bucket's holder becomes another replica). Joins 1 → 4, 10 s steady, `kill -9` of one of 4, then one of 2 replicas leaves (SIGTERM; every fifth time `kill -9`) and rejoins until {target} moves, 2 s quiet after each join and leave; {cycles} cycles. A flip counts for a graceful move when it was made between the start of a join or SIGTERM and the balance after it, in a bucket that moved meanwhile. The audit log (Metadata, apiserver timestamps) is then judged: every successful slice or Endpoints write of a replica within its term of its namespace's bucket.",
            RETRY.as_millis()
        ));
        let label = format!("15 handovers (S={S}, lease {LEASE_SECS} s)");
        let r = &mut self.report;
        let bounds: Vec<String> = joins
            .iter()
            .map(|(n, m)| format!("{n}: {m} (≤ {})", S.div_ceil(*n as u32)))
            .collect();
        r.row(
            &label,
            "rebalance: buckets moved by each join N → N+1 (bound ⌈S/(N+1)⌉)",
            bounds.join(", "),
            "n/a".into(),
            None,
            Goal::Stated(
                "≤ ⌈S/(N+1)⌉",
                joins
                    .iter()
                    .all(|(n, m)| *m <= S.div_ceil(*n as u32) as usize),
            ),
        );
        r.row(
            &label,
            "a pod that stayed Ready missing from its Service's slices, over the whole row (joins, drains, crashes)",
            format!("{missing} times"),
            "n/a".into(),
            None,
            Goal::Stated("0", missing == 0),
        );
        for (what, gap) in [
            ("a replica joins", &joins_gap),
            ("a replica gets SIGTERM and drains", &drains_gap),
        ] {
            let worst = gap.iter().copied().fold(0.0, f64::max);
            r.row(
                &label,
                &format!(
                    "graceful moves, {what}: publication of a moving bucket's flip, p50 / p99 / worst of {} (steady p99 {})",
                    gap.len(),
                    ms(pct(&steady, 0.99) * 1000.0)
                ),
                format!(
                    "{} / {} / {}",
                    ms(pct(gap, 0.5) * 1000.0),
                    ms(pct(gap, 0.99) * 1000.0),
                    ms(worst * 1000.0)
                ),
                "n/a".into(),
                None,
                Goal::Stated("gap ≤ 2 s", !gap.is_empty() && worst <= 2.0),
            );
        }
        let bound = (LEASE + RETRY + Duration::from_secs(1)).as_secs_f64();
        let worst_dead = crash_dead.iter().copied().fold(0.0, f64::max);
        r.row(
            &label,
            &format!(
                "crash (kill -9 of 1 of 4): its {} buckets' flips, worst of {}",
                dead.len(),
                crash_dead.len()
            ),
            ms(worst_dead * 1000.0),
            "n/a".into(),
            None,
            Goal::Stated(
                "≤ lease + retry + 1 s",
                !crash_dead.is_empty() && worst_dead <= bound,
            ),
        );
        let (p_other, p_steady) = (pct(&crash_other, 0.99), pct(&steady, 0.99));
        r.row(
            &label,
            &format!(
                "crash: every other bucket's flips, p99 of {} (portwise column) ÷ the steady p99 of {} before it",
                crash_other.len(),
                steady.len()
            ),
            ms(p_other * 1000.0),
            ms(p_steady * 1000.0),
            crate::stats::ratio(p_other, p_steady),
            Goal::Stated(
                "≤ 1.25× or within 50 ms",
                p_other <= p_steady * 1.25 || p_other - p_steady <= 0.05,
            ),
        );
        let (text, met) = match &judged {
            Ok(t) => (
                format!(
                    "0 of {} writes ({} refused) over {} handovers",
                    t.writes, t.refused, t.handovers
                ),
                t.handovers >= 1000 && t.writes > 0,
            ),
            Err(e) => (format!("violation: {e:#}"), false),
        };
        r.row(
            &label,
            &format!(
                "exclusivity: slice or Endpoints writes outside the writer's term (audit log; {flips} flips, {unpublished} unpublished at the end)"
            ),
            text,
            "n/a".into(),
            None,
            Goal::Stated("0 over ≥ 1,000 handovers", met),
        );
        eprintln!(
            "bench:   {handovers} moves polled; joins {}, drains {}; crash {} / {}; the bench's own watch saw its slowest flip after {watched_worst:.2}s",
            joins_gap.len(),
            drains_gap.len(),
            crash_dead.len(),
            crash_other.len()
        );
        Ok(())
    }
}
