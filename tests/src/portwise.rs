//! Running the controller under test: the one launcher every test, the
//! bench, the load driver and the demo use.
//!
//! Most scenarios run portwise in-process (`portwise_controller::run`)
//! watching only the test's namespace: fast to start, and its logs land in
//! the test's output. Restart and kill scenarios, the fault and shipping
//! tests, the config-file checks and the drivers run the real `portwise`
//! binary as a subprocess, since what they test is the process boundary
//! itself (its pid for SIGKILL, SIGSTOP, RSS and CPU; its identity; its
//! operations port; its log).
//!
//! ```no_run
//! # async fn demo(ns: &portwise_tests::TestNs, kc: &std::path::Path) -> anyhow::Result<()> {
//! use portwise_tests::*;
//! // In-process (the default), watching `ns`:
//! let _pw = Portwise::start(ns, &config("podReady")).await?;
//! // The binary, as another identity, with extra flags:
//! let mut pw = Portwise::builder(ns.cp())
//!     .namespace(ns.name())
//!     .config(&config("podReady"))
//!     .identity(kc)
//!     .args(&["--leader-elect"])
//!     .name("pw-a")
//!     .start()
//!     .await?;
//! pw.wait_ready().await?;
//! pw.freeze()?;
//! pw.thaw()?;
//! pw.kill().await?;
//! pw.start_again().await?;
//! let _took = pw.stop().await?;
//! # Ok(()) }
//! ```

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use tokio::{process::Child, sync::oneshot};

use crate::{ControlPlane, SETTLE, TestNs, ops::Metrics};

/// How long a graceful stop may take before it counts as a failure.
const STOP_WITHIN: Duration = Duration::from_secs(30);
/// How much of a binary's log is echoed when its handle is dropped.
const LOG_TAIL: usize = 400;
/// How much of it an error (an early exit, a failed stop) quotes.
const ERROR_TAIL: usize = 60;

/// How to launch portwise; made by [`Portwise::builder`], consumed by
/// [`Launch::start`].
#[derive(Clone, Debug)]
pub struct Launch {
    cp: &'static ControlPlane,
    name: String,
    namespaces: Vec<String>,
    config: String,
    binary: bool,
    kubeconfig: Option<PathBuf>,
    args: Vec<String>,
    bin: Option<PathBuf>,
    dir: Option<PathBuf>,
    log_filter: Option<String>,
    echo_logs: bool,
    /// Environment variables for the binary (`POD_NAME`, ...).
    envs: Vec<(String, String)>,
}

impl Launch {
    /// Sets an environment variable of the binary (the test's own
    /// environment never reaches it).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.into(), value.into()));
        self
    }

    /// Watch `ns` (repeat for several). None: every namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespaces.push(ns.to_string());
        self
    }

    /// Watch these namespaces (empty: every namespace).
    pub fn namespaces(mut self, namespaces: &[&str]) -> Self {
        self.namespaces
            .extend(namespaces.iter().map(|s| s.to_string()));
        self
    }

    /// The config file's YAML.
    pub fn config(mut self, yaml: &str) -> Self {
        self.config = yaml.to_string();
        self
    }

    /// Run the real binary even when the `in-process` feature is on.
    pub fn binary(mut self) -> Self {
        self.binary = true;
        self
    }

    /// Act as `kubeconfig`'s identity (default: the admin kubeconfig).
    /// Only a process has one of its own, so this implies [`Launch::binary`].
    pub fn identity(mut self, kubeconfig: &Path) -> Self {
        self.kubeconfig = Some(kubeconfig.to_path_buf());
        self.binary = true;
        self
    }

    /// Extra `portwise run` flags; implies [`Launch::binary`].
    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|s| s.to_string()));
        self.binary = true;
        self
    }

    /// `--leader-elect` with its Lease in `lease_namespace`, a `lease_secs`
    /// lease, and `--identity id`; implies [`Launch::binary`].
    pub fn leader_elect(self, lease_namespace: &str, lease_secs: u64, id: &str) -> Self {
        self.args(&[
            "--leader-elect",
            "--lease-namespace",
            lease_namespace,
            "--lease-duration",
            &format!("{lease_secs}s"),
            "--identity",
            id,
        ])
    }

    /// Names this portwise in its log, its files and failure messages
    /// (default `portwise`).
    pub fn name(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }

    /// The binary to run (default: [`portwise_bin`]); implies
    /// [`Launch::binary`].
    pub fn bin(mut self, bin: &Path) -> Self {
        self.bin = Some(bin.to_path_buf());
        self.binary = true;
        self
    }

    /// Keep the config and log as `DIR/NAME.yaml` and `DIR/NAME.log`
    /// (default: a temporary directory, removed with the handle).
    pub fn dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// The binary's `RUST_LOG` (default: `$PORTWISE_CHILD_LOG`, else
    /// `$RUST_LOG`, else `info`).
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = Some(filter.to_string());
        self
    }

    /// Do not echo the binary's log when the handle is dropped (the test
    /// harness shows that echo for failing tests only; a driver would print
    /// it every time).
    pub fn quiet(mut self) -> Self {
        self.echo_logs = false;
        self
    }

    /// Starts it.
    pub async fn start(mut self) -> Result<Portwise> {
        // Without the in-process controller there is only the binary.
        self.binary |= !cfg!(feature = "in-process");
        let (dir, tmp) = match &self.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix(&format!("{}-run-", self.name))
                    .tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let metrics = if self.binary {
            Some(SocketAddr::from(([127, 0, 0, 1], free_port()?)))
        } else {
            None
        };
        let mut pw = Portwise {
            launch: self,
            run: None,
            dir,
            _tmp: tmp,
            metrics,
            starts: 0,
            started: Instant::now(),
            swaps: 0,
        };
        pw.launch().await?;
        Ok(pw)
    }
}

