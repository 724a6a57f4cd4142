//! Leader election (`portwise::ops::leader`) against the real apiserver:
//! one leader at a time, takeover after a crash only once the term is over,
//! immediate handover on release, and a partitioned leader stepping down
//! before anyone else takes over.
//!
//! Short timings keep the test quick; the code paths are the production ones.
#![cfg(feature = "in-process")]

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{
    Client,
    config::{KubeConfigOptions, Kubeconfig},
};
use portwise::ops::leader::{LeaderElector, Timings, identity};
use portwise_tests::*;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
};

const LEASE: &str = "portwise";
const TIMINGS: Timings = Timings {
    lease_duration: Duration::from_secs(3),
    renew_deadline: Duration::from_secs(2),
    retry_period: Duration::from_millis(500),
};
/// Scheduling and request latency on two shared cores.
const SLACK: Duration = Duration::from_millis(1500);

async fn holder(ns: &TestNs) -> Result<Option<String>> {
    let lease = ns.api::<Lease>().get(LEASE).await?;
    Ok(lease
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

async fn until_leader(e: &LeaderElector, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    let mut rx = e.subscribe();
    tokio::time::timeout(within, rx.wait_for(|l| *l))
        .await
        .with_context(|| format!("{} did not lead within {within:?}", e.identity()))??;
    Ok(start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_takeover_after_crash_handover_on_release() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "leader").await?;
    let start = |name: &str| {
        LeaderElector::start(
            ns.client(),
            ns.name(),
            LEASE,
            &identity(Some(name)),
            TIMINGS,
        )
    };
    let a = start("a")?;
    let b = start("b")?;

    // No Lease yet: whoever creates it leads at once.
    wait_for(Duration::from_secs(10), || async {
        ensure!(
            a.is_leader() != b.is_leader(),
            "leaders: a={} b={}",
            a.is_leader(),
            b.is_leader()
        );
        Ok(())
    })
    .await?;

    // Exactly one leader for three terms, and the Lease names it.
    let until = Instant::now() + TIMINGS.lease_duration * 3;
    while Instant::now() < until {
        let (la, lb) = (a.is_leader(), b.is_leader());
        ensure!(la != lb, "leaders: a={la} b={lb}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (leader, follower) = if a.is_leader() { (a, b) } else { (b, a) };
    expect_eq(holder(&ns).await?, Some(leader.identity().to_owned()))?;

    // Crash: dropping the elector aborts its loop without releasing. The
    // follower must wait out the term (last renewal at most one retry period
    // before the crash) and then take over.
    let crashed = Instant::now();
    drop(leader);
    until_leader(
        &follower,
        TIMINGS.lease_duration + TIMINGS.retry_period * 2 + SLACK * 2,
    )
    .await?;
    let took = crashed.elapsed();
    println!("takeover after crash: {took:?}");
    ensure!(
        took + TIMINGS.retry_period + Duration::from_millis(300) >= TIMINGS.lease_duration,
        "took over after {took:?}, before the crashed leader's term could have ended"
    );
    ensure!(
        took <= TIMINGS.lease_duration + TIMINGS.retry_period + SLACK,
        "takeover took {took:?}"
    );
    expect_eq(holder(&ns).await?, Some(follower.identity().to_owned()))?;

    // Release: a waiting candidate takes over without waiting out the term.
    let c = start("c")?;
    tokio::time::sleep(TIMINGS.retry_period * 2).await;
    ensure!(
        !c.is_leader(),
        "c leads while {} holds the Lease",
        follower.identity()
    );
    let released = Instant::now();
    follower.release().await?;
    until_leader(&c, TIMINGS.lease_duration).await?;
    let handover = released.elapsed();
    println!("handover after release: {handover:?}");
    ensure!(
        handover < TIMINGS.retry_period * 2 + SLACK,
        "handover took {handover:?}"
    );
    expect_eq(holder(&ns).await?, Some(c.identity().to_owned()))?;

    c.release().await?;
    expect_eq(holder(&ns).await?, None)?;
    Ok(())
}

/// A TCP proxy to the apiserver that can be "partitioned": after `cut`,
/// open connections stop forwarding and new ones are accepted and left
/// hanging, like a network that drops packets.
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
            while let Ok((mut down, _)) = listener.accept().await {
                if *cut_rx.borrow() {
                    held.lock().await.push(down);
                    continue;
                }
                let mut cut_rx = cut_rx.clone();
                let held = held.clone();
                tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => {}
                        () = async { let _ = cut_rx.wait_for(|c| *c).await; } => {
                            held.lock().await.push(down);
                            held.lock().await.push(up);
                        }
                    }
                });
            }
        });
        Ok(Self { addr, cut, task })
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An admin client whose connections go through `proxy`.
async fn client_via(cp: &ControlPlane, proxy: &Proxy) -> Result<Client> {
    let kc = Kubeconfig::read_from(cp.kubeconfig())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.cluster_url = format!("https://{}", proxy.addr).parse()?;
    Ok(Client::try_from(config)?)
}

async fn apiserver_addr(cp: &ControlPlane) -> Result<SocketAddr> {
    let kc = Kubeconfig::read_from(cp.kubeconfig())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let host = config
        .cluster_url
        .host()
        .context("no host in the kubeconfig")?;
    let port = config.cluster_url.port_u16().unwrap_or(443);
    let Some(addr) = tokio::net::lookup_host((host.trim_matches(['[', ']']), port))
        .await?
        .next()
    else {
        bail!("cannot resolve {host}");
    };
    Ok(addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_steps_down_before_anyone_takes_over() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "leader-partition").await?;
    let proxy = Proxy::start(apiserver_addr(cp).await?).await?;

    let cut_off = LeaderElector::start(
        client_via(cp, &proxy).await?,
        ns.name(),
        LEASE,
        &identity(Some("cut-off")),
        TIMINGS,
    )?;
    until_leader(&cut_off, Duration::from_secs(10)).await?;
    let other = LeaderElector::start(
        ns.client(),
        ns.name(),
        LEASE,
        &identity(Some("other")),
        TIMINGS,
    )?;
    tokio::time::sleep(TIMINGS.retry_period * 2).await;
    ensure!(
        cut_off.is_leader() && !other.is_leader(),
        "roles before the cut"
    );

    let cut = Instant::now();
    proxy.cut();
    let mut cut_rx = cut_off.subscribe();
    tokio::time::timeout(TIMINGS.renew_deadline + SLACK, cut_rx.wait_for(|l| !*l))
        .await
        .context("the partitioned leader kept leading past its renew deadline")??;
    let stepped_down = cut.elapsed();
    ensure!(
        !other.is_leader(),
        "the other replica led before the partitioned one stepped down"
    );
    until_leader(
        &other,
        TIMINGS.lease_duration + TIMINGS.retry_period * 2 + SLACK,
    )
    .await?;
    let took_over = cut.elapsed();
    println!("partition: stepped down after {stepped_down:?}, taken over after {took_over:?}");
    ensure!(stepped_down < took_over);
    ensure!(
        stepped_down <= TIMINGS.renew_deadline + SLACK,
        "stepped down after {stepped_down:?}"
    );
    expect_eq(holder(&ns).await?, Some(other.identity().to_owned()))?;
    other.release().await?;
    Ok(())
}
