//! The [`Supply`] a runtime is built with: gunzip, the directory watch and
//! `oci://` pulls, from this crate's own modules.

use std::path::{Path, PathBuf};

use portwise_core::config::OciRef;

use crate::{
    decode::{self, Component},
    error::{DecodeError, PullError, SetupError, WatchError},
    handoff::{BoxFuture, OciConfig, Pull, Pulled, Supply, Watching},
    oci::Puller,
    watch,
};

/// The supply: [`decode::component`], [`watch::watch`] and [`Puller`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Supplier;

impl Supply for Supplier {
    fn component<'a>(
        &self,
        name: &str,
        stored: &'a [u8],
        stored_sha256: &str,
        max_gunzipped: usize,
    ) -> Result<Component<'a>, DecodeError> {
        decode::component(name, stored, stored_sha256, max_gunzipped)
    }

    fn watch(&self, dir: &Path) -> Result<Watching, WatchError> {
        let (guard, rescans) = watch::watch(dir)?;
        Ok(Watching {
            guard: Box::new(guard),
            rescans: Box::new(rescans),
        })
    }

    fn puller(
        &self,
        config: &OciConfig,
        cache: Option<PathBuf>,
    ) -> Result<Box<dyn Pull>, SetupError> {
        Ok(Box::new(Puller::new(config, cache)?))
    }
}

impl Pull for Puller {
    fn pull<'a>(&'a self, r: &'a OciRef) -> BoxFuture<'a, Result<Pulled, PullError>> {
        Box::pin(Puller::pull(self, r))
    }
}
