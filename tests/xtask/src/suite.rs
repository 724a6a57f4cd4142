//! `suite [CARGO TEST ARGS]`: runs inside the test network namespace
//! (`tests/netns tests/run-suite`): starts one local control plane with the
//! native controllers the tests need, runs every test against it, and
//! stops it whatever happens.

use std::{
    path::PathBuf,
    process::Command,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::{Paths, Result, proc};

pub fn run(paths: &Paths, args: &[String]) -> Result<u8> {
    if std::env::var_os("PORTWISE_NETNS").is_none() {
        return Err("run it inside the test network namespace: tests/netns tests/run-suite".into());
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos();
    let cp_dir = PathBuf::from(format!("/tmp/portwise-cp.{}{nanos:x}", std::process::id()));
    std::fs::create_dir(&cp_dir)?;
    let cp = cp_dir.to_str().ok_or("a /tmp path that is not UTF-8")?;
    let rc = with_control_plane(paths, cp, args);
    // Stopped whatever happened, even after a failed start.
    let _ = proc::status(paths.root.join("tests/control-plane/stop"), &[cp]);
    match rc {
        Ok(0) => {
            // Kept only when something failed, for a post-mortem, so that
            // runs do not fill /tmp.
            std::fs::remove_dir_all(&cp_dir)?;
            Ok(0)
        }
        other => {
            eprintln!("run-suite: control plane files kept in {cp}");
            other
        }
    }
}

fn with_control_plane(paths: &Paths, cp: &str, args: &[String]) -> Result<u8> {
    proc::run(
        paths.root.join("tests/control-plane/start"),
        &[
            cp,
            "--controllers",
            "endpointslice,endpointslicemirroring,garbagecollector,namespace",
        ],
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .ok_or("CARGO_TARGET_DIR is unset")?;
    let bin = std::env::var_os("PORTWISE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target.join("debug/portwise"));
    let cargo_test = |extra: &[&str]| -> Result<bool> {
        Ok(Command::new("cargo")
            .args(["test", "--locked", "--offline", "--workspace"])
            .args(extra)
            .arg("--no-fail-fast")
            .args(args)
            .env("PORTWISE_TEST_KUBECONFIG", format!("{cp}/kubeconfig"))
            .env("PORTWISE_TEST_CP_DIR", cp)
            .env("PORTWISE_BIN", &bin)
            .status()?
            .success())
    };
    // The Rust-only tier (every unit and property test, what a plain
    // `cargo test` runs), then the integration tier: the `it` binaries
    // (one per crate that has one), which a plain `cargo test` leaves out
    // (`test = false`). Both run, whatever the first's outcome.
    let unit = cargo_test(&[])?;
    let it = cargo_test(&["--test", "it"])?;
    Ok(if unit && it { 0 } else { 1 })
}
