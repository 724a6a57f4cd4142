//! How long one check can take at most, from the expression alone: what the
//! judge's per-check deadline (`portwise run --check-timeout`) must exceed,
//! or every slow-but-healthy pod would abstain and, after `abstainLimit`,
//! be excluded.
//!
//! A check runs its expression's parts in order (`all`/`any` short-circuit,
//! but a worst case visits every part), so sequences add; `perPort` runs
//! one port's expression, so it takes the longest. A `wasm` call is bounded
//! by its own `limits.callTimeout`, else by the runtime's default.

use std::time::Duration;

use super::{CheckerExpr, Config};

/// A `--check-timeout` shorter than the worst case of some expressions
/// ([`Config::check_timeout`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--check-timeout {} is shorter than the worst case of {}: those checks would abstain \
     (and after abstainLimit exclude) whenever every probe runs to its timeout; raise \
     --check-timeout, or lower the probes' timeouts or the guests' limits.callTimeout",
    humantime::format_duration(*requested),
    cut.iter()
        .map(|(name, d)| format!("{name} ({})", humantime::format_duration(*d)))
        .collect::<Vec<_>>()
        .join(", ")
)]
pub struct CheckTimeoutError {
    pub requested: Duration,
    /// The expressions it would cut short (`membership`, `policies.NAME`...)
    /// with their worst cases.
    pub cut: Vec<(String, Duration)>,
}

impl CheckerExpr {
    /// The longest one check of this expression can take, given the
    /// runtime's default guest call timeout for `wasm` expressions that set
    /// none of their own.
    pub fn worst_case(&self, default_call_timeout: Duration) -> Duration {
        let worst = |x: &CheckerExpr| x.worst_case(default_call_timeout);
        match self {
            CheckerExpr::TcpDial(t) => t.timeout,
            CheckerExpr::HttpGet(h) => h.timeout,
            CheckerExpr::Grpc(g) => g.timeout,
            CheckerExpr::Wasm(w) => w.limits.call_timeout.unwrap_or(default_call_timeout),
            CheckerExpr::All(xs) | CheckerExpr::Any(xs) => xs.iter().map(worst).sum(),
            CheckerExpr::Not(x) => worst(x),
            CheckerExpr::Stable(s) => worst(&s.checker),
            CheckerExpr::PerPort(p) => p
                .ports
                .values()
                .chain(p.fallback.as_deref())
                .map(worst)
                .max()
                .unwrap_or_default(),
            _ => Duration::ZERO,
        }
    }
}

/// What the default check deadline adds to the worst case: room for the
/// check's own work (queueing for a slot, building the answer) so that a
/// slow probe ends by its own timeout (`exclude`) rather than by the
/// deadline (`abstain`).
pub const CHECK_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

impl Config {
    /// The judge's per-check deadline: `requested` (`--check-timeout`) if it
    /// covers every expression's worst case, else an error that names the
    /// expressions it would cut short; without a request, the largest worst
    /// case plus [`CHECK_TIMEOUT_MARGIN`]. Refused rather than warned about:
    /// a deadline shorter than a check makes every such check abstain, and
    /// after `abstainLimit` exclude, which no one asks for on purpose.
    pub fn check_timeout(
        &self,
        requested: Option<Duration>,
        default_call_timeout: Duration,
    ) -> Result<Duration, CheckTimeoutError> {
        let cases = self.worst_cases(default_call_timeout);
        let longest = cases.iter().map(|(_, d)| *d).max().unwrap_or_default();
        let Some(requested) = requested else {
            return Ok(longest + CHECK_TIMEOUT_MARGIN);
        };
        let cut: Vec<(String, Duration)> =
            cases.into_iter().filter(|(_, d)| *d > requested).collect();
        if cut.is_empty() {
            Ok(requested)
        } else {
            Err(CheckTimeoutError { requested, cut })
        }
    }

