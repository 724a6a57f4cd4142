//! The machine a run measured on, for the results file's header.

use crate::knobs::repo_root;

pub(crate) fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .current_dir(repo_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

pub(crate) fn machine() -> String {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "?".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let commit = sh("git", &["rev-parse", "--short=12", "HEAD"]);
    let dirty = sh("git", &["status", "--porcelain", "--untracked-files=no"]);
    let dirty = if dirty.is_empty() || dirty == "?" {
        ""
    } else {
        " (with uncommitted changes in the work tree)"
    };
    format!(
        "| | |\n|---|---|\n\
         | date | {} |\n\
         | git commit | {commit}{dirty} |\n\
         | nproc | {} |\n\
         | CPU | {cpu} |\n\
         | memory | {mem} |\n\
         | kernel | {} |\n\
         | load average at start | {load} |\n\
         | control plane | kube-apiserver + kube-controller-manager v1.37.2 (tests/control-plane), embedded etcd |",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        sh("nproc", &[]),
        sh("uname", &["-srm"]),
    )
}
