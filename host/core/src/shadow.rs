//! Shadow rollout: which shadow expression a Service gets, and where its
//! verdicts differ from the live ones. Pure; the controller judges, counts
//! and reports (host/controller/src/shadow.rs).
//!
//! The workflow this serves: name the new checker as a shadow, watch the
//! differences on real traffic without publishing anything, then promote it
//! by moving it to `membership` (a config change, or an edit of the team's
//! `MembershipPolicy`: its `spec.shadow` is the shadow of the Services it
//! decides).

use std::{collections::BTreeMap, fmt, net::IpAddr};

use k8s_openapi::api::core::v1::Service;

use crate::{
    config::ShadowSpec,
    membership::{Decision, Family},
    plan::Judged,
};

/// Which shadow applies to a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pick {
    /// No shadow: none configured, or the annotation says `none`.
    Off,
    /// `shadow.membership`, the default.
    Default,
    /// `shadow.expressions.<name>`, chosen by the annotation.
    Named(String),
    /// The `spec.shadow` of the `MembershipPolicy` that decides the
    /// Service, named here.
    Object(String),
    /// The annotation names an expression the file does not have.
    Unknown(String),
}

impl Pick {
    /// How the shadow is named in Events, metrics and `portwise check`.
    pub fn label(&self) -> String {
        match self {
            Pick::Off => "none".into(),
            Pick::Default => "shadow.membership".into(),
            Pick::Named(n) | Pick::Unknown(n) => format!("shadow.expressions.{n}"),
            Pick::Object(n) => format!(
                "{}/spec.shadow",
                crate::policy::Policy::Object(n.clone()).label()
            ),
        }
    }
}

/// The annotation's value picks a named shadow; `none` opts out of every
/// shadow; absent or empty, the deciding policy object's `spec.shadow`
/// applies (`object`: its name, when it has one), else the file's default
/// (if there is one).
///
/// Why the object's shadow beats the operator's default: it is the team's
/// own trial of its own policy, and more specific; a Service that names an
/// operator shadow still gets that one, as it asked.
pub fn pick(service: &Service, spec: Option<&ShadowSpec>, object: Option<&str>) -> Pick {
    let annotation = spec.map_or(crate::config::DEFAULT_SHADOW_ANNOTATION, |s| {
        s.annotation.as_str()
    });
    let picked = crate::align::picked_by_annotation(&service.metadata, annotation);
    match (picked, spec) {
        (Some("none"), _) => Pick::Off,
        (Some(name), Some(spec))
            if spec.expressions.contains_key(name)
                && crate::policy::may_pick(&spec.scopes, name, service) =>
        {
            Pick::Named(name.to_string())
        }
        (Some(name), Some(_)) => Pick::Unknown(name.to_string()),
        // No operator shadows: the annotation can only say `none`, and
        // without an object shadow there is nothing to name.
        (Some(name), None) if object.is_some() => Pick::Unknown(name.to_string()),
        (Some(_), None) => Pick::Off,
        (None, _) if object.is_some() => Pick::Object(object.unwrap_or_default().to_string()),
        (None, Some(spec)) if spec.membership.is_some() => Pick::Default,
        (None, _) => Pick::Off,
    }
}

/// The named shadows `service`'s namespace may pick, for a message that
/// names no other.
pub fn names_for<'a>(spec: &'a ShadowSpec, service: &Service) -> Vec<&'a str> {
    spec.expressions
        .keys()
        .filter(|n| crate::policy::may_pick(&spec.scopes, n, service))
        .map(String::as_str)
        .collect()
}

/// One (port, pod, family) whose shadow verdict is not the live one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The Service port's name, or its number when unnamed.
    pub port: String,
    pub pod: String,
    pub family: Family,
    pub address: IpAddr,
    pub live: Decision,
    pub shadow: Decision,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({}): live {}, shadow {}",
            self.port,
            self.pod,
            self.family,
            word(self.live),
            word(self.shadow)
        )
    }
}

