//! Bringing the loaded modules in line with the modules directory: the
//! rescan (which files changed, which went away) and the install of new
//! content (gunzip, compile or load from the cache, link, check pins and the
//! configurations in use), which either makes the new version current or
//! leaves the serving one alone and says why.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Instant, SystemTime},
};

use super::{
    ModuleVersion, Runtime,
    decode::{check_header, gunzip, is_gzipped, is_module_file, sha256_hex},
    pool::GuestPre,
};
use crate::{
    ModuleInfo,
    bindings::{v01, v02},
    cache::{CompileSource, Loaded},
    failures::FailureKind,
    host::HostState,
};
use portwise_core::text::truncate;

/// A file's identity as far as rescans care: where its content lives (the
/// kubelet swaps `..data` to a new directory), its size and mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    target: Option<PathBuf>,
    len: u64,
    modified: Option<SystemTime>,
}

#[derive(Default)]
pub(super) struct ScanState {
    stamps: HashMap<String, Stamp>,
    /// Modules present at some point and gone from the directory now.
    removed: HashSet<String>,
    /// The last load failure per module, while it is the latest news.
    pub(super) errors: HashMap<String, String>,
}

impl Runtime {
    /// Gunzips (a `.wasm.gz`), compiles (or loads from cache) and links a
    /// module's content. `stored` and `sha256` are the file as stored.
    ///
    /// CPU-heavy (seconds for a large guest): [`Runtime::install`] runs it
    /// on tokio's blocking pool. Also returns why a cached entry present was
    /// not used, if it was not.
    fn compile(
        &self,
        name: &str,
        source: &Path,
        stored: &[u8],
        sha256: &str,
    ) -> Result<(ModuleVersion, Option<String>), String> {
        let started = Instant::now();
        // The cache is keyed by the component's own hash, so `x.wasm` and
        // any `x.wasm.gz` of it share one entry.
        let gunzipped;
        let (bytes, code_sha256) = if is_gzipped(name) {
            gunzipped = gunzip(stored, self.limits.max_gunzipped_bytes)?;
            let code_sha256 = sha256_hex(&gunzipped);
            (&gunzipped[..], code_sha256)
        } else {
            (stored, sha256.to_string())
        };
        check_header(bytes)?;
        let Loaded {
            component,
            source: compiled,
            rejected,
        } =
            match &self.cache {
                Some(cache) => cache.load(&self.engine, &code_sha256, bytes),
                None => wasmtime::component::Component::from_binary(&self.engine, bytes).map(
                    |component| Loaded {
                        component,
                        source: CompileSource::Compiled,
                        rejected: None,
                    },
                ),
            }
            .map_err(|e| {
                format!(
                    "not a valid component: {}",
                    truncate(format!("{e:#}"), 1024)
                )
            })?;
        let load_time = started.elapsed();
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| format!("imports something portwise does not provide: {e:#}"))?;
        let pre = guest_pre(instance_pre)?;
        let version = ModuleVersion {
            name: name.to_string(),
            label: name.into(),
            sha256: sha256.to_string(),
            source: source.to_path_buf(),
            size: bytes.len(),
            compiled,
            load_time,
            pre,
            idle: Mutex::new(Vec::new()),
            validated: Mutex::new(HashMap::new()),
            counters: self.counters.module(name),
        };
        Ok((version, rejected))
    }

    /// Loads new content for `name` and makes it current, unless it fails to
    /// compile, does not match a pin in use, or rejects a configuration in
    /// use: then the current version (if any) keeps serving.
    async fn install(
        self: &Arc<Self>,
        scan: &mut ScanState,
        name: &str,
        source: &Path,
        bytes: Vec<u8>,
    ) -> Result<ModuleInfo, String> {
        let sha256 = sha256_hex(&bytes);
        let counters = self.counters.module(name);
        let fail = |scan: &mut ScanState, message: String| {
            counters.fail(FailureKind::Load);
            let serving = match self.current(name) {
                Some(v) => format!("; still serving sha256 {}", &v.sha256[..12]),
                None => String::new(),
            };
            let message = format!(
                "module {name} (sha256 {}): {message}{serving}",
                &sha256[..12]
            );
            scan.errors.insert(name.to_string(), message.clone());
            self.report(name, false, Some(&sha256), None, message.clone());
            Err(message)
        };
        // Compiling takes seconds of CPU: on the blocking pool, not on a
        // thread of whatever runtime is rescanning (a current-thread one
        // would stall for the whole compile).
        let compiled = {
            let (rt, name, source, sha256) = (
                self.clone(),
                name.to_string(),
                source.to_path_buf(),
                sha256.clone(),
            );
            tokio::task::spawn_blocking(move || rt.compile(&name, &source, &bytes, &sha256)).await
        };
        let (version, rejected) = match compiled {
            Ok(Ok(compiled)) => compiled,
            Ok(Err(message)) => return fail(scan, message),
            Err(e) => return fail(scan, format!("compiling failed: {e}")),
        };
        let users = self.users_of(name);
        if let Some(pin) = users
            .iter()
            .filter_map(|u| u.pin.as_deref())
            .find(|pin| *pin != sha256)
        {
            return fail(
                scan,
                format!("content does not match the sha256 {pin} pinned in the configuration"),
            );
        }
        // Each configuration in use, under each memory limit it runs with.
        let mut configs: Vec<(&str, crate::CallLimits)> = users
            .iter()
            .map(|u| (u.config.as_str(), u.limits))
            .collect();
        configs.sort_unstable_by_key(|(c, l)| (*c, l.memory_bytes));
        configs.dedup_by_key(|(c, l)| (*c, l.memory_bytes));
        for (config, limits) in configs {
            if let Err(message) = version.validate(self, config, &limits).await {
                return fail(
                    scan,
                    format!(
                        "rejects configuration {}: {message}",
                        truncate(config.to_string(), 200)
                    ),
                );
            }
        }
        let info = version.info();
        let compiled = version.compiled;
        let how = match compiled {
            CompileSource::Compiled => "compiled",
            CompileSource::Cached => "loaded from the compiled-code cache",
        };
        let mut message = format!(
            "module {name} (sha256 {}, portwise:membership@{}) {how} in {:.1} ms and serving",
            &sha256[..12],
            version.pre.interface(),
            version.load_time.as_secs_f64() * 1000.0
        );
        if let Some(why) = rejected {
            message.push_str(&format!(" (its cached code was rejected: {why})"));
        }
        self.modules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), Arc::new(version));
        scan.errors.remove(name);
        self.report(name, true, Some(&sha256), Some(compiled), message);
        Ok(info)
    }

    /// Installs a module pulled from a registry under its reference, or
    /// reports why the pull failed. A pull that fell back on the cache (a
    /// tag the registry could not resolve) is reported as a failure too,
    /// then the cached content installed.
    pub(crate) async fn install_pulled(
        self: &Arc<Self>,
        name: &str,
        pulled: Result<crate::oci::Pulled, String>,
    ) -> Result<ModuleInfo, String> {
        let mut scan = self.scan.lock().await;
        let counters = self.counters.module(name);
        let pulled = match pulled {
            Ok(p) => p,
            Err(why) => {
                counters.fail(FailureKind::Load);
                let serving = match self.current(name) {
                    Some(v) => format!("; still serving sha256 {}", &v.sha256[..12]),
                    None => String::new(),
                };
                let message = format!("module {name}: pull failed: {why}{serving}");
                scan.errors.insert(name.to_string(), message.clone());
                self.report(name, false, None, None, message.clone());
                return Err(message);
            }
        };
        if let Some(why) = &pulled.fallback {
            counters.fail(FailureKind::Load);
            self.report(
                name,
                false,
                None,
                None,
                format!("module {name}: pull failed: {why}"),
            );
        }
        tracing::info!(
            module = name,
            manifest = %pulled.manifest,
            from_cache = pulled.cached,
            signed_by = pulled.signed_by.as_ref().map(|v| format!("{} ({})", v.key, v.signature)),
            "{} bytes {}",
            pulled.bytes.len(),
            if pulled.cached { "read from the pull cache" } else { "pulled" }
        );
        let source = pulled.source.clone();
        self.install(&mut scan, name, &source, pulled.bytes).await
    }

    /// Loads one file under its file name.
    pub(crate) async fn load_file(self: &Arc<Self>, path: &Path) -> Result<ModuleInfo, String> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: not a file name", path.display()))?
            .to_string();
        let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut scan = self.scan.lock().await;
        if let Some(current) = self.current(&name)
            && current.sha256 == sha256_hex(&bytes)
        {
            return Ok(current.info());
        }
        self.install(&mut scan, &name, path, bytes).await
    }

    /// Brings the loaded modules in line with the directory. Unchanged files
    /// (same resolved path, size and mtime) are not even read; changed files
    /// with unchanged content are read and hashed but not reloaded.
    pub(crate) async fn rescan(self: &Arc<Self>) {
        let Some(dir) = &self.dir else { return };
        let mut scan = self.scan.lock().await;
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot read modulesDir: {e}");
                return;
            }
        };
        let mut present = HashSet::new();
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // Skip the kubelet's `..data` and `..2026_...` entries and any
            // hidden temporary file.
            if name.starts_with('.') || !is_module_file(&name) {
                continue;
            }
            let path = dir.join(&name);
            // Follows symlinks: a dangling link in the middle of a swap is
            // skipped now and picked up by the event that completes the swap.
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            present.insert(name.clone());
            let stamp = Stamp {
                target: fs::canonicalize(&path).ok(),
                len: meta.len(),
                modified: meta.modified().ok(),
            };
            if scan.stamps.get(&name) == Some(&stamp) {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(module = %name, "cannot read {}: {e}", path.display());
                    continue;
                }
            };
            scan.stamps.insert(name.clone(), stamp);
            if self
                .current(&name)
                .is_some_and(|v| v.sha256 == sha256_hex(&bytes))
            {
                continue;
            }
            let _ = self.install(&mut scan, &name, &path, bytes).await;
        }
        scan.stamps.retain(|name, _| present.contains(name));
        let loaded: Vec<String> = self
            .modules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for name in loaded {
            // Pulled from a registry, not from this directory.
            if name.starts_with(portwise_core::config::OCI_SCHEME) {
                continue;
            }
            if present.contains(&name) {
                scan.removed.remove(&name);
            } else if scan.removed.insert(name.clone()) {
                self.report(
                    &name,
                    false,
                    None,
                    None,
                    format!(
                        "module {name} is gone from {}; still serving the last loaded version",
                        dir.display()
                    ),
                );
            }
        }
    }
}

