//! The checker algebra as pure functions: how `all`, `any`, `not` and
//! `stable` combine decisions. The checkers in `portwise-checkers` only add
//! I/O and reasons around these, so every truth-table row is tested here
//! without a pod, a socket or a clock.
//!
//! | combinator | rule |
//! |---|---|
//! | `all` | the first `exclude` wins; otherwise any `abstain` → `abstain`; otherwise (and for `all()`) `include` |
//! | `any` | the first `include` wins; otherwise any `abstain` → `abstain`; otherwise (and for `any()`) `exclude` |
//! | `not` | `include` ↔ `exclude`; `abstain` stays `abstain` |
//! | `stable` | see [`Damper`] |

use std::time::{Duration, Instant};

use super::Decision;

/// Left-to-right evaluation of `all`/`any` that knows when the answer is
/// settled, so the async combinators can stop before running later probes.
///
/// Feed decisions in order with [`Fold::push`]; it returns `Some(answer)` as
/// soon as one decision settles the result (the *decisive* value: `exclude`
/// for `all`, `include` for `any`). If none does, [`Fold::finish`] gives
/// `abstain` when any child abstained, else the combinator's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fold {
    decisive: Decision,
    otherwise: Decision,
    abstained: bool,
}

impl Fold {
    /// The fold for `all`.
    pub const fn all() -> Self {
        Fold {
            decisive: Decision::Exclude,
            otherwise: Decision::Include,
            abstained: false,
        }
    }

    /// The fold for `any`.
    pub const fn any() -> Self {
        Fold {
            decisive: Decision::Include,
            otherwise: Decision::Exclude,
            abstained: false,
        }
    }

    /// Adds the next child's decision. `Some` means the result is settled and
    /// later children need not run.
    pub fn push(&mut self, d: Decision) -> Option<Decision> {
        if d == self.decisive {
            return Some(d);
        }
        if d == Decision::Abstain {
            self.abstained = true;
        }
        None
    }

    /// The result when no child was decisive.
    pub fn finish(&self) -> Decision {
        if self.abstained {
            Decision::Abstain
        } else {
            self.otherwise
        }
    }

    fn run(mut self, ds: impl IntoIterator<Item = Decision>) -> Decision {
        for d in ds {
            if let Some(settled) = self.push(d) {
                return settled;
            }
        }
        self.finish()
    }
}

/// `all`: the first `exclude` wins; otherwise any `abstain` gives `abstain`;
/// otherwise `include` (so `all()` includes).
/// `abstainLimit`: an abstain keeps what was published only for so long.
///
/// `since` is when the current unbroken run of abstains for one (pod,
/// port, family) began (`None`: the last answer was conclusive). Returns
/// the decision to act on and the new `since`: an abstain that has lasted
/// longer than `limit` counts as exclude, so a pod that vanished from the
/// network (EHOSTUNREACH makes probes abstain) does not stay published
/// until someone deletes its Pod object; a conclusive answer ends the run.
pub fn bound_abstain(
    d: Decision,
    since: Option<Instant>,
    now: Instant,
    limit: Duration,
) -> (Decision, Option<Instant>) {
    match d {
        Decision::Abstain => {
            let since = since.unwrap_or(now);
            if now.saturating_duration_since(since) > limit {
                (Decision::Exclude, Some(since))
            } else {
                (Decision::Abstain, Some(since))
            }
        }
        conclusive => (conclusive, None),
    }
}

pub fn all(ds: &[Decision]) -> Decision {
    Fold::all().run(ds.iter().copied())
}

/// `any`: the first `include` wins; otherwise any `abstain` gives `abstain`;
/// otherwise `exclude` (so `any()` excludes).
pub fn any(ds: &[Decision]) -> Decision {
    Fold::any().run(ds.iter().copied())
}

/// `not`: swaps `include` and `exclude`; "cannot tell" stays "cannot tell".
pub fn not(d: Decision) -> Decision {
    match d {
        Decision::Include => Decision::Exclude,
        Decision::Exclude => Decision::Include,
        Decision::Abstain => Decision::Abstain,
    }
}

/// Kubelet-style damping for `stable`, as a pure state machine.
///
/// - The first conclusive observation (`include` or `exclude`) is taken as
///   is: a pod seen for the first time is not held back.
/// - After that, the damped state flips to `include` only after
///   `success_threshold` consecutive `include`s, and to `exclude` only after
///   `failure_threshold` consecutive `exclude`s. An observation equal to the
///   current state resets the streak.
/// - `abstain` is "no observation": it neither extends nor breaks a streak,
///   and yields the current damped state, because the damped state already
///   *is* the best knowledge of the pod, while the inner checker merely could
///   not look this time. Before any conclusive observation there is no
///   damped state, so `abstain` yields `abstain` (the controller then keeps
///   what it last published, e.g. across a restart).
///
/// A threshold of 0 is treated as 1 (configuration validation rejects 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Damper {
    success_threshold: u32,
    failure_threshold: u32,
    /// The damped answer: `None` until the first conclusive observation,
    /// then `Include` or `Exclude`, never `Abstain`.
    state: Option<Decision>,
    /// Consecutive conclusive observations that disagree with `state`.
    consecutive: u32,
}