/// A running (or stopped) portwise.
pub struct Portwise {
    launch: Launch,
    run: Option<Running>,
    /// Holds the config file and the binary's log.
    dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// The binary's operations port (`--metrics-addr`), the same every run.
    metrics: Option<SocketAddr>,
    starts: usize,
    started: Instant,
    /// Config swaps so far ([`Portwise::swap_config`]).
    swaps: usize,
}

enum Running {
    /// The controller runs on a thread of its own with its own runtime, so
    /// that its futures need not be `Send` and a kill drops every task it
    /// spawned, like a process exit would.
    #[cfg_attr(not(feature = "in-process"), allow(dead_code))]
    InProcess {
        shutdown: Option<oneshot::Sender<()>>,
        kill: Option<oneshot::Sender<()>>,
        done: oneshot::Receiver<Result<()>>,
    },
    Binary {
        child: Child,
    },
}

impl Portwise {
    /// How to launch portwise on `cp`: in-process when the `in-process`
    /// feature is on (the default), else as the binary; watching every
    /// namespace until told otherwise.
    pub fn builder(cp: &'static ControlPlane) -> Launch {
        Launch {
            cp,
            name: "portwise".into(),
            namespaces: Vec::new(),
            config: String::new(),
            binary: false,
            kubeconfig: None,
            args: Vec::new(),
            bin: None,
            dir: None,
            log_filter: None,
            echo_logs: true,
            envs: Vec::new(),
        }
    }

    /// Starts portwise watching only `ns`, in-process when the `in-process`
    /// feature is on (the default), else as the binary.
    pub async fn start(ns: &TestNs, config_yaml: &str) -> Result<Self> {
        Self::builder(ns.cp())
            .namespace(ns.name())
            .config(config_yaml)
            .start()
            .await
    }

    /// Starts the real `portwise` binary watching only `ns`.
    pub async fn spawn_binary(ns: &TestNs, config_yaml: &str) -> Result<Self> {
        Self::builder(ns.cp())
            .namespace(ns.name())
            .config(config_yaml)
            .binary()
            .start()
            .await
    }

    pub fn name(&self) -> &str {
        &self.launch.name
    }

    /// When the current run was started.
    pub fn started_at(&self) -> Instant {
        self.started
    }

    /// The binary's pid (`None` in-process or when stopped).
    pub fn pid(&self) -> Option<u32> {
        match &self.run {
            Some(Running::Binary { child }) => child.id(),
            _ => None,
        }
    }

