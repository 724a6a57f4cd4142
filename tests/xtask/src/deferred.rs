//! `build-deferred [--detach] BUILD...`: builds what a cold `./test`
//! deferred (the deferrable Go tools, `tests/go-tools/build NAME`, the
//! image, the arm64 binary, the release's tools and wkg), so that the
//! next run has it.
//!
//! `--detach` returns at once and builds in a session of its own at the
//! lowest CPU priority, logging to `$PORTWISE_CACHE/logs/deferred-build.log`.
//! It builds from a copy of the checkout's files: CI runs in a clean clone
//! that is removed when the run ends, and builds that read a removed
//! checkout fail half-way (each would then be built inside the next run,
//! on that run's clock).
//!
//! A build named here is recorded in `$PORTWISE_CACHE/deferred-before`
//! first (see [`crate::deferral`]).

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use crate::{Paths, Result, image, proc};

/// The builds `./test` may defer: the deferrable Go tools, the image, the
/// arm64 binary (`deploy/build-binary --arch arm64`, ship::arm64's) and wkg
/// (`tests/wkg/build`, ship::sdk's).
pub fn deferrable(paths: &Paths) -> Result<Vec<String>> {
    let mut builds = proc::lines(
        paths.root.join("tests/go-tools/build"),
        &["--list", "deferrable"],
    )?;
    builds.push("image".to_owned());
    if paths.root.join(ARM64_BUILD).is_file() {
        builds.push("arm64".to_owned());
    }
    if paths.root.join(RELEASE).is_file() {
        builds.push("release".to_owned());
    }
    if paths.root.join(WKG_BUILD).is_file() {
        builds.push("wkg".to_owned());
    }
    Ok(builds)
}

/// The release command, whose tools (skopeo, cargo-cyclonedx: about 200
/// CPU-s cold) are the deferrable build `release` (the rehearsal's).
pub const RELEASE: &str = "deploy/release";

/// Whether the release's tools are installed.
pub fn release_cached(paths: &Paths) -> bool {
    proc::succeeds(paths.root.join(RELEASE), &["--tools", "--cached"]).unwrap_or(false)
}

/// The script that builds wkg from crates.io (ship::sdk's; about 720 CPU-s
/// cold) and, with `--cached`, says whether it is built.
pub const WKG_BUILD: &str = "tests/wkg/build";

/// ship::sdk's packer: with `--tools` it installs the Python wheel's build
/// requirements from PyPI (`--cached`: whether they are), which the suite's
/// network namespace could not. Part of the build `wkg`.
pub const SDK_PACK: &str = "guests/sdk/pack";

/// What the templates of ship::sdk fetch from npm (their metadata), into
/// npm's cache; `--cached`: whether an offline install works. Part of the
/// build `wkg`.
pub const SDK_PREFETCH: &str = "tests/sdk/prefetch";

/// Whether wkg, the packer's tools and the templates' npm metadata are
/// installed.
pub fn wkg_cached(paths: &Paths) -> bool {
    proc::succeeds(paths.root.join(WKG_BUILD), &["--cached"]).unwrap_or(false)
        && proc::succeeds(paths.root.join(SDK_PACK), &["--tools", "--cached"]).unwrap_or(false)
        && proc::succeeds(paths.root.join(SDK_PREFETCH), &["--cached"]).unwrap_or(false)
}

/// The script that builds the arm64 binary (and, with `--core-tests`, the
/// core crate's tests for arm64).
pub const ARM64_BUILD: &str = "deploy/build-binary";

/// Whether the arm64 build's dependencies are compiled (what costs a cold
/// cross build); a changed crate is then rebuilt by the test that needs it.
pub fn arm64_cached(paths: &Paths) -> bool {
    proc::succeeds(
        paths.root.join(ARM64_BUILD),
        &["--arch", "arm64", "--cached"],
    )
    .unwrap_or(false)
}

