//! Operating portwise: metrics, the health/readiness/metrics HTTP endpoint,
//! leader election, and logging setup.
//!
//! Everything here is plumbing around the controller, not part of its
//! decisions: the controller reports into [`metrics::Metrics`], flips
//! [`http::Readiness`] once its caches are synced, and writes only while
//! [`leader::LeaderElector`] says it leads.

pub mod http;
pub mod leader;
pub mod logging;
pub mod metrics;

pub use http::{OpsServer, Readiness};
pub use leader::{LeaderElector, Timings};
pub use logging::LogFormat;
pub use metrics::Metrics;
