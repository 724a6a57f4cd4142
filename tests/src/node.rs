//! A real node (tests/node): kubelet, containerd, the CNI bridge and
//! kube-proxy beside a control plane in node mode, so that portwise runs as
//! the Pods its chart makes and the pods it publishes are real containers.
//!
//! `tests/node/run-suite` starts one node per network namespace and runs the
//! `node` test binary against it (`PORTWISE_NODE_DIR`); the suite's own
//! control plane has no kubelet, and a real node-lifecycle controller would
//! mark its API-only pods NotReady, so the two never share a cluster. The
//! node's tests run one at a time: they share its data path.
//!
//! Everything a user would type goes through the real tools: `kubectl`
//! (the control plane's, same version), `helm` (tests/helm/build), and
//! traffic from a client pod (`kubectl exec … pw-workload connect`), which
//! kube-proxy translates exactly as it would in a cluster.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::sync::OnceCell;

use crate::{built_tool, consumers::Answers, control_plane::repo_root};

/// The one node of this run; see the module docs.
pub struct RealNode {
    dir: PathBuf,
    env: BTreeMap<String, String>,
    /// A Config, not a Client: every `#[tokio::test]` has a runtime of its
    /// own, and a Client's worker dies with the runtime that made it.
    config: kube::Config,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

static NODE: OnceCell<RealNode> = OnceCell::const_new();

/// A command's output as text, or an error naming the command, its status
/// and its stderr.
fn text(what: &str, out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{what}: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `pw-workload connect`'s lines: `ok NAME`, `refused`, `failed WHY`.
fn parse_answers(out: &str) -> Answers {
    let mut answers = Answers::default();
    for line in out.lines() {
        if let Some(name) = line.strip_prefix("ok ") {
            *answers.by_pod.entry(name.to_string()).or_default() += 1;
        } else if line == "refused" {
            answers.refused += 1;
        } else {
            answers.failed += 1;
        }
    }
    answers
}

impl RealNode {
    /// The node `tests/node/run-suite` started (`PORTWISE_NODE_DIR`).
    pub async fn shared() -> Result<&'static RealNode> {
        crate::init_tracing();
        NODE.get_or_try_init(Self::from_env).await
    }

    async fn from_env() -> Result<RealNode> {
        let dir = std::env::var_os("PORTWISE_NODE_DIR")
            .map(PathBuf::from)
            .context(
                "PORTWISE_NODE_DIR is unset: run the node tests with tests/node/run-suite \
             (./test does), which starts a real node inside the test network namespace",
            )?;
        Self::open(dir).await
    }

    /// The node `tests/node/start DIR` started.
    pub async fn open(dir: PathBuf) -> Result<RealNode> {
        let env = crate::env_file(&dir.join("env")).context("the node's env (tests/node/start)")?;
        let kubeconfig = env
            .get("KUBECONFIG")
            .context("no KUBECONFIG in the node's env")?;
        let config = kube::Config::from_custom_kubeconfig(
            Kubeconfig::read_from(kubeconfig)?,
            &KubeConfigOptions::default(),
        )
        .await?;
        Ok(RealNode { dir, env, config })
    }

    /// A value of the node's env file (tests/node/start).
    pub fn env(&self, key: &str) -> Result<&str> {
        self.env
            .get(key)
            .map(String::as_str)
            .with_context(|| format!("{key} is not in {}/env", self.dir.display()))
    }

    /// A client as the cluster admin, for the calling test's runtime.
    pub fn client(&self) -> Client {
        Client::try_from(self.config.clone())
            .expect("a client from a kubeconfig that worked before")
    }

    /// The admin kubeconfig, as users pass it to kubectl and helm.
    pub fn kubeconfig(&self) -> Result<&str> {
        self.env("KUBECONFIG")
    }

    /// The apiserver's audit log (EndpointSlice writes, by user).
    /// The node's cluster CA (`ca.crt`, `ca.key`).
    pub fn pki_dir(&self) -> PathBuf {
        self.dir.join("cp/pki")
    }

    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("cp/audit.log")
    }