pub fn run(paths: &Paths, args: &[String]) -> Result<u8> {
    let (detach, builds) = match args.split_first() {
        Some((first, rest)) if first == "--detach" => (true, rest),
        _ => (false, args),
    };
    let known = deferrable(paths)?;
    if let Some(unknown) = builds.iter().find(|b| !known.contains(b)) {
        return Err(format!("unknown build {unknown} ({})", known.join(" ")).into());
    }
    if detach {
        return detached(paths, builds).map(|()| 0);
    }
    let mut before = OpenOptions::new()
        .create(true)
        .append(true)
        .open(paths.cache.join("deferred-before"))?;
    for b in builds {
        writeln!(before, "{b}")?;
    }
    let mut rc = 0u8;
    for b in builds {
        let t0 = Instant::now();
        let ok = build(paths, b)?;
        if !ok {
            rc = 1;
        }
        println!(
            "build-deferred: {b} done in {} s (exit so far {rc})",
            t0.elapsed().as_secs()
        );
    }
    if let Some(copy) = copy_of(&paths.cache, &paths.root) {
        let _ = std::fs::remove_dir_all(copy);
    }
    Ok(rc)
}

/// Builds one deferrable build in the foreground; whether it succeeded.
pub fn build(paths: &Paths, b: &str) -> Result<bool> {
    let ok = if b == "image" {
        let dir = paths.cache.join("image-build");
        image::start(paths, &dir)?;
        image::wait(&dir).map_err(|e| eprintln!("{e}")).is_ok()
    } else if b == "arm64" {
        Command::new(paths.root.join(ARM64_BUILD))
            .args(["--arch", "arm64", "--core-tests"])
            .stdout(Stdio::null())
            .status()?
            .success()
    } else if b == "release" {
        Command::new(paths.root.join(RELEASE))
            .arg("--tools")
            .stdout(Stdio::null())
            .status()?
            .success()
    } else if b == "wkg" {
        Command::new(paths.root.join(WKG_BUILD))
            .stdout(Stdio::null())
            .status()?
            .success()
            && Command::new(paths.root.join(SDK_PACK))
                .arg("--tools")
                .stdout(Stdio::null())
                .status()?
                .success()
            && Command::new(paths.root.join(SDK_PREFETCH))
                .stdout(Stdio::null())
                .status()?
                .success()
    } else {
        Command::new(paths.root.join("tests/go-tools/build"))
            .arg(b)
            .stdout(Stdio::null())
            .status()?
            .success()
    };
    Ok(ok)
}

/// Starts the builds in the background, from a copy of the checkout.
fn detached(paths: &Paths, builds: &[String]) -> Result<()> {
    let copies = paths.cache.join("deferred-src");
    forget_abandoned(&copies);
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let copy = copies.join(format!("{stamp}"));
    copy_checkout(&paths.root, &copy)?;
    // This program, copied too: the next run's `tests/xtask/run` rebuilds it
    // in place, and the image build starts it again by its own path
    // (`image::start`), which would then name a deleted file.
    let exe = copy.join(".xtask");
    std::fs::copy(std::env::current_exe()?, &exe)?;
    let log = File::create(paths.logs.join("deferred-build.log"))?;
    let child = Command::new("setsid")
        .args(["nice", "-n", "19"])
        .arg(&exe)
        .arg("build-deferred")
        .args(builds)
        .current_dir(&copy)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start the deferred builds: {e}"))?;
    std::fs::write(
        copy.join(".deferred-build.pid"),
        format!("{}\n", child.id()),
    )?;
    Ok(())
}

/// The copy `root` is, when it is one of `cache`'s deferred-build copies.
fn copy_of(cache: &Path, root: &Path) -> Option<PathBuf> {
    (root.parent()? == cache.join("deferred-src")).then(|| root.to_path_buf())
}

/// Removes copies whose build is no longer running (killed before it
/// could remove its own).
fn forget_abandoned(copies: &Path) {
    let Ok(entries) = std::fs::read_dir(copies) else {
        return;
    };
    for e in entries.flatten() {
        let pid = std::fs::read_to_string(e.path().join(".deferred-build.pid")).unwrap_or_default();
        let alive = !pid.trim().is_empty() && Path::new("/proc").join(pid.trim()).exists();
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Copies the files git tracks (as they are in the work tree, edits
/// included) and keeps symlinks as symlinks (the older minors' control
/// planes link to the current one's sources).
fn copy_checkout(root: &Path, to: &Path) -> Result<()> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "git ls-files failed in {}: a git checkout is needed",
            root.display()
        )
        .into());
    }
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name)?;
        let (from, dest) = (root.join(name), to.join(name));
        let Ok(meta) = std::fs::symlink_metadata(&from) else {
            continue; // deleted in the work tree
        };
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &dest)?;
        } else if meta.is_file() {
            std::fs::copy(&from, &dest)?;
        }
    }
    Ok(())
}
