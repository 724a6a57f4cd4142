//! Watching slices converge: one watch per namespace on its EndpointSlices,
//! which tells when every expected Service's slices hold exactly its
//! expected Ready addresses, and a final LIST to confirm it.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use portwise_tests::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL, TestNs};
use tokio::sync::watch;

use crate::objects::{TARGET_PORT, TCP_PORT};
use crate::process::Controller;

/// What one Service's slices should hold: exactly these Ready addresses.
pub(crate) type Expected = HashMap<String, BTreeSet<String>>;

#[derive(Clone, Debug, Default)]
pub(crate) struct SliceInfo {
    pub(crate) service: String,
    pub(crate) manager: String,
    pub(crate) ready: Vec<String>,
    pub(crate) port_ok: bool,
}

pub(crate) struct TrackerState {
    pub(crate) manager: String,
    pub(crate) expected: Expected,
    pub(crate) slices: HashMap<String, SliceInfo>,
    pub(crate) by_service: HashMap<String, HashSet<String>>,
    pub(crate) correct: HashSet<String>,
    pub(crate) initial: Option<HashMap<String, SliceInfo>>,
}

impl TrackerState {
    pub(crate) fn service_correct(&self, svc: &str) -> bool {
        let Some(want) = self.expected.get(svc) else {
            return false;
        };
        let mut got: Vec<&String> = Vec::new();
        for name in self.by_service.get(svc).into_iter().flatten() {
            let s = &self.slices[name];
            if s.manager != self.manager {
                continue;
            }
            if !s.port_ok && !s.ready.is_empty() {
                return false;
            }
            got.extend(s.ready.iter());
        }
        got.len() == want.len() && got.iter().all(|a| want.contains(*a))
    }
    pub(crate) fn refresh(&mut self, svc: &str) {
        if self.service_correct(svc) {
            self.correct.insert(svc.to_string());
        } else {
            self.correct.remove(svc);
        }
    }
    pub(crate) fn upsert(&mut self, name: String, info: SliceInfo) {
        let old = self.slices.insert(name.clone(), info.clone());
        if let Some(old) = old
            && old.service != info.service
        {
            if let Some(set) = self.by_service.get_mut(&old.service) {
                set.remove(&name);
            }
            self.refresh(&old.service);
        }
        self.by_service
            .entry(info.service.clone())
            .or_default()
            .insert(name);
        self.refresh(&info.service);
    }
    pub(crate) fn remove(&mut self, name: &str) {
        if let Some(old) = self.slices.remove(name) {
            if let Some(set) = self.by_service.get_mut(&old.service) {
                set.remove(name);
            }
            self.refresh(&old.service);
        }
    }
    pub(crate) fn all_correct(&self) -> bool {
        self.correct.len() == self.expected.len()
    }
}

pub(crate) fn slice_info(s: &EndpointSlice) -> (String, SliceInfo) {
    let labels = s.labels();
    let ready = s
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    let port_ok = s
        .ports
        .iter()
        .flatten()
        .any(|p| p.port == Some(TARGET_PORT) || p.port == Some(TCP_PORT));
    (
        s.name_any(),
        SliceInfo {
            service: labels.get(SERVICE_NAME_LABEL).cloned().unwrap_or_default(),
            manager: labels.get(MANAGED_BY_LABEL).cloned().unwrap_or_default(),
            ready,
            port_ok,
        },
    )
}

/// Watches one namespace's EndpointSlices and tells when every expected
/// Service's slices hold exactly its expected Ready addresses.
#[derive(Clone)]
pub(crate) struct Tracker {
    pub(crate) state: Arc<Mutex<TrackerState>>,
    /// (services correct, total) after each event.
    pub(crate) progress: watch::Receiver<(usize, usize)>,
    pub(crate) tx: Arc<watch::Sender<(usize, usize)>>,
}

