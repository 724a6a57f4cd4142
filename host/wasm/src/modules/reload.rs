//! Bringing the loaded modules in line with what the supply hands over:
//! the changed files of a modules directory rescan (and the modules that
//! went away), a pulled module, a single file. Installing new content
//! (gunzip, compile or load from the cache, link, check pins and the
//! configurations in use) either makes the new version current or leaves
//! the serving one alone and says why. Reading, watching and pulling are
//! `portwise_supply`'s; compiling and swapping are this file's.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use portwise_supply::{Content, ModuleFile, ModulesDir, PullError, Pulled};

use super::{ModuleVersion, Runtime, pool::GuestPre};
use crate::{
    ModuleInfo,
    compile::{CompileSource, Loaded},
    error::{LoadCause, LoadError},
    failures::FailureKind,
    state::HostState,
    v0_1, v0_2,
    wit::{CHECKER_0_1, CHECKER_0_2},
};

/// Loads are serialised by this state's lock (the runtime's `scan`).
pub(super) struct ScanState {
    /// The modules directory, as the last rescan saw it.
    dir: Option<ModulesDir>,
    /// Modules present at some point and gone from the directory now.
    removed: HashSet<String>,
    /// The last load failure per module, while it is the latest news.
    pub(super) errors: HashMap<String, Arc<LoadError>>,
}

impl ScanState {
    /// `referenced`: the only module files read (`None`: all of them).
    pub(super) fn new(dir: Option<PathBuf>, referenced: Option<HashSet<String>>) -> Self {
        ScanState {
            dir: dir.map(|dir| match referenced {
                Some(names) => ModulesDir::new(dir).only(names),
                None => ModulesDir::new(dir),
            }),
            removed: HashSet::new(),
            errors: HashMap::new(),
        }
    }
}

