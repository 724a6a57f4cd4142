//! Test support for portwise's integration tests.
//!
//! Every promise portwise makes is about what a real kube-apiserver ends up
//! holding, so these helpers drive a real local control plane
//! (`tests/control-plane`) and never a mock. They live in one crate so each
//! integration test file reads as a scenario:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use portwise_tests::*;
//! let cp = ControlPlane::shared().await?;
//! let ns = TestNs::new(cp, "seed").await?;
//! let _pw = Scenario::new(&ns)
//!     .service(service("my-service").annotation(GROUP_KEY, "g").port("http", 8080))
//!     .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
//!     .config(&config("podReady"))
//!     .expect("my-service", by_port([(("http", V4), &["a"][..])]))
//!     .start()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Tests must run inside the test network namespace (`tests/netns`): pod
//! addresses (10.244.0.0/16, fd00:10:244::/64) are local there, and nowhere
//! else may we send packets to private addresses.

mod addresses;
pub mod cilium;
pub mod clustermesh;
pub mod consumers;
mod control_plane;
#[cfg(feature = "registry")]
pub mod cosign;
pub mod deferred;
pub mod envoy_gateway;
pub mod exclusive;
pub mod faults;
mod identity;
mod image_build;
pub mod istiod;
mod listeners;
mod namespace;
pub mod node;
mod objects;
mod observe;
pub mod ops;
pub mod partition;
mod portwise;
#[cfg(feature = "probes")]
mod probe_servers;
pub mod prometheus;
#[cfg(feature = "registry")]
pub mod registry;
mod scenario;
pub mod traefik;
mod wire;
mod writes;

pub use addresses::{PodIps, next_ips};
pub use control_plane::{
    ControlPlane, OLDER_MINORS, SUITE_MINOR, built_tool, minor_selected, repo_root,
};
pub use identity::{
    PORTWISE_USER, impersonating, install_crds, kubeconfig_variant, kubectl, kubectl_as,
    portwise_identity, service_account_token, token_kubeconfig, unreachable_kubeconfig,
    write_kubeconfig,
};
pub use image_build::wait_for_image_build;
pub use listeners::{Concurrency, HttpListener, HttpMode, Request, TcpListener};
pub use namespace::{TEST_MANAGER, TestNs};
pub use objects::{HOLD_FINALIZER, PodBuilder, ServiceBuilder, pod, service};
pub use observe::{
    ByPort, EndpointView, SliceShape, by_port, endpoint_of, endpoint_views, endpoints_by_port,
    events_for, expect_eq, members, names, newest_event_message, shapes, slice_for_port,
    slice_invariants, slice_shapes, slices_for, slices_managed_by, stays_for, wait_for,
};
pub use ops::{Metrics, Sample, http_get};
pub use portwise::{
    BinaryOutcome, Launch, Portwise, check_live_on, free_port, guests_dir, portwise_bin,
    run_binary_to_exit, run_binary_to_exit_on, run_binary_to_exit_with_env,
};
#[cfg(feature = "probes")]
pub use probe_servers::GrpcHealthServer;
pub use scenario::{
    SEED_MEMBERSHIP, Scenario, expect_endpoints, expect_seed, seed_is, seed_pod, seed_scenario,
    seed_scenario_with, seed_slices,
};
pub use wire::{
    WIRE_NS, WireWrite, field_warnings, warnings_to, wire_differences, wire_namespace, wire_writes,
};
pub use writes::{Write, WriteCounter};

use std::time::Duration;

/// The annotation the seed example groups Services and pods by.
pub const GROUP_KEY: &str = "port-mapper.example.com/group";
/// The annotation the seed example lists a pod's ports in.
pub const PORTS_KEY: &str = "port-mapper.example.com/ports";
/// `managedBy` in every test config: the managed-by label and field owner.
pub const MANAGED_BY: &str = "portwise";
/// Label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages an EndpointSlice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The native EndpointSlice controller's managed-by value.
pub const NATIVE_MANAGER: &str = "endpointslice-controller.k8s.io";
/// The native mirroring controller's managed-by value.
pub const MIRROR_MANAGER: &str = "endpointslicemirroring-controller.k8s.io";
/// Address types as EndpointSlices spell them.
pub const V4: &str = "IPv4";
pub const V6: &str = "IPv6";

