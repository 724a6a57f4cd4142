//! The controllers as processes: kube-controller-manager started by the
//! bench, the release portwise binary through the support crate, their
//! CPU and memory, and scrapes of portwise's `/metrics`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Result, anyhow, bail};
use portwise_tests::{
    ControlPlane, Portwise,
    faults::{proc_cpu_time, proc_memory_kib},
};
use tokio::process::Child;

pub(crate) fn stop_pid(pid: i32, wait: Duration) -> Result<()> {
    // SAFETY: signalling a process we started (or that `start` started for us).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + wait;
    while Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie child of `start` is reaped by the netns init; count it gone.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
        {
            break;
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// kube-controller-manager, started by the bench (portwise runs through the
/// support library's [`Portwise`]).
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) started: Instant,
    pub(crate) log: PathBuf,
}

/// What the bench needs of a running controller, native or portwise.
pub(crate) trait Controller {
    fn pid(&self) -> Option<u32>;
    /// Fails if it exited on its own.
    fn check_alive(&mut self) -> Result<()>;
    fn usage(&self) -> Usage {
        self.pid()
            .and_then(|pid| usage(pid).ok())
            .unwrap_or_default()
    }
}

impl Controller for Portwise {
    fn pid(&self) -> Option<u32> {
        Portwise::pid(self)
    }
    fn check_alive(&mut self) -> Result<()> {
        self.check_running()
    }
}

/// A report row of one [`Usage`] figure: (measure, figure, decimals, unit).
pub(crate) type UsageRow = (&'static str, fn(&Usage) -> f64, usize, &'static str);

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    pub(crate) cpu: f64,
    pub(crate) hwm_mib: f64,
    pub(crate) rss_mib: f64,
    /// The apiserver's CPU seconds over the same span (where measured): the
    /// cost of the controller's requests and watches to the control plane.
    pub(crate) api_cpu: f64,
}

/// CPU seconds the apiserver (with its embedded etcd) has used so far.
pub(crate) fn apiserver_cpu(cp: &ControlPlane) -> f64 {
    std::fs::read_to_string(cp.dir().join("apiserver.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .and_then(|pid| proc_cpu_time(pid).ok())
        .map_or(f64::NAN, |d| d.as_secs_f64())
}

impl Proc {
    /// SIGTERM, then SIGKILL after 30 s.
    pub(crate) async fn stop(&mut self) {
        // SAFETY: signalling our own child by pid; not reaped yet.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

impl Controller for Proc {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }
    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            bail!(
                "process {} exited with {status}; last log lines:\n{}",
                self.pid,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }
}

/// CPU seconds and memory of `pid`, from the support library's /proc readers.
pub(crate) fn usage(pid: u32) -> Result<Usage> {
    let cpu = proc_cpu_time(pid)?;
    let (rss, hwm) = proc_memory_kib(pid)?;
    Ok(Usage {
        cpu: cpu.as_secs_f64(),
        hwm_mib: hwm as f64 / 1024.0,
        rss_mib: rss as f64 / 1024.0,
        api_cpu: f64::NAN,
    })
}

/// The release binary: `$PORTWISE_BIN`, which `./bench` sets.
pub(crate) fn release_bin() -> Result<PathBuf> {
    std::env::var_os("PORTWISE_BIN")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!("PORTWISE_BIN must name the release portwise binary (./bench sets it)")
        })
}

/// Starts the release `portwise` binary on `config`, watching `namespaces`,
/// its config and log kept in the work directory as `portwise-TAG.*`.
pub(crate) async fn spawn_portwise(
    cp: &'static ControlPlane,
    work: &Path,
    tag: &str,
    config: &str,
    namespaces: &[&str],
    extra: &[&str],
) -> Result<Portwise> {
    Portwise::builder(cp)
        .name(&format!("portwise-{tag}"))
        .dir(work)
        .bin(&release_bin()?)
        .namespaces(namespaces)
        .config(config)
        .args(extra)
        // The release default, whatever the bench's own environment says:
        // what the rows measure comes from its metrics, not its log.
        .log_filter("info")
        .quiet()
        .start()
        .await
}

/// Stops portwise; a failure to stop cleanly is reported, not fatal.
pub(crate) async fn stop_portwise(pw: &mut Portwise) {
    if let Err(e) = pw.stop().await {
        eprintln!("bench: {e:#}");
    }
}

/// `GET /metrics`, summing every sample of `metric` (all label sets).
pub(crate) async fn scrape(pw: &Portwise, metric: &str) -> Result<f64> {
    Ok(sum_of(&pw.metrics_text().await?, metric))
}

/// The sum of every sample of `metric` in a scrape's text; `metric` may
/// end inside a label set (`name{decision="include"`) to pick some.
pub(crate) fn sum_of(body: &str, metric: &str) -> f64 {
    let mut total = 0.0;
    for line in body.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let boundary = if metric.contains('{') {
            rest.starts_with(',') || rest.starts_with('}')
        } else {
            rest.starts_with('{') || rest.starts_with(' ')
        };
        if !boundary {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            total += v;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE portwise_checks counter\n\
        portwise_checks_total{decision=\"include\",policy=\"membership\"} 7\n\
        portwise_checks_total{decision=\"exclude\",policy=\"membership\"} 2\n\
        portwise_checks_total_extra 100\n\
        portwise_slices_managed{namespace=\"a\",service=\"s\"} 3\n\
        portwise_slices_managed 4\n";

    #[test]
    fn sums_every_label_set_of_a_name_and_no_longer_name() {
        assert_eq!(sum_of(TEXT, "portwise_checks_total"), 9.0);
        assert_eq!(sum_of(TEXT, "portwise_slices_managed"), 7.0);
        assert_eq!(sum_of(TEXT, "portwise_absent"), 0.0);
    }

    #[test]
    fn a_label_prefix_picks_its_samples() {
        assert_eq!(
            sum_of(TEXT, "portwise_checks_total{decision=\"include\""),
            7.0
        );
        assert_eq!(sum_of(TEXT, "portwise_checks_total{decision=\"incl"), 0.0);
    }
}
