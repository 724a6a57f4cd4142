//! The build's identity for `portwise --version` and `portwise_build_info`
//! (src/build.rs): the git revision and the commit's date, taken from the
//! commit, not the clock, so building the same commit twice gives the same
//! binary.
//!
//! - revision: `git rev-parse HEAD`; where git cannot run (the Rust-only
//!   tier is checked with a PATH holding only the Rust toolchain), read
//!   from `.git` itself (HEAD, the ref it names, loose or packed; a
//!   worktree's `.git` file and its `commondir` are followed);
//! - date: `git log -1 --format=%cI` (the committer date, strict ISO 8601);
//! - without a checkout (or a git that answers), `PORTWISE_REVISION` and
//!   `PORTWISE_BUILD_DATE` from the environment, as a build from a source
//!   archive would pass them; else `unknown`.
//!
//! The image is built from a binary compiled on the host
//! (deploy/build-image), so its build sees `.git`.
//!
//! An uncommitted change does not show (no `-dirty`): marking it would
//! rerun this script on every edit. The script reruns when HEAD or the ref
//! it points to moves (`rerun-if-changed` on those files and packed-refs),
//! or when one of the two variables changes.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PORTWISE_REVISION");
    println!("cargo:rerun-if-env-changed=PORTWISE_BUILD_DATE");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));

    let dirs = git_dirs(&manifest);
    if let Some(dirs) = &dirs {
        for path in dirs.watched() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    let revision = dirs
        .as_ref()
        .and_then(|d| {
            git(&manifest, &["rev-parse", "HEAD"])
                .filter(|r| is_object_id(r))
                .or_else(|| d.head())
        })
        .or_else(|| from_env("PORTWISE_REVISION"))
        .unwrap_or_else(|| "unknown".into());
    let date = dirs
        .as_ref()
        .and_then(|_| git(&manifest, &["log", "-1", "--format=%cI"]))
        .or_else(|| from_env("PORTWISE_BUILD_DATE"))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PORTWISE_REVISION={revision}");
    println!("cargo:rustc-env=PORTWISE_BUILD_DATE={date}");
}

/// A variable's value, when set to something printable on one line.
fn from_env(name: &str) -> Option<String> {
    let v = env::var(name).ok()?;
    let v = v.trim();
    (!v.is_empty() && !v.contains(char::is_control)).then(|| v.to_string())
}

/// git's one-line answer, run in `dir`; None when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty() && !text.contains(char::is_control)).then(|| text.to_string())
}

/// A full object name: 40 hex digits (SHA-1) or 64 (SHA-256).
fn is_object_id(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The repository's git directory (a worktree's own) and its common
/// directory (where refs live).
struct GitDirs {
    git: PathBuf,
    common: PathBuf,
}

/// The `.git` of the checkout holding `start`, if any.
fn git_dirs(start: &Path) -> Option<GitDirs> {
    for dir in start.ancestors() {
        let dotgit = dir.join(".git");
        if dotgit.is_dir() {
            return Some(GitDirs {
                git: dotgit.clone(),
                common: dotgit,
            });
        }
        if dotgit.is_file() {
            // A worktree or submodule: `gitdir: PATH`, relative to `dir`.
            let text = std::fs::read_to_string(&dotgit).ok()?;
            let git = dir.join(text.strip_prefix("gitdir:")?.trim());
            let common = std::fs::read_to_string(git.join("commondir"))
                .map(|c| git.join(c.trim()))
                .unwrap_or_else(|_| git.clone());
            return Some(GitDirs { git, common });
        }
    }
    None
}

impl GitDirs {
    /// `ref: refs/heads/x`, or None when HEAD is detached.
    fn head_ref(&self) -> Option<String> {
        let head = std::fs::read_to_string(self.git.join("HEAD")).ok()?;
        head.trim()
            .strip_prefix("ref:")
            .map(|r| r.trim().to_string())
    }

    /// The files whose change moves HEAD: HEAD itself, the ref it names
    /// (loose, else packed-refs: a loose ref wins, so packed-refs, which
    /// every worktree shares, is watched only when the ref is packed), and
    /// HEAD's reflog, which every move appends to (a commit on a branch
    /// whose ref was packed writes a new loose ref, and touches neither
    /// HEAD nor packed-refs). Only existing ones: cargo reruns a script
    /// every time for a path that does not exist.
    fn watched(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.git.join("HEAD"), self.git.join("logs/HEAD")];
        if let Some(r) = self.head_ref() {
            let loose = self.common.join(r);
            paths.push(if loose.is_file() {
                loose
            } else {
                self.common.join("packed-refs")
            });
        }
        paths.retain(|p| p.is_file());
        paths
    }

    /// HEAD's commit, read from the files (when git cannot run).
    fn head(&self) -> Option<String> {
        let id = match self.head_ref() {
            None => std::fs::read_to_string(self.git.join("HEAD")).ok()?,
            Some(r) => std::fs::read_to_string(self.common.join(&r))
                .ok()
                .or_else(|| {
                    let packed = std::fs::read_to_string(self.common.join("packed-refs")).ok()?;
                    packed.lines().find_map(|l| {
                        let (id, name) = l.split_once(' ')?;
                        (name == r).then(|| id.to_string())
                    })
                })?,
        };
        let id = id.trim().to_string();
        is_object_id(&id).then_some(id)
    }
}
