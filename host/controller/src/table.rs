//! What portwise keeps for each Service, in one row per Service.
//!
//! Why one table: a Service's memory (its verdicts and abstain runs, what
//! its last plan saw, its retry backoff, its warning latches, its shadow's
//! last report, what migration cleanup learnt) used to live in nine maps
//! under two key types, and forgetting a Service meant knowing every one of
//! them. Here forgetting is one removal.
//!
//! A row is keyed by the work queue's key (namespace and name) and belongs
//! to one Service object, by uid: a Service deleted and created again under
//! its name starts from an empty row. Work that outlives a Service (a
//! judgement in flight across its deletion, a shadow run) writes back with
//! [`ServiceTable::update_existing`], which finds no row of its uid and
//! drops the write, so nothing of a deleted Service comes back.
//!
//! Some state is asked for by key before any Service object is at hand (a
//! pod change marks when it asked, a Service that left the cache backs off
//! its release): such a row has no uid yet and is adopted by the first
//! Service that reads it.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Service;
use kube::{ResourceExt, runtime::reflector::ObjectRef};

use portwise_core::plan::TriggerMemory;

use crate::{judge::memory as judge, retry::Backoff};

/// The queue's key for a Service.
pub(crate) type Key = ObjectRef<Service>;

/// Everything kept for one Service.
#[derive(Debug, Default)]
pub(crate) struct Row {
    /// The Service object this row belongs to; `None` while only state
    /// asked for by key is kept.
    uid: Option<String>,
    /// Each judge's verdicts and abstain runs of the Service's subjects, as
    /// its last judgement left them (the live judge's and its shadow's).
    pub(crate) verdicts: HashMap<judge::Id, judge::Memory>,
    /// The trigger times the last written plan saw, so the next plan knows
    /// which changed since (`portwise_core::plan::trigger`).
    pub(crate) triggers: TriggerMemory,
    /// Consecutive failed reconciles, for the retry backoff.
    pub(crate) backoff: Option<Backoff>,
    /// When a pod change first asked for the next reconcile, until one
    /// takes it up (the reconcile profile's trigger phase).
    pub(crate) asked: Option<Instant>,
    /// Warnings sent once per transition.
    pub(crate) warned: Warned,
    /// The policy that last decided it (a change raises `PolicyChosen`).
    pub(crate) chosen: Option<portwise_core::policy::Policy>,
    /// What the shadow last reported.
    pub(crate) shadow_report: Option<ShadowReport>,
    /// Its legacy Endpoints object is known to be gone: a steady state
    /// does not GET it on every reconcile.
    pub(crate) endpoints_gone: bool,
    /// A cleanup pass found no native slices: no further LIST until the
    /// Service regains a selector.
    pub(crate) native_slices_gone: bool,
}

/// Warnings already sent, so each goes out once until its cause changes.
#[derive(Debug, Default)]
pub(crate) struct Warned {
    pub(crate) selector: bool,
    pub(crate) external_name: bool,
    /// Why no policy could decide it, as warned (another cause or name
    /// warns again).
    pub(crate) policy: Option<String>,
    /// The unknown shadow name warned about.
    pub(crate) shadow: Option<String>,
}

/// What the shadow last reported of a Service: when, and a digest of the
/// differences it reported.
#[derive(Debug)]
pub(crate) struct ShadowReport {
    pub(crate) at: Instant,
    pub(crate) digest: u64,
}

/// One row per Service (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct ServiceTable {
    rows: Mutex<HashMap<Key, Row>>,
}

fn uid_of(svc: &Service) -> String {
    svc.uid().unwrap_or_default()
}

impl ServiceTable {
    /// Runs `f` on `svc`'s row, made if there is none. A row of another
    /// Service object under the same name (one deleted before its deletion
    /// was handled) starts over: nothing of it applies to this one.
    pub(crate) fn update<R>(&self, svc: &Service, f: impl FnOnce(&mut Row) -> R) -> R {
        let uid = uid_of(svc);
        let mut rows = self.rows.lock().unwrap();
        let row = rows.entry(ObjectRef::from_obj(svc)).or_default();
        match &row.uid {
            Some(u) if *u == uid => {}
            Some(_) => {
                *row = Row {
                    uid: Some(uid),
                    ..Row::default()
                }
            }
            None => row.uid = Some(uid),
        }
        f(row)
    }

    /// Runs `f` on `svc`'s row only if it has one: for work that may have
    /// outlived the Service, whose results must not bring it back.
    pub(crate) fn update_existing<R>(
        &self,
        svc: &Service,
        f: impl FnOnce(&mut Row) -> R,
    ) -> Option<R> {
        let uid = uid_of(svc);
        let mut rows = self.rows.lock().unwrap();
        rows.get_mut(&ObjectRef::from_obj(svc))
            .filter(|row| row.uid.as_deref() == Some(uid.as_str()))
            .map(f)
    }

    /// Reads `svc`'s row, if it has one.
    pub(crate) fn read<R>(&self, svc: &Service, f: impl FnOnce(Option<&Row>) -> R) -> R {
        let uid = uid_of(svc);
        let rows = self.rows.lock().unwrap();
        f(rows
            .get(&ObjectRef::from_obj(svc))
            .filter(|row| row.uid.as_deref().is_none_or(|u| u == uid)))
    }

    /// Runs `f` on the row under `key`, made if there is none, whichever
    /// Service it belongs to: for state asked for by key.
    pub(crate) fn update_key<R>(&self, key: &Key, f: impl FnOnce(&mut Row) -> R) -> R {
        f(self.rows.lock().unwrap().entry(key.clone()).or_default())
    }

