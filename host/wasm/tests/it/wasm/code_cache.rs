//! The compiled-code cache: entries reused, verified before they run, and
//! kept only for what is loaded.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiled_code_is_cached_on_disk_and_corrupt_entries_are_rebuilt() {
    let cache = TempDir::new("codecache");
    let runtime = async || {
        WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            probes: Default::default(),
            modules_dir: None,
            expressions: None,
            cache_dir: Some(cache.path().to_path_buf()),
            watch: false,
            limits: test_limits(),
        })
        .await
        .unwrap()
    };
    let path = guest("ready-role.wasm");

    let first = runtime().await.load_file(&path).await.unwrap();
    assert_eq!(first.compiled, CompileSource::Compiled);
    let second_rt = runtime().await;
    let second = second_rt.load_file(&path).await.unwrap();
    assert_eq!(second.compiled, CompileSource::Cached);
    assert_eq!(first.sha256, second.sha256);
    eprintln!(
        "ready-role.wasm ({} KB): compile {:.2} ms, cached load {:.3} ms",
        first.size / 1024,
        first.load_time.as_secs_f64() * 1e3,
        second.load_time.as_secs_f64() * 1e3
    );
    assert!(
        second.load_time < first.load_time,
        "{second:?} vs {first:?}"
    );
    // The cached module works.
    let server = http_server().await;
    let c = second_rt
        .checker("ready-role.wasm", &json!({"roles": ["primary"]}), None)
        .await
        .unwrap();
    assert_verdict(
        &c.check(&subject(LOCAL, server.port(), &[])).await,
        Decision::Include,
        "role primary",
    );

    // Overwrite the entry with garbage: the next load discards and rebuilds
    // it.
    drop((c, second_rt));
    let entry = cache_entry(cache.path(), "");
    fs::write(&entry, b"this is not compiled code").unwrap();
    let third = runtime().await.load_file(&path).await.unwrap();
    assert_eq!(third.compiled, CompileSource::Compiled);
    let fourth = runtime().await.load_file(&path).await.unwrap();
    assert_eq!(fourth.compiled, CompileSource::Cached);
}

/// The one compiled-code cache entry in `dir` whose name starts with
/// `prefix` (a module's sha256, or "" when there is only one).
fn cache_entry(dir: &Path, prefix: &str) -> PathBuf {
    let entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.ends_with(".cwasm") && name.starts_with(prefix)
        })
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

/// A fresh runtime on `cache` loads `module` and judges a pod with it. The
/// verdict must be `expected`; returns how the code was obtained, the
/// cache's counters and the load's message.
async fn load_and_judge(
    cache: &Path,
    module: &str,
    config: Value,
    s: &Subject,
    expected: (Decision, &str),
) -> (CompileSource, portwise_supply::CodeCacheStats, String) {
    let rt = WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: None,
        expressions: None,
        cache_dir: Some(cache.to_path_buf()),
        watch: false,
        limits: test_limits(),
    })
    .await
    .unwrap();
    let mut events = rt.subscribe();
    let info = rt.load_file(&guest(module)).await.unwrap();
    let message = events.try_recv().map(|e| e.message).unwrap_or_default();
    let c = rt.checker(module, &config, None).await.unwrap();
    assert_verdict(&c.check(s).await, expected.0, expected.1);
    (info.compiled, rt.code_cache_stats().unwrap(), message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_entries_that_fail_verification_never_run_and_are_recompiled() {
    use portwise_supply::CodeCacheStats;
    let cache = TempDir::new("sealed");
    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);
    let roles = || json!({"roles": ["primary"]});
    let include = (Decision::Include, "role primary");
    let stats = |hits, misses, rejected| CodeCacheStats {
        hits,
        misses,
        rejected,
    };
    let judge = || load_and_judge(cache.path(), "ready-role.wasm", roles(), &s, include);

    // Cold: compiled, entry written.
    let (how, st, _) = judge().await;
    assert_eq!((how, st), (CompileSource::Compiled, stats(0, 1, 0)));
    // (d) Warm: loaded from the cache, no compile.
    let (how, st, message) = judge().await;
    assert_eq!((how, st), (CompileSource::Cached, stats(1, 0, 0)));
    assert!(
        message.contains("loaded from the compiled-code cache"),
        "{message}"
    );

    let entry = cache_entry(cache.path(), "");
    let sealed = fs::read(&entry).unwrap();
    // What wasmtime wrote, then a 32-byte tag and 8 bytes of magic.
    let artifact_len = sealed.len() - 40;
    assert_eq!(&sealed[..4], b"\x7fELF");
    let damage: Vec<(&str, Vec<u8>)> = vec![
        // (a) One byte in the middle of the code; the header stays valid, so
        // wasmtime alone would have loaded (and run) it.
        ("a flipped byte mid-code", {
            let mut b = sealed.clone();
            b[artifact_len / 2] ^= 0xff;
            b
        }),
        // (b) Cut short, and cut to less than a seal.
        ("truncated to half", sealed[..sealed.len() / 2].to_vec()),
        ("truncated to 20 bytes", sealed[..20].to_vec()),
        // (c) No seal at all: exactly what `Component::serialize` produced,
        // as an unsealing version would have stored it; and a wrong tag.
        ("the seal missing", sealed[..artifact_len].to_vec()),
        ("a wrong tag", {
            let mut b = sealed.clone();
            b[artifact_len + 7] ^= 0x01;
            b
        }),
    ];
    for (what, bytes) in damage {
        assert_eq!(&bytes[..4], b"\x7fELF", "{what}");
        fs::write(&entry, &bytes).unwrap();
        // Not deserialised: recompiled from the .wasm, and still judging.
        let (how, st, message) = judge().await;
        assert_eq!(
            (how, st),
            (CompileSource::Compiled, stats(0, 0, 1)),
            "{what}"
        );
        assert!(
            message.contains("its cached code was rejected"),
            "{what}: {message}"
        );
        // Rewritten with a valid seal: the next start loads it.
        let (how, st, _) = judge().await;
        assert_eq!((how, st), (CompileSource::Cached, stats(1, 0, 0)), "{what}");
    }

    // A genuine entry, of another module, under this module's name.
    let admin = (Decision::Include, "accepts connections");
    let (how, _, _) =
        load_and_judge(cache.path(), "admin-check.wasm", Value::Null, &s, admin).await;
    assert_eq!(how, CompileSource::Compiled);
    let admin_entry = cache_entry(cache.path(), &sha256_of(&guest("admin-check.wasm")));
    let entry = cache_entry(cache.path(), &sha256_of(&guest("ready-role.wasm")));
    fs::copy(&admin_entry, &entry).unwrap();
    let (how, st, _) = judge().await;
    assert_eq!((how, st), (CompileSource::Compiled, stats(0, 0, 1)));
}

