//! What the shipping tests share: the seed example, kubectl of the control
//! plane, kubeconfigs for other identities, the `portwise` binary as a
//! process with its operations port, a Prometheus text parser and the
//! apiserver's audit log read per acting user.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, config::Kubeconfig};
use portwise_tests::*;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    process::Child,
};

/// The seed example's membership: ready pods, per port as the pod's
/// `port-mapper.example.com/ports` annotation lists.
pub const SEED_MEMBERSHIP: &str =
    "{all: [podReady, {portNames: {annotation: port-mapper.example.com/ports}}]}";

/// The ServiceAccount deploy/kustomize creates, as the apiserver names it.
pub const SA_USER: &str = "system:serviceaccount:portwise-system:portwise";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The seed example: Service `my-service` (http 8080, https 8443) and Ready
/// pods a–d serving http / http,https / http,https / https.
pub async fn seed(ns: &TestNs) -> Result<()> {
    ns.create_service(
        service("my-service")
            .annotation(GROUP_KEY, "my-group")
            .port("http", 8080)
            .port("https", 8443),
    )
    .await?;
    let pods = [
        ("a", "http"),
        ("b", "http,https"),
        ("c", "http,https"),
        ("d", "https"),
    ]
    .into_iter()
    .map(|(name, ports)| {
        pod(name)
            .annotation(GROUP_KEY, "my-group")
            .annotation(PORTS_KEY, ports)
            .container_port("http", 8080, "TCP")
            .container_port("https", 8443, "TCP")
            .ips(next_ips().v4())
    })
    .collect();
    ns.create_pods(pods).await?;
    Ok(())
}

/// Whether `my-service`'s slices hold exactly these pods now.
pub async fn seed_is(ns: &TestNs, http: &[&str], https: &[&str]) -> Result<()> {
    expect_eq(
        endpoints_by_port(ns, "my-service").await?,
        by_port([(("http", V4), http), (("https", V4), https)]),
    )
}

/// Waits until `my-service`'s slices hold exactly these pods.
pub async fn expect_seed(ns: &TestNs, http: &[&str], https: &[&str]) -> Result<()> {
    wait_for(SETTLE, || seed_is(ns, http, https)).await
}

// ---- kubectl ----------------------------------------------------------------