    /// The image deploy/build-image built, imported into containerd.
    pub fn portwise_image(&self) -> Result<&str> {
        match self.env("PORTWISE_IMAGE")? {
            "" => bail!(
                "the node has no portwise image: podman had no localhost/portwise:dev when it started (run deploy/build-image)"
            ),
            image => Ok(image),
        }
    }

    /// The same image under the name the chart and the kustomize base
    /// default to (`ghcr.io/portwise/portwise:VERSION`), as tests/node/start
    /// tagged it in containerd.
    pub fn released_image(&self) -> Result<&str> {
        self.portwise_image()?;
        self.env("RELEASED_IMAGE")
    }

    /// Trusts `ca` for pulls from `host` (`10.244.x.y:5000`): containerd
    /// reads `certs.d/HOST/hosts.toml` at every pull, so it needs no restart.
    pub fn trust_registry(&self, host: &str, ca: &Path) -> Result<()> {
        let dir = Path::new(self.env("CONTAINERD_CERTS_D")?).join(host);
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(ca, dir.join("ca.crt"))?;
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"https://{host}\"\n\n[host.\"https://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
                dir.join("ca.crt").display()
            ),
        )?;
        Ok(())
    }

    /// The test workloads' image (pw-workload, tests/node/workload).
    pub fn workload_image(&self) -> Result<&str> {
        self.env("WORKLOAD_IMAGE")
    }

    fn tool(&self, program: &Path, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("KUBECONFIG", self.kubeconfig()?)
            .current_dir(repo_root())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("running {}", program.display()))?;
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .context("stdin")?
                .write_all(input.as_bytes())?;
        }
        Ok(child.wait_with_output()?)
    }

    fn kubectl_path(&self) -> Result<PathBuf> {
        Ok(PathBuf::from(self.env("PORTWISE_CP")?))
    }

    /// `kubectl ARGS`, its stdout on success.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl_output(args)?;
        text(&format!("kubectl {}", args.join(" ")), out)
    }

    /// `kubectl ARGS` whatever it returns (for refusals a test expects).
    pub fn kubectl_output(&self, args: &[&str]) -> Result<Output> {
        let mut full = vec!["kubectl"];
        full.extend_from_slice(args);
        self.tool(&self.kubectl_path()?, &full, None)
    }

    /// `kubectl apply -f -` of a manifest.
    pub fn apply(&self, manifest: &str) -> Result<String> {
        let out = self.tool(
            &self.kubectl_path()?,
            &["kubectl", "apply", "-f", "-"],
            Some(manifest),
        )?;
        text("kubectl apply -f -", out)
    }

    /// `helm ARGS`, its stdout on success.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let out = self.helm_output(args)?;
        text(&format!("helm {}", args.join(" ")), out)
    }

    /// `helm ARGS` whatever it returns.
    pub fn helm_output(&self, args: &[&str]) -> Result<Output> {
        self.tool(&built_tool("tests/helm/build")?, args, None)
    }

    /// `ctr` against the node's containerd, in the CRI's namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let bin = Path::new(self.env("PORTWISE_NODE_BIN")?).join("ctr");
        let sock = self.env("CONTAINERD_SOCK")?.to_string();
        let mut full = vec!["--address", &sock, "-n", "k8s.io"];
        full.extend_from_slice(args);
        let out = self.tool(&bin, &full, None)?;
        text(&format!("ctr {}", args.join(" ")), out)
    }

    /// `n` connections to `ip:port` from inside pod `ns/pod` (which runs
    /// the workload image): the path a client in the cluster takes,
    /// through kube-proxy's rules on the node.
    pub fn connect_from(
        &self,
        ns: &str,
        pod: &str,
        ip: &str,
        port: u16,
        n: usize,
    ) -> Result<Answers> {
        let port = port.to_string();
        let n_text = n.to_string();
        let out = self.kubectl(&[
            "-n",
            ns,
            "exec",
            pod,
            "--",
            "/pw-workload",
            "connect",
            ip,
            &port,
            &n_text,
            "1000",
        ])?;
        let answers = parse_answers(&out);
        if answers.by_pod.values().sum::<usize>() + answers.refused + answers.failed != n {
            bail!(
                "pw-workload connect printed {} lines for {n} connections:\n{out}",
                out.lines().count()
            );
        }
        Ok(answers)
    }

    /// Polls `connect_from` until the pods answering are exactly `pods`
    /// (every connection answered), or fails with the last answers.
    pub async fn expect_answers(
        &self,
        (ns, client): (&str, &str),
        (ip, port): (&str, u16),
        pods: &[&str],
        within: Duration,
    ) -> Result<Answers> {
        let deadline = tokio::time::Instant::now() + within;
        let want: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
        loop {
            let answers = self.connect_from(ns, client, ip, port, crate::consumers::CONNECTIONS)?;
            if answers.pods() == want && answers.refused == 0 && answers.failed == 0 {
                return Ok(answers);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{ip}:{port} from {ns}/{client}: wanted exactly {want:?} answering, got {answers:?} after {within:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// What portwise published for Service `ns/svc`, by port name: each
/// endpoint's pod and its conditions (`ready`, `serving`, `terminating`;
/// unset reads as Kubernetes says: ready and serving true, terminating
/// false).
pub async fn published(
    client: &Client,
    ns: &str,
    svc: &str,
) -> Result<BTreeMap<String, BTreeMap<String, (bool, bool, bool)>>> {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let slices = kube::Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&format!(
            "kubernetes.io/service-name={svc},endpointslice.kubernetes.io/managed-by=portwise"
        )))
        .await?;
    let mut out: BTreeMap<String, BTreeMap<String, (bool, bool, bool)>> = BTreeMap::new();
    for s in slices.items {
        for port in s.ports.iter().flatten() {
            let set = out
                .entry(port.name.clone().unwrap_or_default())
                .or_default();
            for e in s.endpoints.iter().flatten() {
                let pod = e
                    .target_ref
                    .as_ref()
                    .and_then(|r| r.name.clone())
                    .unwrap_or_else(|| e.addresses.join(","));
                let c = e.conditions.clone().unwrap_or_default();
                set.insert(
                    pod,
                    (
                        c.ready.unwrap_or(true),
                        c.serving.unwrap_or(true),
                        c.terminating.unwrap_or(false),
                    ),
                );
            }
        }
    }
    Ok(out)
}

/// Ready members by port name: pod names, sorted.
pub type Members = BTreeMap<String, Vec<String>>;

/// The ready members of each port of `ns/svc`, as portwise published them.
pub async fn ready_members(client: &Client, ns: &str, svc: &str) -> Result<Members> {
    Ok(published(client, ns, svc)
        .await?
        .into_iter()
        .map(|(port, eps)| {
            let ready = eps
                .into_iter()
                .filter(|(_, (ready, _, _))| *ready)
                .map(|(pod, _)| pod)
                .collect();
            (port, ready)
        })
        .collect())
}

/// An expectation for [`ready_members`]: `members([("http", &["a", "b"])])`.
pub fn members<'a>(entries: impl IntoIterator<Item = (&'a str, &'a [&'a str])>) -> Members {
    entries
        .into_iter()
        .map(|(port, pods)| {
            (
                port.to_string(),
                pods.iter().map(|p| p.to_string()).collect(),
            )
        })
        .collect()
}

