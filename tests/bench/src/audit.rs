//! Requests per client from the apiserver's audit log (a policy that
//! records every request at Metadata level), split by User-Agent into the
//! native controller and portwise.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf, time::Duration};

use anyhow::Result;
use serde_json::Value;

pub(crate) struct Audit {
    pub(crate) path: PathBuf,
}

/// Requests per (client, component, verb, resource).
#[derive(Default, Debug, Clone)]
pub(crate) struct Requests(BTreeMap<(String, String, String, String), u64>);

pub(crate) const WRITE_VERBS: [&str; 5] =
    ["create", "update", "patch", "delete", "deletecollection"];

impl Requests {
    /// Counts the audit events (JSON lines) of `buf`: each request once,
    /// a watch when it starts, anything else when it completes; requests of
    /// other clients, and lines that do not parse (a line cut short at the
    /// end of a read), are left out.
    pub(crate) fn parse(buf: &[u8]) -> Self {
        let mut out = Requests::default();
        for line in buf.split(|b| *b == b'\n') {
            if line.is_empty() {
                continue;
            }
            let Ok(ev) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let verb = ev["verb"].as_str().unwrap_or("");
            let stage = ev["stage"].as_str().unwrap_or("");
            let counted = if verb == "watch" {
                stage == "ResponseStarted"
            } else {
                stage == "ResponseComplete"
            };
            if !counted {
                continue;
            }
            let Some((client, comp)) = classify(ev["userAgent"].as_str().unwrap_or("")) else {
                continue;
            };
            let mut res = ev["objectRef"]["resource"]
                .as_str()
                .unwrap_or("(non-resource)")
                .to_string();
            if let Some(sub) = ev["objectRef"]["subresource"].as_str() {
                res = format!("{res}/{sub}");
            }
            *out.0
                .entry((client.to_string(), comp, verb.to_string(), res))
                .or_default() += 1;
        }
        out
    }
    pub(crate) fn total(&self, client: &str, filter: impl Fn(&str, &str) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|((c, _, verb, res), _)| c == client && filter(verb, res))
            .map(|(_, n)| n)
            .sum()
    }
    pub(crate) fn slice_writes(&self, client: &str) -> u64 {
        self.total(client, |v, r| {
            WRITE_VERBS.contains(&v) && r == "endpointslices"
        })
    }
    pub(crate) fn all(&self, client: &str) -> u64 {
        self.total(client, |_, _| true)
    }
    /// `client`'s requests per (verb, resource), its components together.
    pub(crate) fn of(&self, client: &str) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for ((c, _, v, r), n) in &self.0 {
            if c == client {
                *out.entry((v.clone(), r.clone())).or_default() += n;
            }
        }
        out
    }
    /// "create 1000, list 4, watch 5" for one client.
    pub(crate) fn by_verb(&self, client: &str) -> String {
        let mut verbs: BTreeMap<&str, u64> = BTreeMap::new();
        for ((c, _, v, _), n) in &self.0 {
            if c == client {
                *verbs.entry(v).or_default() += n;
            }
        }
        if verbs.is_empty() {
            return "none".into();
        }
        verbs
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
    /// One table line per (component, verb, resource) of `client`.
    pub(crate) fn detail(&self, client: &str) -> String {
        let mut s = String::new();
        for ((c, comp, v, r), n) in &self.0 {
            if c == client {
                let _ = writeln!(s, "| {comp} | {v} | {r} | {n} |");
            }
        }
        s
    }
}

/// Which controller a User-Agent belongs to, and the component suffix.
pub(crate) fn classify(agent: &str) -> Option<(&'static str, String)> {
    if agent.starts_with("portwise/") {
        return Some((
            "portwise",
            agent.split(' ').next().unwrap_or(agent).to_string(),
        ));
    }
    if agent.starts_with("kube-controller-manager/") {
        let comp = agent.rsplit('/').next().unwrap_or("").to_string();
        return Some(("native", comp));
    }
    None
}

