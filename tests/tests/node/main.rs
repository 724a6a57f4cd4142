//! End-to-end tests on a real node (tests/src/node.rs): portwise installed
//! the way the docs say (Helm, kustomize), running as Pods under the
//! chart's security context with a real ServiceAccount token, publishing
//! pods that are real containers, and kube-proxy routing ClusterIP traffic
//! from a client pod by what it published.
//!
//! Run by `tests/node/run-suite` (./test does), one test at a time. Each
//! runs on a multi-threaded runtime: kubectl and helm block their thread,
//! and a watch (`SliceHistory`) must keep running meanwhile.

mod install;
mod lifecycle;
mod publish;
mod release;
mod support;
