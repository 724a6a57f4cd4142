//! `portwise run`'s guest memory budget: the worst case of the
//! configuration's WebAssembly guests ([`portwise_wasm::budget`]) against
//! the memory limit of the cgroup portwise runs in, read here.

use std::path::{Path, PathBuf};

use portwise_core::config::Config;
use portwise_wasm::{
    Limits,
    budget::{BudgetError, WorstCase, module_uses},
};

/// Refuses `config` when its guests, at worst, hold more memory than
/// `container_limit` (bytes, `None`: unlimited) leaves them.
pub(super) fn check(
    config: &Config,
    limits: &Limits,
    container_limit: Option<u64>,
) -> Result<WorstCase, BudgetError> {
    let live = config
        .membership
        .wasm_specs()
        .into_iter()
        .chain(config.policies.values().flat_map(|p| p.wasm_specs()));
    let shadow = config.shadow.iter().flat_map(|sh| {
        sh.membership
            .iter()
            .chain(sh.expressions.values())
            .flat_map(|e| e.wasm_specs())
    });
    let uses = module_uses(live, shadow, limits);
    let worst = WorstCase::of(&uses, config.max_concurrent_checks, limits);
    worst.fits(container_limit).map(|()| worst)
}

/// The memory limit of this process's cgroup (the smallest along its path
/// to the root), in bytes; `None` when there is none or it cannot be read.
pub(super) fn container_memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_from(&own, Path::new("/sys/fs/cgroup"), |p| {
        std::fs::read_to_string(p).ok()
    })
}

/// Anything at or above this is "no limit" (cgroup v1 writes
/// `9223372036854771712` for it).
const UNLIMITED: u64 = 1 << 60;

/// The limit from `/proc/self/cgroup`'s text, reading files below `root`
/// with `read`: cgroup v2 (`0::/path`, `memory.max`, `max` for none) or v1
/// (the `memory` controller's line, `memory/…/memory.limit_in_bytes`).
fn limit_from(own: &str, root: &Path, read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    let parse = |text: Option<String>| -> Option<u64> {
        let n: u64 = text?.trim().parse().ok()?; // "max" is no limit
        (n < UNLIMITED).then_some(n)
    };
    let along = |base: PathBuf, path: &str, file: &str| -> Option<u64> {
        // The path as this process sees it; in a container with a cgroup
        // namespace it is `/`, and the limit is on the mount's root.
        let mut dir = base.join(path.trim_start_matches('/'));
        let mut least: Option<u64> = None;
        loop {
            if let Some(n) = parse(read(&dir.join(file))) {
                least = Some(least.map_or(n, |l| l.min(n)));
            }
            if dir == base || !dir.pop() {
                return least;
            }
        }
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if controllers.is_empty() {
            if let Some(n) = along(root.to_path_buf(), path, "memory.max") {
                return Some(n);
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            return along(root.join("memory"), path, "memory.limit_in_bytes");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        move |p| map.get(p).cloned()
    }

    #[test]
    fn the_cgroup_limit_is_the_least_along_the_path() {
        let root = Path::new("/sys/fs/cgroup");
        // v2 in a container (cgroup namespace): the mount's root.
        let read = files(&[("/sys/fs/cgroup/memory.max", "536870912\n")]);
        assert_eq!(limit_from("0::/\n", root, &read), Some(512 << 20));
        // v2 without a namespace: the own cgroup or a parent's, the least.
        let read = files(&[
            ("/sys/fs/cgroup/kubepods/memory.max", "1073741824\n"),
            ("/sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n"),
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "536870912\n"),
        ]);
        assert_eq!(
            limit_from("0::/kubepods/pod1/c1\n", root, &read),
            Some(512 << 20)
        );
        assert_eq!(
            limit_from(
                "0::/\n",
                root,
                files(&[("/sys/fs/cgroup/memory.max", "max")])
            ),
            None
        );
        // v1: the memory controller's line; its "unlimited" is huge.
        let v1 = "12:cpu,cpuacct:/x\n4:memory:/kubepods/pod1\n";
        let read = files(&[(
            "/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes",
            "268435456",
        )]);
        assert_eq!(limit_from(v1, root, &read), Some(256 << 20));
        let read = files(&[(
            "/sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes",
            "9223372036854771712",
        )]);
        assert_eq!(limit_from(v1, root, &read), None);
        assert_eq!(limit_from("", root, &read), None);
    }

    fn config(yaml: &str) -> Config {
        Config::from_yaml(yaml).unwrap()
    }

    #[test]
    fn guests_that_could_outgrow_the_container_are_refused_by_name() {
        let cfg = config(
            "serviceKey: {label: g}\nmodulesDir: /m\n\
             membership: {wasm: {module: hog}}\n\
             shadow: {membership: {wasm: {module: other.wasm, limits: {memoryMiB: 8}}}}\n",
        );
        let limits = Limits {
            memory_bytes: 64 << 20,
            max_memory_bytes: 64 << 20,
            ..Limits::default()
        };
        let e = check(&cfg, &limits, Some(512 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("16 × 68 MiB (live checks in flight, on hog.wasm)"),
            "{e}"
        );
        assert!(
            e.contains("16 × 12 MiB (shadow checks in flight, on other.wasm)"),
            "{e}"
        );
        assert!(e.contains("memory limit of 512 MiB"), "{e}");
        // Unlimited, or room enough.
        assert!(check(&cfg, &limits, None).is_ok());
        assert!(check(&cfg, &limits, Some(4 << 30)).is_ok());
        // 16 checks of 8 MiB and 12 MiB fit 512 MiB.
        let small = config(
            "serviceKey: {label: g}\nmodulesDir: /m\nmaxConcurrentChecks: 16\n\
             membership: {wasm: {module: hog, limits: {memoryMiB: 8}}}\n",
        );
        let w = check(&small, &limits, Some(512 << 20)).unwrap();
        assert_eq!(w.bytes, 21 * (12 << 20));
    }
}
