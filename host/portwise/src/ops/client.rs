//! The API client: kube's stack, with three changes that the controller's
//! guarantees rest on.
//!
//! - **A User-Agent** ([`USER_AGENT`]): kube-rs sends none, and audit logs
//!   (and `./bench`) tell controllers apart by it.
//! - **Bounded retries** of 429/503/504 ([`api_retry_policy`]) instead of
//!   kube's default, which can sleep a minute past the apiserver's recovery.
//! - **Writes fenced to the leader's term** ([`FenceLayer`]) and **TCP
//!   connections that give up on unacknowledged data**
//!   (`TCP_USER_TIMEOUT`, [`ClientOptions::tcp_user_timeout`]).
//!
//! # Why the TCP timeout is part of leader election
//! A leader cut off from the apiserver (packets dropped, not refused) stops
//! writing at its renew deadline, and a successor takes over
//! `lease_duration - renew_deadline` later. But a write it sent just before
//! the cut is not gone when portwise gives up on it: the request's bytes sit
//! in the kernel's send queue, and TCP retransmits them. Closing the socket
//! does not discard them either (a close flushes, then sends FIN). Without
//! a bound, they reach the apiserver when the network heals, minutes after
//! the successor took over, and overwrite its slices with the stale view
//! the old leader had. `TCP_USER_TIMEOUT` makes the kernel abort a
//! connection, dropping what is queued, once sent data has gone
//! unacknowledged that long. With the fence's deadline and a user timeout
//! shorter than `lease_duration - renew_deadline`, every byte of a write is
//! acknowledged by the apiserver's host before a successor can lead, or is
//! never delivered. (Acknowledged but not yet processed, under an
//! overloaded apiserver, is the one case this cannot rule out; only
//! server-side fencing tokens could, and Kubernetes has none.)
//!
//! A timeout this short is safe on a healthy path: it counts only while
//! sent data (or a keepalive probe) waits for an ACK, which on a working
//! network takes milliseconds, never while a request waits for its
//! response or a watch waits for events. Keepalive probes after 5 s idle
//! let it catch a dead path under an idle watch as well.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioIo},
};
use kube::client::{Body, ClientBuilder, ConfigExt};
use portwise_controller::Leadership;
use tokio::net::TcpStream;
use tower::{BoxError, Layer, Service, ServiceBuilder};

/// The product's User-Agent, as `kube-controller-manager/…` is the native
/// controller's.
pub const USER_AGENT: &str = concat!("portwise/", env!("CARGO_PKG_VERSION"));

/// Bound on connecting (TCP and TLS) to the apiserver.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle time before a connection's first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);

/// How [`connect`] builds a client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `TCP_USER_TIMEOUT` of every connection (see the module docs).
    pub tcp_user_timeout: Duration,
    /// Mutating requests only within this replica's terms ([`FenceLayer`]);
    /// `None`: unfenced (the electors' own client, or no election).
    pub fence: Option<Leadership>,
}

impl ClientOptions {
    /// Without leader election: a dead path still fails a write within
    /// seconds instead of kube's 295 s read timeout.
    pub fn standalone() -> Self {
        Self {
            tcp_user_timeout: Duration::from_secs(10),
            fence: None,
        }
    }

    /// With leader election on `timings`: half the gap between the renew
    /// deadline and the end of the Lease, so that a write sent at the last
    /// moment of a term is acknowledged or dropped with margin to spare
    /// before anyone else can lead.
    pub fn elected(timings: &super::Timings) -> Self {
        let gap = timings
            .lease_duration
            .saturating_sub(timings.renew_deadline);
        Self {
            tcp_user_timeout: (gap / 2).max(Duration::from_millis(200)),
            fence: None,
        }
    }

    pub fn fenced(mut self, leadership: Leadership) -> Self {
        self.fence = Some(leadership);
        self
    }
}