/// `DIR/bin/kubectl` of the control plane: `kubeconfig` as the identity,
/// the repository as working directory, `stdin` fed if given. Returns the
/// output whatever the exit status.
pub async fn kubectl_as(
    cp: &ControlPlane,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<Output> {
    let bin = cp.dir().join("bin/kubectl");
    ensure!(
        bin.exists(),
        "{} does not exist: is PORTWISE_TEST_CP_DIR a control plane started by tests/control-plane/start?",
        bin.display()
    );
    let mut child = tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(repo())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped");
        pipe.write_all(input.as_bytes()).await?;
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .with_context(|| format!("kubectl {args:?} did not finish within 60s"))??;
    Ok(out)
}

/// kubectl as admin; fails unless it exits 0. Returns stdout.
pub async fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let out = kubectl_as(cp, cp.kubeconfig(), args, stdin).await?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl kustomize DIR` (a path relative to the repository, or absolute).
pub async fn kustomize(cp: &ControlPlane, dir: &str) -> Result<String> {
    kubectl(cp, &["kustomize", dir], None).await
}

/// The documents of a multi-document YAML stream with their `kind`.
pub fn documents(yaml: &str) -> Vec<(String, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        let kind = current
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .map(|k| k.trim().to_string());
        if let Some(kind) = kind {
            docs.push((kind, std::mem::take(current)));
        }
        current.clear();
    };
    for line in yaml.lines() {
        if line == "---" {
            flush(&mut current);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current);
    docs
}

/// The documents of `yaml` whose kind is one of `kinds`, as one stream.
pub fn only_kinds(yaml: &str, kinds: &[&str]) -> String {
    documents(yaml)
        .into_iter()
        .filter(|(k, _)| kinds.contains(&k.as_str()))
        .map(|(_, d)| d)
        .collect::<Vec<_>>()
        .join("---\n")
}

// ---- identities -------------------------------------------------------------

/// Writes a copy of the admin kubeconfig, changed by `edit`, as JSON (which
/// every kubeconfig reader takes as YAML) to `path`.
pub fn kubeconfig_variant(
    cp: &ControlPlane,
    path: &Path,
    edit: impl FnOnce(&mut Kubeconfig),
) -> Result<PathBuf> {
    let mut kc = Kubeconfig::read_from(cp.kubeconfig())?;
    edit(&mut kc);
    std::fs::write(path, serde_json::to_vec_pretty(&kc)?)?;
    Ok(path.to_path_buf())
}

/// A kubeconfig that acts as `user` in `groups` (impersonation by the admin
/// identity): the audit log then records `user` as the acting user.
pub fn impersonating(
    cp: &ControlPlane,
    path: &Path,
    user: &str,
    groups: &[&str],
) -> Result<PathBuf> {
    kubeconfig_variant(cp, path, |kc| {
        for a in &mut kc.auth_infos {
            if let Some(info) = a.auth_info.as_mut() {
                info.impersonate = Some(user.to_string());
                info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
            }
        }
    })
}

/// A kubeconfig that authenticates with `token` only (no client
/// certificate), trusting the control plane's CA.
pub fn token_kubeconfig(cp: &ControlPlane, path: &Path, token: &str) -> Result<PathBuf> {
    kubeconfig_variant(cp, path, |kc| {
        for a in &mut kc.auth_infos {
            a.auth_info = Some(kube::config::AuthInfo {
                token: Some(token.trim().to_string().into()),
                ..Default::default()
            });
        }
    })
}

// ---- the Lease ----------------------------------------------------------------

/// Whether a Lease holder is the replica started with `--identity id`
/// (portwise appends `_<random>` so two replicas never share a name).
pub fn is_identity(holder: Option<&str>, id: &str) -> bool {
    holder.is_some_and(|h| h == id || h.strip_prefix(id).is_some_and(|r| r.starts_with('_')))
}

/// The Lease's holder; `None` when absent, empty or released.
pub async fn lease_holder(api: &Api<Lease>, name: &str) -> Result<Option<String>> {
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

// ---- portwise as a process --------------------------------------------------

/// The real `portwise run` (binary from `PORTWISE_BIN`), with its operations
/// port on 127.0.0.1 and its log in a file shown when the test fails.
pub struct Proc {
    pub name: String,
    args: Vec<String>,
    kubeconfig: PathBuf,
    pub metrics: SocketAddr,
    dir: tempfile::TempDir,
    child: Option<Child>,
    starts: usize,
}

impl Proc {
    /// Starts `portwise run --config CONFIG --metrics-addr 127.0.0.1:PORT ARGS`
    /// as `kubeconfig`'s identity.
    pub fn start(name: &str, kubeconfig: &Path, config_yaml: &str, args: &[&str]) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("portwise-{name}-"))
            .tempdir()?;
        std::fs::write(dir.path().join("config.yaml"), config_yaml)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut p = Self {
            name: name.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            kubeconfig: kubeconfig.to_path_buf(),
            metrics: SocketAddr::from(([127, 0, 0, 1], port)),
            dir,
            child: None,
            starts: 0,
        };
        p.launch()?;
        Ok(p)
    }

    fn launch(&mut self) -> Result<()> {
        self.starts += 1;
        let log_path = self.dir.path().join("portwise.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        use std::io::Write as _;
        writeln!(log, "==== {} start #{} ====", self.name, self.starts)?;
        let child = tokio::process::Command::new(portwise_bin()?)
            .arg("run")
            .arg("--config")
            .arg(self.dir.path().join("config.yaml"))
            .arg("--metrics-addr")
            .arg(self.metrics.to_string())
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env(
                "RUST_LOG",
                std::env::var("PORTWISE_SHIP_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("spawning portwise")?;
        self.child = Some(child);
        Ok(())
    }

    /// Starts it again (same flags, same port) after `kill9` or `stop`.
    pub fn start_again(&mut self) -> Result<()> {
        ensure!(self.child.is_none(), "{} is still running", self.name);
        self.launch()
    }

    /// Fails if the process exited on its own.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.as_mut() {
            None => bail!("{} is not running", self.name),
            Some(c) => match c.try_wait()? {
                Some(s) => bail!("{} exited on its own with {s}\n{}", self.name, self.logs()),
                None => Ok(()),
            },
        }
    }

    /// `kill -9`, and reaps it.
    pub async fn kill9(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.start_kill()?;
            c.wait().await?;
        }
        Ok(())
    }

    /// SIGTERM; fails unless it exits 0 within 30 s. Returns how long it took.
    pub async fn stop(&mut self) -> Result<Duration> {
        let mut c = self.child.take().context("not running")?;
        let started = std::time::Instant::now();
        if let Some(pid) = c.id() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        match tokio::time::timeout(Duration::from_secs(30), c.wait()).await {
            Ok(status) => {
                let status = status?;
                ensure!(
                    status.success(),
                    "{} exited with {status} after SIGTERM, expected 0\n{}",
                    self.name,
                    self.logs()
                );
                Ok(started.elapsed())
            }
            Err(_) => {
                let _ = c.kill().await;
                bail!("{} did not exit within 30s of SIGTERM", self.name)
            }
        }
    }

    /// Everything it logged (all runs).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("portwise.log")).unwrap_or_default()
    }

    /// GET on its operations port: (status, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.metrics, path).await
    }

    /// Its `/metrics`, parsed.
    pub async fn scrape(&self) -> Result<Metrics> {
        let (status, body) = self.get("/metrics").await?;
        ensure!(status == 200, "{} /metrics answered {status}", self.name);
        Ok(Metrics::parse(&body))
    }

    /// Waits until `/readyz` answers 200 (caches synced); fails at once if
    /// the process exits meanwhile.
    pub async fn wait_ready(&mut self) -> Result<Duration> {
        let started = std::time::Instant::now();
        loop {
            self.check_running()?;
            let last = match self.get("/readyz").await {
                Ok((200, _)) => return Ok(started.elapsed()),
                Ok((status, body)) => format!("/readyz {status}: {}", body.trim()),
                Err(e) => format!("{e:#}"),
            };
            if started.elapsed() > SETTLE {
                bail!("{} not ready within {SETTLE:?}: {last}", self.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
        // The harness shows this for failing tests only.
        let logs = self.logs();
        let tail: Vec<&str> = logs.lines().rev().take(200).collect();
        eprintln!(
            "---- {} log (last {} lines) ----\n{}",
            self.name,
            tail.len(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// A plain HTTP/1.1 GET: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to {addr}"))?
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP response from {addr}{path}: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line: {head:?}"))?;
    Ok((status, body.to_string()))
}

// ---- Prometheus text ------------------------------------------------------

/// One sample: metric name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed scrape.
#[derive(Clone, Debug, Default)]
pub struct Metrics(pub Vec<Sample>);

impl Metrics {
    /// Parses the Prometheus / OpenMetrics text format (comments skipped;
    /// label values without escaped quotes, which ours never hold).
    pub fn parse(text: &str) -> Self {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = match line.rsplit_once(' ') {
                Some(x) => x,
                None => continue,
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => {
                    let rest = rest.trim_end_matches('}');
                    let labels = rest
                        .split("\",")
                        .filter(|kv| !kv.is_empty())
                        .filter_map(|kv| {
                            let (k, v) = kv.split_once("=\"")?;
                            Some((k.to_string(), v.trim_end_matches('"').to_string()))
                        })
                        .collect();
                    (name.to_string(), labels)
                }
            };
            out.push(Sample {
                name,
                labels,
                value,
            });
        }
        Self(out)
    }

    /// Samples of `name` whose labels include all of `labels`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The one sample of `name` with `labels`; `None` if absent, an error if
    /// several match.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Result<Option<f64>> {
        let found: Vec<&Sample> = self.select(name, labels).collect();
        match found.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.value)),
            many => bail!("{} samples of {name}{labels:?}: {many:?}", many.len()),
        }
    }

    /// The sum of every sample of `name` with `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.select(name, labels).map(|s| s.value).sum()
    }
}