    /// The binary's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.launch.name))
    }

    /// The binary's combined stdout and stderr so far (all runs).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Log lines of the current run only.
    pub fn current_logs(&self) -> String {
        let all = self.logs();
        all.split_once(&self.start_marker())
            .map(|(_, rest)| rest.to_string())
            .unwrap_or(all)
    }

    /// Waits (up to `within`) for the current run of the binary to log a
    /// line containing `needle`: the signal a test waits for instead of a
    /// sleep (e.g. `cold start: every Service reconciled once`).
    pub async fn wait_for_log(&self, needle: &str, within: Duration) -> Result<()> {
        crate::wait_for(within, || async {
            ensure!(
                self.current_logs().contains(needle),
                "{} has not logged {needle:?} yet",
                self.launch.name
            );
            Ok(())
        })
        .await
    }

    fn start_marker(&self) -> String {
        format!("==== {} start #{} ====", self.launch.name, self.starts)
    }

    /// Graceful stop: the shutdown future (in-process) or SIGTERM (binary).
    /// Fails if portwise does not stop within 30s or stopped with an error
    /// (portwise promises exit 0). Returns how long it took.
    pub async fn stop(&mut self) -> Result<Duration> {
        self.stop_within(STOP_WITHIN).await
    }

    /// [`Portwise::stop`] with another deadline.
    pub async fn stop_within(&mut self, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        let name = self.launch.name.clone();
        match self.run.take() {
            None => Ok(started.elapsed()),
            Some(Running::InProcess {
                shutdown,
                kill,
                done,
            }) => {
                if let Some(tx) = shutdown {
                    let _ = tx.send(());
                }
                let res = tokio::time::timeout(within, done).await;
                drop(kill);
                match res {
                    Err(_) => bail!("{name} did not stop within {within:?} of shutdown"),
                    Ok(Err(_)) => bail!("{name}'s thread panicked"),
                    Ok(Ok(res)) => res.map(|()| started.elapsed()),
                }
            }
            Some(Running::Binary { mut child }) => {
                if let Some(pid) = child.id() {
                    // SAFETY: signalling our own child by pid; not reaped yet.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
                match tokio::time::timeout(within, child.wait()).await {
                    Err(_) => {
                        let _ = child.kill().await;
                        bail!(
                            "{name} did not exit within {within:?} of SIGTERM\n{}",
                            self.log_tail(ERROR_TAIL)
                        )
                    }
                    Ok(status) => {
                        let status = status?;
                        ensure!(
                            status.success(),
                            "{name} exited with {status} after SIGTERM, expected 0\n{}",
                            self.log_tail(ERROR_TAIL)
                        );
                        Ok(started.elapsed())
                    }
                }
            }
        }
    }

    /// Abrupt stop: SIGKILL, and reaps the process (binary), or drops the
    /// controller's tasks mid-flight (in-process).
    pub async fn kill(&mut self) -> Result<()> {
        match self.run.take() {
            None => {}
            Some(Running::InProcess { kill, done, .. }) => {
                if let Some(tx) = kill {
                    let _ = tx.send(());
                }
                let _ = tokio::time::timeout(STOP_WITHIN, done).await;
            }
            Some(Running::Binary { mut child }) => {
                // Fails only when it has exited already; gone either way.
                let _ = child.start_kill();
                child.wait().await?;
            }
        }
        Ok(())
    }

    /// Sends `sig` to the binary.
    pub fn signal(&self, sig: i32) -> Result<()> {
        let pid = self.pid().context("portwise is not running as a process")?;
        // SAFETY: signalling our own child by pid; not reaped yet.
        let rc = unsafe { libc::kill(pid as i32, sig) };
        ensure!(rc == 0, "kill({pid}, {sig}) failed");
        Ok(())
    }

    /// SIGSTOP: the process stays, its connections open, and does nothing.
    pub fn freeze(&self) -> Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// SIGCONT after [`Portwise::freeze`].
    pub fn thaw(&self) -> Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// Stops gracefully and starts again with the same config.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.launch().await
    }

    /// Stops gracefully and starts again with a new config.
    pub async fn restart_with(&mut self, config_yaml: &str) -> Result<()> {
        self.stop().await?;
        self.launch.config = config_yaml.to_string();
        self.launch().await
    }

    /// Replaces the running binary's config file the way the kubelet
    /// updates a mounted ConfigMap: the new content in a directory of its
    /// own, the `..data` symlink swapped to it in one rename, and the file
    /// a symlink through `..data`. Nothing is restarted.
    pub fn swap_config(&mut self, config_yaml: &str) -> Result<()> {
        let name = format!("{}.yaml", self.launch.name);
        self.swaps += 1;
        let version = format!("..{}_{}", std::process::id(), self.swaps);
        std::fs::create_dir(self.dir.join(&version))?;
        std::fs::write(self.dir.join(&version).join(&name), config_yaml)?;
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&version, &tmp)?;
        std::fs::rename(&tmp, self.dir.join("..data"))?;
        let file = self.dir.join(&name);
        if !file.is_symlink() {
            let link_tmp = self.dir.join(format!("{name}.tmp"));
            std::os::unix::fs::symlink(format!("..data/{name}"), &link_tmp)?;
            std::fs::rename(&link_tmp, &file)?;
        }
        self.launch.config = config_yaml.to_string();
        Ok(())
    }

    /// Starts again after `stop` or `kill`: same config, flags and port.
    pub async fn start_again(&mut self) -> Result<()> {
        if self.run.is_some() {
            bail!("{} is still running", self.launch.name);
        }
        self.launch().await
    }

    /// Fails if portwise has exited on its own (it should run until stopped).
    pub fn check_running(&mut self) -> Result<()> {
        let name = self.launch.name.clone();
        match &mut self.run {
            None => bail!("{name} is not running"),
            Some(Running::InProcess { done, .. }) => match done.try_recv() {
                Ok(Ok(())) => bail!("{name} exited on its own without an error"),
                Ok(Err(e)) => bail!("{name} exited on its own: {e:#}"),
                Err(oneshot::error::TryRecvError::Closed) => bail!("{name}'s thread panicked"),
                Err(oneshot::error::TryRecvError::Empty) => Ok(()),
            },
            Some(Running::Binary { child }) => match child.try_wait()? {
                Some(status) => bail!(
                    "{name} exited on its own with {status}\n{}",
                    self.log_tail(ERROR_TAIL)
                ),
                None => Ok(()),
            },
        }
    }

    /// The binary's operations port (`/metrics`, `/healthz`, `/readyz`).
    pub fn metrics_addr(&self) -> Result<SocketAddr> {
        self.metrics
            .context("portwise in-process has no operations port")
    }

    /// GET on its operations port: (status, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        crate::ops::http_get(self.metrics_addr()?, path).await
    }

    /// Its `/metrics` as text.
    pub async fn metrics_text(&self) -> Result<String> {
        let (status, body) = self.get("/metrics").await?;
        ensure!(status == 200, "{} /metrics answered {status}", self.name());
        Ok(body)
    }

    /// Its `/metrics`, parsed.
    pub async fn scrape(&self) -> Result<Metrics> {
        Ok(Metrics::parse(&self.metrics_text().await?))
    }

    /// Pods in its cache: `portwise_cache_objects{kind="pods"}`.
    pub async fn cached_pods(&self) -> Result<f64> {
        Ok(self
            .scrape()
            .await?
            .sum("portwise_cache_objects", &[("kind", "pods")]))
    }

    /// Waits until `/readyz` answers 200 (caches synced); fails at once if
    /// the process exits meanwhile. Returns how long that took.
    pub async fn wait_ready(&mut self) -> Result<Duration> {
        let started = Instant::now();
        loop {
            self.check_running()?;
            let last = match self.get("/readyz").await {
                Ok((200, _)) => return Ok(started.elapsed()),
                Ok((status, body)) => format!("/readyz {status}: {}", body.trim()),
                Err(e) => format!("{e:#}"),
            };
            if started.elapsed() > SETTLE {
                bail!("{} not ready within {SETTLE:?}: {last}", self.name());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Resident set size now and at its peak (VmRSS, VmHWM), in KiB.
    pub fn memory_kib(&self) -> Result<(u64, u64)> {
        let pid = self.pid().context("portwise is not running as a process")?;
        crate::faults::proc_memory_kib(pid)
    }

    /// CPU time (user + system) used so far.
    pub fn cpu_time(&self) -> Result<Duration> {
        let pid = self.pid().context("portwise is not running as a process")?;
        crate::faults::proc_cpu_time(pid)
    }

    fn log_tail(&self, n: usize) -> String {
        let logs = self.logs();
        let lines: Vec<&str> = logs.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    async fn launch(&mut self) -> Result<()> {
        self.starts += 1;
        self.started = Instant::now();
        self.run = Some(if self.launch.binary {
            self.launch_binary()?
        } else {
            self.launch_in_process()?
        });
        Ok(())
    }

    fn launch_binary(&mut self) -> Result<Running> {
        let l = &self.launch;
        let config_path = self.dir.join(format!("{}.yaml", l.name));
        std::fs::write(&config_path, &l.config)?;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        use std::io::Write as _;
        writeln!(log, "{}", self.start_marker())?;
        let bin = match &l.bin {
            Some(b) => b.clone(),
            None => portwise_bin()?,
        };
        let filter = match &l.log_filter {
            Some(f) => f.clone(),
            None => std::env::var("PORTWISE_CHILD_LOG")
                .or_else(|_| std::env::var("RUST_LOG"))
                .unwrap_or_else(|_| "info".into()),
        };
        let mut cmd = tokio::process::Command::new(&bin);
        cmd.arg("run").arg("--config").arg(&config_path);
        for ns in &l.namespaces {
            cmd.arg("--namespace").arg(ns);
        }
        if let Some(addr) = self.metrics {
            cmd.arg("--metrics-addr").arg(addr.to_string());
        }
        cmd.args(&l.args)
            .env(
                "KUBECONFIG",
                l.kubeconfig.as_deref().unwrap_or(l.cp.kubeconfig()),
            )
            // The test's own environment must not configure the process:
            // what it is told comes from here.
            .env_remove("PORTWISE_LOG")
            .env_remove("POD_NAME")
            .env_remove("POD_NAMESPACE")
            .env("RUST_LOG", filter)
            .envs(l.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        Ok(Running::Binary { child })
    }

    #[cfg(feature = "in-process")]
    fn launch_in_process(&mut self) -> Result<Running> {
        let l = &self.launch;
        ensure!(
            l.kubeconfig.is_none() && l.args.is_empty(),
            "an identity or flags need the binary"
        );
        // Parse here so a bad test config fails the test at once; the thread
        // parses its own copy (Config need not be Send).
        portwise_core::config::Config::from_yaml(&l.config)
            .map_err(|e| anyhow!("test config rejected: {e}\n{}", l.config))?;
        let cp = l.cp;
        let yaml = l.config.clone();
        let namespaces = l.namespaces.clone();
        let label = namespaces.join(",");
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel::<Result<()>>();
        std::thread::Builder::new()
            .name(format!("portwise {label}"))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = done_tx.send(Err(e.into()));
                        return;
                    }
                };
                let agent = format!("portwise/{label}");
                let res = rt.block_on(async move {
                    let config = portwise_core::config::Config::from_yaml(&yaml)
                        .map_err(|e| anyhow!("test config rejected: {e}"))?;
                    // A distinct user agent lets the audit log tell this
                    // controller's writes from the test's own.
                    let client = cp.client_with_agent(&agent).await?;
                    let opts = portwise_controller::RunOptions {
                        namespaces,
                        ..Default::default()
                    };
                    let run = portwise_controller::run(client, config, opts, async move {
                        let _ = shutdown_rx.await;
                    });
                    tokio::select! {
                        biased;
                        _ = kill_rx => Ok(()),
                        res = run => res.map_err(|e| anyhow!("portwise_controller::run failed: {e:?}")),
                    }
                });
                // Dropping the runtime cancels whatever the controller spawned.
                rt.shutdown_timeout(Duration::from_secs(5));
                if let Err(e) = &res {
                    eprintln!("portwise ({label}) exited: {e:#}");
                }
                let _ = done_tx.send(res);
            })?;
        Ok(Running::InProcess {
            shutdown: Some(shutdown_tx),
            kill: Some(kill_tx),
            done: done_rx,
        })
    }

    #[cfg(not(feature = "in-process"))]
    fn launch_in_process(&mut self) -> Result<Running> {
        self.launch_binary()
    }
}

