//! Row 6, WebAssembly: a guest policy's decision cost in the controller
//! and the module overhead benchmark.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

use anyhow::Result;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use portwise_tests::{GROUP_KEY, HttpListener, MANAGED_BY_LABEL, TestNs, pod, service};
use serde_json::json;

use crate::Bench;
use crate::objects::{PORTWISE_MANAGER, TARGET_PORT, pod_ip, portwise_config};
use crate::process::{Controller, scrape, spawn_portwise, stop_portwise};
use crate::report::Goal;
use crate::stats::ratio;

impl Bench {
    /// Row 6: WebAssembly decision overhead and restart with cached modules.
    pub(crate) async fn wasm_checks(&mut self) -> Result<()> {
        // (a) the WebAssembly issue's own benchmark, if ./bench built it.
        match std::env::var_os("BENCH_WASM_OVERHEAD_BIN").map(PathBuf::from) {
            Some(bin) if bin.is_file() => {
                eprintln!("bench: row 6: running {}", bin.display());
                let out = tokio::process::Command::new(&bin)
                    .arg("--bench")
                    .env(
                        "BENCH_CALLS",
                        std::env::var("BENCH_CALLS").unwrap_or_else(|_| "2000".into()),
                    )
                    .output()
                    .await?;
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if out.status.success() {
                    self.report.row(
                        "6 WASM",
                        "decision overhead per guest language",
                        "see the table below".into(),
                        "n/a".into(),
                        None,
                        Goal::None,
                    );
                    self.report.section(
                        "Row 6: WebAssembly decision overhead (host/wasm/benches/wasm_overhead.rs)",
                        text,
                    );
                } else {
                    let err = String::from_utf8_lossy(&out.stderr);
                    self.report.not_measured(
                        "6 WASM",
                        "decision overhead per guest language",
                        &format!(
                            "wasm_overhead failed ({}): {}",
                            out.status,
                            err.lines().last().unwrap_or("")
                        ),
                    );
                }
            }
            _ => self.report.not_measured(
                "6 WASM",
                "decision overhead per guest language",
                "the wasm_overhead bench was not built (BENCH_WASM_OVERHEAD_BIN unset)",
            ),
        }

        // (b) restart to first decision with 10 cached modules.
        let guests = portwise_tests::guests_dir();
        let python = guests.join("python-tier-check.wasm");
        if !python.is_file() {
            self.report.not_measured(
                "6 WASM",
                "restart to first decision, 10 cached modules",
                &format!("{} is missing (guests/build python)", python.display()),
            );
            return Ok(());
        }
        let others: Vec<PathBuf> = [
            "admin-check",
            "ready-role",
            "js-drain-check",
            "c-port-names",
        ]
        .iter()
        .map(|n| guests.join(format!("{n}.wasm")))
        .filter(|p| p.is_file())
        .collect();
        if others.is_empty() {
            self.report.not_measured(
                "6 WASM",
                "restart to first decision, 10 cached modules",
                "no other guests built",
            );
            return Ok(());
        }
        let modules = self.work.join("modules");
        std::fs::create_dir_all(&modules)?;
        std::fs::copy(&python, modules.join("python-tier-check.wasm"))?;
        let mut names = vec!["python-tier-check (Python)".to_string()];
        for i in 0..9 {
            let src = &others[i % others.len()];
            let stem = src.file_stem().unwrap().to_string_lossy().to_string();
            std::fs::copy(src, modules.join(format!("{stem}-{i}.wasm")))?;
            names.push(stem);
        }
        let ns = TestNs::new(self.cp, "bench-wasm").await?;
        self.ensure_nodes(&ns).await?;
        let ip = pod_ip(
            2 * (self.knobs.services * self.knobs.pods_per_service + self.knobs.big_pods + 500)
                + self.knobs.probe_pods
                + 100,
        );
        let _http = HttpListener::start(ip, TARGET_PORT as u16).await?;
        ns.create_service(service("w").annotation(GROUP_KEY, "w").port_to(
            "http",
            80,
            json!(TARGET_PORT),
        ))
        .await?;
        ns.create_pod(
            pod("w-0")
                .annotation(GROUP_KEY, "w")
                .label("tier", "frontend")
                .node(&self.nodes[0])
                .ips([ip]),
        )
        .await?;
        let cache = self.work.join("wasm-cache");
        let wasm_config = format!("modulesDir: {}\n", modules.display());
        let membership = "{perPort: {ports: {http: {wasm: {module: python-tier-check.wasm, config: {tiers: [frontend]}}}}, fallback: exclude}}";
        let cache_arg = cache.display().to_string();
        let mut times = Vec::new();
        for (run, cfg) in [
            (
                "cold (empty code cache)",
                portwise_config(&wasm_config, membership),
            ),
            (
                "restart (10 cached modules)",
                portwise_config(&wasm_config, membership),
            ),
            (
                "restart, podReady only (no modules)",
                portwise_config("", "podReady"),
            ),
        ] {
            let mut pw = spawn_portwise(
                self.cp,
                &self.work,
                &format!("wasm-{}", times.len()),
                &cfg,
                &[ns.name()],
                &["--cache-dir", &cache_arg],
            )
            .await?;
            let t0 = pw.started_at();
            let mut first_check = None;
            let mut first_slice = None;
            while t0.elapsed() < Duration::from_secs(300) {
                pw.check_alive()?;
                if first_check.is_none()
                    && scrape(&pw, "portwise_checks_total").await.unwrap_or(0.0) >= 1.0
                {
                    first_check = Some(t0.elapsed());
                }
                if first_check.is_some() {
                    let s = ns.api::<EndpointSlice>().list(&Default::default()).await?;
                    let published = s.items.iter().any(|s| {
                        s.labels().get(MANAGED_BY_LABEL).map(String::as_str)
                            == Some(PORTWISE_MANAGER)
                            && s.endpoints
                                .iter()
                                .flatten()
                                .any(|e| e.addresses.contains(&ip.to_string()))
                            && s.metadata.creation_timestamp.is_some()
                    });
                    // After the first run the slice already exists: count the
                    // decision alone then.
                    if published {
                        first_slice = Some(t0.elapsed());
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop_portwise(&mut pw).await;
            times.push((run, first_check, first_slice));
        }
        let fmt = |d: Option<Duration>| {
            d.map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "—".into())
        };
        let mut body = format!(
            "modulesDir holds 10 modules: {}. Each row starts the release binary; times are from \
             the spawn to the first membership check counted on `/metrics` (polled every 10 ms) and \
             to the slice holding the pod (the slice may already exist from the previous run). The \
             Service's one port is decided by the Python guest.\n\n| run | first decision | slice has the pod |\n|---|---|---|\n",
            names.join(", ")
        );
        for (run, c, s) in &times {
            let _ = writeln!(body, "| {run} | {} | {} |", fmt(*c), fmt(*s));
        }
        self.report
            .section("Row 6: restart to first decision", body);
        let restart = times[1].1;
        let base = times[2].1;
        self.report.row(
            "6 WASM",
            "restart to first decision, 10 cached modules (one Python)",
            fmt(restart),
            "n/a".into(),
            None,
            match restart {
                Some(d) => Goal::Stated("< 1 s", d < Duration::from_secs(1)),
                None => Goal::None,
            },
        );
        self.report.row(
            "6 WASM",
            "same restart without modules (podReady), for scale",
            fmt(base),
            "n/a".into(),
            restart
                .zip(base)
                .and_then(|(a, b)| ratio(a.as_secs_f64(), b.as_secs_f64())),
            Goal::None,
        );
        Ok(())
    }
}