/// EndpointSlice writes in the audit log by `user` (create, update, patch,
/// delete), in order: `(verb, slice name)`.
pub fn slice_writes_by(audit_log: &Path, user: &str) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(audit_log)
        .with_context(|| format!("reading the audit log {}", audit_log.display()))?;
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let res = &ev["objectRef"];
        if res["resource"] != "endpointslices" || ev["user"]["username"] != user {
            continue;
        }
        if ev["stage"] != "ResponseComplete" {
            continue;
        }
        let code = ev["responseStatus"]["code"].as_i64().unwrap_or(0);
        if !(200..300).contains(&code) {
            continue;
        }
        out.push((
            ev["verb"].as_str().unwrap_or_default().to_string(),
            res["name"].as_str().unwrap_or_default().to_string(),
        ));
    }
    Ok(out)
}

/// One endpoint of one slice version: pod, ready, serving, terminating.
pub type EndpointState = (String, bool, bool, bool);
/// One version of a slice: its endpoints under each port it lists.
pub type SliceVersion = BTreeMap<String, Vec<EndpointState>>;

/// Every version of portwise's slices of `ns/svc` seen by a watch from
/// [`SliceHistory::start`] on: a change that lasts a second (a container
/// restarted at once) is caught even when no poll would be.
pub struct SliceHistory {
    seen: std::sync::Arc<std::sync::Mutex<Vec<SliceVersion>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SliceHistory {
    pub fn start(client: Client, ns: &str, svc: &str) -> Self {
        use futures::StreamExt as _;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        use kube::runtime::{WatchStreamExt as _, watcher};
        let api = kube::Api::<EndpointSlice>::namespaced(client, ns);
        let cfg = watcher::Config::default().labels(&format!(
            "kubernetes.io/service-name={svc},endpointslice.kubernetes.io/managed-by=portwise"
        ));
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(api, cfg).applied_objects());
            while let Some(Ok(s)) = stream.next().await {
                let states: Vec<EndpointState> = s
                    .endpoints
                    .iter()
                    .flatten()
                    .map(|e| {
                        let c = e.conditions.clone().unwrap_or_default();
                        (
                            e.target_ref
                                .as_ref()
                                .and_then(|r| r.name.clone())
                                .unwrap_or_default(),
                            c.ready.unwrap_or(true),
                            c.serving.unwrap_or(true),
                            c.terminating.unwrap_or(false),
                        )
                    })
                    .collect();
                let by_port = s
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| (p.name.clone().unwrap_or_default(), states.clone()))
                    .collect();
                sink.lock().expect("history lock").push(by_port);
            }
        });
        SliceHistory { seen, task }
    }

    /// Whether some version of a slice listing `port` had ready members
    /// (sorted pod names) matching `pred`.
    pub fn saw(&self, port: &str, pred: impl Fn(&[String]) -> bool) -> bool {
        self.saw_endpoints(port, |eps| {
            let mut ready: Vec<String> = eps.iter().filter(|e| e.1).map(|e| e.0.clone()).collect();
            ready.sort();
            pred(&ready)
        })
    }

    /// Whether some version of a slice listing `port` had endpoints
    /// matching `pred`.
    pub fn saw_endpoints(&self, port: &str, pred: impl Fn(&[EndpointState]) -> bool) -> bool {
        self.seen
            .lock()
            .expect("history lock")
            .iter()
            .filter_map(|v| v.get(port))
            .any(|m| pred(m))
    }

    /// Everything seen, for a failure message.
    pub fn versions(&self) -> Vec<SliceVersion> {
        self.seen.lock().expect("history lock").clone()
    }
}

