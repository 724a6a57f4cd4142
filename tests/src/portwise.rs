//! Running the controller under test.
//!
//! Most scenarios run portwise in-process (`portwise::controller::run`)
//! watching only the test's namespace: fast to start, and its logs land in
//! the test's output. Restart and kill scenarios, and the config-file checks,
//! run the real `portwise` binary as a subprocess, since what they test is
//! the process boundary itself.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context, Result, anyhow, bail};
use tokio::{process::Child, sync::oneshot};

use crate::{ControlPlane, TestNs};

/// A running (or stopped) portwise.
pub struct Portwise {
    cp: &'static ControlPlane,
    namespaces: Vec<String>,
    config: String,
    binary: bool,
    run: Option<Running>,
    /// Holds the config file and the binary's log.
    dir: tempfile::TempDir,
    starts: usize,
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
    /// Starts portwise watching only `ns`, in-process when the `in-process`
    /// feature is on (the default), else as the binary.
    pub async fn start(ns: &TestNs, config_yaml: &str) -> Result<Self> {
        Self::start_watching(
            ns.cp(),
            &[ns.name()],
            config_yaml,
            !cfg!(feature = "in-process"),
        )
        .await
    }

    /// Starts the real `portwise` binary watching only `ns`.
    pub async fn spawn_binary(ns: &TestNs, config_yaml: &str) -> Result<Self> {
        Self::start_watching(ns.cp(), &[ns.name()], config_yaml, true).await
    }

    /// Starts portwise watching `namespaces` (empty: all).
    pub async fn start_watching(
        cp: &'static ControlPlane,
        namespaces: &[&str],
        config_yaml: &str,
        binary: bool,
    ) -> Result<Self> {
        let mut pw = Self {
            cp,
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            config: config_yaml.to_string(),
            binary,
            run: None,
            dir: tempfile::Builder::new().prefix("portwise-run-").tempdir()?,
            starts: 0,
        };
        pw.launch().await?;
        Ok(pw)
    }

    /// The binary's combined stdout and stderr so far (all runs).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("portwise.log")).unwrap_or_default()
    }

    /// Graceful stop: the shutdown future (in-process) or SIGTERM (binary).
    /// Fails if portwise does not stop within 30s or stopped with an error.
    pub async fn stop(&mut self) -> Result<()> {
        match self.run.take() {
            None => Ok(()),
            Some(Running::InProcess {
                shutdown,
                kill,
                done,
            }) => {
                if let Some(tx) = shutdown {
                    let _ = tx.send(());
                }
                let res = tokio::time::timeout(Duration::from_secs(30), done).await;
                drop(kill);
                match res {
                    Err(_) => bail!("portwise did not stop within 30s of shutdown"),
                    Ok(Err(_)) => bail!("portwise's thread panicked"),
                    Ok(Ok(res)) => res,
                }
            }
            Some(Running::Binary { mut child }) => {
                if let Some(pid) = child.id() {
                    // SAFETY: signalling our own child by pid.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
                match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
                    Err(_) => {
                        let _ = child.kill().await;
                        bail!(
                            "portwise did not exit within 30s of SIGTERM\n{}",
                            self.logs()
                        )
                    }
                    Ok(status) => {
                        let status = status?;
                        if !status.success() {
                            bail!(
                                "portwise exited with {status} after SIGTERM\n{}",
                                self.logs()
                            );
                        }
                        Ok(())
                    }
                }
            }
        }
    }

    /// Abrupt stop: SIGKILL (binary) or dropping the task mid-flight.
    pub async fn kill(&mut self) {
        match self.run.take() {
            None => {}
            Some(Running::InProcess { kill, done, .. }) => {
                if let Some(tx) = kill {
                    let _ = tx.send(());
                }
                let _ = tokio::time::timeout(Duration::from_secs(30), done).await;
            }
            Some(Running::Binary { mut child }) => {
                let _ = child.kill().await;
            }
        }
    }

    /// Stops gracefully and starts again with the same config.
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.launch().await
    }

    /// Stops gracefully and starts again with a new config.
    pub async fn restart_with(&mut self, config_yaml: &str) -> Result<()> {
        self.stop().await?;
        self.config = config_yaml.to_string();
        self.launch().await
    }

    /// Starts again after `stop` or `kill`.
    pub async fn start_again(&mut self) -> Result<()> {
        if self.run.is_some() {
            bail!("portwise is still running");
        }
        self.launch().await
    }

    /// Fails if portwise has exited on its own (it should run until stopped).
    pub fn check_running(&mut self) -> Result<()> {
        match &mut self.run {
            None => bail!("portwise is not running"),
            Some(Running::InProcess { done, .. }) => match done.try_recv() {
                Ok(Ok(())) => bail!("portwise exited on its own without an error"),
                Ok(Err(e)) => bail!("portwise exited on its own: {e:#}"),
                Err(oneshot::error::TryRecvError::Closed) => bail!("portwise's thread panicked"),
                Err(oneshot::error::TryRecvError::Empty) => Ok(()),
            },
            Some(Running::Binary { child }) => match child.try_wait()? {
                Some(status) => bail!("portwise exited on its own with {status}\n{}", self.logs()),
                None => Ok(()),
            },
        }
    }

    async fn launch(&mut self) -> Result<()> {
        self.starts += 1;
        self.run = Some(if self.binary {
            self.launch_binary().await?
        } else {
            self.launch_in_process().await?
        });
        Ok(())
    }

    async fn launch_binary(&mut self) -> Result<Running> {
        let config_path = self.dir.path().join(format!("config-{}.yaml", self.starts));
        std::fs::write(&config_path, &self.config)?;
        let log_path = self.dir.path().join("portwise.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = tokio::process::Command::new(portwise_bin()?);
        cmd.arg("run").arg("--config").arg(&config_path);
        for ns in &self.namespaces {
            cmd.arg("--namespace").arg(ns);
        }
        cmd.env("KUBECONFIG", self.cp.kubeconfig())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().context("spawning portwise")?;
        Ok(Running::Binary { child })
    }

    #[cfg(feature = "in-process")]
    async fn launch_in_process(&mut self) -> Result<Running> {
        // Parse here so a bad test config fails the test at once; the thread
        // parses its own copy (Config need not be Send).
        portwise_core::config::Config::from_yaml(&self.config)
            .map_err(|e| anyhow!("test config rejected: {e}\n{}", self.config))?;
        let cp = self.cp;
        let yaml = self.config.clone();
        let namespaces = self.namespaces.clone();
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
    async fn launch_in_process(&mut self) -> Result<Running> {
        self.launch_binary().await
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
        if self.binary {
            eprintln!("---- portwise binary log ----\n{}", self.logs());
        }
    }
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
    let dir = tempfile::Builder::new().prefix("portwise-cfg-").tempdir()?;
    let config_path = dir.path().join("config.yaml");
    std::fs::write(&config_path, config_yaml)?;
    let kubeconfig = match std::env::var_os("PORTWISE_TEST_KUBECONFIG") {
        Some(k) => PathBuf::from(k),
        None => {
            let k = dir.path().join("kubeconfig");
            std::fs::write(&k, UNREACHABLE_KUBECONFIG)?;
            k
        }
    };
    let config_str = config_path.to_string_lossy().to_string();
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("{config}", &config_str))
        .collect();
    let mut child = tokio::process::Command::new(portwise_bin()?)
        .args(&args)
        .env("KUBECONFIG", kubeconfig)
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

const UNREACHABLE_KUBECONFIG: &str = "\
apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}
users:
- name: none
  user: {token: none}
contexts:
- name: none
  context: {cluster: none, user: none}
current-context: none
";
