//! Builds that a cold `./test` leaves for the next run, and the tests that
//! need them.
//!
//! A cold `.ci/run` must finish within its budget on two cores
//! (docs/build-times.md, "The budget"). Helm, the registry, cosign,
//! promtool and the image's release musl build are a third of a cold run's
//! CPU and serve a few tests, cilium-agent (`cilium`, about 1,250 CPU-s
//! cold) serves the Cilium tests, clustermesh-apiserver (`clustermesh`,
//! about 25 CPU-s on the agent's Go build cache, so deferred only with
//! `cilium`) the ClusterMesh tests, pilot-discovery (`istiod`) the istiod
//! tests, Traefik (`traefik`) the Traefik tests and egctl with Envoy
//! (`envoy-gateway`) the Envoy Gateway tests, the arm64 cross build
//! (`arm64`, `deploy/build-binary --arch arm64`) `ship::arm64`, so on a
//! machine that
//! has not built them yet `./test` does not build them before the suite:
//! it lists them in `PORTWISE_DEFERRED`, builds
//! them after the suite for the next run, and prints which tests did not
//! run and why. Every test that needs one of them asks [`skip`] first.
//!
//! The skip is never silent: it is written to the report file `./test`
//! prints at the end (`PORTWISE_DEFERRED_REPORT`) and to stderr, which
//! `--nocapture` shows. Outside `./test` nothing is deferred, and the tests
//! build what they need.

use std::io::Write as _;

/// True when `./test` deferred one of `builds` in this run: the test is to
/// return at once, having reported `test` as skipped and why.
pub fn skip(builds: &[&str], test: &str) -> bool {
    let deferred = std::env::var("PORTWISE_DEFERRED").unwrap_or_default();
    let report = std::env::var_os("PORTWISE_DEFERRED_REPORT");
    let Some(line) = skip_line(&deferred, builds, test) else {
        return false;
    };
    eprintln!("{line}");
    if let Some(path) = report {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            // The report is how ./test says the test did not run; without
            // it the skip would be silent, so the test fails instead.
            panic!(
                "{line}, and the report {} cannot be written: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
    true
}

/// The report line for `test` when `deferred` (space-separated, as
/// `./test` exports it) holds one of `builds`.
fn skip_line(deferred: &str, builds: &[&str], test: &str) -> Option<String> {
    let missing: Vec<&str> = builds
        .iter()
        .copied()
        .filter(|b| deferred.split_whitespace().any(|d| d == *b))
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "SKIPPED {test}: needs {}, not built on this machine yet; this cold run defers it to \
         stay within its time budget and builds it after the suite, so the next ./test runs it",
        missing.join(" and ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_deferred_build_skips() {
        assert_eq!(skip_line("", &["helm"], "t"), None);
        assert_eq!(skip_line("registry cosign", &["helm"], "t"), None);
        // A name is matched whole: "image" is not "image-build".
        assert_eq!(skip_line("image-build", &["image"], "t"), None);
        let line = skip_line("helm registry cosign", &["registry", "cosign"], "oci::x").unwrap();
        assert!(
            line.starts_with("SKIPPED oci::x: needs registry and cosign, not built"),
            "{line}"
        );
    }
}