impl Drop for SliceHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Traffic from a client pod for the length of an operation (an upgrade,
/// a failover, a rollout): `pw-workload connect` in the background, one
/// connection every `interval`, each answered, refused or failed.
pub struct Traffic {
    child: std::process::Child,
    what: String,
}

impl RealNode {
    /// Starts `count` connections to `ip:port` from `ns/pod`, `interval` apart.
    pub fn traffic(
        &self,
        (ns, pod): (&str, &str),
        (ip, port): (&str, u16),
        count: usize,
        interval: Duration,
    ) -> Result<Traffic> {
        let args = [
            "kubectl".to_string(),
            "-n".into(),
            ns.into(),
            "exec".into(),
            pod.into(),
            "--".into(),
            "/pw-workload".into(),
            "connect".into(),
            ip.into(),
            port.to_string(),
            count.to_string(),
            "1000".into(),
            interval.as_millis().to_string(),
        ];
        let child = Command::new(self.kubectl_path()?)
            .args(&args)
            .env("KUBECONFIG", self.kubeconfig()?)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting kubectl exec … pw-workload connect")?;
        Ok(Traffic {
            child,
            what: format!("{ip}:{port} from {ns}/{pod}"),
        })
    }
}

impl Traffic {
    /// Waits for the connections to finish: what they met.
    pub fn finish(self) -> Result<Answers> {
        let out = self.child.wait_with_output()?;
        Ok(parse_answers(&text(
            &format!("traffic to {}", self.what),
            out,
        )?))
    }
}
