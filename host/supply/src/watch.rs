//! Watching the modules directory: when to look at it again.
//!
//! The directory itself is watched, not its files: the kubelet replaces the
//! `..data` symlink, not the files. The debouncing is
//! `notify-debouncer-mini`'s: it reports a path once no event came for it for
//! [`DEBOUNCE`], and a path that keeps changing again every [`DEBOUNCE`], so a
//! burst cannot postpone a rescan for ever. [`Rescans`] turns its batches
//! into one rescan each, however many queued while the last rescan ran, and
//! asks for a rescan every [`RESCAN_INTERVAL`] without events in case one was
//! missed.

use std::{
    path::Path,
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    time::Duration,
};

use notify_debouncer_mini::{DebounceEventResult, Debouncer};

pub use crate::error::WatchError;

/// Quiet time after a directory event before rescanning: the kubelet's swap
/// is several renames and unlinks.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// A rescan also runs this often without events, in case one was missed.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(60);

/// The directory watch; dropping it stops the watch and ends [`Rescans`].
pub struct DirWatch {
    _debouncer: Debouncer<notify::RecommendedWatcher>,
}

impl std::fmt::Debug for DirWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DirWatch(..)")
    }
}

/// When to rescan: each item is a rescan due now. Blocking; ends when the
/// [`DirWatch`] is dropped.
#[derive(Debug)]
pub struct Rescans {
    rx: Receiver<()>,
}

impl Iterator for Rescans {
    type Item = ();

    fn next(&mut self) -> Option<()> {
        match self.rx.recv_timeout(RESCAN_INTERVAL) {
            // Batches that queued up meanwhile are covered by this rescan.
            Ok(()) => while self.rx.try_recv().is_ok() {},
            Err(RecvTimeoutError::Timeout) => {}
            // The debouncer (owned by the DirWatch) is gone.
            Err(RecvTimeoutError::Disconnected) => return None,
        }
        Some(())
    }
}

/// Starts watching `dir`.
pub fn watch(dir: &Path) -> Result<(DirWatch, Rescans), WatchError> {
    let (tx, rx) = channel::<()>();
    let mut debouncer =
        notify_debouncer_mini::new_debouncer(DEBOUNCE, move |events: DebounceEventResult| {
            if let Err(e) = &events {
                tracing::warn!("module watcher: {e}");
            }
            // An error may mean missed events: rescan then too.
            let _ = tx.send(());
        })
        .map_err(|e| WatchError(Box::new(e)))?;
    debouncer
        .watcher()
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(|e| WatchError(Box::new(e)))?;
    Ok((
        DirWatch {
            _debouncer: debouncer,
        },
        Rescans { rx },
    ))
}
