//! `tests/load`: the long load run of the reliability suite (issue 7,
//! item 4; docs/reliability.md). Not part of `./test`.
//!
//! 10,000 pods over 1,000 Services (two ports each), readiness flapping at
//! 100 changes per second for 5 minutes, against the release `portwise`
//! binary on a local control plane. At the end the slices must equal what
//! the pods say, exactly; the run reports portwise's peak RSS and CPU, the
//! lag from a pod's status patch to the slices showing it (p50/p99), and
//! the slice writes it cost.
//!
//! Lag: every readiness flip is timestamped when the apiserver acknowledges
//! the status patch; a watch on portwise's slices marks it published when
//! every port of the pod's Service shows the pod in (or out) as flipped. A
//! pod is not flipped again before its last flip was published, so every
//! flip is measured on its own.
//!
//! Knobs (environment): LOAD_PODS (10000), LOAD_SERVICES (1000), LOAD_RATE
//! (changes/s, 100), LOAD_SECS (300), LOAD_CONCURRENCY (requests in flight
//! for setup and flapping, 48), LOAD_PORTWISE_ARGS (extra `portwise run`
//! flags, e.g. `--reconcile-concurrency 32`), LOAD_OUT (also write the
//! report there).
//! Exit status 1 when the final state does not match.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    process::ExitCode,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{core::v1::Pod, discovery::v1::EndpointSlice};
use kube::{
    Api,
    api::ListParams,
    runtime::{WatchStreamExt, watcher},
};
use portwise_tests::{
    ControlPlane, GROUP_KEY, MANAGED_BY_LABEL, Portwise, SERVICE_NAME_LABEL, TestNs,
    faults::{Audit, proc_cpu_time},
    next_ips, pod, service,
};
use tokio::sync::Semaphore;

const PORTS: [&str; 2] = ["http", "admin"];

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn svc_name(s: usize) -> String {
    format!("s{s:04}")
}

fn pod_name(s: usize, p: usize) -> String {
    format!("s{s:04}-p{p:02}")
}

/// The Service a pod belongs to (`s0042-p03` -> `s0042`).
fn svc_of(pod: &str) -> &str {
    pod.split_once('-').map_or(pod, |(s, _)| s)
}

/// Slice name -> (Service, port, member pods).
type SliceMembers = HashMap<String, (String, String, BTreeSet<String>)>;

#[derive(Default)]
struct State {
    /// The readiness each pod was last patched to.
    desired: HashMap<String, bool>,
    /// Flips not yet seen in the slices: pod -> (acknowledged at, ready,
    /// sent at).
    pending: HashMap<String, (Option<Instant>, bool, Instant)>,
    /// Pods with a patch in flight (not flipped again until it returns).
    in_flight: BTreeSet<String>,
    /// Slice name -> (Service, port, member pods).
    slices: SliceMembers,
    /// (flip sent at, pod, lag) of every flip seen in the slices.
    lags: Vec<(Instant, String, Duration)>,
    sent: u64,
    failed: u64,
    /// The driver's own slice watch: relists and errors.
    relists: u64,
    watch_errors: u64,
}

impl State {
    fn published(&self, svc: &str, port: &str, pod: &str) -> bool {
        self.slices
            .values()
            .any(|(s, p, members)| s == svc && p == port && members.contains(pod))
    }

    /// After a slice of `svc` changed: flips of its pods now visible on
    /// every port are done.
    fn settle(&mut self, svc: &str, now: Instant) {
        let candidates: Vec<String> = self
            .pending
            .keys()
            .filter(|p| svc_of(p) == svc)
            .cloned()
            .collect();
        for pod in candidates {
            let (acked, ready, sent) = self.pending[&pod];
            if PORTS
                .iter()
                .all(|port| self.published(svc, port, &pod) == ready)
            {
                self.pending.remove(&pod);
                let lag = acked.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                self.lags.push((sent, pod, lag));
            }
        }
    }
}

fn slice_key(s: &EndpointSlice) -> Option<(String, String, String, BTreeSet<String>)> {
    let name = s.metadata.name.clone()?;
    let svc = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
    let port = s.ports.as_ref()?.first()?.name.clone()?;
    let members = s
        .endpoints
        .iter()
        .flatten()
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect();
    Some((name, svc, port, members))
}

