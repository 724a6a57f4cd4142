//! Fault injection for the reliability suite (issue 7, docs/reliability.md).
//!
//! The control-plane faults (apiserver restart, etcd compaction, 429s) would
//! disturb every other test if injected into the shared control plane, so
//! each such test runs on a control plane of its own, in a network namespace
//! of its own: [`isolated`] re-runs the calling test in a fresh `tests/netns`
//! with a private apiserver, and the rest of the support API
//! (`ControlPlane::shared`, `TestNs`, the observers) works unchanged there,
//! because the child sees that apiserver as "the shared one". A fresh
//! namespace also keeps the apiserver on the same port across a restart, as
//! a real cluster's Service address would.
//!
//! The other helpers:
//! * portwise itself runs as the binary through [`crate::Portwise`] (its
//!   pid for `kill -9`, SIGSTOP, RSS and CPU; its log; its metrics port),
//!   as the `portwise` ServiceAccount of [`crate::identity::portwise_identity`]:
//!   faults must hit portwise as a non-admin.
//! * [`Audit`]: the apiserver's audit log, read between two marks.
//! * [`BadTarget`]: probe targets that misbehave on purpose, measuring how
//!   long each probe connection lived and how many bytes it was sent.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Seek, SeekFrom},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    task::JoinHandle,
};

use crate::{ByPort, ControlPlane, TestNs, control_plane::repo_root};

/// Audit policy of an isolated control plane: every request portwise makes
/// (to count them, 429s included: the audit filter wraps the inflight
/// limit), as any ServiceAccount of `portwise-system` (each replica of a
/// partition test has its own, `crate::partition::replica_identity`), plus
/// everyone's writes to slices and Endpoints (as the default policy of
/// tests/control-plane/start).
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:portwise-system"]
- level: Metadata
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
  resources:
  - group: "discovery.k8s.io"
    resources: ["endpointslices"]
  - group: ""
    resources: ["endpoints"]
- level: None
"#;

/// How the private control plane of an [`isolated`] test is started.
#[derive(Clone, Debug, Default)]
pub struct Isolation {
    /// Extra kube-apiserver flags (`PORTWISE_APISERVER_ARGS`).
    pub apiserver_args: &'static str,
    /// `--controllers` for kube-controller-manager; empty: none.
    pub controllers: &'static str,
}

/// Set in the child process of [`isolated`] to the name of the test it runs.
const CHILD_ENV: &str = "PORTWISE_FAULT_CHILD";

/// Fault tests of one binary run one at a time: each brings its own
/// apiserver, and two cores are shared by everything on the machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `body` on a private control plane in a private network namespace.
///
/// Called from test `name` (its exact path in the suite binary, as
/// `cargo test -- --list` prints it: `faults::apiserver_restart`): in the test
/// process, it starts `tests/netns` running `tests/control-plane/start` and
/// then this same test binary filtered to `name`; there (the child), it runs
/// `body`. The child's output is replayed into this test's output, and its
/// failure is this test's failure. Everything the child started (apiserver,
/// portwise, listeners) dies with its namespace.
pub async fn isolated<F, Fut>(name: &str, iso: Isolation, body: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        return body().await;
    }
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::Builder::new()
        .prefix("portwise-fault-")
        .tempdir()?;
    let dir = tmp.path().join("cp");
    let policy = tmp.path().join("audit-policy.yaml");
    std::fs::write(&policy, AUDIT_POLICY)?;
    let exe = std::env::current_exe()?;
    let root = repo_root();
    // `start` goes to stderr so that the child's stdout is the harness's.
    let script = r#"set -e