/// A client from KUBECONFIG or the in-cluster service account, with the
/// changes the module docs list. Otherwise kube's own stack
/// (`kube::client::ClientBuilder::try_from`): TLS from the config, auth,
/// extra headers, kube's connect/read/write timeouts.
pub async fn connect(opts: &ClientOptions) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::infer().await?;
    config.headers.push((
        http::header::USER_AGENT,
        http::header::HeaderValue::from_static(USER_AGENT),
    ));
    // kube's default retry (`RetryPolicy::server_retry`) doubles from 5 ms
    // up to 1000 s over 15 attempts: after a long 429/503 episode a single
    // request could sleep a minute past the apiserver's recovery (20 s of
    // 429s cost 71 s of stale slices, docs/reliability.md 1.3). Retries
    // here stay within seconds and honour the server's `Retry-After`; what
    // is still failing after them goes back to the controller, whose
    // error policy requeues the Service.
    config.default_retry = false;
    anyhow::ensure!(
        config.proxy_url.is_none(),
        "a proxy-url in the kubeconfig is not supported"
    );

    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Keepalive probes give an idle connection (a watch waiting for
    // events) sent data to be acknowledged, so the user timeout notices a
    // dead path there too; otherwise a watch cut off by a partition stays
    // silent after the heal until the apiserver's own retransmission
    // backoff (up to two minutes) gets round to it.
    http.set_keepalive(Some(KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(Duration::from_secs(1)));
    let tcp = UserTimeout {
        inner: http,
        timeout: opts.tcp_user_timeout,
    };
    let https = config.rustls_https_connector_with_connector(tcp)?;
    let mut timed = hyper_timeout::TimeoutConnector::new(https);
    // kube's 30 s connect timeout outlasts a partition's heal: a connect
    // started while cut off waits for its next SYN retransmission (the 5th
    // comes 31 s in) or its timeout, whichever is first, and the watches
    // with it. 10 s still covers three SYN retransmissions and a TLS
    // handshake with a busy apiserver (client-go allows 10 s for the
    // handshake).
    timed.set_connect_timeout(
        config
            .connect_timeout
            .map(|t| t.min(CONNECT_TIMEOUT))
            .or(Some(CONNECT_TIMEOUT)),
    );
    timed.set_read_timeout(config.read_timeout);
    timed.set_write_timeout(config.write_timeout);
    let hyper = hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(timed);

    let hyper: hyper_util::client::legacy::Client<_, Body> = hyper;
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    // Unfenced is a fence that never closes: one stack type either way.
    let leadership = opts.fence.clone().unwrap_or(Leadership::Sole);
    let client = ClientBuilder::new(
        tower::util::BoxService::new(service),
        config.default_namespace,
    )
    // Inside the retry layer: a retried attempt is fenced too.
    .with_layer(&FenceLayer::new(leadership))
    // The retry layer clones its service per attempt; the stack below
    // is boxed (not `Clone`), so a buffer goes in between.
    .with_layer(&tower::buffer::BufferLayer::new(1024))
    .with_layer(&tower::retry::RetryLayer::new(api_retry_policy()))
    .build();
    Ok(client)
}

/// Retries of 429, 503 and 504: 5 at most, 100 ms doubling to 5 s (or the
/// server's `Retry-After`), so one request gives up within about 10 s.
fn api_retry_policy() -> kube::client::retry::RetryPolicy {
    kube::client::retry::RetryPolicy::new(
        Duration::from_millis(100),
        Duration::from_secs(5),
        5,
        true,
    )
    .expect("constant retry parameters are valid")
}

// ---- TCP_USER_TIMEOUT ----------------------------------------------------

/// hyper's connector, plus `TCP_USER_TIMEOUT` on each new connection.
#[derive(Clone)]
struct UserTimeout {
    inner: HttpConnector,
    timeout: Duration,
}

impl Service<http::Uri> for UserTimeout {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let timeout = self.timeout;
        Box::pin(async move {
            let io = connecting.await?;
            // TCP_USER_TIMEOUT is Linux's, where the controller runs. The
            // CLI also builds for macOS (`portwise check`, which makes no
            // API connection); there the keepalive above is the only bound.
            #[cfg(target_os = "linux")]
            socket2::SockRef::from(io.inner()).set_tcp_user_timeout(Some(timeout))?;
            #[cfg(not(target_os = "linux"))]
            let _ = timeout;
            Ok(io)
        })
    }
}