impl Tracker {
    pub(crate) fn start(ns: &TestNs, manager: &str, expected: Expected) -> Self {
        let total = expected.len();
        let state = Arc::new(Mutex::new(TrackerState {
            manager: manager.into(),
            expected,
            slices: HashMap::new(),
            by_service: HashMap::new(),
            correct: HashSet::new(),
            initial: None,
        }));
        let (tx, rx) = watch::channel((0, total));
        let tx = Arc::new(tx);
        let api: Api<EndpointSlice> = ns.api();
        let st = state.clone();
        let txc = tx.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(ev) = ev else { continue };
                let mut s = st.lock().unwrap();
                match ev {
                    watcher::Event::Init => s.initial = Some(HashMap::new()),
                    watcher::Event::InitApply(obj) => {
                        let (n, i) = slice_info(&obj);
                        if let Some(init) = s.initial.as_mut() {
                            init.insert(n, i);
                        }
                    }
                    watcher::Event::InitDone => {
                        let init = s.initial.take().unwrap_or_default();
                        let gone: Vec<String> = s
                            .slices
                            .keys()
                            .filter(|k| !init.contains_key(*k))
                            .cloned()
                            .collect();
                        for g in gone {
                            s.remove(&g);
                        }
                        for (n, i) in init {
                            s.upsert(n, i);
                        }
                    }
                    watcher::Event::Apply(obj) => {
                        let (n, i) = slice_info(&obj);
                        s.upsert(n, i);
                    }
                    watcher::Event::Delete(obj) => s.remove(&obj.name_any()),
                }
                let p = (s.correct.len(), s.expected.len());
                drop(s);
                txc.send_replace(p);
            }
        });
        Self {
            state,
            progress: rx,
            tx,
        }
    }

    /// Replaces what one Service should hold.
    pub(crate) fn expect(&self, svc: &str, ready: BTreeSet<String>) {
        let mut s = self.state.lock().unwrap();
        s.expected.insert(svc.to_string(), ready);
        s.refresh(svc);
        let p = (s.correct.len(), s.expected.len());
        drop(s);
        self.tx.send_replace(p);
    }

    pub(crate) fn correct(&self, svc: &str) -> bool {
        self.state.lock().unwrap().correct.contains(svc)
    }

    /// Waits until every expected Service is right; returns when that was
    /// first seen. `proc` is checked for an early exit.
    pub(crate) async fn converged(
        &self,
        timeout: Duration,
        proc: &mut dyn Controller,
    ) -> Result<Instant> {
        let mut rx = self.progress.clone();
        let deadline = Instant::now() + timeout;
        let mut last_print = Instant::now();
        loop {
            if self.state.lock().unwrap().all_correct() {
                return Ok(Instant::now());
            }
            proc.check_alive()?;
            if Instant::now() > deadline {
                let (c, t) = *rx.borrow();
                bail!("not converged within {timeout:?}: {c}/{t} Services right");
            }
            if last_print.elapsed() > Duration::from_secs(10) {
                let (c, t) = *rx.borrow();
                eprintln!("bench:   … {c}/{t} Services right");
                last_print = Instant::now();
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
        }
    }

    pub(crate) async fn service_converged(&self, svc: &str, timeout: Duration) -> Result<Instant> {
        let mut rx = self.progress.clone();
        let deadline = Instant::now() + timeout;
        loop {
            if self.correct(svc) {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("{svc} not right within {timeout:?}");
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
    }
}

/// A final LIST, independent of the watch: every expected Service right.
pub(crate) async fn verify_by_list(ns: &TestNs, manager: &str, expected: &Expected) -> Result<()> {
    let slices = ns.all_slices().await?;
    let mut st = TrackerState {
        manager: manager.into(),
        expected: expected.clone(),
        slices: HashMap::new(),
        by_service: HashMap::new(),
        correct: HashSet::new(),
        initial: None,
    };
    for s in &slices {
        let (n, i) = slice_info(s);
        st.upsert(n, i);
    }
    if !st.all_correct() {
        let wrong: Vec<&String> = expected
            .keys()
            .filter(|k| !st.correct.contains(*k))
            .take(5)
            .collect();
        bail!(
            "{} of {} Services wrong in a fresh LIST, e.g. {wrong:?}",
            expected.len() - st.correct.len(),
            expected.len()
        );
    }
    Ok(())
}
