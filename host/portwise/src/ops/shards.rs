//! The shard ring (issue 49): which replica holds which bucket of
//! namespaces, kept on Leases through crashes, joins and graceful moves.
//!
//! What is pure lives in `portwise_core::shard`: the hash of a namespace to
//! a bucket, the balanced and sticky [`assign`]ment every replica computes
//! alike, and the [`Step`] a replica takes for a bucket. This module is its
//! I/O: Leases in one namespace, all named after the ring (`NAME`):
//! - `NAME-ring` records the bucket count (annotation [`SHARDS_ANNOTATION`]).
//!   A replica started with another count refuses to join: two replicas
//!   hashing namespaces into different buckets would both write.
//! - `NAME-member-ID`, one per replica, written by it every retry period.
//!   A member is live while its record keeps changing: its term runs the
//!   lease duration from when this replica first saw the record's current
//!   version, on this replica's clock (the elector's rule; wall clocks of
//!   different nodes are never compared). It also lists the buckets the
//!   replica is warm for ([`WARM_ANNOTATION`]).
//! - `NAME-bucket-B`, one per bucket, held through a [`LeaderElector`] of
//!   its own: a bucket has leader election's guarantees (one holder, a
//!   term that ends before anyone else's can begin), and its writer checks
//!   the term of the bucket a write's namespace falls in ([`Terms`]).
//!
//! Every retry period a replica writes its member Lease, lists the ring's
//! Leases, computes the assignment from the live members and the live
//! holders, and takes each bucket's step: keep it, take it, warm up for it
//! (watch its namespaces and probe without writing, then say so on the
//! member Lease), or hand it over once its successor is warm (release the
//! bucket's elector: the term ends first, then the Lease is cleared).
//! While a replica of `--shards 1` leads on the Lease `NAME` itself, no
//! bucket is held: it writes every namespace.
//! After a crash the dead replica's member and bucket Leases stop changing
//! together; once their terms end as seen here, its buckets are assigned
//! to the live members, whose electors start from that observation
//! ([`LeaderElector::start_seen`]) and take them at once.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Instant,
};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ListParams, ObjectMeta, PostParams},
    runtime::events::{Recorder, Reporter},
};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tracing::{debug, info, warn};

mod moves;

pub use portwise_controller::Terms;
use portwise_core::shard::{Bucket, Shards, Standing, Step, assign, step};

use moves::Gone;

use super::leader::{Holding, LeaderElector, LeaderError, LeaseAction, Timings, decide};

/// On the ring Lease: the bucket count the ring was made with.
pub const SHARDS_ANNOTATION: &str = "portwise.io/shards";
/// On a member Lease: the buckets its replica is warm for, comma-separated.
pub const WARM_ANNOTATION: &str = "portwise.io/warm";
/// On a member Lease: `"true"` while its replica drains ([`Drain`]). The
/// others count it out of the assignment, so they warm up for its buckets
/// and it hands them over as in any graceful move.
pub const LEAVING_ANNOTATION: &str = "portwise.io/leaving";

