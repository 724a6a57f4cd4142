//! Compiled code on disk, so a restart does not recompile.
//!
//! Compiling a Python guest takes seconds; loading its precompiled artifact
//! takes milliseconds. An entry is keyed by the module's content hash plus
//! the engine fingerprint (target, compiler settings, wasmtime version): an
//! artifact only ever loads into an engine that could have produced it.
//! Entries are written to a temporary file and renamed into place, so a
//! crash never leaves half an entry under a real name; an entry that fails to
//! load anyway (truncated, corrupt, foreign) is deleted and rebuilt.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use wasmtime::{Engine, component::Component};

/// Where a component came from, and what it cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileSource {
    /// Compiled from the `.wasm` bytes now.
    Compiled,
    /// Loaded from the compiled-code cache.
    Cached,
}

#[derive(Debug)]
pub(crate) struct CodeCache {
    dir: PathBuf,
    fingerprint: String,
}

impl CodeCache {
    pub(crate) fn new(dir: PathBuf, fingerprint: String) -> Self {
        CodeCache { dir, fingerprint }
    }

    pub(crate) fn path(&self, sha256: &str) -> PathBuf {
        // 16 hex digits of the engine fingerprint keep names short; the full
        // check happens when wasmtime reads the artifact's header.
        self.dir
            .join(format!("{sha256}-{}.cwasm", &self.fingerprint[..16]))
    }

    /// Loads the component for `sha256`, compiling (and caching) on a miss.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        sha256: &str,
        wasm: &[u8],
    ) -> wasmtime::Result<(Component, CompileSource, Duration)> {
        let path = self.path(sha256);
        let started = Instant::now();
        if path.exists() {
            // SAFETY: the file is in our own cache directory, was written by
            // `Component::serialize` through `store` below (atomic rename),
            // and wasmtime checks its header and engine compatibility. A
            // file that fails those checks is discarded.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, CompileSource::Cached, started.elapsed())),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "discarding unusable compiled-code cache entry: {e:#}");
                    let _ = fs::remove_file(&path);
                }
            }
        }
        let started = Instant::now();
        let component = Component::from_binary(engine, wasm)?;
        let took = started.elapsed();
        match component.serialize() {
            Ok(bytes) => {
                if let Err(e) = self.store(&path, &bytes) {
                    tracing::warn!(dir = %self.dir.display(), "cannot write compiled-code cache: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot serialise compiled component: {e:#}"),
        }
        Ok((component, CompileSource::Compiled, took))
    }

    fn store(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = fs::File::create(&tmp)?;
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        drop(file);
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }
}

/// `$XDG_CACHE_HOME/portwise/wasm`, else `$HOME/.cache/portwise/wasm`, else
/// `/var/cache/portwise/wasm`.
pub fn default_cache_dir() -> PathBuf {
    let from_env = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(xdg) = from_env("XDG_CACHE_HOME") {
        return xdg.join("portwise").join("wasm");
    }
    if let Some(home) = from_env("HOME") {
        return home.join(".cache").join("portwise").join("wasm");
    }
    PathBuf::from("/var/cache/portwise/wasm")
}
