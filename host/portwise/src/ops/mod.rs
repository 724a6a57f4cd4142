//! Operating portwise: metrics, the health/readiness/metrics HTTP endpoint,
//! leader election, the shard ring, and logging setup.
//!
//! Everything here is plumbing around the controller, not part of its
//! decisions: the controller reports into [`Metrics`], flips
//! [`Readiness`] once its caches are synced, and writes only while
//! [`leader::LeaderElector`] says it leads.

pub mod client;
pub mod http;
pub mod leader;
pub mod logging;
pub mod shards;

pub use http::OpsServer;
pub use leader::{LeaderElector, Timings};
pub use logging::LogFormat;
pub use portwise_controller::{Readiness, metrics::Metrics};