/// The 1-minute load average.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// (Service, port) -> Ready pods, from the pods themselves.
async fn truth(ns: &TestNs) -> Result<BTreeMap<(String, String), BTreeSet<String>>> {
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?.items;
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for p in pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let svc = svc_of(&name).to_string();
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        for port in PORTS {
            let set = out.entry((svc.clone(), port.to_string())).or_default();
            if ready {
                set.insert(name.clone());
            }
        }
    }
    Ok(out)
}

/// (Service, port) -> published pods, from a fresh list of the slices;
/// also fails on a pod published twice for one (Service, port).
async fn published(ns: &TestNs) -> Result<BTreeMap<(String, String), BTreeSet<String>>> {
    let lp = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}=portwise"));
    let slices = ns.api::<EndpointSlice>().list(&lp).await?.items;
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for s in &slices {
        let Some((name, svc, port, members)) = slice_key(s) else {
            continue;
        };
        let set = out.entry((svc, port)).or_default();
        for m in members {
            if !set.insert(m.clone()) {
                bail!("{m} published twice (slice {name})");
            }
        }
    }
    Ok(out)
}

async fn mismatch(ns: &TestNs) -> Result<Option<String>> {
    let (want, got) = (truth(ns).await?, published(ns).await?);
    if want == got {
        return Ok(None);
    }
    let wrong: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(*v))
        .take(5)
        .map(|(k, v)| format!("{k:?}: want {v:?}, got {:?}", got.get(k)))
        .collect();
    Ok(Some(format!(
        "{} of {} (Service, port) pairs differ, e.g. {wrong:#?}",
        want.iter().filter(|(k, v)| got.get(*k) != Some(*v)).count(),
        want.len()
    )))
}