impl Drop for Portwise {
    fn drop(&mut self) {
        match self.run.take() {
            // Dropping the senders ends the controller's thread.
            Some(Running::InProcess { .. }) => {}
            Some(Running::Binary { mut child }) => {
                let _ = child.start_kill();
            }
            None => {}
        }
        // The harness shows captured output only for failing tests.
        if self.launch.binary && self.launch.echo_logs {
            eprintln!(
                "---- {} log (last {LOG_TAIL} lines) ----\n{}",
                self.launch.name,
                self.log_tail(LOG_TAIL)
            );
        }
    }
}

/// A port on 127.0.0.1 that was free a moment ago, for a server another
/// process binds later; never the same port twice in one test process.
///
/// Drawn below Linux's ephemeral range (32768-60999), not with `bind(:0)`:
/// a port from that range can be taken as the source port of any outgoing
/// connection before the server binds it (kube-proxy's metrics port was,
/// in a cold CI run: `bind: address already in use`).
///
/// Every port handed out is remembered: a port is only free until its
/// server binds it, so two draws a moment apart (Traefik's two entry
/// points, in a CI run) could both get it and the second server fail.
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..10_000 {
        let port = fastrand::u16(20000..32000);
        if !handed_out.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(anyhow!(
        "no free port in 20000-31999 on 127.0.0.1 ({} handed out already)",
        handed_out.len()
    ))
}

