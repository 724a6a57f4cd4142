//! Row 11, rollout: `kubectl rollout restart` of a Deployment of real
//! pods on a real node (tests/node), until each controller's slices hold
//! exactly the new pods as ready.

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};
use portwise_tests::{GROUP_KEY, Portwise};

use crate::Bench;
use crate::knobs::{env_usize, repo_root};
use crate::objects::portwise_config;
use crate::process::{release_bin, stop_portwise};
use crate::report::Goal;
use crate::stats::{median_of, ratio};

/// The real node of row 11 (tests/node/start), stopped on drop; one per
/// machine at a time (the lock tests/node/run-suite takes).
pub(crate) struct StartedNode {
    pub(crate) dir: PathBuf,
    pub(crate) _lock: std::fs::File,
}

impl StartedNode {
    pub(crate) fn start(dir: &Path) -> Result<Self> {
        let cache = std::env::var_os("PORTWISE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/portwise")
            });
        let lock = std::fs::File::create(cache.join("node.lock"))?;
        use std::os::fd::AsRawFd as _;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                cache.join("node.lock").display(),
                std::io::Error::last_os_error()
            );
        }
        let status = std::process::Command::new(repo_root().join("tests/node/start"))
            .arg(dir)
            .stdin(Stdio::null())
            .status()?;
        let node = StartedNode {
            dir: dir.to_path_buf(),
            _lock: lock,
        };
        if !status.success() {
            bail!("tests/node/start {} failed ({status})", dir.display());
        }
        Ok(node)
    }
}

impl Drop for StartedNode {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo_root().join("tests/node/stop"))
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
    }
}

/// Row 11's watches: every slice version and pod readiness, when it arrived.
pub(crate) struct RolloutLog {
    pub(crate) events: Arc<std::sync::Mutex<Vec<(Instant, RolloutEvent)>>>,
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Clone, Debug)]
pub(crate) enum RolloutEvent {
    /// A slice of `service` now lists these ready pods (None: deleted).
    Slice {
        name: String,
        service: String,
        ready: Option<BTreeSet<String>>,
    },
    /// A pod's Ready condition.
    Pod { name: String, ready: bool },
}

impl RolloutLog {
    pub(crate) fn start(client: kube::Client, ns: &str) -> Self {
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, ns);
        let sink = events.clone();
        let slice_task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(slices, watcher::Config::default()));
            while let Some(Ok(ev)) = stream.next().await {
                let (s, gone) = match ev {
                    watcher::Event::Apply(s) | watcher::Event::InitApply(s) => (s, false),
                    watcher::Event::Delete(s) => (s, true),
                    _ => continue,
                };
                let service = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .cloned()
                    .unwrap_or_default();
                let ready = (!gone).then(|| {
                    s.endpoints
                        .iter()
                        .flatten()
                        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                        .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
                        .collect()
                });
                let name = s.metadata.name.unwrap_or_default();
                sink.lock().expect("log").push((
                    Instant::now(),
                    RolloutEvent::Slice {
                        name,
                        service,
                        ready,
                    },
                ));
            }
        });
        let sink = events.clone();
        let pod_task = tokio::spawn(async move {
            let mut stream =
                std::pin::pin!(watcher(pods, watcher::Config::default()).applied_objects());
            while let Some(Ok(p)) = stream.next().await {
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let name = p.metadata.name.unwrap_or_default();
                sink.lock()
                    .expect("log")
                    .push((Instant::now(), RolloutEvent::Pod { name, ready }));
            }
        });
        RolloutLog {
            events,
            tasks: vec![slice_task, pod_task],
        }
    }

    /// From `t0` on: when the last of `new` pods was first seen Ready, and
    /// when each of `services` first had exactly `new` as its ready pods.
    pub(crate) fn replay(
        &self,
        t0: Instant,
        new: &BTreeSet<String>,
        services: &[&str; 2],
    ) -> (Option<Instant>, [Option<Instant>; 2]) {
        let events = self.events.lock().expect("log").clone();
        let mut slices: HashMap<String, (String, BTreeSet<String>)> = HashMap::new();
        let mut first_ready: HashMap<&String, Instant> = HashMap::new();
        let mut done = [None, None];
        for (at, ev) in &events {
            match ev {
                RolloutEvent::Slice {
                    name,
                    service,
                    ready,
                } => {
                    match ready {
                        Some(r) => slices.insert(name.clone(), (service.clone(), r.clone())),
                        None => slices.remove(name),
                    };
                    if *at < t0 {
                        continue;
                    }
                    for (i, svc) in services.iter().enumerate() {
                        if done[i].is_some() {
                            continue;
                        }
                        let union: BTreeSet<String> = slices
                            .values()
                            .filter(|(s, _)| s == svc)
                            .flat_map(|(_, r)| r.iter().cloned())
                            .collect();
                        if &union == new {
                            done[i] = Some(*at);
                        }
                    }
                }
                RolloutEvent::Pod { name, ready } => {
                    if *at >= t0
                        && *ready
                        && let Some(n) = new.get(name)
                    {
                        first_ready.entry(n).or_insert(*at);
                    }
                }
            }
        }
        let last = (first_ready.len() == new.len())
            .then(|| first_ready.values().max().copied())
            .flatten();
        (last, done)
    }
}