ctl=(); [ -n "$2" ] && ctl=(--controllers "$2")
tests/control-plane/start "$1" "${ctl[@]}" >&2
exec "$3" --exact "$4" --nocapture --test-threads=1"#;
    let mut cmd = tokio::process::Command::new(root.join("tests/netns"));
    cmd.arg("bash")
        .arg("-c")
        .arg(script)
        .arg("isolated")
        .arg(&dir)
        .arg(iso.controllers)
        .arg(&exe)
        .arg(name)
        .current_dir(&root)
        // A fresh namespace, not the caller's.
        .env_remove("PORTWISE_NETNS")
        .env_remove("PORTWISE_NETNS_RUN")
        .env(CHILD_ENV, name)
        .env("PORTWISE_TEST_KUBECONFIG", dir.join("kubeconfig"))
        .env("PORTWISE_TEST_CP_DIR", &dir)
        .env(
            "PORTWISE_APISERVER_ARGS",
            format!(
                "--audit-policy-file={} {}",
                policy.display(),
                iso.apiserver_args
            ),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd.spawn().context("starting tests/netns")?;
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    // Far above any scenario's own waits (a long run sets its own,
    // `PORTWISE_ISOLATED_SECS`); SIGKILL to unshare ends everything inside
    // the namespace at once.
    let limit = std::env::var("PORTWISE_ISOLATED_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let status = match tokio::time::timeout(Duration::from_secs(limit), child.wait()).await {
        Ok(s) => Some(s?),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    };
    let (out, err) = (out.await?, err.await?);
    eprintln!(
        "---- isolated {name}: {:.1}s ----\n{out}\n---- stderr ----\n{err}",
        started.elapsed().as_secs_f64()
    );
    match status {
        None => bail!("{name} did not finish within {limit}s in its namespace"),
        Some(s) if s.success() => Ok(()),
        Some(s) => bail!(
            "{name} failed in its namespace ({s}):\n{}\n{}",
            tail(&out, 60),
            tail(&err, 30)
        ),
    }
}

fn drain<R: tokio::io::AsyncRead + Unpin + Send + 'static>(r: Option<R>) -> JoinHandle<String> {
    tokio::spawn(async move {
        let mut s = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut s).await;
        }
        String::from_utf8_lossy(&s).into_owned()
    })
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---- the private control plane ------------------------------------------

