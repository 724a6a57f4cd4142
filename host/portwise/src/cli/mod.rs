//! The commands behind the binary, kept in the library so tests and the
//! binary share them; one file a job:
//!
//! * [`run`](run()) (`run.rs`): load and validate the configuration
//!   (refusing to start on any error, with the offending field's path),
//!   connect (KUBECONFIG or in-cluster), serve metrics and health, elect a
//!   leader if asked, and run the controller until SIGTERM/SIGINT; then
//!   release the Lease and exit 0. `report.rs` turns the WebAssembly
//!   runtime's module loads and guest failures into metrics and Events;
//!   `budget.rs` refuses guests that could outgrow the container's memory.
//! * [`check`](check()) (`check.rs`): evaluate a checker against one pod and
//!   Service, from files or from the cluster, and print each verdict. Like
//!   `kwctl run`: guest authors try a `.wasm` without deploying it.
//!   `live.rs` is `check --live` (live against shadow on a cluster's
//!   Service), `bench.rs` is `check --bench`.
//! * [`crd`](crd()) (here): print the MembershipPolicy CRD.
//!
//! Here: what the commands share.

mod bench;
mod budget;
mod check;
mod live;
mod reload;
mod report;
mod run;

pub use check::{CheckArgs, EXIT_REPLAY_MISSED, check};
pub use run::{RunArgs, run};

/// `portwise crd`: the MembershipPolicy CustomResourceDefinition on stdout,
/// generated from the types (portwise-api), so that the installs' copies
/// can be regenerated from the code (host/portwise/tests/crd.rs compares).
pub fn crd() -> anyhow::Result<std::process::ExitCode> {
    use std::io::Write;
    std::io::stdout().write_all(portwise_api::crd_yaml().as_bytes())?;
    Ok(std::process::ExitCode::SUCCESS)
}

use portwise_core::config::{Config, WasmSpec};

/// The largest `limits.memoryMiB` of these expressions, in bytes (0: none
/// set): what the pooling allocator's slots must fit.
pub(super) fn largest_memory_limit(specs: &[&WasmSpec]) -> usize {
    specs
        .iter()
        .filter_map(|w| w.limits.memory_mib)
        .map(|mib| (mib as usize) << 20)
        .max()
        .unwrap_or(0)
}

/// How `oci://` modules are pulled, from the configuration file.
pub(super) fn oci_config(config: &Config) -> portwise_supply::OciConfig {
    portwise_supply::OciConfig {
        auth_file: config.registry_auth.clone(),
        ca_file: config.registry_ca.clone(),
        max_module_bytes: config.max_module_bytes,
        signature_keys: config
            .module_signatures
            .as_ref()
            .map(|s| s.keys.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// The port, family and address columns of a subject's row.
pub(super) fn row(s: &portwise_core::membership::Subject) -> (String, String, String) {
    let port = if s.port.name.is_empty() {
        s.port.port.to_string()
    } else {
        s.port.name.clone()
    };
    (
        port,
        s.family.to_string(),
        format!("{}:{}", s.address, s.port.target),
    )
}
