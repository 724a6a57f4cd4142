//! Shipping and operating portwise, tested on the real apiserver with the
//! real artefacts: the host image under podman, the kustomize base, the
//! Helm chart (rendered by helm built from its Go module), the binary as
//! its ServiceAccount, two binaries electing a leader, and what
//! `/metrics` says. Each test uses its own namespace; the cluster-wide
//! objects they touch (namespace `portwise-system`, the base's RBAC, the
//! Lease `portwise-system/portwise`) are applied idempotently and only the
//! ServiceAccount test uses that Lease.

mod alerts;
mod arm64;
mod ha;
mod helm;
mod image;
mod manifests;
mod metrics;
mod sdk;
mod service_account;
mod sharding;
mod support;