fn word(d: Decision) -> &'static str {
    match d {
        Decision::Include => "include",
        Decision::Exclude => "exclude",
        Decision::Abstain => "abstain",
    }
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

fn port_label(j: &Judged) -> String {
    if j.port.name.is_empty() {
        j.port.port.to_string()
    } else {
        j.port.name.clone()
    }
}

type Key = (String, String, Family, IpAddr);

fn keyed(judged: &[Judged]) -> BTreeMap<Key, Decision> {
    judged
        .iter()
        .map(|j| {
            (
                (port_label(j), name_of(&j.pod.metadata), j.family, j.address),
                j.decision,
            )
        })
        .collect()
}

/// Where the shadow disagrees with the live verdicts, sorted by port, pod,
/// family. Both are judged over the same subjects; a subject only one side
/// has (the Service changed in between) is not a difference.
pub fn differences(live: &[Judged], shadow: &[Judged]) -> Vec<Difference> {
    let live = keyed(live);
    keyed(shadow)
        .into_iter()
        .filter_map(|(key, shadow)| {
            let live = *live.get(&key)?;
            (live != shadow).then_some(Difference {
                port: key.0,
                pod: key.1,
                family: key.2,
                address: key.3,
                live,
                shadow,
            })
        })
        .collect()
}

/// Differing pods per port (every port of `judged` listed, zeros too): what
/// the `portwise_shadow_differences` gauge shows.
pub fn per_port(judged: &[Judged], diffs: &[Difference]) -> BTreeMap<String, usize> {
    let mut out: BTreeMap<String, usize> = judged.iter().map(|j| (port_label(j), 0)).collect();
    let mut seen = std::collections::BTreeSet::new();
    for d in diffs {
        // A dual-stack pod differing in both families counts once.
        if seen.insert((d.port.clone(), d.pod.clone())) {
            *out.entry(d.port.clone()).or_default() += 1;
        }
    }
    out
}

