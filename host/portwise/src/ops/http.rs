//! The operations endpoint: `/metrics`, `/healthz`, `/readyz` on one port.
//!
//! Kept apart from everything the controller does so a kubelet probe or a
//! Prometheus scrape never waits on a reconcile: the handlers read a
//! [`Readiness`] flag and encode [`Metrics`], nothing else.
//!
//! - `/healthz` answers 200 as long as the process serves HTTP at all. A
//!   stuck controller is not "unhealthy" in the restart-me sense; restarting
//!   would only lose the caches.
//! - `/readyz` answers 200 once the controller has flipped [`Readiness`]
//!   (its caches are synced), 503 before. Standby replicas are ready too:
//!   readiness says "can take over", not "is leader".

use std::{future::Future, net::SocketAddr};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::net::TcpListener;

use portwise_controller::{
    Readiness,
    metrics::{self, Metrics},
};

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr} (--metrics-addr): {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("operations HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

#[derive(Clone)]
struct OpsState {
    metrics: Metrics,
    readiness: Readiness,
}

/// The routes, without a listener (for embedding or tests).
pub fn router(metrics: Metrics, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(OpsState { metrics, readiness })
}

async fn metrics_handler(State(state): State<OpsState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

async fn readyz(State(state): State<OpsState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n")
    }
}

/// A bound, not yet serving, operations server. Binding first lets `run`
/// fail at start with a clear message when the port is taken, and lets tests
/// bind port 0 and learn the address.
pub struct OpsServer {
    listener: TcpListener,
    router: Router,
}

impl OpsServer {
    pub async fn bind(
        addr: SocketAddr,
        metrics: Metrics,
        readiness: Readiness,
    ) -> Result<Self, HttpError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| HttpError::Bind { addr, source })?;
        Ok(Self {
            listener,
            router: router(metrics, readiness),
        })
    }

    /// The address actually bound (resolves port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then finishes in-flight requests.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), HttpError> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(HttpError::Serve)
    }
}

/// Binds `addr` (failing now if it cannot) and serves in a background task
/// until the returned handle is aborted or the process exits. For a graceful
/// stop use [`OpsServer`] directly.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<tokio::task::JoinHandle<Result<(), HttpError>>, HttpError> {
    let server = OpsServer::bind(addr, metrics, readiness).await?;
    Ok(tokio::spawn(server.serve(std::future::pending())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use portwise_core::membership::Family;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A minimal HTTP/1.0 GET: (status, content-type, body).
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        let content_type = head
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or_default()
            .to_owned();
        (status, content_type, body.to_owned())
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics() {
        let metrics = Metrics::new();
        let readiness = Readiness::new();
        let server = OpsServer::bind(
            "127.0.0.1:0".parse().unwrap(),
            metrics.clone(),
            readiness.clone(),
        )
        .await
        .unwrap();
        let addr = server.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(async {
            let _ = stopped.await;
        }));

        assert_eq!(get(addr, "/healthz").await.0, 200);
        assert_eq!(get(addr, "/readyz").await.0, 503);
        readiness.set_ready(true);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        readiness.set_ready(false);
        assert_eq!(get(addr, "/readyz").await.0, 503);

        let published = [(("http".to_string(), Family::V4.as_str().to_string()), 7)];
        metrics
            .services
            .set("ns", "svc", &published.into_iter().collect(), 1, 1);
        let (status, content_type, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert_eq!(content_type, metrics::CONTENT_TYPE);
        assert!(
            body.contains(
                "portwise_endpoints_published{namespace=\"ns\",service=\"svc\",port=\"http\",family=\"IPv4\"} 7\n"
            ),
            "{body}"
        );
        assert_eq!(get(addr, "/nope").await.0, 404);

        stop.send(()).unwrap();
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn bind_failure_names_the_flag() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = OpsServer::bind(addr, Metrics::new(), Readiness::new())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("--metrics-addr"), "{err}");
    }
}