/// `tests/control-plane/stop DIR`: the apiserver (and controller-manager)
/// exit; etcd's data stays in DIR.
pub async fn stop_control_plane(cp: &ControlPlane) -> Result<()> {
    let status = tokio::process::Command::new(repo_root().join("tests/control-plane/stop"))
        .arg(cp.dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?;
    ensure!(
        status.success(),
        "tests/control-plane/stop failed: {status}"
    );
    Ok(())
}

/// `kill -9` of the apiserver process (etcd is embedded in it, so etcd
/// dies too; its data is on disk). A graceful `stop` would do, but an
/// apiserver with open watches ignores SIGTERM for 30s+ (then `stop` kills
/// it anyway), which is too slow for a test.
pub async fn crash_apiserver(cp: &ControlPlane) -> Result<()> {
    let pid: i32 = std::fs::read_to_string(cp.dir().join("apiserver.pid"))?
        .trim()
        .parse()
        .context("apiserver.pid")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    ensure!(
        String::from_utf8_lossy(&cmdline).contains(&*cp.dir().to_string_lossy()),
        "pid {pid} is not this control plane's apiserver"
    );
    // SAFETY: killing a process we started (checked against its cmdline).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    for _ in 0..200 {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for tests/netns (its parent) to reap it.
        if state.is_empty()
            || state
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("apiserver {pid} still alive 10s after SIGKILL")
}

/// `tests/control-plane/start DIR` again, with the controllers and extra
/// flags it had (the flags come from this process's environment).
pub async fn start_control_plane(cp: &ControlPlane) -> Result<()> {
    let controllers = std::fs::read_to_string(cp.dir().join("controllers")).unwrap_or_default();
    let mut cmd = tokio::process::Command::new(repo_root().join("tests/control-plane/start"));
    cmd.arg(cp.dir());
    if !controllers.trim().is_empty() {
        cmd.arg("--controllers").arg(controllers.trim());
    }
    let out = cmd.stdin(Stdio::null()).output().await?;
    ensure!(
        out.status.success(),
        "tests/control-plane/start failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// An admin client that does not retry 429/503/504 (kube's default does,
/// with backoff): for load generators that must not stall.
pub async fn client_without_retries(cp: &ControlPlane, agent: &str) -> Result<kube::Client> {
    let mut config = cp.kube_config(agent).await?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// The apiserver's port, from `DIR/env`.
pub fn apiserver_port(cp: &ControlPlane) -> Result<u16> {
    let env = std::fs::read_to_string(cp.dir().join("env"))?;
    env.lines()
        .find_map(|l| l.strip_prefix("APISERVER_PORT="))
        .context("no APISERVER_PORT in env")?
        .trim()
        .parse()
        .context("APISERVER_PORT")
}

/// VmRSS and VmHWM of `pid`, in KiB.
pub fn proc_memory_kib(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// utime + stime of `pid`.
pub fn proc_cpu_time(pid: u32) -> Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command (which may hold spaces) start after ")".
    let rest = stat.rsplit_once(')').context("/proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat(5); `rest` starts at 3.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(Duration::from_millis(ticks * 1000 / hz))
}

/// Destroys (`ss -K`) the established TCP connections `pid` holds to
/// `port`, as a broken network or a proxy restart would. Works on a stopped
/// process too. Returns how many were cut.
pub async fn cut_connections(pid: u32, port: u16) -> Result<usize> {
    let out = tokio::process::Command::new("ss")
        .args(["-Htnp", "state", "established"])
        .arg(format!("( dport = :{port} )"))
        .output()
        .await
        .context("running ss")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let needle = format!("pid={pid},");
    let mut local_ports = Vec::new();
    for line in text.lines().filter(|l| l.contains(&needle)) {
        // Recv-Q Send-Q Local:Port Peer:Port Process
        let local = line.split_whitespace().nth(2).unwrap_or_default();
        if let Some(p) = local
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
        {
            local_ports.push(p);
        }
    }
    for lp in &local_ports {
        let status = tokio::process::Command::new("ss")
            .args(["-K", "-tn", "state", "established"])
            .arg(format!("( dport = :{port} and sport = :{lp} )"))
            .stdout(Stdio::null())
            .status()
            .await?;
        ensure!(status.success(), "ss -K failed: {status}");
    }
    Ok(local_ports.len())
}

// ---- the audit log ---------------------------------------------------------

/// One audited request (stage ResponseComplete, or ResponseStarted for
/// watches that are still open).
#[derive(Clone, Debug)]
pub struct AuditEvent {
    pub user: String,
    pub user_agent: String,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: Option<i64>,
    pub stage: String,
    /// When the apiserver received the request (`requestReceivedTimestamp`):
    /// a request sent just before a process froze lands after the freeze,
    /// and this tells it from one sent after the process resumed.
    pub received: Option<k8s_openapi::jiff::Timestamp>,
}

impl AuditEvent {
    /// A write (create, update, patch, delete, deletecollection).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// Reads the audit log from a mark onwards, across the apiserver's
/// rotations (at 100 MB it renames `audit.log` to `audit-TIME.log` and
/// starts a new one: a long run writes several).
pub struct Audit {
    path: PathBuf,
    offset: u64,
    /// The marked file's inode, which a rotation keeps under its new name.
    inode: Option<u64>,
}

impl Audit {
    /// Everything logged from now on.
    pub fn mark(cp: &ControlPlane) -> Self {
        Self::mark_file(&cp.dir().join("audit.log"))
    }

    /// Everything logged to `path` (an apiserver's `--audit-log-path`) from
    /// now on.
    pub fn mark_file(path: &Path) -> Self {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).ok();
        Self {
            path: path.to_path_buf(),
            offset: meta.as_ref().map_or(0, |m| m.len()),
            inode: meta.map(|m| m.ino()),
        }
    }

    /// Everything in the log at `path` and its rotated files, oldest first.
    pub fn whole(path: &Path) -> Result<Self> {
        let mut audit = Self::mark_file(path);
        audit.offset = 0;
        audit.inode = None;
        let first = audit.files_after(None)?.into_iter().next();
        if let Some((first, _)) = first {
            use std::os::unix::fs::MetadataExt;
            audit.inode = Some(std::fs::metadata(first)?.ino());
        }
        Ok(audit)
    }

    /// The files to read, each from where: the marked one (under whatever
    /// name it has now) from the mark, every later one whole. When the
    /// marked file is gone (a restarted apiserver started a new log), the
    /// current log from the mark, or whole if it is shorter.
    fn files(&self) -> Result<Vec<(PathBuf, u64)>> {
        self.files_after(self.inode)
    }

    fn files_after(&self, marked: Option<u64>) -> Result<Vec<(PathBuf, u64)>> {
        use std::os::unix::fs::MetadataExt;
        let dir = self
            .path
            .parent()
            .context("an audit log path without a directory")?;
        let stem = self
            .path
            .file_stem()
            .and_then(|s| s.to_str())
            .context("an audit log path without a name")?;
        // Rotated names carry the time of the rotation: they sort in order.
        let mut rotated: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{stem}-")) && n.ends_with(".log"))
            })
            .collect();
        rotated.sort();
        rotated.push(self.path.clone());
        let inode = |p: &Path| std::fs::metadata(p).ok().map(|m| m.ino());
        if let Some(i) = rotated
            .iter()
            .position(|p| marked.is_none() || inode(p) == marked)
        {
            return Ok(rotated
                .drain(i..)
                .enumerate()
                .map(|(k, p)| (p, if k == 0 { self.offset } else { 0 }))
                .collect());
        }
        let len = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        Ok(vec![(
            self.path.clone(),
            if len >= self.offset { self.offset } else { 0 },
        )])
    }

    /// Events since the mark (one per request: ResponseComplete, or
    /// ResponseStarted for a watch that has not completed).
    pub fn events(&self) -> Result<Vec<AuditEvent>> {
        let mut complete = Vec::new();
        let mut started: BTreeMap<String, AuditEvent> = BTreeMap::new();
        for (path, from) in self.files()? {
            let Ok(mut f) = std::fs::File::open(&path) else {
                continue;
            };
            f.seek(SeekFrom::Start(from))?;
            for line in BufReader::new(f).lines() {
                let line = line?;
                let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                let e = AuditEvent {
                    user: s(&ev["user"]["username"]),
                    user_agent: s(&ev["userAgent"]),
                    verb: s(&ev["verb"]),
                    resource: s(&ev["objectRef"]["resource"]),
                    subresource: s(&ev["objectRef"]["subresource"]),
                    namespace: s(&ev["objectRef"]["namespace"]),
                    name: s(&ev["objectRef"]["name"]),
                    code: ev["responseStatus"]["code"].as_i64(),
                    stage: s(&ev["stage"]),
                    received: ev["requestReceivedTimestamp"]
                        .as_str()
                        .and_then(|t| t.parse().ok()),
                };
                let id = s(&ev["auditID"]);
                match e.stage.as_str() {
                    "ResponseStarted" => {
                        started.insert(id, e);
                    }
                    "ResponseComplete" | "Panic" => {
                        started.remove(&id);
                        complete.push(e);
                    }
                    _ => {}
                }
            }
        }
        complete.extend(started.into_values());
        Ok(complete)
    }

    /// Requests made by `user` since the mark.
    pub fn by_user(&self, user: &str) -> Result<Vec<AuditEvent>> {
        Ok(self
            .events()?
            .into_iter()
            .filter(|e| e.user == user)
            .collect())
    }
}

// ---- the truth -------------------------------------------------------------

/// What `podReady` membership must publish for a Service whose ports are
/// `ports` (IPv4 only): every pod of the namespace in group `group` that is
/// Running, Ready, has an address and is not being deleted, under each port.
pub async fn ready_truth(ns: &TestNs, group: &str, ports: &[&str]) -> Result<ByPort> {
    let pods = ns.api::<Pod>().list(&ListParams::default()).await?.items;
    let ready: std::collections::BTreeSet<String> = pods
        .iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::GROUP_KEY))
                .map(String::as_str)
                == Some(group)
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let st = p.status.clone().unwrap_or_default();
            st.phase.as_deref() == Some("Running")
                && st.pod_ip.is_some()
                && st
                    .conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    Ok(ports
        .iter()
        .map(|p| ((p.to_string(), crate::V4.to_string()), ready.clone()))
        .collect())
}

/// Retries `op` (a request that may meet a restarting apiserver) for up to
/// `within`.
pub async fn retrying<T, F, Fut>(within: Duration, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let start = Instant::now();
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() >= within => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

// ---- probe targets that misbehave -----------------------------------------

/// How a [`BadTarget`] treats a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Accepts, reads the request, never answers.
    Silent,
    /// Sends a status line, then one header line every 100ms, forever.
    EndlessHeaders,
    /// `Content-Length: 1073741824`, then streams the gigabyte.
    GigabyteBody,
    /// `302` to the same path with `?hop=N+1`, every time.
    RedirectLoop,
    /// Half a response, then a TCP reset.
    ResetMidResponse,
    /// Never accepts, and its accept queue is full: SYNs go unanswered, so
    /// a dial hangs until its timeout.
    Blackhole,
}

/// One probe connection as the target saw it.
#[derive(Clone, Debug)]
pub struct Conn {
    pub opened: Instant,
    /// When the prober went away (EOF, reset, or a failed write).
    pub closed: Option<Instant>,
    pub bytes_sent: u64,
    /// The request path, once read.
    pub path: Option<String>,
}

impl Conn {
    /// How long the prober kept the connection (until now if still open).
    pub fn lifetime(&self) -> Duration {
        self.closed.unwrap_or_else(Instant::now) - self.opened
    }
}

/// A listener on a pod address that misbehaves in one way.
pub struct BadTarget {
    pub addr: SocketAddr,
    pub how: Misbehaviour,
    conns: Arc<Mutex<Vec<Conn>>>,
    task: Option<JoinHandle<()>>,
    /// Blackhole: the connections that fill the accept queue, and the
    /// listener itself (never accepted from).
    _held: Vec<TcpStream>,
    _listener: Option<tokio::net::TcpListener>,
}

impl BadTarget {
    pub async fn start(ip: impl Into<IpAddr>, port: u16, how: Misbehaviour) -> Result<Self> {
        let addr = SocketAddr::new(ip.into(), port);
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket
            .bind(addr)
            .with_context(|| format!("binding {addr} (inside tests/netns?)"))?;
        let conns: Arc<Mutex<Vec<Conn>>> = Arc::default();
        if how == Misbehaviour::Blackhole {
            // Backlog 0 holds one connection; fill it (and one more for
            // kernels that count from 1), then new SYNs are dropped.
            let listener = socket.listen(0)?;
            let mut held = Vec::new();
            for _ in 0..2 {
                if let Ok(Ok(s)) =
                    tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await
                {
                    held.push(s);
                }
            }
            return Ok(Self {
                addr,
                how,
                conns,
                task: None,
                _held: held,
                _listener: Some(listener),
            });
        }
        let listener = socket.listen(1024)?;
        let c = conns.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let idx = {
                    let mut v = c.lock().unwrap();
                    v.push(Conn {
                        opened: Instant::now(),
                        closed: None,
                        bytes_sent: 0,
                        path: None,
                    });
                    v.len() - 1
                };
                tokio::spawn(misbehave(stream, how, c.clone(), idx));
            }
        });
        Ok(Self {
            addr,
            how,
            conns,
            task: Some(task),
            _held: Vec::new(),
            _listener: None,
        })
    }

    /// Every connection seen so far.
    pub fn conns(&self) -> Vec<Conn> {
        self.conns.lock().unwrap().clone()
    }
}

