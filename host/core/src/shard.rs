//! Shards (issue 49): namespaces hashed into a fixed number of buckets, and
//! which replica holds which bucket.
//!
//! Why namespaces: a group never crosses a namespace, so a Service, its
//! pods, its verdict memory and every write it causes fall into one bucket,
//! and every write portwise makes is namespaced: the write fence maps
//! namespace → bucket → the holder's term.
//!
//! Why hash *ranges* rather than a modulo: bucket `b` of `S` holds the
//! hashes in `[b·2⁶⁴/S, (b+1)·2⁶⁴/S)`, one contiguous range, so a bucket is
//! one range of a range-sharded list and watch (KEP-5866's `shardRange`)
//! where an apiserver offers one over the same hash.
//!
//! Why FNV-1a-64 *mixed* ([`spread`], MurmurHash3's 64-bit finalizer): a
//! range is chosen by the hash's top bits, and FNV-1a's top bits hardly
//! depend on a name's last characters (the last byte is multiplied by the
//! prime, `2⁴⁰ + 0x1b3`, into bits 0–48 only). Namespaces named
//! `tenant000` … `tenant049` all fell in one bucket of 16: one replica
//! doing all the work, the hot shard Argo CD's users complain of. The
//! finalizer is a bijection that makes every bit depend on every bit.
//!
//! Why a balanced, sticky assignment: each of `N` members holds ⌊S/N⌋ or
//! ⌈S/N⌉ buckets (no hot replica, the complaint of Argo CD's and Knative's
//! users), and a bucket moves only when that balance needs it, so scaling
//! from `N` to `N+1` members moves at most ⌈S/(N+1)⌉ buckets and a member
//! leaving moves only its own. The assignment is a pure function of the
//! members and the current holders: every replica computes the same one.

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;

/// FNV-1a, 64 bits (offset basis and prime of the FNV specification).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// MurmurHash3's 64-bit finalizer (`fmix64`): a bijection of `u64` whose
/// every output bit depends on every input bit.
pub fn spread(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The hash a namespace's bucket is chosen by.
pub fn namespace_hash(namespace: &str) -> u64 {
    spread(fnv1a64(namespace.as_bytes()))
}

/// A bucket: `0..S`.
pub type Bucket = u32;

/// The number of buckets, fixed at install (`--shards`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shards(NonZeroU32);

impl Shards {
    /// One bucket: every namespace in it, today's single writer.
    pub const ONE: Shards = Shards(NonZeroU32::MIN);

    pub fn new(count: NonZeroU32) -> Shards {
        Shards(count)
    }

    pub fn count(self) -> u32 {
        self.0.get()
    }

    /// The bucket of `namespace`: the range its hash falls in.
    pub fn bucket(self, namespace: &str) -> Bucket {
        let h = u128::from(namespace_hash(namespace));
        // h · S / 2⁶⁴ < S, so it fits.
        ((h * u128::from(self.count())) >> 64) as Bucket
    }

    /// The hashes bucket `b` holds: `[start, end)`, `end` `None` for 2⁶⁴.
    pub fn range(self, b: Bucket) -> (u64, Option<u64>) {
        let s = u128::from(self.count());
        // The smallest h with h · S ≥ b · 2⁶⁴: the bound `bucket` rounds to.
        let start = |b: u128| (b << 64).div_ceil(s);
        let end = start(u128::from(b) + 1);
        (
            start(u128::from(b)) as u64,
            u64::try_from(end).ok(), // 2⁶⁴ for the last bucket
        )
    }
}

/// Which member holds each bucket after balancing: every bucket held by
/// one of `members`, each member holding ⌊S/N⌋ or ⌈S/N⌉, and as few
/// buckets as that allows taken from the holders in `current` (holders
/// that are no longer members hold nothing). Without members, nothing is
/// held.
pub fn assign(
    shards: Shards,
    members: &BTreeSet<String>,
    current: &BTreeMap<Bucket, String>,
) -> BTreeMap<Bucket, String> {
    let s = shards.count() as usize;
    let n = members.len();
    if n == 0 {
        return BTreeMap::new();
    }
    let mut held: BTreeMap<&str, Vec<Bucket>> =
        members.iter().map(|m| (m.as_str(), Vec::new())).collect();
    for (&b, holder) in current.range(..shards.count()) {
        if let Some(bs) = held.get_mut(holder.as_str()) {
            bs.push(b);
        }
    }
    // Quotas: ⌈S/N⌉ for S mod N members, ⌊S/N⌋ for the others. The larger
    // quotas go to those holding the most already (then by name), which
    // keeps the moves to the fewest.
    let (floor, extra) = (s / n, s % n);
    let mut by_load: Vec<&str> = held.keys().copied().collect();
    by_load.sort_by(|a, b| held[b].len().cmp(&held[a].len()).then(a.cmp(b)));
    let quota: BTreeMap<&str, usize> = by_load
        .iter()
        .enumerate()
        .map(|(i, m)| (*m, floor + usize::from(i < extra)))
        .collect();
    // Surplus released (a member's highest buckets), then given with the
    // unheld buckets, lowest first, to members short of their quota.
    let mut free: BTreeSet<Bucket> = (0..shards.count()).collect();
    for (m, bs) in &mut held {
        bs.truncate(quota[m]);
        for b in bs.iter() {
            free.remove(b);
        }
    }
    let mut free = free.into_iter();
    for (m, bs) in &mut held {
        while bs.len() < quota[m] {
            bs.push(free.next().expect("the quotas add up to S"));
        }
    }
    held.into_iter()
        .flat_map(|(m, bs)| bs.into_iter().map(move |b| (b, m.to_string())))
        .collect()
}

/// How many buckets change holder from `before` to `after` (a bucket held
/// in one and not the other counts).
pub fn moves(before: &BTreeMap<Bucket, String>, after: &BTreeMap<Bucket, String>) -> usize {
    let buckets: BTreeSet<&Bucket> = before.keys().chain(after.keys()).collect();
    buckets
        .into_iter()
        .filter(|b| before.get(b) != after.get(b))
        .count()
}

/// How a bucket's Lease stands, as this replica sees it (the elector's
/// reading of the record and its clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Held by this replica, its term running.
    Mine,
    /// Free, released, or its holder's term is over.
    Free,
    /// Held by `holder`, its term running.
    Held { holder: String },
}

