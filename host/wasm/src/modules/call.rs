//! Dispatching a call into a guest: `check` (every membership decision)
//! and `validate-config` (once per version and configuration), each within
//! its deadlines, and sorting whatever went wrong into a [`FailureKind`].
//! A call never fails: a failure is an `abstain` with a reason, counted.

use super::{
    CheckerSpec, ModuleVersion, Runtime,
    failure::{Failure, classify},
    pool::{Guest, Ready},
};
use crate::{CallLimits, error::Rejection, failures::FailureKind, state::CallLabels, v0_1, v0_2};
use portwise_core::{
    membership::{Subject, Verdict},
    text::truncate,
};

impl ModuleVersion {
    /// Runs `validate-config` once per configuration for this version.
    pub(crate) async fn validate(
        &self,
        rt: &Runtime,
        config: &str,
        limits: &CallLimits,
    ) -> Result<(), Rejection> {
        // A tighter memory limit can fail where a looser one passed.
        let key = (config.to_string(), limits.memory_bytes);
        if let Some(known) = self
            .validated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return known.clone();
        }
        let result = match self.call_validate(rt, config, limits).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(Rejection::Guest(truncate(
                message,
                rt.limits.max_reason_bytes,
            ))),
            Err(failure) => Err(Rejection::Failed(failure)),
        };
        self.validated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, result.clone());
        result
    }

    async fn call_validate(
        &self,
        rt: &Runtime,
        config: &str,
        limits: &CallLimits,
    ) -> Result<Result<(), String>, Failure> {
        let mut ready = self.take(rt, limits).await?;
        let labels = CallLabels {
            module: self.label.clone(),
            ..Default::default()
        };
        ready.store.data_mut().begin_call(None, labels, limits);
        ready.store.set_epoch_deadline(1);
        let call = async {
            match &ready.guest {
                Guest::V01(g) => {
                    g.portwise_membership_checker()
                        .call_validate_config(&mut ready.store, config)
                        .await
                }
                Guest::V02(g) => {
                    g.portwise_membership_checker()
                        .call_validate_config(&mut ready.store, config)
                        .await
                }
            }
        };
        let outcome = tokio::time::timeout(limits.call_timeout, call).await;
        self.settle(ready, outcome, rt, limits)
    }

    /// One `check` on an instance of either WIT version: 0.1 gets the pod
    /// and Service as records, 0.2 as handles to views of them.
    async fn call_check(
        &self,
        rt: &Runtime,
        config: &str,
        subject: &Subject,
        limits: &CallLimits,
    ) -> Result<Verdict, Failure> {
        let labels = CallLabels {
            module: self.label.clone(),
            service: Some(subject.service.clone()),
            pod: Some(subject.pod.clone()),
            port: if subject.port.name.is_empty() {
                subject.port.port.to_string()
            } else {
                subject.port.name.clone()
            },
        };
        let mut ready = self.take(rt, limits).await?;
        ready
            .store
            .data_mut()
            .begin_call(Some(subject.address), labels, limits);
        ready.store.data_mut().call.ports =
            portwise_core::align::probe_ports(&subject.service, &subject.pod);
        ready.store.set_epoch_deadline(1);
        let max_reason = rt.limits.max_reason_bytes;
        let outcome = match &ready.guest {
            Guest::V01(g) => {
                let computed = v0_1::Computed::new(subject);
                let lists = v0_1::Lists::new(subject, &computed);
                let call = g.portwise_membership_checker().call_check(
                    &mut ready.store,
                    config,
                    v0_1::service(&subject.service, &lists),
                    v0_1::pod(&subject.pod, &lists),
                    v0_1::target(subject, &computed.address),
                );
                tokio::time::timeout(limits.call_timeout, call)
                    .await
                    .map(|r| r.map(|v| v0_1::verdict(v, max_reason)))
            }
            Guest::V02(g) => {
                let (pod, service) = match ready
                    .store
                    .data_mut()
                    .begin_views(subject.pod.clone(), subject.service.clone())
                {
                    Ok(handles) => handles,
                    Err(e) => {
                        return Err(Failure::new(
                            FailureKind::Trap,
                            format!("cannot hand over the pod: {e:#}"),
                        ));
                    }
                };
                let (pod_rep, service_rep) = (pod.rep(), service.rep());
                let address = subject.address.to_canonical().to_string();
                let call = g.portwise_membership_checker().call_check(
                    &mut ready.store,
                    config,
                    service,
                    pod,
                    v0_2::target(subject, &address),
                );
                let outcome = tokio::time::timeout(limits.call_timeout, call)
                    .await
                    .map(|r| r.map(|v| v0_2::verdict(v, max_reason)));
                ready.store.data_mut().end_views(pod_rep, service_rep);
                outcome
            }
        };
        self.settle(ready, outcome, rt, limits)
    }

    /// Logs the guest's output, returns a healthy instance to the pool and
    /// turns everything else into a [`Failure`] (dropping the instance).
    fn settle<R>(
        &self,
        ready: Ready,
        outcome: Result<wasmtime::Result<R>, tokio::time::error::Elapsed>,
        rt: &Runtime,
        limits: &CallLimits,
    ) -> Result<R, Failure> {
        let stderr_tail = ready.store.data().flush_output();
        match outcome {
            Ok(Ok(value)) => {
                self.put_back(ready, rt);
                Ok(value)
            }
            Ok(Err(e)) => {
                let mut failure = classify(&e, ready.store.data(), limits);
                if let Some(tail) = stderr_tail
                    && failure.kind != FailureKind::Deadline
                {
                    failure.message = format!("{} (stderr: {tail})", failure.message);
                }
                Err(failure)
            }
            Err(_) => Err(Failure::new(
                FailureKind::Deadline,
                format!("call did not finish within {:?}", limits.call_timeout),
            )),
        }
    }
}