// ---- the write fence ----------------------------------------------------

/// Refuses mutating requests (anything but GET, HEAD, OPTIONS) outside the
/// term that covers them (the leader's, or sharded, that of the bucket the
/// request's namespace falls in: [`namespace_of`]), and cuts one short at
/// the term's end. The error says so; the controller's retry then finds it
/// no longer leads.
#[derive(Clone, Debug)]
pub struct FenceLayer {
    term: Leadership,
}

impl FenceLayer {
    pub fn new(term: Leadership) -> Self {
        Self { term }
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = Fence<S>;
    fn layer(&self, inner: S) -> Fence<S> {
        Fence {
            inner,
            term: self.term.clone(),
        }
    }
}

/// The service [`FenceLayer`] makes.
#[derive(Clone, Debug)]
pub struct Fence<S> {
    inner: S,
    term: Leadership,
}

/// Why a write was not sent, or not waited for.
#[derive(Debug, thiserror::Error)]
pub enum Fenced {
    #[error("{method} {path} not sent: this replica's term as leader is over")]
    NotLeader { method: http::Method, path: String },
    #[error("{method} {path} not sent: this replica holds no term for its namespace's bucket")]
    NotHolder { method: http::Method, path: String },
    #[error("{method} {path} cut off at the end of this replica's term as leader")]
    TermEnded { method: http::Method, path: String },
}

/// The namespace a request's path is within (`/api/v1/namespaces/NS/…`,
/// `/apis/GROUP/VERSION/namespaces/NS/…`); `None` for cluster-scoped
/// paths, the Namespace objects themselves (`/api/v1/namespaces/NS`)
/// included. With shards (issue 49) the fence allows a write within the
/// term of the bucket its namespace falls in: every write portwise makes
/// is namespaced, so a write this cannot place is refused there.
pub fn namespace_of(path: &str) -> Option<&str> {
    let mut parts = path.trim_start_matches('/').split('/');
    match parts.next()? {
        "api" => {
            parts.next()?; // the version
        }
        "apis" => {
            parts.next()?; // the group
            parts.next()?; // the version
        }
        _ => return None,
    }
    if parts.next()? != "namespaces" {
        return None;
    }
    let ns = parts.next().filter(|ns| !ns.is_empty())?;
    // A resource within it, not the Namespace itself.
    parts.next().filter(|r| !r.is_empty())?;
    Some(ns)
}

fn mutates(method: &http::Method) -> bool {
    !matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

impl<S, B, R> Service<http::Request<B>> for Fence<S>
where
    S: Service<http::Request<B>, Response = R>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if !mutates(req.method()) {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        }
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        // Checked last thing before the request is handed to hyper.
        let Some(left) = self.term.remaining(namespace_of(&path)) else {
            let refused = match self.term {
                Leadership::Shards { .. } => Fenced::NotHolder { method, path },
                _ => Fenced::NotLeader { method, path },
            };
            return Box::pin(async move { Err(refused.into()) });
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            match tokio::time::timeout(left, fut).await {
                Ok(res) => res.map_err(Into::into),
                Err(_) => Err(Fenced::TermEnded { method, path }.into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use portwise_controller::Tenure;
    use portwise_core::shard::Shards;
    use tokio::sync::watch;
    use tower::ServiceExt;

    use super::*;

    #[test]
    fn the_namespace_of_a_path_is_the_one_its_resource_is_in() {
        for (path, want) in [
            (
                "/apis/discovery.k8s.io/v1/namespaces/team-a/endpointslices/web-http-1",
                Some("team-a"),
            ),
            (
                "/apis/discovery.k8s.io/v1/namespaces/team-a/endpointslices",
                Some("team-a"),
            ),
            ("/api/v1/namespaces/team-b/endpoints/web", Some("team-b")),
            ("/api/v1/namespaces/team-b/events", Some("team-b")),
            (
                "/apis/coordination.k8s.io/v1/namespaces/portwise-system/leases/portwise",
                Some("portwise-system"),
            ),
            // The Namespace object itself, and cluster-scoped paths.
            ("/api/v1/namespaces/team-b", None),
            ("/api/v1/namespaces", None),
            ("/api/v1/nodes/n1", None),
            ("/apis/discovery.k8s.io/v1/endpointslices", None),
            ("/version", None),
            ("", None),
        ] {
            assert_eq!(namespace_of(path), want, "{path}");
        }
    }

    /// A sharded replica writes in the namespaces of the buckets it holds,
    /// within each one's term, and nowhere else (cluster-scoped writes
    /// included).
    #[tokio::test]
    async fn a_sharded_replica_writes_only_in_the_buckets_it_holds() {
        let shards = Shards::new(std::num::NonZeroU32::new(4).unwrap());
        let held = "team-a";
        let other = (0..)
            .map(|i| format!("team-{i}"))
            .find(|ns| shards.bucket(ns) != shards.bucket(held))
            .unwrap();
        let terms = portwise_controller::Terms::default();
        let (term, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(5)));
        terms.set(shards.bucket(held), Some(rx));
        let sink = Sink::default();
        let mut svc = FenceLayer::new(Leadership::Shards {
            shards,
            terms: terms.clone(),
        })
        .layer(sink.clone());
        let write = |ns: &str| {
            http::Request::builder()
                .method(http::Method::PUT)
                .uri(format!(
                    "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices/x"
                ))
                .body(())
                .unwrap()
        };
        let mut send = async |r| svc.ready().await.unwrap().call(r).await;
        send(write(held)).await.unwrap();
        let refused = send(write(&other)).await.unwrap_err();
        assert!(refused.to_string().contains("holds no term"), "{refused}");
        let cluster = http::Request::builder()
            .method(http::Method::DELETE)
            .uri("/api/v1/nodes/n1")
            .body(())
            .unwrap();
        send(cluster).await.unwrap_err();
        // The bucket's term over (a frozen process waking up): refused too.
        term.send_replace(Some(Instant::now() - Duration::from_millis(1)));
        send(write(held)).await.unwrap_err();
        assert_eq!(sink.0.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// Counts the requests that got through.
    #[derive(Clone, Default)]
    struct Sink(std::sync::Arc<std::sync::atomic::AtomicUsize>);

    impl Service<http::Request<()>> for Sink {
        type Response = ();
        type Error = BoxError;
        type Future = std::future::Ready<Result<(), BoxError>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    fn req(method: http::Method) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri("/apis/discovery.k8s.io/v1/namespaces/a/endpointslices/x")
            .body(())
            .unwrap()
    }

    #[tokio::test]
    async fn writes_pass_only_within_the_term_and_reads_always() {
        let (term, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(5)));
        let sink = Sink::default();
        let mut svc = FenceLayer::new(Leadership::Leader(Tenure::new(rx))).layer(sink.clone());
        svc.ready()
            .await
            .unwrap()
            .call(req(http::Method::PATCH))
            .await
            .unwrap();
        // A term that ended while this process was frozen: the elector's
        // last word is still "leading", the clock says otherwise.
        term.send_replace(Some(Instant::now() - Duration::from_millis(1)));
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(req(http::Method::DELETE))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("term as leader is over"), "{err}");
        term.send_replace(None);
        assert!(svc.call(req(http::Method::POST)).await.is_err());
        svc.call(req(http::Method::GET)).await.unwrap();
        assert_eq!(sink.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_write_that_would_outlast_the_term_is_cut_at_its_end() {
        let end = Instant::now() + Duration::from_millis(100);
        let (_term, rx) = watch::channel(Some(end));
        let never = tower::service_fn(|_: http::Request<()>| {
            std::future::pending::<Result<(), BoxError>>()
        });
        let mut svc = FenceLayer::new(Leadership::Leader(Tenure::new(rx))).layer(never);
        let err = svc.call(req(http::Method::PATCH)).await.unwrap_err();
        assert!(err.to_string().contains("cut off at the end"), "{err}");
        assert!(Instant::now() >= end);
    }
}
