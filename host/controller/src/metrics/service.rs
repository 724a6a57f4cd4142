//! The per-Service series: levels, not events, so they are replaced as a
//! whole when a Service is reconciled and dropped with the Service (a
//! renamed or removed port does not linger).

use std::{
    collections::{BTreeMap, HashSet},
    sync::PoisonError,
    time::Duration,
};

use portwise_core::{align::NotJudged, membership::Family};

use super::{
    labels::{
        NotJudgedLabels, PublishedLabels, ServiceLabels, ShadowLabels, ShadowPortLabels,
        gauge_value, label,
    },
    registry::{Metrics, PublishedIndex},
};

impl Metrics {
    fn index(&self) -> std::sync::MutexGuard<'_, PublishedIndex> {
        // The index only mirrors series; a panic elsewhere cannot leave it
        // inconsistent in a way worse than a stale series.
        self.published_index
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the number of endpoints published for one Service port (its name,
    /// or its number when unnamed) and address family.
    pub fn set_published(
        &self,
        namespace: &str,
        service: &str,
        port: &str,
        family: Family,
        endpoints: usize,
    ) {
        let mut index = self.index();
        let family = family.as_str().to_owned();
        index
            .entry((label(namespace), label(service)))
            .or_default()
            .insert((label(port), family.clone()));
        self.endpoints_published
            .get_or_create(&PublishedLabels {
                namespace: label(namespace),
                service: label(service),
                port: label(port),
                family,
            })
            .set(gauge_value(endpoints));
    }

    /// Sets the number of EndpointSlices portwise manages for one Service.
    pub fn set_slices_managed(&self, namespace: &str, service: &str, slices: usize) {
        self.slices_managed
            .get_or_create(&ServiceLabels {
                namespace: label(namespace),
                service: label(service),
            })
            .set(gauge_value(slices));
    }

    /// Replaces every per-Service series of one Service. `published` maps
    /// (Service port name or number, `IPv4`/`IPv6`) to the endpoints
    /// published, for every port and family the Service has now (as
    /// `plan::Summary::endpoints`); series of pairs not listed are dropped.
    pub fn set_service(
        &self,
        namespace: &str,
        service: &str,
        published: &BTreeMap<(String, String), usize>,
        slices: usize,
        desired_slices: usize,
    ) {
        self.set_native_share(
            namespace,
            service,
            published.values().sum(),
            slices,
            desired_slices,
        );
        let mut index = self.index();
        let key = (label(namespace), label(service));
        let mut now = HashSet::new();
        for ((port, family), endpoints) in published {
            let labels = PublishedLabels {
                namespace: label(namespace),
                service: label(service),
                port: label(port),
                family: label(family),
            };
            self.endpoints_published
                .get_or_create(&labels)
                .set(gauge_value(*endpoints));
            now.insert((labels.port, labels.family));
        }
        if let Some(before) = index.get(&key) {
            for (port, family) in before.difference(&now) {
                self.endpoints_published.remove(&PublishedLabels {
                    namespace: label(namespace),
                    service: label(service),
                    port: port.clone(),
                    family: family.clone(),
                });
            }
        }
        if now.is_empty() {
            index.remove(&key);
        } else {
            index.insert(key, now);
        }
        drop(index);
        self.set_slices_managed(namespace, service, slices);
    }

    /// Marks a complete sync of a Service (everything planned was written)
    /// at `at`: the series a staleness alert watches.
    pub fn set_service_synced(&self, namespace: &str, service: &str, at: std::time::SystemTime) {
        let unix = at
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.service_synced
            .get_or_create(&ServiceLabels {
                namespace: label(namespace),
                service: label(service),
            })
            .set(unix);
    }

    /// Sets the pods of a Service's group that are not judged, every reason
    /// listed (zeros included, so a cleared reason reads 0, not stale).
    pub fn set_not_judged(
        &self,
        namespace: &str,
        service: &str,
        counts: &BTreeMap<NotJudged, usize>,
    ) {
        for why in NotJudged::ALL {
            self.pods_not_judged
                .get_or_create(&NotJudgedLabels {
                    namespace: label(namespace),
                    service: label(service),
                    reason: why.as_str().to_string(),
                })
                .set(gauge_value(counts.get(&why).copied().unwrap_or(0)));
        }
    }

    /// Drops every per-Service series of a Service that was deleted or is no
    /// longer managed, so dashboards do not show ghosts.
    pub fn forget_service(&self, namespace: &str, service: &str) {
        let mut index = self.index();
        if let Some(ports) = index.remove(&(label(namespace), label(service))) {
            for (port, family) in ports {
                self.endpoints_published.remove(&PublishedLabels {
                    namespace: label(namespace),
                    service: label(service),
                    port,
                    family,
                });
            }
        }
        let labels = ServiceLabels {
            namespace: label(namespace),
            service: label(service),
        };
        self.slices_managed.remove(&labels);
        self.abstain_longest.remove(&labels);
        self.service_synced.remove(&labels);
        for why in NotJudged::ALL {
            self.pods_not_judged.remove(&NotJudgedLabels {
                namespace: label(namespace),
                service: label(service),
                reason: why.as_str().to_string(),
            });
        }
        drop(index);
        self.forget_shadow(namespace, service);
        self.forget_native_share(namespace, service);
    }

    /// Replaces a Service's shadow series: differing pods per port (every
    /// port listed, zeros included) and the verdicts compared.
    pub fn set_shadow(
        &self,
        namespace: &str,
        service: &str,
        shadow: &str,
        per_port: &BTreeMap<String, usize>,
        verdicts: usize,
    ) {
        let mut index = self
            .shadow_index
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (label(namespace), label(service));
        let ports: HashSet<String> = per_port.keys().map(|p| label(p)).collect();
        if let Some((old_shadow, old_ports)) = index.get(&key) {
            for port in old_ports {
                if old_shadow != shadow || !ports.contains(port) {
                    self.shadow_differences.remove(&ShadowPortLabels {
                        namespace: key.0.clone(),
                        service: key.1.clone(),
                        shadow: old_shadow.clone(),
                        port: port.clone(),
                    });
                }
            }
            if old_shadow != shadow {
                self.shadow_verdicts.remove(&ShadowLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    shadow: old_shadow.clone(),
                });
            }
        }
        for (port, n) in per_port {
            self.shadow_differences
                .get_or_create(&ShadowPortLabels {
                    namespace: key.0.clone(),
                    service: key.1.clone(),
                    shadow: label(shadow),
                    port: label(port),
                })
                .set(gauge_value(*n));
        }
        self.shadow_verdicts
            .get_or_create(&ShadowLabels {
                namespace: key.0.clone(),
                service: key.1.clone(),
                shadow: label(shadow),
            })
            .set(gauge_value(verdicts));
        index.insert(key, (label(shadow), ports));
    }

    /// Drops a Service's shadow series (no shadow applies any more).
    pub fn forget_shadow(&self, namespace: &str, service: &str) {
        let mut index = self
            .shadow_index
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((shadow, ports)) = index.remove(&(label(namespace), label(service))) {
            for port in ports {
                self.shadow_differences.remove(&ShadowPortLabels {
                    namespace: label(namespace),
                    service: label(service),
                    shadow: shadow.clone(),
                    port,
                });
            }
            self.shadow_verdicts.remove(&ShadowLabels {
                namespace: label(namespace),
                service: label(service),
                shadow,
            });
        }
    }

    /// The longest ongoing abstain of a Service (zero when none).
    pub fn set_abstain_longest(&self, namespace: &str, service: &str, longest: Duration) {
        self.abstain_longest
            .get_or_create(&ServiceLabels {
                namespace: label(namespace),
                service: label(service),
            })
            .set(longest.as_secs_f64());
    }
}
