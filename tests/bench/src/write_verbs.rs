//! Row 3's third part, write cost: what a slice write costs the apiserver
//! by verb (server-side apply against update, create against apply of a
//! new name) on slices of 10 and 1000 endpoints.

use std::{fmt::Write as _, time::Instant};

use anyhow::Result;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use portwise_tests::TestNs;
use serde_json::{Value, json};

use crate::Bench;
use crate::process::apiserver_cpu;
use crate::report::Goal;
use crate::stats::{ms, pct};

/// The slice writes row 3 compares: how portwise writes and how the native
/// controller does, for a known slice and for a new name.
#[derive(Clone, Copy)]
pub(crate) enum Verb {
    Apply,
    Put,
    ApplyNew,
    Post,
}

impl Verb {
    pub(crate) const ALL: [Verb; 4] = [Verb::Apply, Verb::Put, Verb::ApplyNew, Verb::Post];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Verb::Apply => "server-side apply",
            Verb::Put => "update (PUT)",
            Verb::ApplyNew => "server-side apply of a new name (create)",
            Verb::Post => "create (POST)",
        }
    }
}

impl Bench {
    /// What a slice write costs the apiserver by verb: server-side apply
    /// (portwise: `force`, the whole slice) against an update with the
    /// object's resourceVersion (the native controller's PUT), on slices of
    /// 10 and 1000 endpoints that nobody else writes, one write at a time,
    /// each flipping one endpoint's readiness.
    pub(crate) async fn write_verbs(&mut self) -> Result<()> {
        let writes = self.knobs.verb_writes;
        if writes == 0 {
            return Ok(());
        }
        eprintln!("bench: row 3 write verbs: {writes} writes each");
        let ns = TestNs::new(self.cp, "bench-verbs").await?;
        let api: Api<EndpointSlice> = ns.api();
        let slice = |name: &str, n: usize, first_ready: bool| -> Result<EndpointSlice> {
            let endpoints: Vec<Value> = (0..n)
                .map(|i| {
                    json!({
                        "addresses": [format!("10.250.{}.{}", i / 250, 1 + i % 250)],
                        "conditions": { "ready": i != 0 || first_ready },
                    })
                })
                .collect();
            Ok(serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/service-name": "verbs",
                        "endpointslice.kubernetes.io/managed-by": "bench.portwise.io",
                    },
                },
                "addressType": "IPv4",
                "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
                "endpoints": endpoints,
            }))?)
        };
        let mut detail = format!(
            "What one EndpointSlice write costs by verb, on slices nobody else writes: {writes} writes per row, one at a time, each flipping one endpoint's `ready`. Server-side apply as portwise writes (the whole slice, `force`, its field manager) against an update (PUT) of the object last returned, with its resourceVersion, as the native controller writes; and the same for new names: a server-side apply without `force` (portwise's create) against a POST (the native controller's). Latency is the client's round trip; apiserver CPU is its utime+stime over the writes (embedded etcd included), per write.\n\n| endpoints | verb | writes | p50 | p99 | apiserver CPU per write |\n|---|---|---|---|---|---|\n"
        );
        for n in [10usize, 1000] {
            let ssa = format!("ssa-{n}");
            let params = PatchParams::apply("bench-ssa").force();
            api.patch(&ssa, &params, &Patch::Apply(slice(&ssa, n, true)?))
                .await?;
            let put = format!("put-{n}");
            let mut current = api
                .create(&PostParams::default(), &slice(&put, n, true)?)
                .await?;
            let created = PatchParams::apply("bench-ssa");
            for verb in Verb::ALL {
                let mut took = Vec::with_capacity(writes);
                let cpu0 = apiserver_cpu(self.cp);
                for i in 0..writes {
                    let ready = i % 2 == 1;
                    let t = Instant::now();
                    match verb {
                        Verb::Put => {
                            let mut next = slice(&put, n, ready)?;
                            next.metadata = current.metadata.clone();
                            current = api.replace(&put, &PostParams::default(), &next).await?;
                        }
                        Verb::Apply => {
                            api.patch(&ssa, &params, &Patch::Apply(slice(&ssa, n, ready)?))
                                .await?;
                        }
                        Verb::Post => {
                            let name = format!("post-{n}-{i}");
                            api.create(&PostParams::default(), &slice(&name, n, ready)?)
                                .await?;
                        }
                        Verb::ApplyNew => {
                            let name = format!("ssa-{n}-{i}");
                            api.patch(&name, &created, &Patch::Apply(slice(&name, n, ready)?))
                                .await?;
                        }
                    }
                    took.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                let verb = verb.label();
                let cpu = (apiserver_cpu(self.cp) - cpu0) / writes as f64;
                let _ = writeln!(
                    detail,
                    "| {n} | {verb} | {writes} | {} | {} | {} |",
                    ms(pct(&took, 0.5)),
                    ms(pct(&took, 0.99)),
                    ms(cpu * 1000.0),
                );
                self.report.row(
                    "3 write cost by verb (one slice, one write at a time)",
                    &format!("{verb}, {n} endpoints: round trip p50 / apiserver CPU per write"),
                    format!("{} / {}", ms(pct(&took, 0.5)), ms(cpu * 1000.0)),
                    "n/a".into(),
                    None,
                    Goal::None,
                );
            }
        }
        self.report
            .section("Row 3: what a slice write costs by verb", detail);
        Ok(())
    }
}