async fn wait_converged(ns: &TestNs, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        match mismatch(ns).await? {
            None => return Ok(start.elapsed()),
            Some(why) if start.elapsed() > within => {
                bail!("not converged after {within:?}: {why}")
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("load: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool> {
    let pods_n = knob("LOAD_PODS", 10_000) as usize;
    let svcs_n = knob("LOAD_SERVICES", 1_000) as usize;
    let rate = knob("LOAD_RATE", 100);
    let secs = knob("LOAD_SECS", 300);
    let conc = knob("LOAD_CONCURRENCY", 48) as usize;
    let per_svc = pods_n.div_ceil(svcs_n);
    let say = |s: String| eprintln!("load: {s}");

    let cp = ControlPlane::shared().await?;
    let ns = Arc::new(TestNs::new(cp, "load").await?);
    say(format!(
        "{pods_n} pods over {svcs_n} Services ({} ports each) in {}",
        PORTS.len(),
        ns.name()
    ));

    let setup = Instant::now();
    stream::iter(0..svcs_n)
        .map(|s| {
            let ns = ns.clone();
            async move {
                let mut b = service(&svc_name(s)).annotation(GROUP_KEY, &svc_name(s));
                for (i, port) in PORTS.iter().enumerate() {
                    b = b.port(port, 8080 + i as i32);
                }
                ns.create_service(b).await
            }
        })
        .buffer_unordered(conc)
        .try_collect::<Vec<_>>()
        .await?;
    let names: Vec<String> = (0..pods_n)
        .map(|i| pod_name(i / per_svc, i % per_svc))
        .collect();
    let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    stream::iter(names.clone())
        .map(|name| {
            let (ns, created) = (ns.clone(), created.clone());
            async move {
                let svc = svc_of(&name).to_string();
                ns.create_pod(pod(&name).annotation(GROUP_KEY, &svc).ips(next_ips().v4()))
                    .await?;
                let n = created.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if n % 1000 == 0 {
                    eprintln!("load: {n} pods");
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(conc)
        .try_collect::<Vec<_>>()
        .await?;
    let setup_took = setup.elapsed();
    say(format!("setup: {setup_took:?}"));

    let state = Arc::new(Mutex::new(State::default()));
    {
        let mut st = state.lock().unwrap();
        for n in &names {
            st.desired.insert(n.clone(), true);
        }
    }
    // The slice watch that timestamps publication.
    let watch = {
        let state = state.clone();
        let api: Api<EndpointSlice> = ns.api();
        let cfg = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}=portwise"));
        tokio::spawn(async move {
            let mut events = watcher(api, cfg).default_backoff().boxed();
            // A relist (after a 410) is applied as a whole at its end, so
            // that a half-read list never settles a flip.
            let mut relist: Option<SliceMembers> = None;
            while let Some(ev) = events.next().await {
                let now = Instant::now();
                let mut st = state.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Init) => relist = Some(HashMap::new()),
                    Ok(watcher::Event::InitApply(s)) => {
                        if let Some((name, svc, port, members)) = slice_key(&s) {
                            relist
                                .get_or_insert_with(HashMap::new)
                                .insert(name, (svc, port, members));
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        st.slices = relist.take().unwrap_or_default();
                        st.relists += 1;
                        let svcs: BTreeSet<String> =
                            st.slices.values().map(|(s, ..)| s.clone()).collect();
                        for svc in svcs {
                            st.settle(&svc, now);
                        }
                    }
                    Ok(watcher::Event::Apply(s)) => {
                        if let Some((name, svc, port, members)) = slice_key(&s) {
                            st.slices.insert(name, (svc.clone(), port, members));
                            st.settle(&svc, now);
                        }
                    }
                    Ok(watcher::Event::Delete(s)) => {
                        if let Some((name, svc, ..)) = slice_key(&s) {
                            st.slices.remove(&name);
                            st.settle(&svc, now);
                        }
                    }
                    Err(_) => st.watch_errors += 1,
                }
            }
        })
    };

    let config = format!(
        "managedBy: portwise\nserviceKey: {{annotation: {GROUP_KEY}}}\nmembership: podReady\n"
    );
    let extra = std::env::var("LOAD_PORTWISE_ARGS").unwrap_or_default();
    let extra: Vec<&str> = extra.split_whitespace().collect();
    let mut pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&config)
        .binary()
        .args(&extra)
        .start()
        .await?;
    let pid = pw.pid().context("portwise pid")?;
    let started = Instant::now();
    let cold = wait_converged(&ns, Duration::from_secs(600)).await?;
    let (rss_cold, _) = pw.memory_kib()?;
    let cpu_cold = pw.cpu_time()?;
    say(format!(
        "cold sync: every slice right {cold:?} after start; RSS {} MiB, CPU {cpu_cold:?}",
        rss_cold / 1024
    ));

    // Flapping.
    let audit = Audit::mark(cp);
    let cpu_before = pw.cpu_time()?;
    // The apiserver (etcd is embedded in it), for context.
    let apiserver_pid: Option<u32> = std::fs::read_to_string(cp.dir().join("apiserver.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok());
    let api_cpu_before = apiserver_pid.and_then(|p| proc_cpu_time(p).ok());
    let load_before = loadavg();
    let sem = Arc::new(Semaphore::new(conc));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let flap_start = Instant::now();
    let deadline = flap_start + Duration::from_secs(secs);
    let mut samples: Vec<(Duration, u64, Duration)> = Vec::new();
    let mut last_sample = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut rng = fastrand::Rng::with_seed(7);
    while Instant::now() < deadline {
        tick.tick().await;
        // A pod whose last flip is still on its way is left alone, so that
        // every flip is measured on its own.
        let pick = loop {
            let n = &names[rng.usize(..names.len())];
            let st = state.lock().unwrap();
            if !st.in_flight.contains(n) && !st.pending.contains_key(n) {
                break n.clone();
            }
        };
        let ready = {
            let mut st = state.lock().unwrap();
            let ready = !st.desired[&pick];
            st.desired.insert(pick.clone(), ready);
            st.in_flight.insert(pick.clone());
            st.pending
                .insert(pick.clone(), (None, ready, Instant::now()));
            st.sent += 1;
            ready
        };
        let permit = sem.clone().acquire_owned().await?;
        let (task_ns, task_state) = (ns.clone(), state.clone());
        tasks.spawn(async move {
            let res = task_ns.set_ready(&pick, ready).await;
            let now = Instant::now();
            let mut st = task_state.lock().unwrap();
            st.in_flight.remove(&pick);
            match res {
                Ok(_) => {
                    if let Some(p) = st.pending.get_mut(&pick)
                        && p.1 == ready
                        && p.0.is_none()
                    {
                        p.0 = Some(now);
                    }
                }
                Err(_) => {
                    // Unknown whether it landed: stop tracking this flip.
                    st.failed += 1;
                    st.pending.remove(&pick);
                }
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
        if last_sample.elapsed() >= Duration::from_secs(1) {
            last_sample = Instant::now();
            if let (Ok((rss, _)), Ok(cpu)) = (pw.memory_kib(), pw.cpu_time()) {
                samples.push((flap_start.elapsed(), rss, cpu));
            }
            let t = flap_start.elapsed().as_secs();
            if t.is_multiple_of(30) {
                let st = state.lock().unwrap();
                eprintln!(
                    "load: {t}s: {} flips sent, {} published, {} pending",
                    st.sent,
                    st.lags.len(),
                    st.pending.len()
                );
                // Are the oldest pending flips missing from the apiserver, or
                // only from this driver's watch?
                let mut oldest: Vec<(Instant, String, bool)> = st
                    .pending
                    .iter()
                    .map(|(p, (_, ready, sent))| (*sent, p.clone(), *ready))
                    .collect();
                oldest.sort();
                oldest.truncate(10);
                drop(st);
                let ns = ns.clone();
                tokio::spawn(async move {
                    let (mut stored, mut missing, mut ages) = (0, 0, Vec::new());
                    for (sent, pod, ready) in oldest {
                        let svc = svc_of(&pod).to_string();
                        let lp = ListParams::default().labels(&format!(
                            "{SERVICE_NAME_LABEL}={svc},{MANAGED_BY_LABEL}=portwise"
                        ));
                        let Ok(list) = ns.api::<EndpointSlice>().list(&lp).await else {
                            continue;
                        };
                        let shown = PORTS.iter().all(|port| {
                            list.items.iter().any(|sl| {
                                slice_key(sl)
                                    .is_some_and(|(_, _, p, m)| p == *port && m.contains(&pod))
                            }) == ready
                        });
                        ages.push(sent.elapsed().as_secs());
                        if shown { stored += 1 } else { missing += 1 }
                    }
                    eprintln!(
                        "load: {t}s: of the oldest pending flips (ages {ages:?} s), {stored} are \
                         already in the apiserver's slices, {missing} not yet"
                    );
                });
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    let flap_took = flap_start.elapsed();
    let drain = wait_converged(&ns, Duration::from_secs(300)).await;
    let cpu_after = pw.cpu_time()?;
    let api_cpu = match (apiserver_pid, api_cpu_before) {
        (Some(p), Some(before)) => proc_cpu_time(p).ok().map(|a| a.saturating_sub(before)),
        _ => None,
    };
    let load_after = loadavg();
    let (_, rss_peak) = pw.memory_kib()?;
    // Let the watch catch up with the final state before reading lags.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    pw.check_running()?;
    let portwise_writes = audit
        .events()?
        .iter()
        .filter(|e| {
            e.resource == "endpointslices" && e.is_write() && e.user_agent.starts_with("portwise")
        })
        .count();

    let st = state.lock().unwrap();
    let mut lags: Vec<Duration> = st.lags.iter().map(|(_, _, l)| *l).collect();
    lags.sort();
    // Lag by minute of the run, and the slow tail by Service.
    let mut by_minute: BTreeMap<u64, Vec<Duration>> = BTreeMap::new();
    for (sent, _, lag) in &st.lags {
        by_minute
            .entry(sent.saturating_duration_since(flap_start).as_secs() / 60)
            .or_default()
            .push(*lag);
    }
    let minutes: Vec<String> = by_minute
        .iter_mut()
        .map(|(m, v)| {
            v.sort();
            format!(
                "min {m}: p50 {} / p99 {} ms",
                percentile(v, 0.5).as_millis(),
                percentile(v, 0.99).as_millis()
            )
        })
        .collect();
    let slow: Vec<&(Instant, String, Duration)> = st
        .lags
        .iter()
        .filter(|(_, _, l)| *l > Duration::from_secs(30))
        .collect();
    let slow_services: BTreeSet<&str> = slow.iter().map(|(_, p, _)| svc_of(p)).collect();
    let achieved = st.sent as f64 / flap_took.as_secs_f64();
    let cpu_flap = cpu_after.saturating_sub(cpu_before);
    let busiest = samples
        .windows(2)
        .map(|w| {
            (w[1].2.saturating_sub(w[0].2)).as_secs_f64()
                / (w[1].0.saturating_sub(w[0].0)).as_secs_f64().max(1e-3)
        })
        .fold(0.0f64, f64::max);
    let matched = drain.is_ok();
    let report = format!(
        "| | |\n|---|---|\n\
         | pods / Services / ports per Service | {pods_n} / {svcs_n} / {ports} |\n\
         | setup (create Services and pods, set status) | {setup:.0?} |\n\
         | cold sync (portwise start → every slice right) | {cold:.1?} |\n\
         | flapping | {sent} readiness flips in {flap:.0?} ({achieved:.1}/s; asked {rate}/s), {failed} patches failed |\n\
         | final state equals the pods' state | {verdict} |\n\
         | converged after the last flip | {drain_s} |\n\
         | lag flip → slices, p50 / p90 / p99 / max | {p50} / {p90} / {p99} / {max} ms ({measured} flips measured) |\n\
         | portwise peak RSS (VmHWM) | {hwm} MiB (after cold sync: {rss_cold} MiB) |\n\
         | portwise CPU while flapping | {cpu:.1?} in {flap:.0?} = {cores:.2} cores on average; busiest second {busiest:.2} cores |\n\
         | portwise slice writes while flapping | {portwise_writes} ({per_flip:.2} per flip) |\n\
         | apiserver + etcd CPU while flapping | {api} |\n\
         | machine load average (1 min) at start / end of flapping | {load_before} / {load_after} |\n\
         | lag by minute of the run | {minutes} |\n\
         | flips slower than 30s | {slow} flips in {slow_services} Services |\n\
         | the driver's slice watch | {relists} lists, {watch_errors} errors |\n\
         | extra portwise flags | {flags} |\n",
        ports = PORTS.len(),
        setup = setup_took,
        sent = st.sent,
        flap = flap_took,
        failed = st.failed,
        verdict = if matched { "yes" } else { "**NO**" },
        drain_s = match &drain {
            Ok(d) => format!("{d:.1?}"),
            Err(e) => format!("{e:#}"),
        },
        p50 = percentile(&lags, 0.50).as_millis(),
        p90 = percentile(&lags, 0.90).as_millis(),
        p99 = percentile(&lags, 0.99).as_millis(),
        max = lags.last().copied().unwrap_or_default().as_millis(),
        measured = lags.len(),
        hwm = rss_peak / 1024,
        rss_cold = rss_cold / 1024,
        cpu = cpu_flap,
        cores = cpu_flap.as_secs_f64() / flap_took.as_secs_f64(),
        per_flip = portwise_writes as f64 / st.sent.max(1) as f64,
        api = api_cpu.map_or("not measured".to_string(), |c| format!(
            "{c:.1?} = {:.2} cores on average",
            c.as_secs_f64() / flap_took.as_secs_f64()
        )),
        minutes = minutes.join("; "),
        relists = st.relists,
        watch_errors = st.watch_errors,
        slow = slow.len(),
        slow_services = slow_services.len(),
        flags = if extra.is_empty() {
            "none".to_string()
        } else {
            extra.join(" ")
        },
    );
    println!("{report}");
    if let Ok(out) = std::env::var("LOAD_OUT") {
        std::fs::write(&out, &report).with_context(|| format!("writing {out}"))?;
    }
    say(format!("portwise pid {pid}, ran {:?}", started.elapsed()));
    Ok(matched)
}