impl Drop for BadTarget {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn read_head(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 16 * 1024 {
            return None;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    head.split_whitespace().nth(1).map(str::to_string)
}

async fn send(s: &mut TcpStream, sent: &AtomicU64, data: &[u8]) -> bool {
    let ok = s.write_all(data).await.is_ok();
    if ok {
        sent.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
    ok
}

async fn misbehave(mut s: TcpStream, how: Misbehaviour, conns: Arc<Mutex<Vec<Conn>>>, idx: usize) {
    let sent = AtomicU64::new(0);
    let path = read_head(&mut s).await;
    conns.lock().unwrap()[idx].path = path.clone();
    if path.is_some() {
        match how {
            Misbehaviour::Silent | Misbehaviour::Blackhole => {
                let mut sink = [0u8; 512];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            }
            Misbehaviour::EndlessHeaders => {
                if send(&mut s, &sent, b"HTTP/1.1 200 OK\r\n").await {
                    let mut i = 0u64;
                    loop {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        i += 1;
                        if !send(&mut s, &sent, format!("X-Drip-{i}: x\r\n").as_bytes()).await {
                            break;
                        }
                    }
                }
            }
            Misbehaviour::GigabyteBody => {
                let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1073741824\r\n\r\n";
                if send(&mut s, &sent, head).await {
                    let chunk = vec![b'x'; 64 * 1024];
                    for _ in 0..(1usize << 14) {
                        if !send(&mut s, &sent, &chunk).await {
                            break;
                        }
                    }
                }
            }
            Misbehaviour::RedirectLoop => {
                let p = path.clone().unwrap_or_default();
                let hop: u64 = p
                    .split_once("hop=")
                    .and_then(|(_, h)| h.parse().ok())
                    .unwrap_or(0);
                let base = p.split('?').next().unwrap_or("/");
                let resp = format!(
                    "HTTP/1.1 302 Found\r\nLocation: {base}?hop={}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    hop + 1
                );
                send(&mut s, &sent, resp.as_bytes()).await;
                let _ = s.shutdown().await;
                let mut sink = [0u8; 512];
                while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
            }
            Misbehaviour::ResetMidResponse => {
                send(
                    &mut s,
                    &sent,
                    b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial body",
                )
                .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                // SO_LINGER 0: close sends RST instead of FIN.
                #[allow(deprecated)]
                let _ = s.set_linger(Some(Duration::ZERO));
                drop(s);
            }
        }
    }
    let mut v = conns.lock().unwrap();
    v[idx].closed = Some(Instant::now());
    v[idx].bytes_sent = sent.load(Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, name: &str) -> String {
        format!(
            "{{\"auditID\":\"{id}\",\"stage\":\"ResponseComplete\",\"verb\":\"update\",\"user\":{{\"username\":\"u\"}},\"objectRef\":{{\"resource\":\"leases\",\"name\":\"{name}\"}},\"responseStatus\":{{\"code\":200}}}}\n"
        )
    }

    /// The apiserver renames a full log and starts a new one: what was
    /// logged after the mark in both is read, and nothing before it.
    #[test]
    fn events_follow_the_log_across_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.log");
        std::fs::write(&log, line("1", "before")).unwrap();
        let audit = Audit::mark_file(&log);
        let append = |text: String| {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&log)
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
        };
        append(line("2", "after-mark"));
        std::fs::rename(&log, dir.path().join("audit-2026-12-06T22-05-58.183.log")).unwrap();
        // The new log is longer than the mark's offset: read from the mark
        // in it, this would skip its first line and miss the rotated one.
        append(line("3", "new-log") + &line("4", "new-log-2"));
        let names: Vec<String> = audit
            .events()
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["after-mark", "new-log", "new-log-2"]);
    }
}