/// What a replica does with one bucket, given who should hold it
/// ([`assign`]) and how its Lease stands: the graceful move, in steps.
///
/// A move never leaves a bucket with no writer while both replicas live:
/// the old holder keeps writing until its successor is warm, then drains
/// (finishes the writes in flight), closes its fence and releases; only
/// then is the Lease free for the successor to take. A crash skips the
/// handshake: the Lease expires and the successor takes it cold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Hold on: renew, keep writing.
    Keep,
    /// Take the Lease (free or expired) and start writing. After a crash
    /// the state (abstains, stability) is seeded from the published slices.
    Take,
    /// Another holds what is now ours: watch its namespaces and probe
    /// without writing, then say so on its Lease.
    Warm,
    /// Ours, now another's, whose successor is warm: drain, close the
    /// fence, release.
    HandOver { to: String },
    /// Ours, now another's, whose successor is not warm yet: keep writing.
    KeepUntilReady { to: String },
    /// Neither ours nor ours to be.
    Ignore,
}

/// The [`Step`] for a bucket: `me` this replica, `desired` the holder
/// [`assign`] names (`None` without members), `standing` its Lease, and
/// `successor_ready` whether the member it should go to has said it is
/// warm (on the bucket's Lease: it has listed the bucket's namespaces and
/// run a probe round without writing).
pub fn step(me: &str, desired: Option<&str>, standing: &Standing, successor_ready: bool) -> Step {
    let ours = desired == Some(me);
    match standing {
        Standing::Mine if ours => Step::Keep,
        Standing::Mine => match desired {
            // No member to give it to (the ring is shrinking to nothing):
            // keep it rather than leave it unwritten.
            None => Step::Keep,
            Some(to) if successor_ready => Step::HandOver { to: to.to_string() },
            Some(to) => Step::KeepUntilReady { to: to.to_string() },
        },
        Standing::Free if ours => Step::Take,
        Standing::Free => Step::Ignore,
        // Warm until the holder releases; then the Lease reads Free.
        Standing::Held { .. } if ours => Step::Warm,
        Standing::Held { .. } => Step::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shards(s: u32) -> Shards {
        Shards::new(NonZeroU32::new(s).unwrap())
    }

    fn names(n: usize) -> BTreeSet<String> {
        (0..n).map(|i| format!("portwise-{i}")).collect()
    }

    fn loads(a: &BTreeMap<Bucket, String>) -> BTreeMap<&str, usize> {
        let mut l = BTreeMap::new();
        for m in a.values() {
            *l.entry(m.as_str()).or_default() += 1;
        }
        l
    }

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        // From the FNV specification's test suite.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn spread_matches_murmur3_s_finalizer() {
        assert_eq!(spread(0), 0);
        // fmix64(1), from MurmurHash3's reference implementation.
        assert_eq!(spread(1), 0xb456_bcfc_34c2_cb2c);
    }

    /// Names that differ only at their end spread over the buckets: with
    /// FNV-1a's top bits alone, all fifty fell in one bucket.
    #[test]
    fn sequential_names_spread_over_the_buckets() {
        let s = shards(16);
        for pattern in ["tenant{:03}", "team-{}", "ns-{}", "shop-{}-prod"] {
            let mut load = [0usize; 16];
            for i in 0..50 {
                let name = pattern
                    .replace("{:03}", &format!("{i:03}"))
                    .replace("{}", &i.to_string());
                load[s.bucket(&name) as usize] += 1;
            }
            let most = load.iter().max().copied().unwrap_or(0);
            let used = load.iter().filter(|n| **n > 0).count();
            // 50 balls into 16 bins: the fullest holds about 7.
            assert!(most <= 10 && used >= 12, "{pattern}: {load:?}");
        }
    }

    #[test]
    fn one_shard_holds_every_namespace() {
        for ns in ["", "default", "kube-system", "team-a"] {
            assert_eq!(Shards::ONE.bucket(ns), 0);
        }
        assert_eq!(Shards::ONE.range(0), (0, None));
    }

    #[test]
    fn buckets_are_contiguous_hash_ranges() {
        let s = shards(16);
        assert_eq!(s.range(0).0, 0);
        assert_eq!(s.range(15).1, None);
        for b in 0..15 {
            assert_eq!(s.range(b).1, Some(s.range(b + 1).0), "bucket {b}");
        }
        assert_eq!(s.range(1).0, 1 << 60);
    }

    #[test]
    fn three_members_of_sixteen_buckets_hold_six_five_and_five() {
        let a = assign(shards(16), &names(3), &BTreeMap::new());
        let mut l: Vec<usize> = loads(&a).into_values().collect();
        l.sort();
        assert_eq!(l, vec![5, 5, 6]);
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn no_member_holds_nothing() {
        let current = assign(shards(4), &names(2), &BTreeMap::new());
        assert!(assign(shards(4), &BTreeSet::new(), &current).is_empty());
    }

    #[test]
    fn a_graceful_move_hands_over_only_once_the_successor_is_warm() {
        let held_by_a = Standing::Held { holder: "a".into() };
        // b is to take the bucket from a: it warms while a keeps writing.
        assert_eq!(step("b", Some("b"), &held_by_a, false), Step::Warm);
        assert_eq!(
            step("a", Some("b"), &Standing::Mine, false),
            Step::KeepUntilReady { to: "b".into() }
        );
        // b says it is warm: a drains and releases; b takes the free Lease.
        assert_eq!(
            step("a", Some("b"), &Standing::Mine, true),
            Step::HandOver { to: "b".into() }
        );
        assert_eq!(step("b", Some("b"), &Standing::Free, false), Step::Take);
        // A third replica does nothing throughout.
        assert_eq!(step("c", Some("b"), &held_by_a, false), Step::Ignore);
        assert_eq!(step("c", Some("b"), &Standing::Free, false), Step::Ignore);
    }

    #[test]
    fn a_holder_keeps_what_is_its_own_and_what_nobody_can_take() {
        assert_eq!(step("a", Some("a"), &Standing::Mine, false), Step::Keep);
        assert_eq!(step("a", None, &Standing::Mine, true), Step::Keep);
        // A crashed holder's Lease expires: the member it is assigned to
        // takes it, with no handshake.
        assert_eq!(step("b", Some("b"), &Standing::Free, false), Step::Take);
    }

    proptest! {
        /// Whatever the standing, at most one replica writes a bucket: of
        /// the steps that write (Keep, KeepUntilReady, Take), only the
        /// Lease's holder gets Keep or KeepUntilReady, and Take only when
        /// nobody holds it.
        #[test]
        fn at_most_one_replica_writes_a_bucket(
            n in 1usize..5,
            desired in proptest::option::of(0usize..5),
            holder in proptest::option::of(0usize..5),
            ready in any::<bool>(),
        ) {
            let name = |i: usize| format!("r{i}");
            let desired = desired.map(name);
            let mut writers = 0;
            for i in 0..n {
                let me = name(i);
                let standing = match &holder {
                    Some(h) if *h == i => Standing::Mine,
                    Some(h) => Standing::Held { holder: name(*h) },
                    None => Standing::Free,
                };
                let s = step(&me, desired.as_deref(), &standing, ready);
                let writes = matches!(s, Step::Keep | Step::KeepUntilReady { .. } | Step::Take);
                if writes {
                    writers += 1;
                    if matches!(s, Step::Take) {
                        prop_assert!(holder.is_none());
                    } else {
                        prop_assert_eq!(holder, Some(i));
                    }
                }
            }
            prop_assert!(writers <= 1);
        }

        #[test]
        fn a_namespace_falls_in_the_range_of_its_bucket(ns in "[a-z0-9-]{0,20}", s in 1u32..64) {
            let s = shards(s);
            let b = s.bucket(&ns);
            prop_assert!(b < s.count());
            let (start, end) = s.range(b);
            let h = namespace_hash(&ns);
            prop_assert!(h >= start);
            prop_assert!(end.is_none_or(|e| h < e));
        }

        /// Every bucket held once, by a member, each member within one of
        /// the others, and a second pass moves nothing.
        #[test]
        fn the_assignment_is_complete_balanced_and_stable(
            s in 1u32..40,
            n in 1usize..9,
            holders in proptest::collection::btree_map(0u32..40, 0usize..12, 0..40),
        ) {
            let shards = shards(s);
            let members = names(n);
            let current: BTreeMap<Bucket, String> = holders
                .into_iter()
                .map(|(b, m)| (b, format!("portwise-{m}")))
                .collect();
            let a = assign(shards, &members, &current);
            prop_assert_eq!(a.keys().copied().collect::<Vec<_>>(), (0..s).collect::<Vec<_>>());
            prop_assert!(a.values().all(|m| members.contains(m)));
            let l = loads(&a);
            let (lo, hi) = (s as usize / n, (s as usize).div_ceil(n));
            for m in &members {
                let got = l.get(m.as_str()).copied().unwrap_or(0);
                prop_assert!(got == lo || got == hi, "{m} holds {got}, not {lo} or {hi}");
            }
            prop_assert_eq!(assign(shards, &members, &a), a);
        }

        /// Scaling out moves at most ⌈S/(N+1)⌉ buckets (the new member's
        /// share); a member leaving moves its buckets and nothing else.
        #[test]
        fn scaling_moves_only_the_share_that_changes_hands(s in 1u32..64, n in 1usize..8) {
            let shards = shards(s);
            let before = assign(shards, &names(n), &BTreeMap::new());
            let out = assign(shards, &names(n + 1), &before);
            prop_assert!(moves(&before, &out) <= (s as usize).div_ceil(n + 1));
            if n >= 2 {
                let gone = format!("portwise-{}", n - 1);
                let mut fewer = names(n);
                fewer.remove(&gone);
                let after = assign(shards, &fewer, &before);
                let held_by_gone = before.values().filter(|m| **m == gone).count();
                prop_assert_eq!(moves(&before, &after), held_by_gone);
            }
        }
    }
}
