//! Gzip-compressed modules (`.wasm.gz`).

use super::*;

/// `gzip -9` of the parts, one after the other.
fn gzip(parts: &[&[u8]]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for part in parts {
        gz.write_all(part).unwrap();
    }
    gz.finish().unwrap()
}

/// `NAME.wasm.gz` of a built guest, written to `dir`.
fn gzipped_guest(name: &str, dir: &Path) -> PathBuf {
    let plain = guest(name);
    let file = plain.file_name().unwrap().to_str().unwrap();
    let path = dir.join(format!("{file}.gz"));
    fs::write(&path, gzip(&[&fs::read(&plain).unwrap()])).unwrap();
    path
}

/// 100 MiB of zeros, gzipped (about 100 KB), built in memory.
fn gzip_bomb() -> Vec<u8> {
    let zeros = vec![0u8; 1 << 20];
    gzip(&vec![&zeros[..]; 100])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzipped_module_judges_like_the_plain_one_and_shares_its_cached_code() {
    let h = Harness::new(test_limits()).await;
    let dir = TempDir::new("gz");
    let gz_path = gzipped_guest("ready-role.wasm", dir.path());
    let plain = h.rt.load_file(&guest("ready-role.wasm")).await.unwrap();
    let gz = h.rt.load_file(&gz_path).await.unwrap();
    assert_eq!(gz.module, "ready-role.wasm.gz");
    // The pin is over the file as stored (`sha256sum ready-role.wasm.gz`);
    // the code cache is keyed by the component, so the plain file's entry
    // serves the gzipped one.
    assert_eq!(gz.sha256, sha256_of(&gz_path));
    assert_ne!(gz.sha256, plain.sha256);
    assert_eq!(gz.size, plain.size);
    assert_eq!(plain.compiled, CompileSource::Compiled);
    assert_eq!(gz.compiled, CompileSource::Cached);

    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);
    let configs = [
        json!({"roles": ["primary"]}),
        json!({"roles": ["replica", "primary"], "path": "/replica"}),
        json!({"roles": ["primary"], "path": "/replica"}),
        json!({"roles": ["primary"], "path": "/fail"}),
        json!({"roles": ["primary"], "path": "/notjson"}),
    ];
    let mut decisions = Vec::new();
    for config in configs {
        let a =
            h.rt.checker("ready-role.wasm", &config, None)
                .await
                .unwrap();
        let b =
            h.rt.checker("ready-role.wasm.gz", &config, Some(&gz.sha256))
                .await
                .unwrap();
        let (va, vb) = (a.check(&s).await, b.check(&s).await);
        assert_eq!(va, vb, "{config}");
        decisions.push(va.decision);
    }
    assert_eq!(
        decisions,
        [
            Decision::Include,
            Decision::Include,
            Decision::Exclude,
            Decision::Exclude,
            Decision::Exclude
        ]
    );
    // The component's digest is not the file's.
    match h
        .rt
        .checker(
            "ready-role.wasm.gz",
            &json!({"roles": ["primary"]}),
            Some(&plain.sha256),
        )
        .await
    {
        Err(WasmError::PinMismatch { actual, .. }) => assert_eq!(actual, gz.sha256),
        other => panic!("{other:?}"),
    }
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm.gz", kind), 0, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzipped_module_hot_swaps_and_a_gzip_bomb_leaves_the_old_one_serving() {
    let cache = TempDir::new("cache");
    let scratch = TempDir::new("gz");
    let admin = gzipped_guest("admin-check.wasm", scratch.path());
    let mut cm = ConfigMapDir::new(&[("check.wasm.gz", &admin)]);
    let rt = dir_runtime(cm.dir.path(), &cache).await;
    let mut events = rt.subscribe();
    let original = sha256_of(&admin);
    let modules = rt.modules();
    assert_eq!(
        (modules[0].module.as_str(), modules[0].sha256.as_str()),
        ("check.wasm.gz", original.as_str())
    );

    // Names are exact: `check.wasm` does not find `check.wasm.gz`, but the
    // error says where it is.
    match rt.checker("check.wasm", &json!({}), None).await {
        Err(WasmError::NotLoaded { why, .. }) => {
            assert!(
                matches!(&why, portwise_wasm::WhyNotLoaded::NoSuchFile { other: Some(o), .. } if o == "check.wasm.gz"),
                "{why:?}"
            );
            assert!(why.to_string().contains("check.wasm.gz is loaded"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    // Unpinned, so the bad versions below reach gunzip: a pin would refuse
    // them first, on their bytes as stored (modules_dir.rs).
    let checker = rt.checker("check.wasm.gz", &json!({}), None).await.unwrap();
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    assert_verdict(&checker.check(&s).await, Decision::Include, "marked");

    // A bomb and a corrupt file, each swapped in by the kubelet: refused,
    // counted, reported; the old version keeps serving.
    let started = Instant::now();
    let bomb = gzip_bomb();
    eprintln!(
        "gzip bomb: 100 MiB -> {} KB in {:.0} ms",
        bomb.len() / 1024,
        started.elapsed().as_secs_f64() * 1e3
    );
    let bad_versions: [(&str, Vec<u8>, &str); 2] = [
        (
            "bomb",
            bomb,
            "gunzips to more than 64 MiB, the limit for a module's gunzipped size",
        ),
        (
            "not gzip",
            fs::read(guest("admin-check.wasm")).unwrap(),
            "not a valid gzip file",
        ),
    ];
    for (i, (what, bytes, part)) in bad_versions.into_iter().enumerate() {
        let started = Instant::now();
        cm.publish_bytes("check.wasm.gz", &bytes);
        let e = next_event(&mut events, "check.wasm.gz").await;
        eprintln!(
            "{what}: refused {:.0} ms after the swap",
            started.elapsed().as_secs_f64() * 1e3
        );
        assert!(!e.ok, "{what}: {e:?}");
        assert!(
            e.message.starts_with("module check.wasm.gz (sha256 "),
            "{what}: {}",
            e.message
        );
        assert!(e.message.contains(part), "{what}: {}", e.message);
        assert!(
            e.message
                .contains(&format!("still serving sha256 {}", &original[..12])),
            "{}",
            e.message
        );
        assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
        assert_eq!(rt.modules()[0].sha256, original);
        assert!(
            rt.load_errors()
                .await
                .iter()
                .any(|(m, why)| m == "check.wasm.gz" && why.contains(part))
        );
        let loads_failed = rt
            .failures()
            .iter()
            .find(|f| f.module == "check.wasm.gz" && f.kind == FailureKind::Load)
            .unwrap()
            .count;
        assert_eq!(loads_failed, i as u64 + 1, "{what}");
    }

    // A good gzipped version is hot-swapped in.
    drop(checker);
    let trap = gzipped_guest("hostile/trap.wasm", scratch.path());
    cm.publish(&[("check.wasm.gz", &trap)]);
    let e = next_event(&mut events, "check.wasm.gz").await;
    assert!(e.ok, "{e:?}");
    assert_eq!(e.sha256, Some(sha256_of(&trap)));
    let checker = rt.checker("check.wasm.gz", &json!({}), None).await.unwrap();
    assert_verdict(&checker.check(&s).await, Decision::Abstain, "trap: ");
    assert!(rt.load_errors().await.is_empty());
}
