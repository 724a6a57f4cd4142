//! One writer at a time, judged from the apiserver's audit log alone
//! (issue 49): every slice or Endpoints write a sharded replica makes must
//! fall within its term of the bucket of the write's namespace.
//!
//! A replica's term of a bucket, as the apiserver saw it: from one of its
//! successful writes to the bucket's Lease (an acquisition or a renewal),
//! for at most the lease duration, and only until another replica's write
//! to that Lease succeeds (it acquired the bucket). Both ends are the
//! apiserver's `requestReceivedTimestamp`s: no client clock is trusted. A
//! write received later than that (sent in time but delivered late, after
//! a partition healed) is a violation too: the fence must keep such a
//! write from ever arriving.
//!
//! What this cannot see: a write between a replica's own release of a
//! bucket and the next acquisition (the audit log at Metadata level does
//! not say whether a Lease update renewed or released). The fence ends the
//! term before it releases, and the unit tests of the fence cover that.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::jiff::Timestamp;
use portwise_core::shard::{Bucket, Shards};

use crate::faults::AuditEvent;

/// What [`check`] counted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Successful slice and Endpoints writes by the replicas, each checked.
    pub writes: usize,
    /// Refused ones (conflicts, a fence's late request): they changed
    /// nothing, and are not judged.
    pub refused: usize,
    /// Times a bucket's Lease passed from one replica to another.
    pub handovers: usize,
}

/// Checks that every successful slice or Endpoints write by a user that
/// `is_replica` accepts was made within that user's term of the bucket of
/// its namespace. `lease` is the Leases' duration; `lease_name(b)` names
/// bucket `b`'s Lease.
pub fn check(
    events: &[AuditEvent],
    shards: Shards,
    lease: Duration,
    lease_name: impl Fn(Bucket) -> String,
    is_replica: impl Fn(&str) -> bool,
) -> Result<Tally> {
    let ok = |e: &AuditEvent| e.code.is_some_and(|c| (200..300).contains(&c));
    let buckets: BTreeMap<String, Bucket> =
        (0..shards.count()).map(|b| (lease_name(b), b)).collect();
    let mut events: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.is_write() && is_replica(&e.user) && e.received.is_some())
        .collect();
    events.sort_by_key(|e| e.received);
    let lease = k8s_openapi::jiff::SignedDuration::try_from(lease)?;
    // Per bucket: the last replica whose Lease write succeeded, and when.
    let mut term: BTreeMap<Bucket, (&str, Timestamp)> = BTreeMap::new();
    let mut tally = Tally::default();
    for e in events {
        let at = e.received.expect("filtered above");
        if e.resource == "leases" {
            if let Some(b) = buckets.get(&e.name).filter(|_| ok(e)) {
                if term.get(b).is_some_and(|(u, _)| *u != e.user) {
                    tally.handovers += 1;
                }
                term.insert(*b, (&e.user, at));
            }
            continue;
        }
        if e.resource != "endpointslices" && e.resource != "endpoints" {
            continue;
        }
        if !ok(e) {
            tally.refused += 1;
            continue;
        }
        tally.writes += 1;
        let b = shards.bucket(&e.namespace);
        match term.get(&b) {
            Some((u, since)) if *u == e.user && at.duration_since(*since) <= lease => {}
            Some((u, since)) => bail!(
                "{} {} {}/{} at {at} is outside its term of bucket {b}: the bucket's Lease was last written by {u} at {since} (lease {lease:?})",
                e.user,
                e.verb,
                e.namespace,
                e.name
            ),
            None => bail!(
                "{} {} {}/{} at {at}: nobody held bucket {b} yet",
                e.user,
                e.verb,
                e.namespace,
                e.name
            ),
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn ev(user: &str, resource: &str, ns: &str, name: &str, secs: f64, code: i64) -> AuditEvent {
        let at = Timestamp::from_millisecond(1_800_000_000_000 + (secs * 1000.0) as i64).unwrap();
        AuditEvent {
            user: user.into(),
            user_agent: String::new(),
            verb: "update".into(),
            resource: resource.into(),
            subresource: String::new(),
            namespace: ns.into(),
            name: name.into(),
            code: Some(code),
            stage: "ResponseComplete".into(),
            received: Some(at),
        }
    }

    fn run(events: &[AuditEvent]) -> Result<Tally> {
        let shards = Shards::new(NonZeroU32::new(1).unwrap());
        check(
            events,
            shards,
            Duration::from_secs(3),
            |b| format!("portwise-bucket-{b}"),
            |u| u.starts_with("pw-"),
        )
    }

    const L: &str = "portwise-bucket-0";

    #[test]
    fn writes_within_each_holders_term_pass_and_handovers_count() {
        let t = run(&[
            ev("pw-a", "leases", "sys", L, 0.0, 200),
            ev("pw-a", "endpointslices", "ns", "s", 1.0, 200),
            ev("pw-a", "leases", "sys", L, 2.0, 200),
            ev("pw-a", "endpointslices", "ns", "s", 4.5, 201),
            // b's attempt while a holds: refused by the apiserver.
            ev("pw-b", "leases", "sys", L, 4.6, 409),
            ev("pw-b", "leases", "sys", L, 6.0, 200),
            ev("pw-a", "endpointslices", "ns", "s", 6.1, 409),
            ev("pw-b", "endpoints", "ns", "s", 6.2, 200),
            ev("admin", "endpointslices", "ns", "x", 7.0, 200),
        ])
        .unwrap();
        assert_eq!(
            t,
            Tally {
                writes: 3,
                refused: 1,
                handovers: 1
            }
        );
    }

    #[test]
    fn a_write_after_another_took_the_bucket_fails() {
        let err = run(&[
            ev("pw-a", "leases", "sys", L, 0.0, 200),
            ev("pw-b", "leases", "sys", L, 3.5, 200),
            ev("pw-a", "endpointslices", "ns", "s", 3.6, 200),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("last written by pw-b"), "{err}");
    }

    #[test]
    fn a_write_past_the_lease_without_renewal_fails() {
        let err = run(&[
            ev("pw-a", "leases", "sys", L, 0.0, 200),
            ev("pw-a", "endpointslices", "ns", "s", 3.2, 200),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("outside its term"), "{err}");
    }

    #[test]
    fn a_write_before_any_term_fails() {
        assert!(run(&[ev("pw-a", "endpointslices", "ns", "s", 0.0, 200)]).is_err());
    }
}