impl Audit {
    /// Requests since `from`, read 2 s from now: a request's
    /// ResponseComplete event can reach the file just after its response
    /// (and the watch event it caused) reached us.
    pub(crate) async fn settled_between(&self, from: u64) -> Result<Requests> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.between(from, self.offset())
    }
    pub(crate) fn offset(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }
    /// Requests logged between two offsets. The audit backend is blocking,
    /// so a request is in the file by the time it has returned. Watches
    /// count when they start, everything else when it completes.
    pub(crate) fn between(&self, from: u64, to: u64) -> Result<Requests> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path)?;
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::with_capacity((to.saturating_sub(from)) as usize);
        f.take(to.saturating_sub(from)).read_to_end(&mut buf)?;
        Ok(Requests::parse(&buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(agent: &str, verb: &str, stage: &str, resource: &str) -> String {
        serde_json::json!({
            "kind": "Event", "stage": stage, "verb": verb, "userAgent": agent,
            "objectRef": {"resource": resource, "namespace": "n"},
        })
        .to_string()
    }

    const PORTWISE: &str = "portwise/0.1.0 (controller)";
    const NATIVE: &str =
        "kube-controller-manager/v1.37.0 (linux/amd64) kubernetes/abc/endpointslice-controller";

    #[test]
    fn counts_each_request_once_by_client_and_verb() {
        let lines = [
            event(PORTWISE, "create", "RequestReceived", "endpointslices"),
            event(PORTWISE, "create", "ResponseComplete", "endpointslices"),
            event(PORTWISE, "update", "ResponseComplete", "endpointslices"),
            event(PORTWISE, "watch", "ResponseStarted", "pods"),
            event(PORTWISE, "watch", "ResponseComplete", "pods"),
            event(PORTWISE, "list", "ResponseComplete", "pods"),
            event(NATIVE, "update", "ResponseComplete", "endpointslices"),
            event(NATIVE, "get", "ResponseComplete", "services"),
            event(
                "kubectl/v1.37.0",
                "create",
                "ResponseComplete",
                "endpointslices",
            ),
        ];
        let mut text = lines.join("\n");
        // A read can end in the middle of an event.
        text.push_str("\n{\"kind\":\"Event\",\"stage\":\"ResponseCom");
        let r = Requests::parse(text.as_bytes());
        assert_eq!(r.slice_writes("portwise"), 2);
        assert_eq!(r.slice_writes("native"), 1);
        assert_eq!(r.all("portwise"), 4);
        assert_eq!(r.all("native"), 2);
        assert_eq!(r.by_verb("portwise"), "create 1, list 1, update 1, watch 1");
        assert_eq!(r.by_verb("nobody"), "none");
        assert_eq!(
            r.detail("native"),
            "| endpointslice-controller | get | services | 1 |\n\
             | endpointslice-controller | update | endpointslices | 1 |\n"
        );
    }

    #[test]
    fn a_subresource_is_its_own_resource() {
        let mut ev: Value =
            serde_json::from_str(&event(PORTWISE, "patch", "ResponseComplete", "pods")).unwrap();
        ev["objectRef"]["subresource"] = "status".into();
        let r = Requests::parse(ev.to_string().as_bytes());
        assert_eq!(
            r.detail("portwise"),
            "| portwise/0.1.0 | patch | pods/status | 1 |\n"
        );
        assert_eq!(r.slice_writes("portwise"), 0);
    }

    #[test]
    fn user_agents_name_the_controller_and_its_component() {
        assert_eq!(
            classify(PORTWISE),
            Some(("portwise", "portwise/0.1.0".into()))
        );
        assert_eq!(
            classify(NATIVE),
            Some(("native", "endpointslice-controller".into()))
        );
        assert_eq!(classify("kubectl/v1.37.0"), None);
    }
}
