//! The rules of the election, without I/O: how long terms last and how
//! often each side acts ([`Timings`]), and what a replica does about a
//! Lease it has just read ([`decide`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;

use super::LeaderError;

/// How long terms last and how often the holder and the others act.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    /// How long a term lasts after it was last seen renewed (whole seconds:
    /// the Lease stores seconds).
    pub lease_duration: Duration,
    /// The holder steps down when no renewal succeeded for this long.
    pub renew_deadline: Duration,
    /// Pause between attempts (renewals for the holder, polls for others).
    pub retry_period: Duration,
}

impl Default for Timings {
    /// client-go's and controller-runtime's defaults: 15 s, 10 s, 2 s.
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// Timings scaled from one lease duration with client-go's ratios
    /// (15 s → renew deadline 10 s, retry 2 s). Call [`Timings::validate`]
    /// (or let [`LeaderElector::start`] do it) for odd values.
    pub fn from_lease_duration(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: lease_duration * 2 / 15,
        }
    }

    /// client-go's constraints: the holder must give up before anyone else
    /// may take over, and must get more than one attempt before giving up.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let invalid = |msg: &str| Err(LeaderError::InvalidTimings(format!("{self:?}: {msg}")));
        if self.lease_duration < Duration::from_secs(1) || self.lease_duration.subsec_nanos() != 0 {
            return invalid("lease_duration must be a whole number of seconds, at least 1");
        }
        if self.retry_period.is_zero() {
            return invalid("retry_period must be positive");
        }
        if self.renew_deadline >= self.lease_duration {
            return invalid("renew_deadline must be shorter than lease_duration");
        }
        if self.renew_deadline <= self.retry_period.mul_f64(1.2) {
            return invalid("renew_deadline must exceed 1.2 × retry_period");
        }
        Ok(())
    }

    pub(crate) fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// The parts of a Lease the decision reads.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Holding {
    /// `spec.holderIdentity`; `None` (or empty, as client-go releases) means free.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds` as the holder declared it.
    pub lease_duration: Option<Duration>,
}

impl Holding {
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            lease_duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .filter(|&s| s > 0)
                .map(Duration::from_secs),
        }
    }
}

/// What to do with the Lease as it stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// This replica holds it: renew.
    Renew,
    /// Free (released) or the holder's term is over: take it.
    Acquire,
    /// Another replica's term runs for `remaining` more, as seen from here.
    Wait { remaining: Duration },
}

/// Can `me` take or keep this Lease now?
///
/// `observed_at` is when this replica first saw the record's current
/// version; the term of another holder ends the record's lease duration
/// (or `default_duration` if the record has none) after that, on this
/// replica's clock. Pure: the I/O loop feeds it.
pub fn decide(
    holding: &Holding,
    me: &str,
    observed_at: Instant,
    now: Instant,
    default_duration: Duration,
) -> LeaseAction {
    match holding.holder.as_deref() {
        None => LeaseAction::Acquire,
        Some(holder) if holder == me => LeaseAction::Renew,
        Some(_) => {
            let term = holding.lease_duration.unwrap_or(default_duration);
            let ends = observed_at + term;
            if now >= ends {
                LeaseAction::Acquire
            } else {
                LeaseAction::Wait {
                    remaining: ends - now,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn held_by(holder: &str, secs: Option<u64>) -> Holding {
        Holding {
            holder: Some(holder.to_owned()),
            lease_duration: secs.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_free_lease_is_taken_at_once() {
        let t0 = Instant::now();
        assert_eq!(
            decide(&Holding::default(), "me", t0, t0, D),
            LeaseAction::Acquire
        );
    }

    #[test]
    fn own_lease_is_renewed_whatever_the_time() {
        let t0 = Instant::now();
        let h = held_by("me", Some(15));
        assert_eq!(decide(&h, "me", t0, t0, D), LeaseAction::Renew);
        assert_eq!(
            decide(&h, "me", t0, t0 + Duration::from_secs(600), D),
            LeaseAction::Renew
        );
    }

    #[test]
    fn another_holders_term_runs_from_when_this_replica_saw_it() {
        let t0 = Instant::now();
        let h = held_by("other", Some(15));
        assert_eq!(
            decide(&h, "me", t0, t0, D),
            LeaseAction::Wait { remaining: D }
        );
        assert_eq!(
            decide(&h, "me", t0, t0 + Duration::from_millis(14_500), D),
            LeaseAction::Wait {
                remaining: Duration::from_millis(500)
            }
        );
        assert_eq!(decide(&h, "me", t0, t0 + D, D), LeaseAction::Acquire);
        assert_eq!(
            decide(&h, "me", t0, t0 + Duration::from_secs(16), D),
            LeaseAction::Acquire
        );
    }

    #[test]
    fn the_holders_declared_duration_wins_over_ours() {
        let t0 = Instant::now();
        let h = held_by("other", Some(60));
        assert_eq!(
            decide(&h, "me", t0, t0 + Duration::from_secs(20), D),
            LeaseAction::Wait {
                remaining: Duration::from_secs(40)
            }
        );
        // No declared duration: fall back to ours rather than "expired".
        let h = held_by("other", None);
        assert_eq!(
            decide(&h, "me", t0, t0 + Duration::from_secs(5), D),
            LeaseAction::Wait {
                remaining: Duration::from_secs(10)
            }
        );
    }

    #[test]
    fn holding_reads_client_go_releases_and_bad_durations_as_absent() {
        let lease = |holder: Option<&str>, secs: Option<i32>| Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: secs,
                ..Default::default()
            }),
        };
        assert_eq!(Holding::of(&lease(Some(""), Some(1))).holder, None);
        assert_eq!(Holding::of(&lease(None, None)), Holding::default());
        assert_eq!(Holding::of(&lease(Some("a"), Some(0))).lease_duration, None);
        assert_eq!(
            Holding::of(&lease(Some("a"), Some(-3))).lease_duration,
            None
        );
        assert_eq!(
            Holding::of(&lease(Some("a"), Some(15))),
            held_by("a", Some(15))
        );
        assert_eq!(Holding::of(&Lease::default()), Holding::default());
    }

    #[test]
    fn the_holder_gives_up_before_anyone_may_take_over() {
        Timings::default().validate().unwrap();
        let bad = |lease, renew, retry| Timings {
            lease_duration: Duration::from_millis(lease),
            renew_deadline: Duration::from_millis(renew),
            retry_period: Duration::from_millis(retry),
        };
        assert!(bad(10_000, 10_000, 2_000).validate().is_err());
        assert!(bad(10_000, 2_400, 2_000).validate().is_err());
        assert!(
            bad(1_500, 1_000, 200).validate().is_err(),
            "fractional seconds"
        );
        assert!(bad(15_000, 10_000, 0).validate().is_err());
        assert!(bad(2_000, 1_500, 500).validate().is_ok());
        assert_eq!(
            Timings::from_lease_duration(Duration::from_secs(15)),
            Timings::default()
        );
        Timings::from_lease_duration(Duration::from_secs(3))
            .validate()
            .unwrap();
        assert!(
            Timings::from_lease_duration(Duration::from_millis(2500))
                .validate()
                .is_err()
        );
    }
}