/// The Event's note: how many verdicts differ and the first few.
pub fn note(pick: &Pick, diffs: &[Difference], total: usize) -> String {
    if diffs.is_empty() {
        return format!(
            "{} agrees with the live membership on all {total} verdicts",
            pick.label()
        );
    }
    const SHOWN: usize = 10;
    let listed: Vec<String> = diffs.iter().take(SHOWN).map(ToString::to_string).collect();
    let more = diffs.len().saturating_sub(SHOWN);
    format!(
        "{} differs from the live membership on {} of {total} verdicts (nothing of it is published): {}{}",
        pick.label(),
        diffs.len(),
        listed.join("; "),
        if more > 0 {
            format!("; and {more} more")
        } else {
            String::new()
        }
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    use super::*;
    use crate::{config::CheckerExpr, membership::ResolvedPort};

    fn spec(default: bool, named: &[&str]) -> ShadowSpec {
        ShadowSpec {
            membership: default.then_some(CheckerExpr::PodReady),
            expressions: named
                .iter()
                .map(|n| (n.to_string(), CheckerExpr::Exclude))
                .collect(),
            annotation: "portwise.io/shadow".into(),
            scopes: BTreeMap::new(),
        }
    }

    fn svc(annotation: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: annotation.map(|a| {
                    [("portwise.io/shadow".to_string(), a.to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_annotation_picks_and_none_opts_out() {
        let s = spec(true, &["next"]);
        assert_eq!(pick(&svc(None), Some(&s), None), Pick::Default);
        assert_eq!(pick(&svc(Some(" ")), Some(&s), None), Pick::Default);
        assert_eq!(
            pick(&svc(Some("next")), Some(&s), None),
            Pick::Named("next".into())
        );
        assert_eq!(pick(&svc(Some("none")), Some(&s), None), Pick::Off);
        assert_eq!(
            pick(&svc(Some("nxet")), Some(&s), None),
            Pick::Unknown("nxet".into())
        );
        let no_default = spec(false, &["next"]);
        assert_eq!(pick(&svc(None), Some(&no_default), None), Pick::Off);
        assert_eq!(pick(&svc(Some("next")), None, None), Pick::Off);
    }

    #[test]
    fn a_deciding_objects_shadow_beats_the_default_not_the_annotation() {
        let s = spec(true, &["next"]);
        let team = Some("team");
        let object = Pick::Object("team".into());
        assert_eq!(pick(&svc(None), Some(&s), team), object);
        assert_eq!(pick(&svc(None), None, team), object);
        assert_eq!(object.label(), "membershippolicy/team/spec.shadow");
        // The Service's own choice stands.
        assert_eq!(
            pick(&svc(Some("next")), Some(&s), team),
            Pick::Named("next".into())
        );
        assert_eq!(pick(&svc(Some("none")), Some(&s), team), Pick::Off);
        assert_eq!(pick(&svc(Some("none")), None, team), Pick::Off);
        // A name nobody has is reported, with or without operator shadows.
        assert_eq!(
            pick(&svc(Some("nxet")), None, team),
            Pick::Unknown("nxet".into())
        );
        assert_eq!(
            pick(&svc(Some("nxet")), Some(&s), team),
            Pick::Unknown("nxet".into())
        );
    }

    fn judged(port: &str, pod: &str, family: Family, decision: Decision) -> Judged {
        Judged {
            port: ResolvedPort {
                name: port.into(),
                port: 80,
                protocol: "TCP".into(),
                target: 8080,
            },
            family,
            pod: Arc::new(Pod {
                metadata: ObjectMeta {
                    name: Some(pod.into()),
                    ..Default::default()
                },
                ..Default::default()
            }),
            address: match family {
                Family::V4 => "10.244.0.1".parse().unwrap(),
                Family::V6 => "fd00:10:244::1".parse().unwrap(),
            },
            decision,
        }
    }

    #[test]
    fn differences_are_per_port_pod_and_family() {
        use Decision::*;
        use Family::*;
        let live = [
            judged("http", "a", V4, Include),
            judged("http", "a", V6, Include),
            judged("http", "b", V4, Exclude),
            judged("admin", "a", V4, Abstain),
            judged("", "c", V4, Include),
        ];
        let shadow = [
            judged("http", "a", V4, Exclude),
            judged("http", "a", V6, Exclude),
            judged("http", "b", V4, Exclude),
            judged("admin", "a", V4, Include),
            judged("", "c", V4, Include),
            // Only the shadow saw it: not a difference.
            judged("http", "z", V4, Include),
        ];
        let d = differences(&live, &shadow);
        let got: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "admin a (IPv4): live abstain, shadow include",
                "http a (IPv4): live include, shadow exclude",
                "http a (IPv6): live include, shadow exclude",
            ]
        );
        let counts = per_port(&live, &d);
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [("80".into(), 0), ("admin".into(), 1), ("http".into(), 1)]
        );
        assert_eq!(differences(&live, &live), []);
    }

    #[test]
    fn the_note_counts_and_lists() {
        use Decision::*;
        let live: Vec<Judged> = (0..12)
            .map(|i| judged("http", &format!("p{i:02}"), Family::V4, Include))
            .collect();
        let shadow: Vec<Judged> = (0..12)
            .map(|i| judged("http", &format!("p{i:02}"), Family::V4, Exclude))
            .collect();
        let d = differences(&live, &shadow);
        let n = note(&Pick::Named("next".into()), &d, live.len());
        assert!(
            n.starts_with(
                "shadow.expressions.next differs from the live membership on 12 of 12 verdicts"
            ),
            "{n}"
        );
        assert!(
            n.contains("http p00 (IPv4): live include, shadow exclude"),
            "{n}"
        );
        assert!(n.ends_with("; and 2 more"), "{n}");
        assert_eq!(
            note(&Pick::Default, &[], 12),
            "shadow.membership agrees with the live membership on all 12 verdicts"
        );
    }
}