impl Runtime {
    /// Gunzips (a `.wasm.gz`), bounds (`bounds.rs`), compiles (or loads
    /// from cache) and links a module's content (the file as stored).
    ///
    /// CPU-heavy (seconds for a large guest): [`Runtime::install`] runs it
    /// on tokio's blocking pool. Also returns why a cached entry present was
    /// not used, if it was not.
    fn compile(
        &self,
        name: &str,
        content: &Content,
    ) -> Result<(ModuleVersion, Option<String>), LoadCause> {
        let started = Instant::now();
        // The cache is keyed by the component's own hash, so `x.wasm` and
        // any `x.wasm.gz` of it share one entry.
        let code = self
            .supply
            .component(
                name,
                &content.bytes,
                &content.sha256,
                self.limits.max_gunzipped_bytes,
            )
            .map_err(LoadCause::Decode)?;
        let bytes = &code.bytes[..];
        // Before the compiler, and before the cache too: whether a module
        // loads does not depend on what the cache holds.
        crate::bounds::check(name, bytes, &self.limits).map_err(LoadCause::Bounds)?;
        let Loaded {
            component,
            source: compiled,
            rejected,
        } =
            match &self.cache {
                Some(cache) => cache.load(&self.engine, &code.sha256, bytes),
                None => wasmtime::component::Component::from_binary(&self.engine, bytes).map(
                    |component| Loaded {
                        component,
                        source: CompileSource::Compiled,
                        rejected: None,
                    },
                ),
            }
            .map_err(|source| LoadCause::Compile { source })?;
        let load_time = started.elapsed();
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(LoadCause::Imports)?;
        let pre = guest_pre(instance_pre)?;
        let version = ModuleVersion {
            name: name.to_string(),
            label: name.into(),
            sha256: content.sha256.clone(),
            source: content.source.clone(),
            size: bytes.len(),
            code_sha256: code.sha256.clone(),
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
    /// use: then the current version (if any) keeps serving. Either way,
    /// the compiled-code cache then keeps only the entries of modules
    /// loaded (see [`crate::compile::CodeCache::retain`]).
    async fn install(
        self: &Arc<Self>,
        errors: &mut HashMap<String, Arc<LoadError>>,
        name: &str,
        content: Content,
    ) -> Result<ModuleInfo, Arc<LoadError>> {
        let installed = self.swap_in(errors, name, content).await;
        if let Some(cache) = &self.cache {
            let modules = self.modules.read().unwrap_or_else(|e| e.into_inner());
            cache.retain(&modules.values().map(|m| &m.code_sha256[..]).collect());
        }
        installed
    }

    async fn swap_in(
        self: &Arc<Self>,
        errors: &mut HashMap<String, Arc<LoadError>>,
        name: &str,
        content: Content,
    ) -> Result<ModuleInfo, Arc<LoadError>> {
        let sha256 = content.sha256.clone();
        let counters = self.counters.module(name);
        let fail = |errors: &mut HashMap<String, Arc<LoadError>>, cause: LoadCause| {
            counters.fail(FailureKind::Load);
            let error = Arc::new(LoadError::Refused {
                module: name.to_string(),
                sha256: sha256.clone(),
                cause,
                serving: self.current(name).map(|v| v.sha256.clone()),
            });
            errors.insert(name.to_string(), error.clone());
            self.report(name, false, Some(&sha256), None, error.to_string());
            Err(error)
        };
        // The pin first, on the bytes as stored: content that is not the
        // pinned module is never gunzipped nor compiled.
        let users = self.users_of(name);
        if let Some(pin) = self
            .pins_of(name, &users)
            .into_iter()
            .find(|pin| *pin != sha256)
        {
            return fail(errors, LoadCause::PinMismatch { pin });
        }
        // Compiling takes seconds of CPU: on the blocking pool, not on a
        // thread of whatever runtime is rescanning (a current-thread one
        // would stall for the whole compile).
        let compiled = {
            let (rt, name) = (self.clone(), name.to_string());
            tokio::task::spawn_blocking(move || rt.compile(&name, &content)).await
        };
        let (version, rejected) = match compiled {
            Ok(Ok(compiled)) => compiled,
            Ok(Err(cause)) => return fail(errors, cause),
            Err(e) => return fail(errors, LoadCause::Compiling(e)),
        };
        // Each configuration in use, under each memory limit it runs with.
        let mut configs: Vec<(&str, crate::CallLimits)> = users
            .iter()
            .map(|u| (u.config.as_str(), u.limits))
            .collect();
        configs.sort_unstable_by_key(|(c, l)| (*c, l.memory_bytes));
        configs.dedup_by_key(|(c, l)| (*c, l.memory_bytes));
        for (config, limits) in configs {
            if let Err(rejection) = version.validate(self, config, &limits).await {
                let config = config.to_string();
                return fail(errors, LoadCause::ConfigRejected { config, rejection });
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
        errors.remove(name);
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
        pulled: Result<Pulled, PullError>,
    ) -> Result<ModuleInfo, Arc<LoadError>> {
        let mut scan = self.scan.lock().await;
        let counters = self.counters.module(name);
        let pulled = match pulled {
            Ok(p) => p,
            Err(source) => {
                counters.fail(FailureKind::Load);
                let error = Arc::new(LoadError::Pull {
                    module: name.to_string(),
                    source,
                    serving: self.current(name).map(|v| v.sha256.clone()),
                });
                scan.errors.insert(name.to_string(), error.clone());
                self.report(name, false, None, None, error.to_string());
                return Err(error);
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
            pulled.content.bytes.len(),
            if pulled.cached { "read from the pull cache" } else { "pulled" }
        );
        self.install(&mut scan.errors, name, pulled.content).await
    }

    /// Loads one file under its file name.
    pub(crate) async fn load_file(
        self: &Arc<Self>,
        path: &Path,
    ) -> Result<ModuleInfo, Arc<LoadError>> {
        let file = ModuleFile::read(path).map_err(|e| Arc::new(LoadError::Read(e)))?;
        let mut scan = self.scan.lock().await;
        if let Some(current) = self.current(&file.name)
            && current.sha256 == file.content.sha256
        {
            return Ok(current.info());
        }
        self.install(&mut scan.errors, &file.name, file.content)
            .await
    }

    /// Brings the loaded modules in line with the directory. Unchanged files
    /// (same resolved path, size and mtime) are not even read; changed files
    /// with unchanged content are read and hashed but not reloaded.
    pub(crate) async fn rescan(self: &Arc<Self>) {
        let mut scan = self.scan.lock().await;
        let ScanState {
            dir,
            removed,
            errors,
        } = &mut *scan;
        let Some(dir) = dir else { return };
        let Some(mut files) = dir.scan() else { return };
        for file in files.by_ref() {
            if self
                .current(&file.name)
                .is_some_and(|v| v.sha256 == file.content.sha256)
            {
                continue;
            }
            let _ = self.install(errors, &file.name, file.content).await;
        }
        let present = files.finish();
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
                removed.remove(&name);
            } else if removed.insert(name.clone()) {
                self.report(
                    &name,
                    false,
                    None,
                    None,
                    format!(
                        "module {name} is gone from {}; still serving the last loaded version",
                        dir.path().display()
                    ),
                );
            }
        }
    }
}

/// Picks the WIT version by what the component exports: 0.2 if it exports
/// the 0.2 checker, else 0.1; anything else is not a membership checker.
fn guest_pre(
    instance_pre: wasmtime::component::InstancePre<HostState>,
) -> Result<GuestPre, LoadCause> {
    let component = instance_pre.component();
    if component.get_export_index(None, CHECKER_0_2).is_some() {
        return v0_2::MembershipCheckerPre::new(instance_pre)
            .map(GuestPre::V02)
            .map_err(|source| LoadCause::Exports {
                export: CHECKER_0_2,
                source,
            });
    }
    if component.get_export_index(None, CHECKER_0_1).is_some() {
        return v0_1::MembershipCheckerPre::new(instance_pre)
            .map(GuestPre::V01)
            .map_err(|source| LoadCause::Exports {
                export: CHECKER_0_1,
                source,
            });
    }
    Err(LoadCause::NotAChecker)
}

/// Issue 45: what reaches the compiler. The example guest kept in
/// `tests/fixtures`, so these run without the built guests.
#[cfg(test)]
mod tests {
    use std::{fs, io::Write, path::Path, sync::Arc};

    use portwise_core::config::WasmSpec;
    use serde_json::json;

    use crate::{Limits, WasmConfig, WasmError, WasmRuntime};

    const GUEST: &[u8] = include_bytes!("../../tests/fixtures/admin-check-0.2.0.wasm");

    fn spec(module: &str, sha256: Option<&str>) -> WasmSpec {
        serde_json::from_value(json!({"module": module, "config": {}, "sha256": sha256})).unwrap()
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap()
    }

    async fn runtime(
        dir: &Path,
        cache: &Path,
        expressions: Option<Vec<WasmSpec>>,
        limits: Limits,
    ) -> WasmRuntime {
        WasmRuntime::new(WasmConfig {
            supply: Arc::new(portwise_supply::Supplier),
            modules_dir: Some(dir.to_path_buf()),
            expressions,
            cache_dir: Some(cache.to_path_buf()),
            watch: false,
            limits: Limits {
                max_instances: 8,
                ..limits
            },
            oci: Default::default(),
            probes: Default::default(),
        })
        .await
        .unwrap()
    }

    /// Files no expression names are not read, gunzipped nor compiled:
    /// neither garbage nor a gzip bomb beside the module in use leaves a
    /// load error, and the module in use serves.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn files_no_expression_names_are_not_compiled() {
        let (dir, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fs::write(dir.path().join("check.wasm"), GUEST).unwrap();
        fs::write(dir.path().join("garbage.wasm"), b"not wasm at all").unwrap();
        let bomb = gzip(&vec![0u8; 80 << 20]);
        fs::write(dir.path().join("bomb.wasm.gz"), bomb).unwrap();
        let rt = runtime(
            dir.path(),
            cache.path(),
            Some(vec![spec("check", None)]),
            Limits::default(),
        )
        .await;
        assert_eq!(rt.load_errors().await, []);
        let loaded: Vec<String> = rt.modules().into_iter().map(|m| m.module).collect();
        assert_eq!(loaded, ["check.wasm"]);
        // One compile: the module in use.
        assert_eq!(rt.code_cache_stats().unwrap().misses, 1);
        rt.checker("check.wasm", &json!({}), None).await.unwrap();
        let Err(WasmError::NotLoaded { why, .. }) =
            rt.checker("garbage.wasm", &json!({}), None).await
        else {
            panic!("garbage.wasm was loaded");
        };
        assert!(
            why.to_string()
                .contains("no expression of the configuration names it"),
            "{why}"
        );
        // Nor on a rescan.
        fs::write(dir.path().join("garbage.wasm"), b"still not wasm").unwrap();
        rt.rescan().await;
        assert_eq!(rt.load_errors().await, []);
    }

    /// A pin is compared with the file's bytes before anything else: a file
    /// that is not even WebAssembly, or a gzip bomb, gives the pin error,
    /// and nothing is gunzipped or compiled; at the first load and on a
    /// reload alike.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn content_that_does_not_match_its_pin_is_refused_before_compiling() {
        let (dir, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let pin = portwise_supply::sha256_hex(GUEST);
        fs::write(dir.path().join("check.wasm"), b"not wasm at all").unwrap();
        fs::write(dir.path().join("bomb.wasm.gz"), gzip(&vec![0u8; 80 << 20])).unwrap();
        let expressions = vec![
            spec("check.wasm", Some(&pin.to_ascii_uppercase())),
            spec("bomb.wasm.gz", Some(&pin)),
        ];
        let rt = runtime(
            dir.path(),
            cache.path(),
            Some(expressions),
            Limits::default(),
        )
        .await;
        let errors = rt.load_errors().await;
        assert_eq!(errors.len(), 2, "{errors:?}");
        for (module, error) in &errors {
            assert!(
                error.contains(&format!("does not match the sha256 {pin} pinned")),
                "{module}: {error}"
            );
        }
        assert_eq!(
            rt.code_cache_stats().unwrap().misses,
            0,
            "something was compiled"
        );

        // The pinned content serves; garbage in its place is refused by
        // the pin again, and the pinned version keeps serving.
        fs::write(dir.path().join("check.wasm"), GUEST).unwrap();
        rt.rescan().await;
        rt.checker("check.wasm", &json!({}), Some(&pin))
            .await
            .unwrap();
        fs::write(dir.path().join("check.wasm"), b"not wasm, and longer").unwrap();
        rt.rescan().await;
        let errors = rt.load_errors().await;
        let error = &errors.iter().find(|(m, _)| m == "check.wasm").unwrap().1;
        assert!(error.contains("does not match the sha256"), "{error}");
        assert!(error.contains("still serving"), "{error}");
        assert_eq!(rt.code_cache_stats().unwrap().misses, 1);
    }

    /// A component past a compile bound is refused before the compiler,
    /// with the file and the figure named.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_component_over_a_compile_bound_is_refused_by_name() {
        let (dir, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fs::write(dir.path().join("check.wasm.gz"), gzip(GUEST)).unwrap();
        let limits = Limits {
            max_function_bytes: 1024,
            ..Limits::default()
        };
        let rt = runtime(
            dir.path(),
            cache.path(),
            Some(vec![spec("check.wasm.gz", None)]),
            limits,
        )
        .await;
        let errors = rt.load_errors().await;
        let [(module, error)] = &errors[..] else {
            panic!("{errors:?}");
        };
        assert_eq!(module, "check.wasm.gz");
        assert!(
            error.contains("check.wasm.gz: function body ")
                && error.contains("above the 1.0 KiB compile limit"),
            "{error}"
        );
        assert_eq!(rt.code_cache_stats().unwrap().misses, 0, "it was compiled");
    }

    /// The pin's refusal is typed: the pin and the content's digest are
    /// data, not text to parse, and a checker asking for the module gets
    /// the load error itself as the reason.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pin_mismatch_carries_the_pin_and_the_content_digest() {
        use crate::{LoadCause, LoadError, WhyNotLoaded};
        let (dir, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fs::write(dir.path().join("check.wasm"), b"not the pinned module").unwrap();
        let pin = portwise_supply::sha256_hex(GUEST);
        let rt = runtime(
            dir.path(),
            cache.path(),
            Some(vec![spec("check.wasm", Some(&pin))]),
            Limits::default(),
        )
        .await;
        let Err(WasmError::NotLoaded { module, why }) =
            rt.checker("check.wasm", &json!({}), Some(&pin)).await
        else {
            panic!("check.wasm was loaded");
        };
        assert_eq!(module, "check.wasm");
        let WhyNotLoaded::Failed(error) = &why else {
            panic!("{why:?}");
        };
        let LoadError::Refused {
            sha256,
            cause: LoadCause::PinMismatch { pin: expected },
            serving: None,
            ..
        } = &**error
        else {
            panic!("{error:?}");
        };
        assert_eq!(*expected, pin);
        assert_eq!(
            *sha256,
            portwise_supply::sha256_hex(b"not the pinned module")
        );
    }

    /// A checker tree that cannot be built says which expression, and
    /// keeps the runtime's error as its source: a wrong pin is told apart
    /// from a missing module without reading the message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_build_error_keeps_the_wasm_error_as_its_source() {
        use portwise_checkers::{BuildContext, BuildErrorKind};
        use portwise_core::config::CheckerExpr;
        let (dir, cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fs::write(dir.path().join("check.wasm"), GUEST).unwrap();
        let rt = runtime(dir.path(), cache.path(), None, Limits::default()).await;
        let wrong = "ab".repeat(32);
        let expr = CheckerExpr::Wasm(spec("check.wasm", Some(&wrong)));
        let ctx = BuildContext {
            wasm: Some(&rt),
            ..BuildContext::default()
        };
        let Err(e) = portwise_checkers::build_at(&expr, &ctx, "policies.web").await else {
            panic!("built with a wrong pin");
        };
        assert_eq!(e.path, "policies.web.wasm");
        let BuildErrorKind::Wasm(source) = &e.kind else {
            panic!("{e:?}");
        };
        match source.downcast_ref::<WasmError>() {
            Some(WasmError::PinMismatch {
                module,
                expected,
                actual,
            }) => {
                assert_eq!(module, "check.wasm");
                assert_eq!(*expected, wrong);
                assert_eq!(*actual, portwise_supply::sha256_hex(GUEST));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            e.to_string()
                .starts_with("policies.web.wasm: module check.wasm has sha256 "),
            "{e}"
        );
    }
}
