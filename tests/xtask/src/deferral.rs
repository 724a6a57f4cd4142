//! What a cold run leaves for the next one: the decision, apart from the
//! builds it is about, so that its rules are tested on their own.
//!
//! A cold `.ci/run` must fit its budget on two cores (docs/build-times.md).
//! The deferrable builds (the Go tools' table marks them, plus the host
//! image) serve a few tests each, so a machine that has not built one yet
//! builds it after the suite, for the next run, and its tests report that
//! they did not run. A build is deferred once: one deferred before and
//! still missing (it failed or was killed) is built in the run, where its
//! failure shows instead of hiding behind another skip.

/// What the decision reads besides the cache.
#[derive(Debug, Default)]
pub struct Ask<'a> {
    /// The deferrable builds, in build order (cilium before clustermesh).
    pub deferrable: &'a [String],
    /// Builds asked for now even on a cold cache (`PORTWISE_BUILD_NOW`).
    pub now: &'a [String],
    /// Builds an earlier run deferred (`$PORTWISE_CACHE/deferred-before`).
    pub before: &'a [String],
    /// Build everything now (`PORTWISE_BUILD_ALL=1`).
    pub all: bool,
}

/// The builds deferred, in build order; the missing ones a rule makes in
/// this run instead (before the suite: inside its network namespace
/// nothing can be downloaded), and a line for each of those.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub deferred: Vec<String>,
    pub now: Vec<String>,
    pub notes: Vec<String>,
}

impl Plan {
    pub fn defers(&self, build: &str) -> bool {
        self.deferred.iter().any(|d| d == build)
    }
}

/// Decides what to defer; `cached` says whether a build is done (it may
/// wait for one in progress, so it is asked only where the answer counts).
pub fn plan(ask: &Ask<'_>, cached: &mut dyn FnMut(&str) -> bool) -> Plan {
    let mut plan = Plan::default();
    if ask.all {
        return plan;
    }
    let has = |list: &[String], b: &str| list.iter().any(|x| x == b);
    for build in ask.deferrable {
        if cached(build) {
            continue;
        }
        // clustermesh-apiserver costs about 25 CPU-s on top of
        // cilium-agent's Go build cache, and a cold agent's cost without
        // it: deferred only with the agent, else built in this run.
        if build == "clustermesh" && !plan.defers("cilium") {
            continue;
        }
        if has(ask.now, build) {
            plan.now.push(build.clone());
            plan.notes
                .push(format!("{build}: built in this run (PORTWISE_BUILD_NOW)"));
        } else if has(ask.before, build) {
            plan.now.push(build.clone());
            plan.notes.push(format!(
                "{build}: deferred by an earlier run and still not built; building it in this run"
            ));
        } else {
            plan.deferred.push(build.clone());
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn decide(ask: &Ask<'_>, cached: &str) -> Plan {
        let cached = names(cached);
        plan(ask, &mut |b| cached.iter().any(|c| c == b))
    }

    #[test]
    fn a_cold_cache_defers_every_missing_build_in_build_order() {
        let deferrable = names("helm registry cilium clustermesh image");
        let ask = Ask {
            deferrable: &deferrable,
            ..Ask::default()
        };
        let plan = decide(&ask, "registry");
        assert_eq!(plan.deferred, names("helm cilium clustermesh image"));
        assert!(plan.now.is_empty() && plan.notes.is_empty());
    }

    #[test]
    fn clustermesh_is_deferred_only_with_cilium() {
        let deferrable = names("cilium clustermesh");
        let ask = Ask {
            deferrable: &deferrable,
            ..Ask::default()
        };
        let plan = decide(&ask, "cilium");
        assert_eq!(
            plan.deferred,
            Vec::<String>::new(),
            "built in the run on the agent's cache"
        );
    }

    #[test]
    fn a_build_deferred_before_and_still_missing_is_built_in_the_run() {
        let deferrable = names("helm cosign");
        let before = names("cosign");
        let ask = Ask {
            deferrable: &deferrable,
            before: &before,
            ..Ask::default()
        };
        let plan = decide(&ask, "");
        assert_eq!(plan.deferred, names("helm"));
        assert_eq!(plan.now, names("cosign"));
        assert_eq!(plan.notes.len(), 1);
        assert!(
            plan.notes[0].starts_with("cosign: deferred by an earlier run"),
            "{:?}",
            plan.notes
        );
    }

    #[test]
    fn builds_asked_for_now_are_not_deferred() {
        let deferrable = names("helm image");
        let now = names("image");
        let ask = Ask {
            deferrable: &deferrable,
            now: &now,
            ..Ask::default()
        };
        let plan = decide(&ask, "");
        assert_eq!(plan.deferred, names("helm"));
        assert_eq!(plan.now, names("image"));
        assert_eq!(
            plan.notes,
            vec!["image: built in this run (PORTWISE_BUILD_NOW)".to_owned()]
        );
    }

    #[test]
    fn build_all_defers_nothing_and_asks_no_cache() {
        let deferrable = names("helm image");
        let ask = Ask {
            deferrable: &deferrable,
            all: true,
            ..Ask::default()
        };
        let plan = plan(&ask, &mut |b| panic!("asked whether {b} is cached"));
        assert_eq!(plan, Plan::default());
    }
}
