//! What this binary was built from: the workspace version, the git
//! revision and the commit's date, as the build script found them
//! (build.rs: `git rev-parse HEAD` and `git log -1 --format=%cI`, else
//! `PORTWISE_REVISION` and `PORTWISE_BUILD_DATE` from the build's
//! environment, else `unknown`). `portwise --version` prints them and
//! `portwise_build_info` carries them as labels.

use portwise_controller::metrics::BuildInfo;

/// The workspace version (Cargo.toml).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit's full object name, or `unknown`.
pub const REVISION: &str = env!("PORTWISE_REVISION");
/// The commit's date (strict ISO 8601), or `unknown`.
pub const DATE: &str = env!("PORTWISE_BUILD_DATE");

/// `portwise --version`: `0.2.0 (revision 3f1c…, 2026-12-06T01:02:03+00:00)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("PORTWISE_REVISION"),
    ", ",
    env!("PORTWISE_BUILD_DATE"),
    ")"
);

/// The labels of `portwise_build_info`.
pub const INFO: BuildInfo = BuildInfo {
    version: VERSION,
    revision: REVISION,
    build_date: DATE,
};

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn is_hex40(s: &str) -> bool {
        s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
    }

    /// git's answer in the checkout, when git runs here.
    fn git(args: &[&str]) -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// This crate is built from a checkout: the build script found its
    /// commit (from `.git`'s files if git cannot run), and the metrics
    /// carry it.
    #[test]
    fn build_info_names_this_checkout_s_commit() {
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
        assert!(checkout.exists(), "not built from a checkout");
        assert!(is_hex40(REVISION), "revision {REVISION:?}");
        if let Some(head) = git(&["rev-parse", "HEAD"]) {
            assert_eq!(REVISION, head);
            assert_eq!(Some(DATE.to_string()), git(&["log", "-1", "--format=%cI"]));
            // A date from the commit: `YYYY-MM-DDTHH:MM:SS±HH:MM`.
            assert!(DATE.len() == 25 && DATE.as_bytes()[10] == b'T', "{DATE}");
        }
        let text = portwise_controller::metrics::Metrics::with_build(INFO).encode();
        let series = format!(
            r#"portwise_build_info{{version="{VERSION}",revision="{REVISION}",build_date="{DATE}"}} 1"#
        );
        assert!(text.lines().any(|l| l == series), "{series} not in\n{text}");
    }

    #[test]
    fn the_long_version_names_version_revision_and_date() {
        assert_eq!(
            LONG_VERSION,
            format!("{VERSION} (revision {REVISION}, {DATE})")
        );
        assert_eq!(INFO.version, VERSION);
    }
}