impl Damper {
    pub fn new(success_threshold: u32, failure_threshold: u32) -> Self {
        Damper {
            success_threshold: success_threshold.max(1),
            failure_threshold: failure_threshold.max(1),
            state: None,
            consecutive: 0,
        }
    }

    /// The damped answer so far (`None` before any conclusive observation).
    pub fn state(&self) -> Option<Decision> {
        self.state
    }

    /// Observations against the current state in a row.
    pub fn consecutive(&self) -> u32 {
        self.consecutive
    }

    /// Feeds one observation of the inner checker and returns the damped
    /// decision.
    pub fn observe(&mut self, d: Decision) -> Decision {
        let Some(state) = self.state else {
            if d != Decision::Abstain {
                self.state = Some(d);
            }
            return d;
        };
        match d {
            Decision::Abstain => {}
            same if same == state => self.consecutive = 0,
            flip => {
                self.consecutive += 1;
                let needed = match flip {
                    Decision::Include => self.success_threshold,
                    _ => self.failure_threshold,
                };
                if self.consecutive >= needed {
                    self.state = Some(flip);
                    self.consecutive = 0;
                }
            }
        }
        self.state.unwrap_or(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::{Abstain as A, Exclude as E, Include as I};

    const ALL3: [Decision; 3] = [I, E, A];

    /// Reference semantics written as set membership, independent of Fold.
    fn all_ref(ds: &[Decision]) -> Decision {
        if ds.contains(&E) {
            E
        } else if ds.contains(&A) {
            A
        } else {
            I
        }
    }
    fn any_ref(ds: &[Decision]) -> Decision {
        if ds.contains(&I) {
            I
        } else if ds.contains(&A) {
            A
        } else {
            E
        }
    }

    #[test]
    fn all_truth_table_explicit() {
        let rows: &[(&[Decision], Decision)] = &[
            (&[], I),
            (&[I], I),
            (&[E], E),
            (&[A], A),
            (&[I, I], I),
            (&[I, E], E),
            (&[I, A], A),
            (&[E, I], E),
            (&[E, E], E),
            (&[E, A], E),
            (&[A, I], A),
            (&[A, E], E),
            (&[A, A], A),
        ];
        for (ds, want) in rows {
            assert_eq!(all(ds), *want, "all{ds:?}");
        }
    }

    #[test]
    fn any_truth_table_explicit() {
        let rows: &[(&[Decision], Decision)] = &[
            (&[], E),
            (&[I], I),
            (&[E], E),
            (&[A], A),
            (&[I, I], I),
            (&[I, E], I),
            (&[I, A], I),
            (&[E, I], I),
            (&[E, E], E),
            (&[E, A], A),
            (&[A, I], I),
            (&[A, E], A),
            (&[A, A], A),
        ];
        for (ds, want) in rows {
            assert_eq!(any(ds), *want, "any{ds:?}");
        }
    }

    #[test]
    fn all_and_any_match_reference_for_every_sequence_up_to_4() {
        let mut seqs: Vec<Vec<Decision>> = vec![vec![]];
        for _ in 0..4 {
            let next: Vec<Vec<Decision>> = seqs
                .iter()
                .filter(|s| s.len() == seqs.last().unwrap().len())
                .flat_map(|s| ALL3.iter().map(move |d| [s.clone(), vec![*d]].concat()))
                .collect();
            seqs.extend(next);
        }
        assert_eq!(seqs.len(), 1 + 3 + 9 + 27 + 81);
        for s in &seqs {
            assert_eq!(all(s), all_ref(s), "all{s:?}");
            assert_eq!(any(s), any_ref(s), "any{s:?}");
            // De Morgan holds in the three-valued algebra too.
            let negated: Vec<_> = s.iter().map(|d| not(*d)).collect();
            assert_eq!(not(all(s)), any(&negated), "not all{s:?}");
            assert_eq!(not(any(s)), all(&negated), "not any{s:?}");
        }
    }

    #[test]
    fn fold_settles_at_the_first_decisive_child() {
        let mut f = Fold::all();
        assert_eq!(f.push(I), None);
        assert_eq!(f.push(A), None);
        assert_eq!(f.push(E), Some(E)); // later children need not run
        let mut f = Fold::any();
        assert_eq!(f.push(E), None);
        assert_eq!(f.push(A), None);
        assert_eq!(f.finish(), A);
        assert_eq!(f.push(I), Some(I));
        assert_eq!(Fold::all().finish(), I);
        assert_eq!(Fold::any().finish(), E);
    }

    #[test]
    fn not_truth_table() {
        assert_eq!(not(I), E);
        assert_eq!(not(E), I);
        assert_eq!(not(A), A);
        for d in ALL3 {
            assert_eq!(not(not(d)), d);
        }
    }

    fn run(d: &mut Damper, obs: &[Decision]) -> Vec<Decision> {
        obs.iter().map(|o| d.observe(*o)).collect()
    }

    #[test]
    fn damper_first_observation_taken_as_is() {
        for first in [I, E] {
            let mut d = Damper::new(5, 5);
            assert_eq!(d.observe(first), first);
            assert_eq!(d.state(), Some(first));
        }
    }

    #[test]
    fn damper_abstain_before_anything_is_abstain_and_keeps_no_state() {
        let mut d = Damper::new(2, 3);
        assert_eq!(run(&mut d, &[A, A]), [A, A]);
        assert_eq!(d.state(), None);
        // The first conclusive observation after abstains is still taken as is.
        assert_eq!(d.observe(E), E);
        assert_eq!(d.state(), Some(E));
    }

    #[test]
    fn damper_failure_threshold() {
        let mut d = Damper::new(2, 3);
        assert_eq!(run(&mut d, &[I, E, E]), [I, I, I]);
        assert_eq!(d.consecutive(), 2);
        assert_eq!(d.observe(E), E); // third consecutive exclude flips
        assert_eq!(d.consecutive(), 0);
        assert_eq!(d.observe(E), E);
    }

    #[test]
    fn damper_success_threshold() {
        let mut d = Damper::new(2, 3);
        assert_eq!(run(&mut d, &[E, I]), [E, E]);
        assert_eq!(d.observe(I), I); // second consecutive include flips
        assert_eq!(d.observe(I), I);
    }

    #[test]
    fn damper_same_observation_resets_streak() {
        let mut d = Damper::new(2, 3);
        // E, E, I (reset), E, E: never three in a row.
        assert_eq!(run(&mut d, &[I, E, E, I, E, E]), [I; 6]);
        assert_eq!(d.observe(E), E);
        // I, E (reset), I: never two in a row.
        assert_eq!(run(&mut d, &[I, E, I]), [E, E, E]);
    }

    #[test]
    fn damper_abstain_is_transparent_to_streaks_and_yields_state() {
        let mut d = Damper::new(2, 3);
        assert_eq!(run(&mut d, &[I, E, A, E, A]), [I, I, I, I, I]);
        assert_eq!(d.consecutive(), 2);
        assert_eq!(d.observe(E), E); // E, (A), E, (A), E = three excludes
        assert_eq!(d.observe(A), E); // abstain yields the damped state
        assert_eq!(run(&mut d, &[I, A, I]), [E, E, I]);
    }

    #[test]
    fn damper_threshold_one_follows_the_input() {
        let mut d = Damper::new(1, 1);
        let obs = [I, E, I, I, E, A, E, I];
        assert_eq!(run(&mut d, &obs), [I, E, I, I, E, E, E, I]);
    }

    #[test]
    fn damper_zero_thresholds_act_as_one() {
        let mut d = Damper::new(0, 0);
        assert_eq!(run(&mut d, &[I, E, I]), [I, E, I]);
    }

    #[test]
    fn damper_never_outputs_abstain_once_settled() {
        // Exhaustive over sequences of length 6 starting with a conclusive answer.
        for code in 0..3usize.pow(5) {
            for first in [I, E] {
                let mut d = Damper::new(2, 3);
                d.observe(first);
                let mut c = code;
                for _ in 0..5 {
                    let o = ALL3[c % 3];
                    c /= 3;
                    assert_ne!(d.observe(o), A);
                }
            }
        }
    }
}

#[cfg(test)]
mod abstain_bound_tests {
    use super::*;

    #[test]
    fn an_abstain_counts_as_exclude_once_it_outlasts_the_limit() {
        use Decision::*;
        let limit = Duration::from_secs(300);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let (d, since) = bound_abstain(Abstain, None, at(0), limit);
        assert_eq!((d, since), (Abstain, Some(at(0))));
        assert_eq!(
            bound_abstain(Abstain, since, at(300), limit),
            (Abstain, since)
        );
        assert_eq!(
            bound_abstain(Abstain, since, at(301), limit),
            (Exclude, since)
        );
        // A conclusive answer ends the run; the next abstain starts afresh.
        assert_eq!(
            bound_abstain(Include, since, at(302), limit),
            (Include, None)
        );
        assert_eq!(
            bound_abstain(Abstain, None, at(303), limit),
            (Abstain, Some(at(303)))
        );
    }
}
