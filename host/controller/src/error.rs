//! The errors of one reconcile.

use crate::{apply, migrate};

/// Errors of one reconcile. Each is retried with backoff by the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("writing slices of {service}: {source}")]
    Apply {
        service: String,
        #[source]
        source: apply::Error,
    },
    #[error("cleaning up native leftovers of {service}: {source}")]
    Migrate {
        service: String,
        #[source]
        source: migrate::Error,
    },
    #[error("building the membership checker: {0}")]
    Build(#[from] portwise_checkers::BuildError),
}

impl Error {
    /// A short stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Apply { .. } => "apply",
            Error::Migrate { .. } => "migrate",
            Error::Build(_) => "build",
        }
    }
}
