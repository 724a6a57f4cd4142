//! The bench's own control plane: a fresh directory, a full audit policy,
//! and the controller-manager's command line kept for later cold starts.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::audit::Audit;
use crate::knobs::repo_root;
use crate::process::{Proc, stop_pid};

/// The bench's own control plane: a fresh directory, a full audit policy,
/// and the controller-manager's command line kept for a later cold start.
pub(crate) struct BenchCp {
    pub(crate) dir: PathBuf,
    pub(crate) cm_argv: Vec<String>,
}

pub(crate) const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: None
  users: [\"system:apiserver\"]
- level: Metadata
";

impl BenchCp {
    /// Runs before any thread exists (the support crate reads the
    /// environment, and setting it is only sound then).
    pub(crate) fn start(work: &Path) -> Result<Self> {
        let dir = work.join("cp");
        let policy = work.join("audit-policy-all.yaml");
        std::fs::write(&policy, AUDIT_POLICY)?;
        let start = repo_root().join("tests/control-plane/start");
        let mut extra = std::env::var("PORTWISE_APISERVER_ARGS").unwrap_or_default();
        // The last --audit-policy-file wins: every request, not only writes,
        // so reads per client are counted too.
        extra.push_str(&format!(" --audit-policy-file={}", policy.display()));
        let status = std::process::Command::new(&start)
            .arg(&dir)
            .args(["--controllers", "endpointslice"])
            .env("PORTWISE_APISERVER_ARGS", extra.trim())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status()
            .context("running tests/control-plane/start")?;
        if !status.success() {
            bail!("tests/control-plane/start failed: {status}");
        }
        let pid: i32 = std::fs::read_to_string(dir.join("controller-manager.pid"))?
            .trim()
            .parse()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let cm_argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        if cm_argv.len() < 2 {
            bail!("could not read the controller-manager's command line");
        }
        // Stop it before any object exists: the native controller must
        // start cold on the full state, as portwise will.
        stop_pid(pid, Duration::from_secs(30))?;
        // SAFETY: no other thread exists yet.
        unsafe {
            std::env::set_var("PORTWISE_TEST_KUBECONFIG", dir.join("kubeconfig"));
            std::env::set_var("PORTWISE_TEST_CP_DIR", &dir);
            // Namespaces go with the whole control plane at the end.
            std::env::set_var("PORTWISE_TEST_KEEP", "1");
        }
        Ok(Self { dir, cm_argv })
    }

    pub(crate) fn audit(&self) -> Audit {
        Audit {
            path: self.dir.join("audit.log"),
        }
    }

    /// Starts kube-controller-manager with the recorded argv plus `extra`.
    pub(crate) fn spawn_cm(&self, extra: &[&str]) -> Result<Proc> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("controller-manager.log"))?;
        let mut cmd = tokio::process::Command::new(&self.cm_argv[0]);
        cmd.args(&self.cm_argv[1..])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().context("starting kube-controller-manager")?;
        let pid = child.id().context("no pid")?;
        // So that tests/control-plane/stop (and the netns wrapper) end it.
        std::fs::write(self.dir.join("controller-manager.pid"), format!("{pid}\n"))?;
        Ok(Proc {
            child,
            pid,
            started: Instant::now(),
            log: self.dir.join("controller-manager.log"),
        })
    }
}

/// When kube-controller-manager's informers had all synced, after
/// `spawned_at`: the last klog `"Caches are synced"` line it wrote to `log`
/// past byte `from` ([`klog_synced_after`]). The upstream binary's log is
/// the only place that tells it: no metric of it says when its informers
/// synced (portwise's own stages come from its metrics).
pub(crate) fn caches_synced_in_klog(
    log: &Path,
    from: u64,
    spawned_at: std::time::SystemTime,
) -> Option<Duration> {
    let text = std::fs::read(log).ok()?;
    klog_synced_after(
        &String::from_utf8_lossy(text.get(from as usize..)?),
        spawned_at,
    )
}

/// The last `"Caches are synced"` line of klog `text` within a minute after
/// `spawned_at`, as time since then (klog stamps time of day, UTC here,
/// without a year).
pub(crate) fn klog_synced_after(text: &str, spawned_at: std::time::SystemTime) -> Option<Duration> {
    let day = 86_400.0;
    let spawned = spawned_at
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64()
        % day;
    text.lines()
        .filter(|l| l.contains("\"Caches are synced\""))
        .filter_map(|l| {
            // "I1204 10:20:54.210502   155 shared_informer.go:531] ..."
            let clock = l.split_whitespace().nth(1)?;
            let mut hms = clock.split(':');
            let h: f64 = hms.next()?.parse().ok()?;
            let m: f64 = hms.next()?.parse().ok()?;
            let s: f64 = hms.next()?.parse().ok()?;
            let after = (h * 3600.0 + m * 60.0 + s - spawned).rem_euclid(day);
            (after < 60.0).then_some(after)
        })
        .max_by(f64::total_cmp)
        .map(Duration::from_secs_f64)
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn the_last_sync_within_a_minute_of_the_spawn_counts() {
        // 2026-12-04 10:20:50 UTC.
        let spawned = UNIX_EPOCH + Duration::from_secs(1_796_379_650);
        let log = "\
I1204 10:20:49.000000   155 shared_informer.go:531] \"Caches are synced\" controller=\"old\"
I1204 10:20:51.250000   155 shared_informer.go:531] \"Caches are synced\" controller=\"pods\"
I1204 10:20:53.500000   155 shared_informer.go:531] \"Caches are synced\" controller=\"endpointslice\"
I1204 10:20:54.000000   155 something.go:1] \"Started controller\"
I1204 10:22:00.000000   155 shared_informer.go:531] \"Caches are synced\" controller=\"late\"
";
        assert_eq!(
            klog_synced_after(log, spawned),
            Some(Duration::from_millis(3500))
        );
        assert_eq!(klog_synced_after("no sync yet\n", spawned), None);
    }

    #[test]
    fn a_spawn_just_before_midnight_counts_a_sync_after_it() {
        // 2026-12-04 23:59:59 UTC; the sync at 00:00:01.5 the next day.
        let spawned = UNIX_EPOCH + Duration::from_secs(1_796_428_799);
        let log = "I1205 00:00:01.500000   155 shared_informer.go:531] \"Caches are synced\"\n";
        assert_eq!(
            klog_synced_after(log, spawned),
            Some(Duration::from_millis(2500))
        );
    }
}