    /// Every expression a check can run, live and shadow, by the name
    /// metrics and `check` use (`membership`, `policies.NAME`,
    /// `shadow.membership`, `shadow.expressions.NAME`), with its worst case.
    pub fn worst_cases(&self, default_call_timeout: Duration) -> Vec<(String, Duration)> {
        let mut out = vec![(
            "membership".to_string(),
            self.membership.worst_case(default_call_timeout),
        )];
        for (name, x) in &self.policies {
            out.push((
                format!("policies.{name}"),
                x.worst_case(default_call_timeout),
            ));
        }
        if let Some(shadow) = &self.shadow {
            if let Some(m) = &shadow.membership {
                out.push((
                    "shadow.membership".into(),
                    m.worst_case(default_call_timeout),
                ));
            }
            for (name, x) in &shadow.expressions {
                out.push((
                    format!("shadow.expressions.{name}"),
                    x.worst_case(default_call_timeout),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr(yaml: &str) -> CheckerExpr {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn sequences_add_and_per_port_takes_the_longest_port() {
        let x = expr(
            "perPort: {ports: {http: {all: [podReady, {httpGet: {path: /, timeout: 2s}}, {tcpDial: {timeout: 3s}}]}}, \
             fallback: {not: {wasm: {module: x.wasm}}}}",
        );
        assert_eq!(x.worst_case(Duration::from_secs(1)), Duration::from_secs(5));
        assert_eq!(x.worst_case(Duration::from_secs(9)), Duration::from_secs(9));
        assert_eq!(
            CheckerExpr::PodReady.worst_case(Duration::from_secs(9)),
            Duration::ZERO
        );
    }

    /// Issue 24: a guest's own `callTimeout` counts, not the default.
    #[test]
    fn a_wasm_expression_counts_its_own_call_timeout() {
        let x = expr("wasm: {module: slow.wasm, limits: {callTimeout: 30s}}");
        assert_eq!(
            x.worst_case(Duration::from_secs(5)),
            Duration::from_secs(30)
        );
        let x = expr(
            "any: [{wasm: {module: a.wasm, limits: {callTimeout: 20s}}}, {wasm: {module: b.wasm}}]",
        );
        assert_eq!(
            x.worst_case(Duration::from_secs(5)),
            Duration::from_secs(25)
        );
    }

    /// Issue 24: the deadline comes from every expression's own limits, and
    /// a requested one that would cut a check short is refused by name.
    #[test]
    fn the_check_deadline_covers_every_expression_or_is_refused() {
        let c = Config::from_yaml(
            "serviceKey: {label: g}\nmodulesDir: /m\n\
             membership: {wasm: {module: slow.wasm, limits: {callTimeout: 30s}}}\n\
             shadow:\n  expressions:\n    hang: {httpGet: {path: /, timeout: 40s}}\n",
        )
        .unwrap();
        let five = Duration::from_secs(5);
        assert_eq!(c.check_timeout(None, five), Ok(Duration::from_secs(45)));
        assert_eq!(
            c.check_timeout(Some(Duration::from_secs(50)), five),
            Ok(Duration::from_secs(50))
        );
        let err = c
            .check_timeout(Some(Duration::from_secs(35)), five)
            .unwrap_err();
        // Typed: what was asked, and which expressions it would cut.
        assert_eq!(err.requested, Duration::from_secs(35));
        assert_eq!(
            err.cut,
            [(
                "shadow.expressions.hang".to_string(),
                Duration::from_secs(40)
            )]
        );
        let err = err.to_string();
        assert!(
            err.contains("shadow.expressions.hang (40s)") && !err.contains("membership (30s)"),
            "{err}"
        );
        let err = c
            .check_timeout(Some(Duration::from_secs(10)), five)
            .unwrap_err()
            .to_string();
        assert!(err.contains("membership (30s)"), "{err}");
    }

    /// Issue 24: shadow expressions are judged under the same deadline, so
    /// they are counted too, each by name.
    #[test]
    fn shadows_are_counted_by_name() {
        let c = Config::from_yaml(
            "serviceKey: {label: g}\nmodulesDir: /m\nmembership: podReady\n\
             shadow:\n  membership: {tcpDial: {timeout: 4s}}\n  expressions:\n    slow: {wasm: {module: s.wasm, limits: {callTimeout: 40s}}}\n",
        )
        .unwrap();
        assert_eq!(
            c.worst_cases(Duration::from_secs(5)),
            vec![
                ("membership".to_string(), Duration::ZERO),
                ("shadow.membership".to_string(), Duration::from_secs(4)),
                (
                    "shadow.expressions.slow".to_string(),
                    Duration::from_secs(40)
                ),
            ]
        );
    }
}
