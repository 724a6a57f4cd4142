//! The host image that `./test` builds beside the suite.
//!
//! The image's release musl build is the longest single build of a cold
//! run and shares nothing with the dev build, so `./test` starts it in the
//! background when the suite starts (`tests/xtask/src/image.rs`) and the image
//! test waits here for it. The build holds `$PORTWISE_IMAGE_BUILD/lock`
//! while it runs and leaves its exit code in `status` and its output in
//! `log`. Without `PORTWISE_IMAGE_BUILD` (the suite run by hand) there is
//! nothing to wait for, and the image test uses the image as it is.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

/// Far above a cold release musl build on two busy cores (about 15 min).
const PATIENCE: Duration = Duration::from_secs(50 * 60);

/// Waits until the background image build has finished; an error, with
/// the end of its log, if it failed.
pub async fn wait_for_image_build() -> Result<()> {
    let Some(dir) = std::env::var_os("PORTWISE_IMAGE_BUILD").map(PathBuf::from) else {
        return Ok(());
    };
    tokio::task::spawn_blocking(move || wait_blocking(&dir, PATIENCE)).await?
}

fn wait_blocking(dir: &Path, patience: Duration) -> Result<()> {
    let lock_path = dir.join("lock");
    let lock = File::open(&lock_path).with_context(|| {
        format!(
            "PORTWISE_IMAGE_BUILD is set but {} is missing: no background image build was started",
            lock_path.display()
        )
    })?;
    let started = Instant::now();
    // Shared and non-blocking, polled: a build that hangs becomes this
    // test's timeout, not a hung suite.
    while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        ensure!(
            started.elapsed() < patience,
            "the background image build ({}) still runs after {patience:?}",
            dir.join("log").display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let waited = started.elapsed();
    if waited > Duration::from_secs(1) {
        eprintln!("image_build: waited {waited:.0?} for the background image build");
    }
    let log = dir.join("log");
    let status = std::fs::read_to_string(dir.join("status")).with_context(|| {
        format!(
            "the background image build ended without an exit status (killed?); its log: {}",
            log.display()
        )
    })?;
    if status.trim() != "0" {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "the background image build (deploy/build-image) failed with exit {}; the end of {}:\n{}",
            status.trim(),
            log.display(),
            tail.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build_dir(status: Option<&str>, log: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("lock"), "").unwrap();
        std::fs::write(dir.path().join("log"), log).unwrap();
        if let Some(s) = status {
            std::fs::write(dir.path().join("status"), s).unwrap();
        }
        dir
    }

    #[test]
    fn a_finished_build_passes_and_a_failed_one_shows_its_log() {
        let ok = build_dir(Some("0\n"), "built");
        wait_blocking(ok.path(), Duration::from_secs(1)).unwrap();
        let failed = build_dir(Some("101\n"), "error[E0425]: cannot find value");
        let err = wait_blocking(failed.path(), Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("exit 101") && err.contains("E0425"), "{err}");
        let killed = build_dir(None, "");
        let err = wait_blocking(killed.path(), Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("without an exit status"), "{err}");
    }

    #[test]
    fn a_running_build_is_waited_for_until_it_lets_go() {
        let dir = build_dir(None, "");
        let holder = File::open(dir.path().join("lock")).unwrap();
        assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
        let err = wait_blocking(dir.path(), Duration::from_millis(600))
            .unwrap_err()
            .to_string();
        assert!(err.contains("still runs"), "{err}");
        let path = dir.path().to_path_buf();
        let waiter = std::thread::spawn(move || wait_blocking(&path, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(700));
        std::fs::write(dir.path().join("status"), "0").unwrap();
        drop(holder);
        waiter.join().unwrap().unwrap();
    }
}