/// Where `guests/build` puts the example guests: `$PORTWISE_GUESTS_DIR`,
/// default `~/.cache/portwise/guests`.
pub fn guests_dir() -> PathBuf {
    std::env::var_os("PORTWISE_GUESTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/portwise/guests")
        })
}

/// The `portwise` binary: `$PORTWISE_BIN`, else `$CARGO_TARGET_DIR/debug/portwise`,
/// else next to this test binary's directory (target/debug/deps/..).
pub fn portwise_bin() -> Result<PathBuf> {
    let candidates = [
        std::env::var_os("PORTWISE_BIN").map(PathBuf::from),
        std::env::var_os("CARGO_TARGET_DIR").map(|d| Path::new(&d).join("debug/portwise")),
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent()?.parent().map(|d| d.join("portwise"))),
    ];
    for c in candidates.into_iter().flatten() {
        if c.is_file() {
            return Ok(c);
        }
    }
    Err(anyhow!(
        "no portwise binary found: set PORTWISE_BIN or run `cargo build -p portwise --bin portwise` first"
    ))
}

/// What a binary run that was expected to exit did.
#[derive(Debug)]
pub struct BinaryOutcome {
    /// The exit code; `None` when killed by a signal or by the timeout.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `portwise ARGS...` with `config_yaml` written to a file whose path
/// replaces `{config}` in `args`, and waits up to `timeout` for it to exit.
/// KUBECONFIG points at the test control plane when one is exported, else at
/// an unreachable apiserver, so a config error must be reported before
/// portwise ever needs the cluster.
pub async fn run_binary_to_exit(
    args: &[&str],
    config_yaml: &str,
    timeout: Duration,
) -> Result<BinaryOutcome> {
    run_binary(args, config_yaml, timeout, None, &[]).await
}

/// [`run_binary_to_exit`] with extra environment variables (`POD_NAME`,
/// say, which makes portwise publish its module Events on that Pod).
pub async fn run_binary_to_exit_with_env(
    args: &[&str],
    config_yaml: &str,
    timeout: Duration,
    env: &[(&str, &str)],
) -> Result<BinaryOutcome> {
    run_binary(args, config_yaml, timeout, None, env).await
}

/// `portwise check --live --config CONFIG --service NAMESPACE/NAME`
/// against `cp`, run to its exit (within a minute).
pub async fn check_live_on(
    cp: &ControlPlane,
    config_yaml: &str,
    service: &str,
) -> Result<BinaryOutcome> {
    run_binary_to_exit_on(
        cp,
        &[
            "check",
            "--live",
            "--config",
            "{config}",
            "--service",
            service,
        ],
        config_yaml,
        Duration::from_secs(60),
    )
    .await
}

/// [`run_binary_to_exit`] against `cp`, whichever control plane the run
/// exported.
pub async fn run_binary_to_exit_on(
    cp: &ControlPlane,
    args: &[&str],
    config_yaml: &str,
    timeout: Duration,
) -> Result<BinaryOutcome> {
    run_binary(
        args,
        config_yaml,
        timeout,
        Some(cp.kubeconfig().to_path_buf()),
        &[],
    )
    .await
}

async fn run_binary(
    args: &[&str],
    config_yaml: &str,
    timeout: Duration,
    kubeconfig: Option<PathBuf>,
    env: &[(&str, &str)],
) -> Result<BinaryOutcome> {
    let dir = tempfile::Builder::new().prefix("portwise-cfg-").tempdir()?;
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config_yaml)?;
    let kubeconfig = match kubeconfig
        .or_else(|| std::env::var_os("PORTWISE_TEST_KUBECONFIG").map(PathBuf::from))
    {
        Some(k) => k,
        None => crate::identity::unreachable_kubeconfig(&dir.path().join("kubeconfig"))?,
    };
    let config_str = config_path.to_string_lossy().to_string();
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("{config}", &config_str))
        .collect();
    let mut child = tokio::process::Command::new(portwise_bin()?)
        .args(&args)
        .env("KUBECONFIG", kubeconfig)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let out = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut s).await;
        s
    });
    let err = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut s).await;
        s
    });
    let (code, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => (status?.code(), false),
        Err(_) => {
            let _ = child.kill().await;
            (None, true)
        }
    };
    Ok(BinaryOutcome {
        code,
        timed_out,
        stdout: out.await?,
        stderr: err.await?,
    })
}