/// The exports a 0.1 and a 0.2 checker have; semver-compatible patch
/// versions (`@0.2.3`) are found by wasmtime's export lookup too.
const CHECKER_0_2: &str = "portwise:membership/checker@0.2.0";
const CHECKER_0_1: &str = "portwise:membership/checker@0.1.0";

/// Picks the WIT version by what the component exports: 0.2 if it exports
/// the 0.2 checker, else 0.1; anything else is not a membership checker.
fn guest_pre(
    instance_pre: wasmtime::component::InstancePre<HostState>,
) -> Result<GuestPre, String> {
    let component = instance_pre.component();
    if component.get_export_index(None, CHECKER_0_2).is_some() {
        return v02::MembershipCheckerPre::new(instance_pre)
            .map(GuestPre::V02)
            .map_err(|e| format!("exports {CHECKER_0_2} but not as portwise defines it: {e:#}"));
    }
    if component.get_export_index(None, CHECKER_0_1).is_some() {
        return v01::MembershipCheckerPre::new(instance_pre)
            .map(GuestPre::V01)
            .map_err(|e| format!("exports {CHECKER_0_1} but not as portwise defines it: {e:#}"));
    }
    Err(format!(
        "not a portwise membership checker: exports neither {CHECKER_0_2} nor {CHECKER_0_1} \
         (build it against wit/membership.wit, world membership-checker)"
    ))
}