/// `bytes` (a component) with a custom section carrying `payload`
/// appended: the same component, with a different sha256.
fn with_custom_section(bytes: &[u8], payload: &str) -> Vec<u8> {
    let name = b"portwise-test";
    let len = 1 + name.len() + payload.len();
    assert!(len < 128, "one LEB128 byte");
    let mut out = bytes.to_vec();
    out.extend([0x00, len as u8, name.len() as u8]);
    out.extend(name);
    out.extend(payload.as_bytes());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compiled_code_cache_keeps_only_what_is_loaded() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE_0_1);
    let bytes = fs::read(&fixture).unwrap();
    let dir = TempDir::new("reloads");
    let cache = TempDir::new("bounded");
    let rt = WasmRuntime::new(WasmConfig {
        supply: Arc::new(Supplier),
        oci: Default::default(),
        probes: Default::default(),
        modules_dir: None,
        expressions: None,
        cache_dir: Some(cache.path().to_path_buf()),
        watch: false,
        limits: test_limits(),
    })
    .await
    .unwrap();
    // Another module, loaded once and kept loaded: its entry stays.
    let other = dir.path().join("other.wasm");
    fs::write(&other, with_custom_section(&bytes, "other")).unwrap();
    let other = rt.load_file(&other).await.unwrap();
    // An entry this runtime never touched (another engine's, or a module
    // of the previous start not loaded yet): left alone.
    let foreign = cache
        .path()
        .join(format!("{}-0123456789abcdef.sealed.cwasm", "a".repeat(64)));
    fs::write(&foreign, b"someone else's").unwrap();
    // Twenty hot reloads of one module, each with new content.
    let path = dir.path().join("reloaded.wasm");
    let mut last = None;
    for i in 0..20 {
        fs::write(&path, with_custom_section(&bytes, &format!("v{i}"))).unwrap();
        last = Some(rt.load_file(&path).await.unwrap());
    }
    // New content that fails to load: its entry goes too.
    let broken = dir.path().join("broken.wasm");
    fs::write(&broken, b"\0asm\x0d\0\x01\0").unwrap();
    rt.load_file(&broken).await.unwrap_err();

    let last = last.unwrap();
    let mut names: Vec<String> = fs::read_dir(cache.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cwasm"))
        .collect();
    names.sort();
    let mut expected = vec![
        cache_entry(cache.path(), &last.sha256),
        cache_entry(cache.path(), &other.sha256),
        foreign,
    ]
    .into_iter()
    .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
    .collect::<Vec<_>>();
    expected.sort();
    assert_eq!(names, expected);
    assert!(
        cache
            .path()
            .join(portwise_supply::sealed::KEY_FILE)
            .is_file()
    );
    // Both modules still serving (the broken one never did).
    assert_eq!(rt.modules().len(), 2);
}