impl Runtime {
    /// One guest decision, never failing: every failure is an abstain with a
    /// reason, counted by kind.
    pub(crate) async fn check(&self, spec: &CheckerSpec, subject: &Subject) -> Verdict {
        spec.counters.call();
        match self.try_check(spec, subject).await {
            Ok(verdict) => verdict,
            Err(failure) => {
                spec.counters.fail(failure.kind);
                match failure.kind {
                    FailureKind::Load | FailureKind::Config => {
                        tracing::debug!(module = %spec.module, "{failure}")
                    }
                    _ => tracing::warn!(
                        module = %spec.module,
                        pod = subject.pod.metadata.name.as_deref().unwrap_or(""),
                        port = %subject.port.name,
                        "guest failed, abstaining: {failure}"
                    ),
                }
                Verdict::abstain().because(format!("wasm {}: {failure}", spec.module))
            }
        }
    }

    async fn try_check(&self, spec: &CheckerSpec, subject: &Subject) -> Result<Verdict, Failure> {
        let version = self
            .current(&spec.module)
            .ok_or_else(|| Failure::new(FailureKind::Load, "module is not loaded"))?;
        if let Some(pin) = &spec.pin
            && *pin != version.sha256
        {
            return Err(Failure::new(
                FailureKind::Load,
                format!(
                    "content sha256 {} does not match the pinned {pin}",
                    version.sha256
                ),
            ));
        }
        version
            .validate(self, &spec.config, &spec.limits)
            .await
            .map_err(|m| Failure::new(FailureKind::Config, m.to_string()))?;
        let verdict = version
            .call_check(self, &spec.config, subject, &spec.limits)
            .await?;
        tracing::debug!(
            module = %spec.module,
            pod = subject.pod.metadata.name.as_deref().unwrap_or_default(),
            port = %subject.port.name,
            address = %subject.address,
            decision = ?verdict.decision,
            reason = verdict.reason.as_deref().unwrap_or(""),
            "guest verdict"
        );
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v0_1::portwise::membership::types::Decision as WitDecision;
    use portwise_core::membership::Decision;

    #[test]
    fn verdict_reasons_are_truncated_on_a_char_boundary() {
        let v = v0_1::verdict(
            v0_1::portwise::membership::types::Verdict {
                decision: WitDecision::Include,
                reason: Some("é".repeat(1000)),
            },
            11,
        );
        assert_eq!(v.decision, Decision::Include);
        let reason = v.reason.unwrap();
        assert!(reason.starts_with("éééé"), "{reason}");
        assert!(reason.contains("truncated"), "{reason}");
        assert!(reason.len() < 80);
    }
}
