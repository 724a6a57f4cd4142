//! `test [-- CARGO TEST ARGS]`: everything `./test` does once the
//! toolchains are installed: builds what the suite needs, then runs the
//! suite inside a private network namespace against a real kube-apiserver.
//!
//! On two cores the builds are the cost, so they overlap: the Go tools
//! (tests/go-tools/tools, each cached by version) build in the background
//! while cargo builds the workspace, and the host image's release musl
//! build runs beside the suite, whose image test waits for it. Each step's
//! time is printed, and a background log is shown when its build fails.

use std::{
    fs::File,
    io::Write as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Instant,
};

use crate::{Paths, Result, deferral, deferred, image, proc};

pub fn run(paths: &Paths, args: &[String]) -> Result<u8> {
    let steps = proc::Steps::start();
    let root = &paths.root;
    let logs = &paths.logs;
    let go_build = root.join("tests/go-tools/build");

    steps.step("deferred builds");
    let image_dir = paths.cache.join("image-build");
    let builds_image = root.join("deploy/build-image").is_file();
    let mut deferrable = deferred::deferrable(paths)?;
    if !builds_image {
        deferrable.retain(|b| b != "image");
    }
    let words = |var: &str| -> Vec<String> {
        std::env::var(var)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let now = words("PORTWISE_BUILD_NOW");
    let before: Vec<String> = std::fs::read_to_string(paths.cache.join("deferred-before"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let ask = deferral::Ask {
        deferrable: &deferrable,
        now: &now,
        before: &before,
        all: std::env::var("PORTWISE_BUILD_ALL").as_deref() == Ok("1"),
    };
    let plan = deferral::plan(&ask, &mut |build| {
        if build == "image" {
            image_cached(paths, &image_dir)
        } else if build == "arm64" {
            deferred::arm64_cached(paths)
        } else if build == "release" {
            deferred::release_cached(paths)
        } else if build == "wkg" {
            deferred::wkg_cached(paths)
        } else {
            // --cached waits for a build in progress (an earlier run's
            // deferred one).
            proc::succeeds(&go_build, &[build, "--cached"]).unwrap_or(false)
        }
    });
    for note in &plan.notes {
        println!(
            "{note} (log: {})",
            logs.join("deferred-build.log").display()
        );
    }
    let deferred_report = logs.join("deferred-tests");
    let _ = std::fs::remove_file(&deferred_report);
    if plan.deferred.is_empty() {
        println!("none: every build is cached or cheap");
    } else {
        println!(
            "cold cache: {} built after the suite, for the next run; their tests report SKIPPED",
            plan.deferred.join(" ")
        );
    }
    // SAFETY: set before any thread of this process starts; the tests read
    // them (tests/src/deferred.rs).
    unsafe {
        std::env::set_var("PORTWISE_DEFERRED", plan.deferred.join(" "));
        std::env::set_var("PORTWISE_DEFERRED_REPORT", &deferred_report);
    }

    let go_log = logs.join("go-tools.log");
    steps.step(&format!(
        "Go tools, in the background (log: {})",
        go_log.display()
    ));
    let all_go_tools = proc::lines(&go_build, &["--list"])?;
    if all_go_tools.is_empty() {
        return Err("no Go tools listed (tests/go-tools/build --list)".into());
    }
    // The rest of what this run builds rather than defers (the arm64
    // binary, the release's tools, wkg): before the suite, since inside its
    // network namespace their tests could not download what they need.
    let others_now: Vec<String> = plan
        .now
        .iter()
        .filter(|b| *b != "image" && !all_go_tools.contains(b))
        .cloned()
        .collect();
    let go_now: Vec<String> = all_go_tools
        .into_iter()
        .filter(|t| !plan.defers(t))
        .collect();
    let go_tools = {
        let (go_build, log) = (go_build.clone(), File::create(&go_log)?);
        // One after another, in the table's order: they share the Go build
        // cache, and the control plane, which the suite needs first, comes
        // first.
        thread::spawn(move || build_go_tools(&go_build, &go_now, log))
    };

    steps.step("crates");
    // Every crate the workspace locks, before anything runs cargo
    // --offline (cargo-deny here, the suite inside the network namespace):
    // on a fresh machine the registry cache is empty.
    proc::run("cargo", &["fetch", "--locked"])?;
    proc::run(root.join("tests/deny"), &[])?;
    proc::run(root.join("tests/setup"), &["--check"])?;
    proc::run(root.join("tests/prune-target"), &[])?;
    // This orchestration's own tests (the deferral rules).
    let xtask_target = paths.cache.join("xtask-target");
    proc::run(
        "cargo",
        &[
            "test",
            "--quiet",
            "--locked",
            "--offline",
            "--manifest-path",
            "tests/xtask/Cargo.toml",
            "--target-dir",
            xtask_target
                .to_str()
                .ok_or("a cache path that is not UTF-8")?,
        ],
    )?;

    steps.step("guests (Rust, Python, JavaScript, C, Go)");
    proc::run(root.join("guests/build"), &[])?;

    steps.step("host and tests");
    proc::run("cargo", &["build", "--locked", "-p", "portwise", "--bins"])?;
    proc::run("cargo", &["test", "--locked", "--workspace", "--no-run"])?;
    proc::run(
        "cargo",
        &[
            "test",
            "--locked",
            "--workspace",
            "--test",
            "it",
            "--no-run",
        ],
    )?;
    // The real node's test binary (tests/tests/node), when its suite runs.
    if !plan.defers("node") {
        proc::run(
            "cargo",
            &[
                "test",
                "--locked",
                "-p",
                "portwise-tests",
                "--test",
                "node",
                "--no-run",
            ],
        )?;
    }

    steps.step("waiting for the Go tools");
    let go_result = go_tools
        .join()
        .map_err(|_| "the Go tools' thread panicked")?;
    let go_text = std::fs::read_to_string(&go_log).unwrap_or_default();
    if let Err(e) = go_result {
        eprint!("{go_text}");
        return Err(format!("a Go tool build failed (log above): {e}").into());
    }
    print!("{go_text}");

    for b in &others_now {
        steps.step(&format!("{b}, deferred before and still missing"));
        if !deferred::build(paths, b)? {
            return Err(
                format!("the build {b} failed; to see why: tests/build-deferred {b}").into(),
            );
        }
    }

    // Stops the background image build when this run ends early (a
    // filtered run that never reached the image test), so nothing outlives
    // ./test.
    struct StopImage<'a>(Option<&'a Path>);
    impl Drop for StopImage<'_> {
        fn drop(&mut self) {
            if let Some(dir) = self.0 {
                let _ = image::stop(dir);
            }
        }
    }
    let mut image_guard = StopImage(None);
    if builds_image && !plan.defers("image") {
        steps.step(&format!(
            "host image, in the background beside the suite (log: {})",
            image_dir.join("log").display()
        ));
        // ship::image waits for it (tests/src/image_build.rs reads the lock
        // and the status this leaves) and fails with the log if it failed.
        // SAFETY: the Go tools' thread has ended; no other thread runs.
        unsafe { std::env::set_var("PORTWISE_IMAGE_BUILD", &image_dir) };
        image::start(paths, &image_dir)?;
        image_guard.0 = Some(&image_dir);
    }

    let args: &[String] = match args.split_first() {
        Some((first, rest)) if first == "--" => rest,
        _ => args,
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let netns = root.join("tests/netns");
    steps.step("suite (inside a private network namespace)");
    let mut rc = 0;
    let mut suite_args = vec!["tests/run-suite"];
    suite_args.extend(&args);
    if proc::status(&netns, &suite_args)? != 0 {
        rc = 1;
    }

    // The real node's tests (tests/tests/node): a cluster of their own in a
    // network namespace of their own (tests/src/node.rs says why). They
    // need the node, Helm and the image; a cold run that deferred one of
    // them reports them as not run, like the suite's own deferred tests.
    let node_needs: Vec<&str> = ["node", "helm", "image"]
        .into_iter()
        .filter(|b| plan.defers(b))
        .collect();
    if !node_needs.is_empty() {
        let line = format!(
            "SKIPPED the real node's tests (tests/tests/node): need {}, not built on this machine yet; built after the suite, so the next ./test runs them",
            node_needs.join(" ")
        );
        println!("{line}");
        let mut report = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&deferred_report)?;
        writeln!(report, "{line}")?;
    } else if !args.is_empty() && std::env::var("PORTWISE_NODE_SUITE").as_deref() != Ok("1") {
        println!(
            "(a filtered run: the real node's tests are run by PORTWISE_NODE_SUITE=1 ./test -- FILTER, or tests/netns tests/node/run-suite)"
        );
    } else {
        steps.step("real node suite (inside a network namespace of its own)");
        if image_guard.0.is_some() {
            // The node imports the image the background build makes.
            if let Err(e) = image::wait(&image_dir) {
                eprintln!("{e}\ntest: the real node's tests need the image");
                rc = 1;
            }
        }
        let mut node_args = vec!["tests/node/run-suite"];
        node_args.extend(&args);
        if proc::status(&netns, &node_args)? != 0 {
            rc = 1;
        }
    }

    if !plan.deferred.is_empty() {
        let list = plan.deferred.join(" ");
        steps.step(&format!("deferred: {list}"));
        println!("Not run, because this machine had not built {list} yet (a cold cache):");
        let report = std::fs::read_to_string(&deferred_report).unwrap_or_default();
        if report.trim().is_empty() {
            println!("  (no test reported a skip: a filtered run)");
        } else {
            let mut lines: Vec<&str> = report.lines().collect();
            lines.sort_unstable();
            for l in lines {
                println!("  {l}");
            }
        }
        // Detached, in a session of its own and at the lowest priority, so
        // that this run ends now and the next one finds them built (it
        // waits for a build still in progress).
        let mut detach = vec!["--detach".to_owned()];
        detach.extend(plan.deferred.iter().cloned());
        deferred::run(paths, &detach)?;
        println!(
            "Building them now, in the background, for the next run (log: {}).",
            logs.join("deferred-build.log").display()
        );
    }
    drop(image_guard);
    steps.step(&format!("done, exit {rc}"));
    Ok(rc)
}

/// What costs a cold image build is its dependencies, compiled for musl in
/// release; once they are, a changed binary or Containerfile is built and
/// tested beside the suite as usual.
fn image_cached(paths: &Paths, dir: &Path) -> bool {
    let _ = image::settle(dir);
    let deps = paths
        .cache
        .join("target-image/x86_64-unknown-linux-musl/release/deps");
    std::fs::read_dir(deps).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libwasmtime-") && name.ends_with(".rlib")
        })
    })
}

fn build_go_tools(
    go_build: &Path,
    tools: &[String],
    mut log: File,
) -> std::result::Result<(), String> {
    for tool in tools {
        let t0 = Instant::now();
        let ok = Command::new(go_build)
            .arg(tool)
            .stdout(Stdio::null())
            .stderr(log.try_clone().map_err(|e| e.to_string())?)
            .status()
            .map_err(|e| format!("cannot run {}: {e}", go_build.display()))?
            .success();
        if !ok {
            let _ = writeln!(log, "go tools: tests/go-tools/build {tool} failed");
            return Err(format!("tests/go-tools/build {tool} failed"));
        }
        let _ = writeln!(
            log,
            "go tools: {tool} ready in {} s",
            t0.elapsed().as_secs()
        );
    }
    Ok(())
}
