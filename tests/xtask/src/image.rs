//! The host image's release build, in the background beside the suite.
//!
//! The image's release musl build is the longest single build of a cold
//! run and shares nothing with the dev build, so `./test` starts it when the
//! suite starts and the image test waits for it (tests/src/image_build.rs).
//! The protocol between them is three files in one directory: `lock` is
//! held (flock) while the build runs, then `status` holds its exit code and
//! `log` its output; `pid` names its process group, so that a run that
//! ends early can stop it.
//!
//! - `image-build start DIR`: starts it and returns once it holds the lock
//!   (no waiter can look before that).
//! - `image-build stop DIR`: ends a build still running.
//! - `image-build wait DIR`: waits for it; fails with the log if it failed.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
};

use crate::{Paths, Result, proc};

pub fn run(paths: &Paths, args: &[String]) -> Result<u8> {
    let (Some(cmd), Some(dir)) = (args.first(), args.get(1)) else {
        return Err("usage: image-build start|stop|wait DIR".into());
    };
    let dir = Path::new(dir);
    match cmd.as_str() {
        "start" => start(paths, dir).map(|()| 0),
        "stop" => stop(dir).map(|()| 0),
        "wait" => wait(dir).map(|()| 0),
        // The background process `start` makes.
        "hold" => hold(paths, dir),
        other => Err(format!("unknown command {other} (start, stop, wait)").into()),
    }
}

pub fn start(_paths: &Paths, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for f in ["status", "pid"] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    File::create(dir.join("log"))?;
    // A process group of its own (so that `stop` ends cargo and podman
    // with it), which says on stdout when it holds the lock.
    let mut child = Command::new(std::env::current_exe()?)
        .args(["image-build", "hold"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no pipe from the image build")?)
        .read_line(&mut line)?;
    if line.trim() != "locked" {
        return Err(format!(
            "the image build did not take {}",
            dir.join("lock").display()
        )
        .into());
    }
    std::fs::write(dir.join("pid"), format!("{}\n", child.id()))?;
    // Not waited for: it outlives this call, and reports through `status`.
    Ok(())
}

/// The background build: holds the lock until the status is written.
fn hold(paths: &Paths, dir: &Path) -> Result<u8> {
    let lock = File::create(dir.join("lock"))?;
    lock.lock()?;
    let mut out = std::io::stdout();
    writeln!(out, "locked")?;
    out.flush()?;
    let log = File::create(dir.join("log"))?;
    let status = Command::new(paths.root.join("deploy/build-image"))
        // A target directory of its own: cargo locks a target directory
        // per build, and the suite's `cargo test` must not wait for this.
        .env("CARGO_TARGET_DIR", paths.cache.join("target-image"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()?;
    let code = status.code().unwrap_or(1);
    std::fs::write(dir.join("status"), format!("{code}\n"))?;
    drop(lock);
    Ok(u8::try_from(code).unwrap_or(1))
}

pub fn stop(dir: &Path) -> Result<()> {
    if dir.join("status").exists() {
        return Ok(());
    }
    let Ok(pid) = std::fs::read_to_string(dir.join("pid")) else {
        return Ok(());
    };
    let pid = pid.trim();
    if Path::new("/proc").join(pid).exists() {
        eprintln!("image-build: stopping the unfinished image build (pid {pid})");
        let _ = proc::status("kill", &["-TERM", "--", &format!("-{pid}")]);
    }
    Ok(())
}

/// Waits for a build in progress (if any) and says whether it succeeded.
pub fn wait(dir: &Path) -> Result<()> {
    let lock = dir.join("lock");
    if let Ok(f) = File::open(&lock) {
        f.lock_shared()?;
    }
    match std::fs::read_to_string(dir.join("status")) {
        Ok(s) if s.trim() == "0" => Ok(()),
        Ok(s) => Err(format!(
            "the image build failed (exit {}); its log:\n{}",
            s.trim(),
            std::fs::read_to_string(dir.join("log")).unwrap_or_default()
        )
        .into()),
        Err(_) => Err(format!(
            "the image build left no status in {} (killed?)",
            dir.display()
        )
        .into()),
    }
}

/// Waits for a build in progress, without judging it (the cache check
/// that follows does).
pub fn settle(dir: &Path) -> Result<()> {
    if let Ok(f) = File::open(dir.join("lock")) {
        f.lock_shared()?;
    }
    Ok(())
}