/// How long a test waits for portwise to converge after a change. Generous:
/// two cores are shared by every build and test on the machine.
pub const SETTLE: Duration = Duration::from_secs(30);

/// A complete config file for the seed's group annotation, with a short
/// resync so probe-driven changes show up quickly. `membership` is a YAML
/// flow expression, e.g. `podReady` or `{all: [podReady, notTerminating]}`.
pub fn config(membership: &str) -> String {
    config_with(membership, "")
}

/// [`config`] plus extra top-level lines (e.g. `"maxEndpointsPerSlice: 10\n"`).
pub fn config_with(membership: &str, extra: &str) -> String {
    format!(
        "managedBy: {MANAGED_BY}\n\
         serviceKey: {{annotation: {GROUP_KEY}}}\n\
         resyncPeriod: 2s\n\
         {extra}\
         membership: {membership}\n"
    )
}

/// The `KEY=VALUE` lines of an env file (`tests/node/start`'s `env`,
/// `deploy/release`'s `release.env`); other lines are skipped.
pub fn env_file(
    path: &std::path::Path,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    use anyhow::Context as _;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// A finished command's stdout, or an error naming `what`, its status and
/// both its outputs.
pub fn stdout_of(what: &str, out: &std::process::Output) -> anyhow::Result<String> {
    anyhow::ensure!(
        out.status.success(),
        "{what}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs a tracing subscriber once (RUST_LOG filters; default `info` for
/// portwise, `warn` elsewhere) writing through the test harness's capture.
pub fn init_tracing() {
    use std::sync::Once;
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,portwise=info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// The Kubernetes matrix: `on_older_minors!(NAME => BODY)` runs the async
/// `BODY(cp: &'static ControlPlane) -> anyhow::Result<()>` as the tests
/// `NAME::k8s_1_35` and `NAME::k8s_1_36`, each on that minor's control plane
/// ([`ControlPlane::minor`]: skipped, saying why, when `PORTWISE_K8S_MINORS`
/// leaves the minor out or a cold `./test` deferred its build). `NAME` is
/// the test that runs `BODY` on the suite's own control plane (1.37), so a
/// filter on it runs the row for every minor. The minors are
/// [`OLDER_MINORS`]; a unit test below keeps the two lists together.
#[macro_export]
macro_rules! on_older_minors {
    ($name:ident => $body:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn k8s_1_35() -> ::anyhow::Result<()> {
                $crate::run_on_minor("1.35", concat!(module_path!(), "::k8s_1_35"), super::$body)
                    .await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn k8s_1_36() -> ::anyhow::Result<()> {
                $crate::run_on_minor("1.36", concat!(module_path!(), "::k8s_1_36"), super::$body)
                    .await
            }
        }
    };
}

/// [`on_older_minors`]'s test body: `body` on `minor`'s control plane,
/// unless that is not to run. Errors name the minor.
pub async fn run_on_minor<F, Fut>(minor: &str, test: &str, body: F) -> anyhow::Result<()>
where
    F: FnOnce(&'static ControlPlane) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    use anyhow::Context as _;
    // module_path! starts with the test binary's crate (`it::`), which the
    // report's test names do not.
    let test = test.split_once("::").map_or(test, |(_, rest)| rest);
    match ControlPlane::minor(minor, test).await? {
        Some(cp) => body(cp)
            .await
            .with_context(|| format!("on Kubernetes {minor}")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod matrix_tests {
    /// The macro spells the minors out (a test name is an identifier); they
    /// must be the ones the support crate builds control planes for.
    #[test]
    fn the_macro_covers_the_older_minors() {
        let source = include_str!("lib.rs");
        for minor in super::OLDER_MINORS {
            let test = format!("fn k8s_{}()", minor.replace('.', "_"));
            assert!(source.contains(&test), "on_older_minors! has no {test}");
        }
    }
}
