//! The built-in checkers, one file per family:
//! - `facts.rs`: the pod facts (`podReady`, `notTerminating`, `portNames`)
//!   and the constants (`include`, `exclude`, `abstain`), answered from the
//!   objects alone;
//! - `probe.rs`: what every port probe shares (the address, the
//!   `publishNotReadyAddresses` yield, port-less Services, probe errors),
//!   and the probes on it, `tcp.rs` (`tcpDial`), `http.rs` (`httpGet`)
//!   and `grpc.rs` (`grpc`);
//! - `combinators.rs`: `all`, `any`, `not`, `perPort`;
//! - `stable.rs`: `stable`, the kubelet-style damper and its store.
//!
//! The combination rules come from [`portwise_core::membership::algebra`]; these modules add the
//! async plumbing, short-circuiting (a settled `all`/`any` does not run the
//! probes after the deciding child) and reasons for logs.
//!
//! Probe outcomes map to decisions as follows:
//! - a 2xx answer / an accepted connection / gRPC `SERVING`: `include`;
//! - any other status, connection refused, a reset or malformed response,
//!   any other gRPC answer, a timeout: `exclude`. A probe that times out means the pod did not serve
//!   in time; that is a fact about the pod, as for kubelet's probes;
//! - an error that shows the *controller* cannot reach the pod network (no
//!   route, network/host unreachable, no local ports or file descriptors,
//!   see [`ProbeError::Unreachable`](portwise_probe::ProbeError::Unreachable)):
//!   `abstain`, so a controller that lost its own network does not
//!   unpublish every endpoint.

mod combinators;
mod facts;
mod grpc;
mod http;
mod probe;
mod stable;
mod tcp;

pub use combinators::{All, Any, Not, PerPort};
pub use facts::{Constant, NotTerminating, PodReady, PortNames};
pub use grpc::Grpc;
pub use http::HttpGet;
pub use probe::{probe_addr, verdict_for_probe_error};
pub use stable::{Stable, StableKey, StableStore};
pub use tcp::TcpDial;

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod probe_tests;
