//! Bucket moves told as Events on the bucket's Lease (`BucketAcquired`,
//! `BucketReleased`, `BucketLost`), so that `kubectl describe lease` and
//! `kubectl get events` say who held a bucket when, as client-go's leader
//! election does for its Lease.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Event;
use portwise_controller::Reason;
use portwise_core::shard::Bucket;
use tracing::debug;

use super::{Engine, bucket_lease, member_lease};

/// Why a bucket stopped being held here.
pub(super) enum Gone<'a> {
    HandedOver(&'a str),
    Left,
    /// A replica of `--shards 1` leads: it writes everywhere.
    Yielded(&'a str),
    /// The elector stepped down: no renewal within the renew deadline.
    Lost,
}

impl Engine {
    /// Events for the buckets this replica took or stopped holding since
    /// its last round.
    pub(super) fn record_moves(&mut self, handed: &BTreeMap<Bucket, String>) {
        let held: BTreeSet<Bucket> = self
            .electors
            .iter()
            .filter(|(_, e)| e.is_leader())
            .map(|(b, _)| *b)
            .collect();
        for &b in held.difference(&self.recorded) {
            let from = self
                .last_holders
                .get(&b)
                .filter(|h| **h != self.cfg.identity)
                .cloned();
            let before = match &from {
                Some(h) => format!("from {h}"),
                None => "free before".to_string(),
            };
            let note = format!(
                "{} holds bucket {b} of {} ({before}): it writes the slices of the namespaces in it",
                self.cfg.identity,
                self.cfg.shards.count()
            );
            self.record(b, Reason::BucketAcquired, "Acquire", from.as_deref(), note);
        }
        for b in self.recorded.difference(&held).copied().collect::<Vec<_>>() {
            let gone = match handed.get(&b) {
                Some(to) => Gone::HandedOver(to),
                None => Gone::Lost,
            };
            self.record_gone(b, gone);
        }
        self.recorded = held;
    }

    pub(super) fn record_gone(&self, b: Bucket, gone: Gone<'_>) {
        let me = &self.cfg.identity;
        let (reason, action, other, note) = match gone {
            Gone::HandedOver(to) => (
                Reason::BucketReleased,
                "HandOver",
                Some(to),
                format!("{me} handed bucket {b} over to {to}, which was warm for it"),
            ),
            Gone::Left => (
                Reason::BucketReleased,
                "Leave",
                None,
                format!("{me} released bucket {b}: it left the ring"),
            ),
            Gone::Yielded(leader) => (
                Reason::BucketReleased,
                "Yield",
                None,
                format!(
                    "{me} released bucket {b}: {leader}, started without --shards, leads on the ring's Lease"
                ),
            ),
            Gone::Lost => (
                Reason::BucketLost,
                "Lose",
                None,
                format!(
                    "{me} lost bucket {b}: no renewal of its Lease succeeded within the renew deadline, so its term ended and it stopped writing there"
                ),
            ),
        };
        self.record(b, reason, action, other, note);
    }

    /// Publishes an Event on bucket `b`'s Lease from a task of its own (a
    /// slow Events API never delays a round). `other`, the replica the
    /// bucket came from or went to, is the Event's related object (its
    /// member Lease): Events of one replica on one bucket are merged into
    /// a series (kube's recorder) only when action and related match, so a
    /// hand-over to another replica is an Event of its own.
    fn record(&self, b: Bucket, reason: Reason, action: &str, other: Option<&str>, note: String) {
        let recorder = self.events.clone();
        let lease = |name: String| ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            name: Some(name),
            namespace: Some(self.cfg.namespace.clone()),
            ..Default::default()
        };
        let regarding = lease(bucket_lease(&self.cfg.name, b));
        let secondary = other.map(|o| lease(member_lease(&self.cfg.name, o)));
        let action = action.to_string();
        tokio::spawn(async move {
            let ev = Event {
                type_: reason.event_type(),
                reason: reason.as_str().into(),
                note: Some(note),
                action,
                secondary,
            };
            if let Err(e) = recorder.publish(&ev, &regarding).await {
                debug!(error = %e, "could not publish a bucket Event");
            }
        });
    }
}