/// Where the ring lives and who this replica is.
#[derive(Clone, Debug)]
pub struct RingConfig {
    /// The Leases' namespace.
    pub namespace: String,
    /// The ring's name, the prefix of its Leases' names.
    pub name: String,
    /// This replica's identity ([`super::leader::identity`]: unique per
    /// process start).
    pub identity: String,
    pub shards: Shards,
    pub timings: Timings,
    /// Who reports the ring's Events (the config's `managedBy`).
    pub manager: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(
        "the shard ring {ring} was made with {recorded} buckets and this replica was started with \
         --shards {ours}; every replica must hash namespaces alike, so it holds nothing \
         (change --shards back, or delete the ring's Leases with every replica stopped)"
    )]
    Mismatch {
        ring: String,
        recorded: String,
        ours: u32,
    },
    #[error(transparent)]
    Leader(#[from] LeaderError),
    #[error("shard ring request failed: {0}")]
    Kube(#[from] kube::Error),
}

/// A replica's place in the ring, run in the background until
/// [`Ring::leave`].
#[derive(Debug)]
pub struct Ring {
    leaving: Arc<watch::Sender<bool>>,
    drained: watch::Receiver<bool>,
    terms: Terms,
    warming: watch::Receiver<BTreeSet<Bucket>>,
    warm: Arc<watch::Sender<BTreeSet<Bucket>>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Engine>>,
}

impl Ring {
    /// Joins the ring: checks (or records) its bucket count, then runs.
    pub async fn join(client: Client, cfg: RingConfig) -> Result<Ring, RingError> {
        cfg.timings.validate()?;
        let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
        check_count(&api, &cfg).await?;
        let terms = Terms::default();
        let (warming_tx, warming) = watch::channel(BTreeSet::new());
        let (warm, warm_rx) = watch::channel(BTreeSet::new());
        let (shutdown, shutdown_rx) = oneshot::channel();
        let (leaving, leaving_rx) = watch::channel(false);
        let (drained_tx, drained) = watch::channel(false);
        info!(ring = %cfg.name, identity = %cfg.identity, shards = cfg.shards.count(), "joining the shard ring");
        let events = Recorder::new(
            client.clone(),
            Reporter {
                controller: cfg.manager.clone(),
                instance: Some(cfg.identity.clone()),
            },
        );
        let engine = Engine {
            leaving: leaving_rx,
            drained: drained_tx,
            events,
            rounds: 0,
            recorded: BTreeSet::new(),
            last_holders: BTreeMap::new(),
            member: None,
            said_warm: BTreeSet::new(),
            client,
            api,
            cfg,
            seen: HashMap::new(),
            electors: BTreeMap::new(),
            terms: terms.clone(),
            warming: warming_tx,
            warm: warm_rx,
            yielding: false,
        };
        Ok(Ring {
            leaving: Arc::new(leaving),
            drained,
            terms,
            warming,
            warm: Arc::new(warm),
            shutdown: Some(shutdown),
            task: Some(tokio::spawn(engine.run(shutdown_rx))),
        })
    }

    /// This replica's terms, per bucket.
    pub fn terms(&self) -> Terms {
        self.terms.clone()
    }

    /// The buckets assigned here and still held elsewhere: watch their
    /// namespaces and probe without writing, then [`Ring::report_warm`].
    pub fn warming(&self) -> watch::Receiver<BTreeSet<Bucket>> {
        self.warming.clone()
    }

    /// The buckets this replica is ready to take over: said on its member
    /// Lease at the next retry period, after which their holders hand
    /// them over.
    pub fn report_warm(&self, buckets: BTreeSet<Bucket>) {
        self.warm.send_replace(buckets);
    }

    /// Where [`Ring::report_warm`] reports, for a task of its own (the
    /// part of the controller that warms buckets up).
    pub fn warm_reporter(&self) -> Arc<watch::Sender<BTreeSet<Bucket>>> {
        self.warm.clone()
    }

    /// A handle that drains this replica: for the signal handler, which
    /// runs it before the controller stops.
    pub fn drain(&self) -> Drain {
        Drain {
            leaving: self.leaving.clone(),
            drained: self.drained.clone(),
        }
    }

    /// Leaves the ring: every bucket's term ends, its Lease is released,
    /// and the member Lease is deleted, so that the others take the
    /// buckets over at once instead of waiting out the terms.
    pub async fn leave(mut self) -> Result<(), RingError> {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        let engine = task.await.map_err(LeaderError::from)?;
        engine.leave().await
    }
}

/// Hands every bucket this replica holds over to warm successors, while
/// its controller still writes them: what a SIGTERM does first, so that a
/// rolling update or a scale-down moves buckets as gracefully as a join
/// does (the successor has listed the namespaces and judged their Services
/// before it takes over), instead of leaving them to a cold takeover.
pub struct Drain {
    leaving: Arc<watch::Sender<bool>>,
    drained: watch::Receiver<bool>,
}

impl Drain {
    /// Says so on the member Lease and waits until no bucket is held here
    /// (or no other replica is left to take one), at most `within`.
    /// Whether it finished in time; what is left is released by
    /// [`Ring::leave`].
    pub async fn run(mut self, within: std::time::Duration) -> bool {
        self.leaving.send_replace(true);
        tokio::time::timeout(within, self.drained.wait_for(|d| *d))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Drop for Ring {
    /// A crash, as far as the others can tell: nothing is released.
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Who writes `namespace`, as the shard rings of the cluster say (for
/// `portwise check --live`): for each ring Lease found (any namespace), a
/// line naming the bucket `namespace` falls in and its holder. Empty when
/// there is no ring (one leader, or none).
pub async fn writer_of(client: &Client, namespace: &str) -> Result<Vec<String>, kube::Error> {
    let rings = Api::<Lease>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await?;
    let mut lines = Vec::new();
    for ring in rings.items {
        let (Some(name), Some(ns)) = (
            ring.metadata.name.as_deref(),
            ring.metadata.namespace.as_deref(),
        ) else {
            continue;
        };
        let Some(prefix) = name.strip_suffix("-ring") else {
            continue;
        };
        let Some(count) = ring
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARDS_ANNOTATION))
            .and_then(|c| c.parse::<u32>().ok())
            .and_then(std::num::NonZeroU32::new)
        else {
            continue;
        };
        let b = Shards::new(count).bucket(namespace);
        let holder = Api::<Lease>::namespaced(client.clone(), ns)
            .get_opt(&bucket_lease(prefix, b))
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty());
        lines.push(match holder {
            Some(h) => format!(
                "namespace {namespace} is bucket {b} of the {count} of the shard ring {ns}/{prefix}, held by {h}"
            ),
            None => format!(
                "namespace {namespace} is bucket {b} of the {count} of the shard ring {ns}/{prefix}, held by no replica: its Services are not written"
            ),
        });
    }
    Ok(lines)
}

/// Creates the ring Lease with this replica's count, or checks the count
/// it records.
async fn check_count(api: &Api<Lease>, cfg: &RingConfig) -> Result<(), RingError> {
    let name = format!("{}-ring", cfg.name);
    let ours = cfg.shards.count();
    let recorded = match api.get_opt(&name).await? {
        Some(lease) => lease,
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    annotations: Some([(SHARDS_ANNOTATION.to_string(), ours.to_string())].into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec::default()),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(created) => created,
                // Another replica made it first: check what it recorded.
                Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => {
                    api.get(&name).await?
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    let count = recorded
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SHARDS_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    if count != ours.to_string() {
        return Err(RingError::Mismatch {
            ring: format!("{}/{name}", cfg.namespace),
            recorded: if count.is_empty() {
                "no recorded".into()
            } else {
                count
            },
            ours,
        });
    }
    Ok(())
}

/// A Lease name for `identity`: lowercase letters, digits and '-' (an
/// identity may hold '_').
fn member_lease(ring: &str, identity: &str) -> String {
    let clean: String = identity
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let mut name = format!("{ring}-member-{}", clean.trim_matches('-'));
    name.truncate(253);
    name
}

fn bucket_lease(ring: &str, b: Bucket) -> String {
    format!("{ring}-bucket-{b}")
}

fn parse_buckets(text: &str) -> BTreeSet<Bucket> {
    text.split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect()
}

fn format_buckets(buckets: &BTreeSet<Bucket>) -> String {
    buckets
        .iter()
        .map(Bucket::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

struct Engine {
    client: Client,
    api: Api<Lease>,
    cfg: RingConfig,
    /// Per Lease name: its `resourceVersion` and when this replica first
    /// saw it (terms are judged from there).
    seen: HashMap<String, (String, Instant)>,
    electors: BTreeMap<Bucket, LeaderElector>,
    terms: Terms,
    warming: watch::Sender<BTreeSet<Bucket>>,
    warm: watch::Receiver<BTreeSet<Bucket>>,
    /// A single leader holds the Lease named after the ring: no bucket is
    /// held until it stops.
    yielding: bool,
    /// Set by [`Drain::run`]: hand every bucket over, take none.
    leaving: watch::Receiver<bool>,
    /// Told once nothing is held here while leaving.
    drained: watch::Sender<bool>,
    /// Rounds run so far: see [`SETTLE_ROUNDS`].
    rounds: u32,
    /// Bucket moves as Events on the bucket's Lease, so that
    /// `kubectl describe lease` and `kubectl get events` say who held a
    /// bucket when (client-go's leader election does the same).
    events: Recorder,
    /// The buckets this replica held at the end of its last round, as its
    /// Events told.
    recorded: BTreeSet<Bucket>,
    /// Each bucket's last live holder seen.
    last_holders: BTreeMap<Bucket, String>,
    /// The member Lease as last written (`None`: read it first).
    member: Option<Lease>,
    /// The buckets it says this replica is warm for.
    said_warm: BTreeSet<Bucket>,
}

/// A replica's first rounds take no free bucket: replicas started together
/// (a Deployment's) may not have written their member Leases when the
/// first of them lists the ring, and it would take every bucket, so watch
/// and cache every namespace's pods, only to hand most of them over a few
/// rounds later (bench row 14 saw 1.2× the single replica's peak RSS at
/// N=2). Two retry periods let the members of a simultaneous start see
/// each other; a crash's takeover waits for them only in a replica that
/// has just started.
const SETTLE_ROUNDS: u32 = 2;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("ring", &self.cfg.name)
            .field("identity", &self.cfg.identity)
            .field("competing", &self.electors.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Engine {
    async fn run(mut self, mut shutdown: oneshot::Receiver<()>) -> Self {
        let retry = self.cfg.timings.retry_period;
        loop {
            // A round slower than a term: the others count this replica gone
            // by then anyway (its member Lease unchanged).
            let round = tokio::time::timeout(self.cfg.timings.lease_duration, self.round());
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                r = round => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(ring = %self.cfg.name, error = %e, "shard ring round failed"),
                    Err(_) => warn!(ring = %self.cfg.name, "shard ring round timed out"),
                },
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                () = tokio::time::sleep(retry) => {}
            }
        }
        self
    }

    /// One round: write the member Lease, read the ring, take each
    /// bucket's step.
    async fn round(&mut self) -> Result<(), RingError> {
        // Read once: the member Lease says what this round acts on.
        let leaving = *self.leaving.borrow();
        self.write_member(leaving).await?;
        let leases = self.api.list(&ListParams::default()).await?;
        let now = Instant::now();
        let me = self.cfg.identity.clone();
        let member_prefix = format!("{}-member-", self.cfg.name);
        let bucket_prefix = format!("{}-bucket-", self.cfg.name);
        // A leaving replica (this one, or another) is no member: the
        // assignment gives its buckets to the others.
        let mut members = BTreeSet::new();
        if !leaving {
            members.insert(me.clone());
        }
        let mut warm: BTreeMap<String, BTreeSet<Bucket>> = BTreeMap::new();
        let mut holders: BTreeMap<Bucket, String> = BTreeMap::new();
        let mut single_leader = None;
        let mut seen_now = HashMap::new();
        for lease in &leases.items {
            let Some(name) = lease.metadata.name.clone() else {
                continue;
            };
            let version = lease.metadata.resource_version.clone().unwrap_or_default();
            let first_seen = match self.seen.get(&name) {
                Some((v, at)) if *v == version => *at,
                _ => now,
            };
            seen_now.insert(name.clone(), (version, first_seen));
            let holding = Holding::of(lease);
            let Some(holder) = holding.holder.clone() else {
                continue;
            };
            let live = !matches!(
                decide(
                    &holding,
                    "", // nobody: is the holder's term still running?
                    first_seen,
                    now,
                    self.cfg.timings.lease_duration,
                ),
                LeaseAction::Acquire
            ) || holder == me;
            if !live {
                continue;
            }
            if name == self.cfg.name {
                single_leader = Some(holder);
            } else if name.starts_with(&member_prefix) {
                let annotations = lease.metadata.annotations.as_ref();
                if holder == me
                    || annotations
                        .and_then(|a| a.get(LEAVING_ANNOTATION))
                        .is_some_and(|v| v == "true")
                {
                    continue;
                }
                let buckets = annotations
                    .and_then(|a| a.get(WARM_ANNOTATION))
                    .map(|t| parse_buckets(t))
                    .unwrap_or_default();
                members.insert(holder.clone());
                warm.insert(holder, buckets);
            } else if let Some(b) = name
                .strip_prefix(&bucket_prefix)
                .and_then(|b| b.parse::<Bucket>().ok())
            {
                holders.insert(b, holder);
            }
        }
        self.seen = seen_now;

        // A replica of `--shards 1` leads on the Lease named after the ring
        // (a rolling update from one leader to shards, say): it writes
        // every namespace, so no bucket may be held beside it. Hold none
        // until its term is over.
        if let Some(leader) = single_leader {
            if !std::mem::replace(&mut self.yielding, true) {
                warn!(ring = %self.cfg.name, %leader,
                    "a replica started without --shards leads on the Lease {}: holding no bucket until it stops", self.cfg.name);
            }
            for b in self.electors.keys().copied().collect::<Vec<_>>() {
                self.stop(b).await;
            }
            for b in std::mem::take(&mut self.recorded) {
                self.record_gone(b, Gone::Yielded(&leader));
            }
            self.warming.send_if_modified(|w| {
                let changed = !w.is_empty();
                w.clear();
                changed
            });
            if leaving {
                self.drained.send_replace(true);
            }
            return Ok(());
        }
        if std::mem::take(&mut self.yielding) {
            info!(ring = %self.cfg.name, "the Lease {} has no live holder any more: taking buckets", self.cfg.name);
        }

        let desired = assign(self.cfg.shards, &members, &holders);
        let mut warming = BTreeSet::new();
        let mut handed: BTreeMap<Bucket, String> = BTreeMap::new();
        for b in 0..self.cfg.shards.count() {
            let leading = self.electors.get(&b).is_some_and(LeaderElector::is_leader);
            let standing = match holders.get(&b) {
                _ if leading => Standing::Mine,
                Some(h) if *h != me => Standing::Held { holder: h.clone() },
                // Free, expired, or ours on record while our elector does
                // not lead (it stepped down): take it (again).
                _ => Standing::Free,
            };
            let to = desired.get(&b).map(String::as_str);
            let ready = to.is_some_and(|to| warm.get(to).is_some_and(|w| w.contains(&b)));
            match step(&me, to, &standing, ready) {
                Step::Take if self.rounds < SETTLE_ROUNDS => {}
                Step::Keep | Step::KeepUntilReady { .. } | Step::Take => {
                    self.compete(b)?;
                    self.expect_handover(b, false);
                }
                Step::Warm => {
                    warming.insert(b);
                    // Competing already: it takes the Lease the moment the
                    // holder releases it, which it does once it reads this
                    // replica's member Lease say the bucket is warm.
                    self.compete(b)?;
                    self.expect_handover(b, self.said_warm.contains(&b));
                }
                Step::HandOver { to } => {
                    info!(ring = %self.cfg.name, bucket = b, %to, "handing the bucket over");
                    self.stop(b).await;
                    handed.insert(b, to.to_string());
                }
                Step::Ignore => {
                    if !leading {
                        self.stop(b).await;
                    }
                }
            }
        }
        debug!(ring = %self.cfg.name, ?desired, held = ?self.terms.held(), "shard ring round");
        self.record_moves(&handed);
        // The last live holder ever seen, kept past its expiry: a crash's
        // successor names whom it took over from.
        self.last_holders.extend(holders);
        self.rounds = self.rounds.saturating_add(1);
        if leaving && (members.is_empty() || self.recorded.is_empty()) {
            // Handed over, or nobody to hand to: the rest is released on
            // leaving.
            self.drained.send_replace(true);
        }
        self.warming.send_if_modified(|w| {
            let changed = *w != warming;
            *w = warming;
            changed
        });
        Ok(())
    }

    /// Writes this replica's member Lease: holder, renewal and the buckets
    /// it is warm for (only those still assigned to it and not yet held).
    async fn write_member(&mut self, leaving: bool) -> Result<(), RingError> {
        let name = member_lease(&self.cfg.name, &self.cfg.identity);
        let warm: BTreeSet<Bucket> = self
            .warm
            .borrow()
            .intersection(&self.warming.borrow())
            .copied()
            .collect();
        let wall = MicroTime(Timestamp::now());
        // Only this replica writes its member Lease: what it last wrote is
        // what is there, unless a write failed (then read it again).
        let known = match self.member.take() {
            Some(lease) => Some(lease),
            None => self.api.get_opt(&name).await?,
        };
        let mut lease = known.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                acquire_time: Some(wall.clone()),
                ..Default::default()
            }),
        });
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(WARM_ANNOTATION.to_string(), format_buckets(&warm));
        let annotations = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        if leaving {
            annotations.insert(LEAVING_ANNOTATION.to_string(), "true".to_string());
        } else {
            annotations.remove(LEAVING_ANNOTATION);
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        spec.holder_identity = Some(self.cfg.identity.clone());
        spec.renew_time = Some(wall);
        spec.lease_duration_seconds = Some(self.cfg.timings.lease_duration_seconds());
        let written = if lease.metadata.resource_version.is_some() {
            self.api
                .replace(&name, &PostParams::default(), &lease)
                .await?
        } else {
            self.api.create(&PostParams::default(), &lease).await?
        };
        self.member = Some(written);
        self.said_warm = warm;
        Ok(())
    }

    fn expect_handover(&self, b: Bucket, expecting: bool) {
        if let Some(e) = self.electors.get(&b) {
            e.expect_handover(expecting);
        }
    }

    /// Competes for bucket `b` (if not already), from this round's
    /// observation of its Lease.
    fn compete(&mut self, b: Bucket) -> Result<(), RingError> {
        if self.electors.contains_key(&b) {
            return Ok(());
        }
        let name = bucket_lease(&self.cfg.name, b);
        let elector = LeaderElector::start_seen(
            self.client.clone(),
            &self.cfg.namespace,
            &name,
            &self.cfg.identity,
            self.cfg.timings,
            self.seen.get(&name).cloned(),
        )?;
        self.terms.set(b, Some(elector.subscribe_term()));
        self.electors.insert(b, elector);
        Ok(())
    }

    /// Stops competing for bucket `b`: its term ends here first, then its
    /// Lease is released if held.
    async fn stop(&mut self, b: Bucket) {
        let Some(elector) = self.electors.remove(&b) else {
            return;
        };
        self.terms.set(b, None);
        if let Err(e) = elector.release().await {
            warn!(ring = %self.cfg.name, bucket = b, error = %e, "could not release the bucket's Lease; it expires instead");
        }
    }

    async fn leave(mut self) -> Result<(), RingError> {
        // Whatever was taken since the last round is told first.
        self.record_moves(&BTreeMap::new());
        let buckets: Vec<Bucket> = self.electors.keys().copied().collect();
        for b in buckets {
            self.stop(b).await;
        }
        for b in std::mem::take(&mut self.recorded) {
            self.record_gone(b, Gone::Left);
        }
        let name = member_lease(&self.cfg.name, &self.cfg.identity);
        match self.api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        info!(ring = %self.cfg.name, identity = %self.cfg.identity, "left the shard ring");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lease_names_are_valid_names() {
        assert_eq!(
            member_lease("portwise", "Pod-7_0a1B2c3d"),
            "portwise-member-pod-7-0a1b2c3d"
        );
        assert!(member_lease("p", &"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn warm_buckets_round_trip() {
        let b: BTreeSet<Bucket> = [3, 1, 12].into();
        assert_eq!(format_buckets(&b), "1,3,12");
        assert_eq!(parse_buckets("1,3,12"), b);
        assert_eq!(parse_buckets(""), BTreeSet::new());
        assert_eq!(parse_buckets("1, x,2"), [1, 2].into());
    }
}
