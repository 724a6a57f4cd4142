//! The local control plane the tests talk to.
//!
//! Starting kube-apiserver costs seconds, so one control plane serves a whole
//! run: the test command starts it and exports `PORTWISE_TEST_KUBECONFIG`.
//! When that is unset (running one test binary by hand), the first test
//! starts one for this binary and an `atexit` hook stops it, because the test
//! harness never runs static destructors.

use std::{
    path::{Path, PathBuf},
    sync::Mutex,
};

use anyhow::{Context, Result, bail};
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use tokio::sync::OnceCell;

/// Native controllers a self-started control plane runs beside portwise.
const CONTROLLERS: &str = "endpointslice,endpointslicemirroring,garbagecollector,namespace";

/// A running kube-apiserver (plus the native controllers named above).
#[derive(Debug)]
pub struct ControlPlane {
    kubeconfig: PathBuf,
    /// The control plane's state directory (`start DIR`): holds the
    /// kubeconfig and, when enabled, `audit.log`.
    dir: PathBuf,
    /// Kept alive while we own the directory.
    _tmp: Option<tempfile::TempDir>,
}

static SHARED: OnceCell<ControlPlane> = OnceCell::const_new();
/// Directory of a control plane this process started, for the exit hook.
static STARTED: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The repository root (tests/..).
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Runs one of the tests' cached tool builds (`tests/coredns/build`, ...),
/// which prints the binary's path on stdout once it is built or found.
pub fn built_tool(script: &str) -> anyhow::Result<PathBuf> {
    use anyhow::Context as _;
    let out = std::process::Command::new(repo_root().join(script))
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {script}"))?;
    if !out.status.success() {
        anyhow::bail!("{script} failed ({})", out.status);
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

impl ControlPlane {
    /// The control plane for this test process: the one named by
    /// `PORTWISE_TEST_KUBECONFIG`, else one started once for this binary.
    pub async fn shared() -> Result<&'static ControlPlane> {
        crate::init_tracing();
        ensure_in_test_netns()?;
        SHARED.get_or_try_init(Self::reuse_or_start).await
    }

    async fn reuse_or_start() -> Result<ControlPlane> {
        if let Some(path) = std::env::var_os("PORTWISE_TEST_KUBECONFIG") {
            let kubeconfig = PathBuf::from(path);
            if !kubeconfig.is_file() {
                bail!(
                    "PORTWISE_TEST_KUBECONFIG={} is not a file; start a control plane with \
                     tests/control-plane/start DIR and point it at DIR/kubeconfig",
                    kubeconfig.display()
                );
            }
            // The test command also exports the directory; by convention the
            // kubeconfig sits in it.
            let dir = std::env::var_os("PORTWISE_TEST_CP_DIR")
                .map(PathBuf::from)
                .or_else(|| kubeconfig.parent().map(Path::to_path_buf))
                .unwrap_or_default();
            return Ok(ControlPlane {
                kubeconfig,
                dir,
                _tmp: None,
            });
        }
        let tmp = tempfile::Builder::new().prefix("portwise-cp-").tempdir()?;
        let dir = tmp.path().to_path_buf();
        let start = repo_root().join("tests/control-plane/start");
        if !start.exists() {
            bail!(
                "{} does not exist yet: the local control plane is not built",
                start.display()
            );
        }
        eprintln!(
            "portwise-tests: starting a control plane in {}",
            dir.display()
        );
        let status = tokio::process::Command::new(&start)
            .arg(&dir)
            .arg("--controllers")
            .arg(CONTROLLERS)
            .status()
            .await
            .with_context(|| format!("running {}", start.display()))?;
        if !status.success() {
            bail!("{} {} failed: {status}", start.display(), dir.display());
        }
        *STARTED.lock().unwrap() = Some(dir.clone());
        // SAFETY: registering a plain extern "C" fn with no captured state.
        unsafe { libc::atexit(stop_started_control_plane) };
        Ok(ControlPlane {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            _tmp: Some(tmp),
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The apiserver's audit log, when the control plane writes one.
    pub fn audit_log(&self) -> Option<PathBuf> {
        let p = self.dir.join("audit.log");
        p.is_file().then_some(p)
    }

    /// A new admin client. Create one per test: a client's connections live
    /// on the runtime that made them and every `#[tokio::test]` has its own.
    pub async fn client(&self) -> Result<Client> {
        self.client_with_agent("portwise-tests").await
    }

    /// A new admin client sending `User-Agent: agent`, which the audit log
    /// records (used to tell the controller's writes from the test's).
    pub async fn client_with_agent(&self, agent: &str) -> Result<Client> {
        let config = self.kube_config(agent).await?;
        Ok(Client::try_from(config)?)
    }

    pub(crate) async fn kube_config(&self, agent: &str) -> Result<kube::Config> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .context("loading kubeconfig")?;
        config.headers.push((
            http::header::USER_AGENT,
            agent
                .parse()
                .context("user agent is not a valid header value")?,
        ));
        Ok(config)
    }
}

extern "C" fn stop_started_control_plane() {
    let Some(dir) = STARTED.lock().ok().and_then(|mut g| g.take()) else {
        return;
    };
    let stop = repo_root().join("tests/control-plane/stop");
    let stopped = std::process::Command::new(stop)
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    // The shared control plane lives in a static, so its TempDir is never
    // dropped: remove the directory here (etcd data, ~60 MB per test binary
    // that started one), or every run leaves it in /tmp. Kept when the stop
    // failed, since processes may still use it.
    if stopped {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Refuses to run outside the test network namespace: there, pod addresses
/// are not local, and sending to private ranges is forbidden.
fn ensure_in_test_netns() -> Result<()> {
    if std::env::var("PORTWISE_NETNS").as_deref() == Ok("1") {
        return Ok(());
    }
    // /proc/self/net/dev lists the interfaces of *our* namespace (unlike
    // /sys/class/net, which shows the namespace sysfs was mounted in).
    let devs = std::fs::read_to_string("/proc/self/net/dev").unwrap_or_default();
    let others: Vec<&str> = devs
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .filter(|name| *name != "lo")
        .collect();
    if others.is_empty() && !devs.is_empty() {
        return Ok(());
    }
    bail!(
        "portwise integration tests must run inside the test network namespace \
         (interfaces here: {others:?}). Build outside it, then run e.g.\n  \
         tests/netns bash -c 'tests/control-plane/start /tmp/cp && \
         PORTWISE_TEST_KUBECONFIG=/tmp/cp/kubeconfig cargo test -p portwise-tests --offline'"
    )
}