    /// Forgets `svc`: its row goes, unless the row already belongs to a
    /// Service created since under the same name. Idempotent.
    pub(crate) fn forget(&self, svc: &Service) {
        let uid = uid_of(svc);
        let mut rows = self.rows.lock().unwrap();
        let key = ObjectRef::from_obj(svc);
        if rows
            .get(&key)
            .is_some_and(|row| row.uid.as_deref().is_none_or(|u| u == uid))
        {
            rows.remove(&key);
        }
    }

    /// How many Services anything is kept for (tests: nothing outlives a
    /// Service).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.rows.lock().unwrap().len()
    }

    /// A pod change asks for `key`'s reconcile now; only the first ask
    /// counts until a reconcile takes it.
    pub(crate) fn mark_asked(&self, key: &Key) {
        self.update_key(key, |row| {
            row.asked.get_or_insert_with(Instant::now);
        });
    }

    /// How long ago the outstanding ask for `key` was made, if any; it is
    /// served now (and so forgotten).
    pub(crate) fn take_asked(&self, key: &Key) -> Option<Duration> {
        let mut rows = self.rows.lock().unwrap();
        rows.get_mut(key)?.asked.take().map(|at| at.elapsed())
    }

    /// Records a failed reconcile of `key`; the delay before its retry.
    pub(crate) fn failed(&self, key: &Key) -> (Duration, u32) {
        self.update_key(key, |row| {
            let backoff = row.backoff.get_or_insert_with(Backoff::default);
            (backoff.fail(), backoff.failures())
        })
    }

    /// A successful reconcile starts `svc`'s backoff over.
    /// A row still without a uid is its, too: the failures may have been
    /// counted by key (a release of a Service that left the cache).
    pub(crate) fn succeeded(&self, svc: &Service) {
        let uid = uid_of(svc);
        let mut rows = self.rows.lock().unwrap();
        if let Some(row) = rows
            .get_mut(&ObjectRef::from_obj(svc))
            .filter(|row| row.uid.as_deref().is_none_or(|u| u == uid))
        {
            row.backoff = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, uid: &str) -> Service {
        let mut svc = Service::default();
        svc.metadata.namespace = Some("shop".into());
        svc.metadata.name = Some(name.into());
        svc.metadata.uid = Some(uid.into());
        svc
    }

    #[test]
    fn forgetting_a_service_is_one_removal() {
        let table = ServiceTable::default();
        let web = service("web", "1");
        table.update(&web, |row| {
            row.warned.selector = true;
            row.endpoints_gone = true;
            row.native_slices_gone = true;
        });
        table.failed(&ObjectRef::from_obj(&web));
        table.mark_asked(&ObjectRef::from_obj(&web));
        assert_eq!(table.len(), 1, "one row per Service, whatever is kept");
        table.forget(&web);
        assert_eq!(table.len(), 0);
        table.forget(&web);
        assert_eq!(table.len(), 0, "idempotent");
    }

    #[test]
    fn a_service_created_again_under_its_name_starts_over() {
        let table = ServiceTable::default();
        let (old, new) = (service("web", "1"), service("web", "2"));
        table.update(&old, |row| row.warned.selector = true);
        assert!(table.update(&new, |row| !row.warned.selector));
        // The old object's late results and its deletion leave the new
        // one's row alone.
        assert_eq!(
            table.update_existing(&old, |row| row.warned.selector = true),
            None
        );
        table.update(&new, |row| row.endpoints_gone = true);
        table.forget(&old);
        assert!(table.read(&new, |row| row.is_some_and(|r| r.endpoints_gone)));
        assert!(table.read(&new, |row| row.is_some_and(|r| !r.warned.selector)));
    }

    #[test]
    fn work_that_outlives_its_service_does_not_bring_it_back() {
        let table = ServiceTable::default();
        let web = service("web", "1");
        table.update(&web, |_| ());
        table.forget(&web);
        assert_eq!(
            table.update_existing(&web, |row| row.endpoints_gone = true),
            None
        );
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn the_first_request_counts_until_a_reconcile_takes_it() {
        let table = ServiceTable::default();
        let web = ObjectRef::<Service>::new("web").within("shop");
        assert_eq!(table.take_asked(&web), None);
        table.mark_asked(&web);
        std::thread::sleep(Duration::from_millis(20));
        // A later request does not move the first one's time.
        table.mark_asked(&web);
        let waited = table.take_asked(&web).expect("asked");
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        // Taken: the next reconcile was not asked for by a pod.
        assert_eq!(table.take_asked(&web), None);
        // A row made by key is adopted by its Service, keeping its state.
        table.mark_asked(&web);
        let svc = service("web", "1");
        assert!(table.update(&svc, |row| row.asked.is_some()));
    }

    #[test]
    fn each_service_backs_off_on_its_own_and_success_starts_over() {
        let table = ServiceTable::default();
        let (a, b) = (service("a", "1"), service("b", "2"));
        let (ka, kb) = (ObjectRef::from_obj(&a), ObjectRef::from_obj(&b));
        let first = crate::retry::FIRST;
        assert_eq!(table.failed(&ka), (first, 1));
        assert_eq!(table.failed(&ka), (first * 2, 2));
        assert_eq!(table.failed(&ka), (first * 4, 3));
        // Another Service's failures do not add to a's.
        assert_eq!(table.failed(&kb), (first, 1));
        table.succeeded(&a);
        assert_eq!(table.failed(&ka), (first, 1));
        assert_eq!(table.failed(&kb), (first * 2, 2));
    }
}
