//! portwise's test orchestration, run through `tests/xtask/run`:
//!
//! - `test [-- CARGO TEST ARGS]`: what `./test` does after installing the
//!   toolchains (`tests/setup`): decides what a cold cache defers, builds
//!   the Go tools beside the workspace, runs the suite and the real node's
//!   suite in network namespaces of their own, and leaves the deferred
//!   builds for the next run ([`test`]).
//! - `suite [CARGO TEST ARGS]`: inside the test network namespace, starts a
//!   control plane and runs every test against it ([`suite`]).
//! - `build-deferred [--detach] BUILD...`: builds what a cold run deferred
//!   ([`deferred`]).
//! - `image-build start|stop|wait DIR`: the host image's release build,
//!   beside the suite ([`image`]).
//!
//! What stays in bash: `tests/netns` (entering a network namespace is
//! `unshare` and `ip`), `tests/setup` (it installs the toolchain this is
//! built with), and the recipes that build one thing each (the Go tools'
//! builder, whose cache stamps hash its own text, the node's and the
//! guests' builds, the image's).
//!
//! No dependencies: it must build in seconds on a fresh machine, before
//! the workspace, without a registry.

mod deferral;
mod deferred;
mod image;
mod proc;
mod suite;
mod test;

use std::{path::PathBuf, process::ExitCode};

/// Errors end the command with their text; each names what failed.
pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Where things are: the checkout (the current directory, which
/// `tests/xtask/run` sets) and the cache `tests/env.sh` names.
pub struct Paths {
    pub root: PathBuf,
    pub cache: PathBuf,
    pub logs: PathBuf,
}

impl Paths {
    fn from_env() -> Result<Self> {
        let root = std::env::current_dir()?;
        if !root.join("tests/xtask/Cargo.toml").is_file() {
            return Err(format!(
                "{} is not a portwise checkout: run through tests/xtask/run",
                root.display()
            )
            .into());
        }
        let cache = std::env::var_os("PORTWISE_CACHE")
            .map(PathBuf::from)
            .ok_or(
                "PORTWISE_CACHE is unset: run through tests/xtask/run (it sources tests/env.sh)",
            )?;
        let logs = cache.join("logs");
        std::fs::create_dir_all(&logs)?;
        Ok(Self { root, cache, logs })
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => ("", &[][..]),
    };
    let paths = match Paths::from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        "test" => test::run(&paths, rest),
        "suite" => suite::run(&paths, rest),
        "build-deferred" => deferred::run(&paths, rest),
        "image-build" => image::run(&paths, rest),
        _ => {
            eprintln!(
                "usage: tests/xtask/run test [-- ARGS] | suite [ARGS] | build-deferred [--detach] BUILD... | image-build start|stop|wait DIR"
            );
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("xtask {command}: {e}");
            ExitCode::from(1)
        }
    }
}