impl Drop for RolloutLog {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The ready endpoints' pods of each Service in `ns`, by Service name.
pub(crate) async fn ready_pods_by_service(
    slices: &Api<EndpointSlice>,
) -> Result<HashMap<String, BTreeSet<String>>> {
    let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
    for s in slices.list(&kube::api::ListParams::default()).await?.items {
        let Some(svc) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .cloned()
        else {
            continue;
        };
        let set = out.entry(svc).or_default();
        for e in s.endpoints.iter().flatten() {
            if e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
                && let Some(pod) = e.target_ref.as_ref().and_then(|r| r.name.clone())
            {
                set.insert(pod);
            }
        }
    }
    Ok(out)
}

impl Bench {
    /// Row 11: `kubectl rollout restart` of a Deployment of N real pods on
    /// a real node (tests/node), and how long until each controller's slices
    /// hold exactly the N new pods as ready: portwise (a selector-less
    /// Service aligned by annotation, `membership: podReady`) and the
    /// native controller (a selector twin of it), in the same rollouts.
    pub(crate) async fn rollout(&mut self) -> Result<()> {
        const NS: &str = "bench-rollout";
        let pods = env_usize("BENCH_ROLLOUT_PODS", 20).max(2);
        let runs = self.knobs.fair_runs;
        eprintln!("bench: row 11: a real node, a Deployment of {pods} pods, {runs} rollouts");
        let dir = self.work.join("node");
        let _ = std::fs::remove_dir_all(&dir);
        let started = StartedNode::start(&dir)?;
        let node = portwise_tests::node::RealNode::open(dir.clone()).await?;
        let client = node.client();
        let image = node.workload_image()?.to_string();
        node.apply(&format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Service
metadata: {{name: native, namespace: {NS}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: colocated, namespace: {NS}, annotations: {{{GROUP_KEY}: web}}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: {pods}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{{GROUP_KEY}: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: serve
        image: {image}
        imagePullPolicy: Never
        args: ["serve", "web", "8080"]
        readinessProbe:
          exec: {{command: ["/pw-workload", "ready"]}}
          periodSeconds: 1
"#
        ))?;
        let mut pw = Portwise::builder(self.cp)
            .name("portwise-row11")
            .dir(&self.work)
            .bin(&release_bin()?)
            .namespaces(&[NS])
            .config(&portwise_config("", "podReady"))
            .identity(Path::new(node.kubeconfig()?))
            .log_filter("info")
            .quiet()
            .start()
            .await?;
        let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
        let res = async {
            node.kubectl(&[
                "-n",
                NS,
                "rollout",
                "status",
                "deployment/web",
                "--timeout=300s",
            ])?;
            let settle = Instant::now();
            loop {
                let by = ready_pods_by_service(&slices).await?;
                let n = |s: &str| by.get(s).map_or(0, |p| p.len());
                if n("native") == pods && n("colocated") == pods {
                    break;
                }
                if settle.elapsed() > Duration::from_secs(120) {
                    bail!("the slices never held the {pods} pods before the rollouts: {by:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // What the bench's watches saw, as it arrived: the slices of
            // both Services and the pods' readiness, so that each
            // controller's lag after the last new pod turned Ready is
            // measured to the event, not to a poll.
            let log = RolloutLog::start(node.client(), NS);
            let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            let mut lags: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            let mut rollout_times = Vec::new();
            for run in 0..runs {
                let old = ready_pods_by_service(&slices)
                    .await?
                    .remove("native")
                    .unwrap_or_default();
                let t0 = Instant::now();
                node.kubectl(&["-n", NS, "rollout", "restart", "deployment/web"])?;
                node.kubectl(&[
                    "-n",
                    NS,
                    "rollout",
                    "status",
                    "deployment/web",
                    "--timeout=300s",
                ])?;
                rollout_times.push(t0.elapsed().as_secs_f64());
                // Until both Services' slices hold exactly the new pods.
                let deadline = Instant::now() + Duration::from_secs(60);
                let (new, last_ready, done) = loop {
                    let new = ready_pods_by_service(&slices)
                        .await?
                        .remove("native")
                        .unwrap_or_default();
                    let r = log.replay(t0, &new, &["colocated", "native"]);
                    if new.len() == pods
                        && new.is_disjoint(&old)
                        && let (Some(last), [Some(a), Some(b)]) = r
                    {
                        break (new, last, [a, b]);
                    }
                    if Instant::now() > deadline {
                        bail!("rollout {run}: the slices did not follow within 60 s of the rollout: {r:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                for i in 0..2 {
                    times[i].push((done[i] - t0).as_secs_f64());
                    lags[i].push(done[i].saturating_duration_since(last_ready).as_secs_f64() * 1e3);
                }
                eprintln!(
                    "bench: row 11: rollout {run} ({} new pods, last Ready at {:.2} s): portwise {:.2} s (+{:.0} ms), native {:.2} s (+{:.0} ms)",
                    new.len(),
                    (last_ready - t0).as_secs_f64(),
                    times[0][run],
                    lags[0][run],
                    times[1][run],
                    lags[1][run]
                );
            }
            Ok((times, lags, rollout_times))
        }
        .await;
        stop_portwise(&mut pw).await;
        drop(started);
        let (times, lags, rollout_times) = res?;
        let (p, n) = (median_of(&times[0]), median_of(&times[1]));
        let (pl, nl) = (median_of(&lags[0]), median_of(&lags[1]));
        let each = |xs: &[f64]| {
            xs.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.report.row(
            "11 rollout",
            &format!(
                "`kubectl rollout restart` of {pods} real pods → slices hold exactly the new pods, median of {runs} (each run, s: portwise {}; native {})",
                each(&times[0]),
                each(&times[1])
            ),
            format!("{p:.2} s"),
            format!("{n:.2} s"),
            ratio(p, n),
            Goal::RatioAtMost(1.0),
        );
        self.report.row(
            "11 rollout",
            &format!(
                "of which the lag after the last new pod turned Ready (pod watch → slice watch), \
                 median of {runs} (each run, ms: portwise {}; native {})",
                lags[0]
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                lags[1]
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!("{pl:.0} ms"),
            format!("{nl:.0} ms"),
            ratio(pl, nl),
            Goal::RatioAtMost(1.0),
        );
        self.protocol.push(format!(
            "- **Row 11** runs on a real node (tests/node: kubelet, containerd, CNI bridge, a              control plane in node mode with the native controllers), in a cluster of its own. A              Deployment of {pods} pods (`pw-workload serve`, exec readiness probe every 1 s,              default rolling update: 25 % surge, 25 % unavailable) backs two Services: `native`              with `spec.selector` (the native endpointslice controller) and `colocated` without              one, aligned by `{GROUP_KEY}` (the release `portwise`, as a process, `membership:              podReady`). Each run times, from just before `kubectl rollout restart`, when each              Service's slices first list exactly {pods} ready pods, none of them an old one              (polled every 20 ms). Both follow the same pods in the same rollout. The rollout              itself (`kubectl rollout status` done) took a median of {:.2} s.",
            median_of(&rollout_times)
        ));
        Ok(())
    }
}
