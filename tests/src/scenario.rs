//! The setup most integration tests share, as one builder: create the
//! Services, create the pods, start portwise, wait until the slices say
//! what the test expects to begin with. Each test then reads as its
//! scenario:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use portwise_tests::*;
//! let cp = ControlPlane::shared().await?;
//! let ns = TestNs::new(cp, "example").await?;
//! let _pw = Scenario::new(&ns)
//!     .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
//!     .pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
//!     .config(&config("podReady"))
//!     .expect("web", by_port([(("http", V4), &["a"][..])]))
//!     .start()
//!     .await?;
//! # Ok(()) }
//! ```

use anyhow::Result;

use crate::{
    ByPort, GROUP_KEY, Launch, PORTS_KEY, PodBuilder, Portwise, ServiceBuilder, TestNs, V4,
    by_port, config, endpoints_by_port, expect_eq, next_ips, pod, service, wait_for,
};

/// Services, pods and a portwise for one namespace; see the module docs.
#[must_use = "a Scenario does nothing until `start` or `create`"]
pub struct Scenario<'a> {
    ns: &'a TestNs,
    services: Vec<ServiceBuilder>,
    pods: Vec<PodBuilder>,
    /// How portwise starts (watching the namespace).
    launch: Launch,
    expect: Vec<(String, ByPort)>,
}

impl<'a> Scenario<'a> {
    /// Nothing yet; portwise's config defaults to `config("podReady")`.
    pub fn new(ns: &'a TestNs) -> Self {
        Self {
            ns,
            services: Vec::new(),
            pods: Vec::new(),
            launch: Portwise::builder(ns.cp())
                .namespace(ns.name())
                .config(&config("podReady")),
            expect: Vec::new(),
        }
    }

    /// A Service, created before any pod (in the order given).
    pub fn service(mut self, svc: ServiceBuilder) -> Self {
        self.services.push(svc);
        self
    }

    /// A pod, created after the Services, one at a time in the order given
    /// (each Ready, with its addresses, unless the builder says otherwise).
    pub fn pod(mut self, pod: PodBuilder) -> Self {
        self.pods.push(pod);
        self
    }

    /// Several pods; see [`Scenario::pod`].
    pub fn pods(mut self, pods: impl IntoIterator<Item = PodBuilder>) -> Self {
        self.pods.extend(pods);
        self
    }

    /// portwise's config file.
    pub fn config(self, yaml: &str) -> Self {
        self.with_portwise(|l| l.config(yaml))
    }

    /// Run the real binary rather than portwise in-process.
    pub fn binary(self) -> Self {
        self.with_portwise(Launch::binary)
    }

    /// Any other launch setting (identity, flags, name, ...).
    pub fn with_portwise(mut self, f: impl FnOnce(Launch) -> Launch) -> Self {
        self.launch = f(self.launch);
        self
    }

    /// `start` returns only once `svc`'s slices hold exactly `expected`
    /// (within [`crate::SETTLE`]).
    pub fn expect(mut self, svc: &str, expected: ByPort) -> Self {
        self.expect.push((svc.to_string(), expected));
        self
    }

    /// Creates the Services and pods, without portwise.
    pub async fn create(self) -> Result<()> {
        self.create_objects().await
    }

    /// Creates the Services and pods, starts portwise watching the
    /// namespace, and waits for every [`Scenario::expect`].
    pub async fn start(self) -> Result<Portwise> {
        self.create_objects().await?;
        let pw = self.launch.start().await?;
        for (svc, expected) in &self.expect {
            expect_endpoints(self.ns, svc, expected.clone()).await?;
        }
        Ok(pw)
    }

    async fn create_objects(&self) -> Result<()> {
        for svc in &self.services {
            self.ns.create_service(svc.clone()).await?;
        }
        for pod in &self.pods {
            self.ns.create_pod(pod.clone()).await?;
        }
        Ok(())
    }
}

/// Waits (up to [`crate::SETTLE`]) until `svc`'s slices hold exactly
/// `expected`: the check nearly every scenario makes after each change.
pub async fn expect_endpoints(ns: &TestNs, svc: &str, expected: ByPort) -> Result<()> {
    wait_for(crate::SETTLE, || async {
        expect_eq(endpoints_by_port(ns, svc).await?, expected.clone())
    })
    .await
}

// ---- the seed example ------------------------------------------------------

/// The seed example's membership: ready pods, per port as the pod's
/// `port-mapper.example.com/ports` annotation lists.
pub const SEED_MEMBERSHIP: &str =
    "{all: [podReady, {portNames: {annotation: port-mapper.example.com/ports}}]}";

/// The seed example: Service `my-service` (http 8080, https 8443) and Ready
/// pods a–d serving http / http,https / http,https / https, with
/// [`SEED_MEMBERSHIP`] as portwise's config.
pub fn seed_scenario(ns: &TestNs) -> Scenario<'_> {
    seed_scenario_with(
        ns,
        service("my-service")
            .annotation(GROUP_KEY, "my-group")
            .port("http", 8080)
            .port("https", 8443),
        |_, pod| pod.ips(next_ips().v4()),
    )
}

/// The seed example's pods and config around another shape of
/// `my-service` (headless, dual-stack, ...); `dress` finishes each pod
/// (its addresses at least), given its name.
pub fn seed_scenario_with(
    ns: &TestNs,
    svc: ServiceBuilder,
    dress: impl Fn(&str, PodBuilder) -> PodBuilder,
) -> Scenario<'_> {
    Scenario::new(ns)
        .service(svc)
        .pods(
            [
                ("a", "http"),
                ("b", "http,https"),
                ("c", "http,https"),
                ("d", "https"),
            ]
            .map(|(name, ports)| {
                dress(
                    name,
                    seed_pod(name, ports).annotation(GROUP_KEY, "my-group"),
                )
            }),
        )
        .config(&config(SEED_MEMBERSHIP))
}

/// A pod of the seed's shape: container ports http 8080 and https 8443,
/// `ports` (e.g. `"http,https"`) in its [`PORTS_KEY`] annotation.
pub fn seed_pod(name: &str, ports: &str) -> PodBuilder {
    pod(name)
        .annotation(PORTS_KEY, ports)
        .container_port("http", 8080, "TCP")
        .container_port("https", 8443, "TCP")
}

/// The seed example's slices as `http` and `https` pods.
pub fn seed_slices(http: &[&str], https: &[&str]) -> ByPort {
    by_port([(("http", V4), http), (("https", V4), https)])
}

/// Whether `my-service`'s slices hold exactly these pods now.
pub async fn seed_is(ns: &TestNs, http: &[&str], https: &[&str]) -> Result<()> {
    expect_eq(
        endpoints_by_port(ns, "my-service").await?,
        seed_slices(http, https),
    )
}

/// Waits until `my-service`'s slices hold exactly these pods.
pub async fn expect_seed(ns: &TestNs, http: &[&str], https: &[&str]) -> Result<()> {
    wait_for(crate::SETTLE, || seed_is(ns, http, https)).await
}