// ---- the audit log ------------------------------------------------------------

/// One audited write to an EndpointSlice.
#[derive(Clone, Debug)]
pub struct SliceWrite {
    /// The acting user: the impersonated one if any, else the authenticated one.
    pub user: String,
    pub user_agent: String,
    pub verb: String,
    pub name: String,
    pub code: Option<i64>,
}

/// Reads the control plane's audit log (`DIR/audit.log`) from a mark on.
pub struct AuditMark {
    path: PathBuf,
    offset: u64,
}

impl AuditMark {
    pub fn now(cp: &ControlPlane) -> Result<Self> {
        let path = cp.audit_log().with_context(|| {
            format!(
                "{} has no audit.log: start the control plane with tests/control-plane/start",
                cp.dir().display()
            )
        })?;
        let offset = std::fs::metadata(&path)?.len();
        Ok(Self { path, offset })
    }

    /// Completed writes to EndpointSlices in `namespace` since the mark.
    pub fn slice_writes(&self, namespace: &str) -> Result<Vec<SliceWrite>> {
        use std::io::{BufRead, BufReader, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path)?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut out = Vec::new();
        for line in BufReader::new(f).lines() {
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line?) else {
                continue;
            };
            let obj = &ev["objectRef"];
            if ev["stage"] != "ResponseComplete"
                || obj["resource"] != "endpointslices"
                || obj["namespace"] != namespace
            {
                continue;
            }
            let verb = ev["verb"].as_str().unwrap_or_default();
            if !["create", "update", "patch", "delete", "deletecollection"].contains(&verb) {
                continue;
            }
            let user = ev["impersonatedUser"]["username"]
                .as_str()
                .or(ev["user"]["username"].as_str())
                .unwrap_or_default();
            out.push(SliceWrite {
                user: user.to_string(),
                user_agent: ev["userAgent"].as_str().unwrap_or_default().to_string(),
                verb: verb.to_string(),
                name: obj["name"].as_str().unwrap_or_default().to_string(),
                code: ev["responseStatus"]["code"].as_i64(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openmetrics_text() {
        let m = Metrics::parse(
            "# HELP portwise_leader x\n# TYPE portwise_leader gauge\nportwise_leader 1\n\
             portwise_endpoints_published{namespace=\"n\",service=\"s\",port=\"http\",family=\"IPv4\"} 3\n\
             portwise_writes_total{kind=\"apply\"} 7\nportwise_writes_total{kind=\"delete\"} 1\n# EOF\n",
        );
        assert_eq!(m.value("portwise_leader", &[]).unwrap(), Some(1.0));
        assert_eq!(
            m.value(
                "portwise_endpoints_published",
                &[("service", "s"), ("port", "http"), ("family", "IPv4")]
            )
            .unwrap(),
            Some(3.0)
        );
        assert_eq!(m.sum("portwise_writes_total", &[]), 8.0);
        assert!(m.value("portwise_writes_total", &[]).is_err());
    }

    #[test]
    fn splits_yaml_documents_by_kind() {
        let y = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\ndata:\n  x: |\n    kind: Nope\n";
        let docs = documents(y);
        assert_eq!(
            docs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["Namespace", "ConfigMap"]
        );
        assert_eq!(only_kinds(y, &["Namespace"]).lines().count(), 4);
    }
}
