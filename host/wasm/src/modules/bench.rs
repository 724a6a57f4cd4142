//! Timing what a module costs besides its calls, for `portwise check
//! --bench`: creating a fresh instance of the current version.

use std::time::{Duration, Instant};

use super::{Runtime, serving_runtime};
use crate::error::InstantiateError;

impl Runtime {
    /// Creates (and drops) `runs` fresh instances of `module`'s current
    /// version, each timed from asking for a slot to a ready instance.
    pub(crate) async fn time_instantiation(
        &self,
        module: &str,
        runs: usize,
    ) -> Result<Vec<Duration>, InstantiateError> {
        let version = self
            .current(module)
            .ok_or_else(|| InstantiateError::NotLoaded(module.to_string()))?;
        // The runtime's defaults: the instance an expression without
        // `limits` gets.
        let limits = self
            .limits
            .for_expression(&Default::default())
            .expect("the runtime's own defaults are within its ceiling");
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            let slot = self.slot().await.map_err(InstantiateError::Failed)?;
            let ready = version
                .instantiate(self, slot, serving_runtime(), &limits)
                .await
                .map_err(InstantiateError::Failed)?;
            times.push(started.elapsed());
            drop(ready);
        }
        Ok(times)
    }
}
