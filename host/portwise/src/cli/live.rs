//! `portwise check --live`: a Service of the cluster judged with the live
//! and the shadow membership of a configuration file, side by side,
//! writing nothing.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::Api;

use portwise_checkers::{BuildContext, WasmCheckers};
use portwise_core::{align, config::Config, policy::Policy};
use portwise_wasm::{Limits, WasmConfig, WasmRuntime};

use super::{largest_memory_limit, oci_config};
use crate::ops::client::{ClientOptions, connect};

/// `portwise check --live`: the live and shadow verdicts of every pod of a
/// Service in the cluster, side by side. Reads only (GET and LIST).
/// `config` is `--config`, `target` the Service as `NAMESPACE/NAME`,
/// `cache_dir` the compiled-module cache.
pub(super) async fn check_live(
    config: Option<&Path>,
    target: Option<String>,
    cache_dir: PathBuf,
) -> anyhow::Result<ExitCode> {
    use portwise_core::shadow::{self, Pick};
    let path = config.context("--live needs --config FILE")?;
    let cfg =
        Config::load(path).with_context(|| format!("invalid configuration {}", path.display()))?;
    let target = target.context("give the Service with --service NAMESPACE/NAME")?;
    let (ns, name) = target
        .split_once('/')
        .with_context(|| format!("--service {target:?}: expected NAMESPACE/NAME"))?;
    let client = connect(&ClientOptions::standalone())
        .await
        .context("no Kubernetes connection (set KUBECONFIG or run in a cluster)")?;
    let svc: Service = Api::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("cannot read Service {ns}/{name}"))?;
    // Sharded, which replica writes it (reading the Leases may be refused:
    // that is not this command's business).
    match crate::ops::shards::writer_of(&client, ns).await {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => eprintln!(
            "cannot read the shard rings' Leases ({e}): which replica writes {ns} is not shown"
        ),
    }
    let group = portwise_core::align::key_value(&svc.metadata, &cfg.service_key)
        .with_context(|| {
            format!(
                "Service {ns}/{name} does not carry the serviceKey: portwise does not manage it"
            )
        })?
        .to_string();
    let pods: Vec<Arc<Pod>> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .with_context(|| format!("cannot list pods in {ns}"))?
        .items
        .into_iter()
        .filter(|p| {
            portwise_core::align::key_value(&p.metadata, cfg.pod_key()) == Some(group.as_str())
        })
        .map(Arc::new)
        .collect();
    // As the controller sees them: a pod on a Node that is gone is not
    // judged (unless the Service publishes not-ready addresses).
    let nodes: Option<HashSet<String>> = match Api::<Node>::all(client.clone())
        .list_metadata(&Default::default())
        .await
    {
        Ok(list) => Some(
            list.items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect(),
        ),
        Err(e) => {
            eprintln!("cannot list Nodes ({e}): pods are judged here whatever their Node");
            None
        }
    };
    let node_known = |n: &str| nodes.as_ref().is_none_or(|known| known.contains(n));
    let (pods, not_judged): (Vec<_>, Vec<_>) = pods
        .into_iter()
        .map(|p| {
            let why = align::not_judged(&svc, &p, &node_known, &cfg.pod_addresses);
            (p, why)
        })
        .partition(|(_, why)| why.is_none());
    let pods: Vec<Arc<Pod>> = pods.into_iter().map(|(p, _)| p).collect();

    // The namespace's MembershipPolicies, read as the controller reads
    // them, when the file lets them decide.
    let objects = match &cfg.membership_policies {
        Some(limits) => {
            let listed = Api::<portwise_api::MembershipPolicy>::namespaced(client.clone(), ns)
                .list(&Default::default())
                .await
                .with_context(|| format!("cannot list MembershipPolicies in {ns}"))?;
            portwise_controller::policies::read_objects(&listed.items, limits, &svc)
        }
        None => Vec::new(),
    };
    let views: Vec<_> = objects.iter().map(|(view, _)| view.clone()).collect();
    let policy = match portwise_core::policy::choose(&svc, &cfg, &views) {
        Ok(p) => p,
        Err(why) => {
            println!("Service {ns}/{name}: {why}; portwise judges none of its pods");
            return Ok(ExitCode::FAILURE);
        }
    };
    let deciding = match &policy {
        Policy::Object(n) => Some(
            objects
                .iter()
                .find_map(|(view, exprs)| (view.name == *n).then_some(exprs.as_ref()).flatten())
                .context("the chosen MembershipPolicy has no expression")?,
        ),
        _ => None,
    };
    let live_expr = match (&policy, deciding) {
        (_, Some(exprs)) => &exprs.membership,
        (Policy::Named(n), None) => &cfg.policies[n],
        _ => &cfg.membership,
    };
    let object_shadow = deciding.and_then(|e| e.shadow.as_ref());

    let mut all_exprs = cfg.all_wasm_specs();
    if let Some(exprs) = deciding {
        all_exprs.extend(exprs.membership.wasm_specs());
        all_exprs.extend(object_shadow.iter().flat_map(|s| s.wasm_specs()));
    }
    let pulls = all_exprs.iter().any(|s| s.oci().is_some());
    let runtime = match (&cfg.modules_dir, pulls) {
        (None, false) => None,
        (dir, _) => Some(
            WasmRuntime::new(WasmConfig {
                supply: Arc::new(portwise_supply::Supplier),
                oci: oci_config(&cfg),
                probes: Default::default(),
                modules_dir: dir.clone(),
                expressions: Some(all_exprs.iter().map(|s| (*s).clone()).collect()),
                cache_dir: Some(cache_dir),
                watch: false,
                limits: Limits {
                    max_memory_bytes: largest_memory_limit(&all_exprs),
                    ..Limits::default()
                },
            })
            .await?,
        ),
    };
    if let Some(rt) = &runtime {
        for (module, result) in rt.pull(&all_exprs).await {
            if let Err(e) = result {
                eprintln!("{module}: {e}");
            }
        }
    }
    let ctx = BuildContext {
        wasm: runtime.as_ref().map(|r| r as &dyn WasmCheckers),
        ..BuildContext::default()
    };
    let live = portwise_checkers::build_at(live_expr, &ctx, &policy.label())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    match &policy {
        Policy::Object(n) => println!(
            "Service {ns}/{name} is decided by {} (MembershipPolicy {ns}/{n})",
            policy.label()
        ),
        _ => println!("Service {ns}/{name} is decided by {}", policy.label()),
    }
    let object = match (&policy, object_shadow) {
        (Policy::Object(n), Some(_)) => Some(n.as_str()),
        _ => None,
    };
    let pick = shadow::pick(&svc, cfg.shadow.as_ref(), object);
    let shadow_expr = match (&pick, &cfg.shadow) {
        (Pick::Object(_), _) => object_shadow,
        (Pick::Default, Some(sh)) => sh.membership.as_ref(),
        (Pick::Named(n), Some(sh)) => sh.expressions.get(n),
        _ => None,
    };
    let shadow_checker = match shadow_expr {
        Some(e) => Some(
            portwise_checkers::build_at(e, &ctx, &pick.label())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?,
        ),
        None => None,
    };
    match &pick {
        Pick::Unknown(n) => println!(
            "Service {ns}/{name} names shadow {n:?}, which {} does not have: live verdicts only",
            path.display()
        ),
        Pick::Off => println!("Service {ns}/{name} has no shadow: live verdicts only"),
        _ => println!(
            "Service {ns}/{name}: live membership against {}",
            pick.label()
        ),
    }

    let svc = Arc::new(svc);
    let subjects = align::subjects(&svc, &pods, &cfg.pod_addresses);
    println!(
        "{:<16} {:<6} {:<24} {:<40} {:<8} {:<8} {:<5} REASONS (live | shadow)",
        "PORT", "FAMILY", "POD", "ADDRESS", "LIVE", "SHADOW", "DIFF"
    );
    let word = |d: portwise_core::membership::Decision| format!("{d:?}").to_lowercase();
    let (mut differ, total) = (0usize, subjects.len());
    for s in &subjects {
        let l = live.check(s).await;
        let sh = match &shadow_checker {
            Some(c) => Some(c.check(s).await),
            None => None,
        };
        let diff = sh.as_ref().is_some_and(|v| v.decision != l.decision);
        differ += usize::from(diff);
        let port = if s.port.name.is_empty() {
            s.port.port.to_string()
        } else {
            s.port.name.clone()
        };
        println!(
            "{:<16} {:<6} {:<24} {:<40} {:<8} {:<8} {:<5} {} | {}",
            port,
            s.family.to_string(),
            s.pod.metadata.name.as_deref().unwrap_or_default(),
            format!("{}:{}", s.address, s.port.target),
            word(l.decision),
            sh.as_ref().map_or("-".to_string(), |v| word(v.decision)),
            if diff { "yes" } else { "" },
            l.reason.unwrap_or_default(),
            sh.and_then(|v| v.reason).unwrap_or_default(),
        );
    }
    if shadow_checker.is_some() {
        println!("{differ} of {total} verdicts differ; nothing was written");
    }
    for (pod, why) in &not_judged {
        if let Some(why) = why {
            println!(
                "pod {} is not judged ({}): {}",
                pod.metadata.name.as_deref().unwrap_or_default(),
                why.as_str(),
                why.explain()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
