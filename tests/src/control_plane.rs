//! The local control plane the tests talk to.
//!
//! Starting kube-apiserver costs seconds, so one control plane serves a whole
//! run: the test command starts it and exports `PORTWISE_TEST_KUBECONFIG`.
//! When that is unset (running one test binary by hand), the first test
//! starts one for this binary and an `atexit` hook stops it, because the test
//! harness never runs static destructors.
//!
//! The older Kubernetes minors the chart supports (1.35, 1.36) each get a
//! control plane of their own, built from that minor's modules
//! (`tests/control-plane/build MINOR`) and started by the first test that
//! asks for it ([`ControlPlane::minor`]): the suite's matrix tests (the
//! oracle, the seed, kube-proxy, legacy Endpoints, the write economy) run
//! their bodies against each, while every other test stays on the suite's
//! own control plane, 1.37. `PORTWISE_K8S_MINORS=1.35,1.37` picks which
//! minors the matrix runs on (default: all).

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
/// Directories of the control planes this process started, for the exit
/// hook.
static STARTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// The minor of the suite's own control plane (tests/control-plane/go.mod).
pub const SUITE_MINOR: &str = "1.37";
/// The older minors the chart supports, each with a control plane of its
/// own for the matrix tests (tests/control-plane/MINOR/go.mod).
pub const OLDER_MINORS: [&str; 2] = ["1.35", "1.36"];
/// One per entry of [`OLDER_MINORS`], started on first use.
static OLDER: [OnceCell<ControlPlane>; 2] = [OnceCell::const_new(), OnceCell::const_new()];

/// Whether `PORTWISE_K8S_MINORS` (comma-separated, e.g. `1.35,1.37`; unset
/// or empty: every minor) selects `minor`.
pub fn minor_selected(minor: &str) -> bool {
    minor_in(
        std::env::var("PORTWISE_K8S_MINORS")
            .as_deref()
            .unwrap_or(""),
        minor,
    )
}

fn minor_in(list: &str, minor: &str) -> bool {
    let list = list.trim();
    list.is_empty() || list.split(',').any(|m| m.trim() == minor)
}

/// The repository root (tests/..).
/// The repository root (the checkout the suite runs from).
pub fn repo_root() -> PathBuf {
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

    /// The control plane of Kubernetes `minor` for the matrix test `test`
    /// (its name as the report shows it): the suite's own for
    /// [`SUITE_MINOR`], else one of [`OLDER_MINORS`], started once per test
    /// process. `None` when the test is not to run, having said why: the
    /// minor is not in `PORTWISE_K8S_MINORS`, or a cold `./test` deferred
    /// its build (`control-plane@MINOR`, tests/src/deferred.rs).
    pub async fn minor(minor: &str, test: &str) -> Result<Option<&'static ControlPlane>> {
        if !minor_selected(minor) {
            eprintln!("SKIPPED {test}: Kubernetes {minor} is not in PORTWISE_K8S_MINORS");
            return Ok(None);
        }
        if minor == SUITE_MINOR {
            return Self::shared().await.map(Some);
        }
        let Some(i) = OLDER_MINORS.iter().position(|m| *m == minor) else {
            bail!("Kubernetes {minor} has no control plane here ({SUITE_MINOR}, {OLDER_MINORS:?})");
        };
        let build = format!("control-plane@{minor}");
        if crate::deferred::skip(&[build.as_str()], test) {
            return Ok(None);
        }
        crate::init_tracing();
        ensure_in_test_netns()?;
        OLDER[i]
            .get_or_try_init(|| Self::start(Some(minor)))
            .await
            .map(Some)
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
        Self::start(None).await
    }

    /// Starts a control plane for this process: the suite's minor, or
    /// `minor`'s.
    async fn start(minor: Option<&str>) -> Result<ControlPlane> {
        // One start at a time: `start` picks free ports (6443 when free)
        // by asking the kernel, so two at once could pick the same ones.
        static STARTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one = STARTING.lock().await;
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
            "portwise-tests: starting a control plane (Kubernetes {}) in {}",
            minor.unwrap_or(SUITE_MINOR),
            dir.display()
        );
        let mut cmd = tokio::process::Command::new(&start);
        cmd.arg(&dir).arg("--controllers").arg(CONTROLLERS);
        if let Some(minor) = minor {
            cmd.arg("--minor").arg(minor);
        }
        let status = cmd
            .status()
            .await
            .with_context(|| format!("running {}", start.display()))?;
        if !status.success() {
            bail!("{} {} failed: {status}", start.display(), dir.display());
        }
        let mut started = STARTED.lock().unwrap();
        if started.is_empty() {
            // SAFETY: registering a plain extern "C" fn with no captured state.
            unsafe { libc::atexit(stop_started_control_planes) };
        }
        started.push(dir.clone());
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
    /// The apiserver's `Warning` headers to this client are kept
    /// ([`crate::warnings_to`]).
    pub async fn client_with_agent(&self, agent: &str) -> Result<Client> {
        let config = self.kube_config(agent).await?;
        let agent = agent.to_string();
        let keep = tower::util::MapResponseLayer::new(move |res: http::Response<_>| {
            crate::wire::keep_warnings(&agent, res.headers());
            res
        });
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(&keep)
            .build())
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

extern "C" fn stop_started_control_planes() {
    let dirs = STARTED
        .lock()
        .map(|mut g| std::mem::take(&mut *g))
        .unwrap_or_default();
    for dir in dirs {
        let stop = repo_root().join("tests/control-plane/stop");
        let stopped = std::process::Command::new(stop)
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        // A control plane lives in a static, so its TempDir is never
        // dropped: remove the directory here (etcd data, ~60 MB per control
        // plane), or every run leaves it in /tmp. Kept when the stop
        // failed, since processes may still use it.
        if stopped {
            let _ = std::fs::remove_dir_all(&dir);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_are_picked_by_name() {
        assert!(minor_in("", "1.35"));
        assert!(minor_in(" ", "1.37"));
        assert!(minor_in("1.35,1.37", "1.35"));
        assert!(minor_in("1.35, 1.37", "1.37"));
        assert!(!minor_in("1.35,1.37", "1.36"));
        // A name is matched whole: 1.3 is not 1.35.
        assert!(!minor_in("1.3", "1.35"));
    }
}
