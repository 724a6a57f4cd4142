//! The servers behind the kubelet-style probes: TLS for an HTTPS admin
//! port (a self-signed certificate, as pods commonly serve) and the
//! reference gRPC health server (tonic-health), bound on pod addresses in
//! the test network namespace.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use anyhow::{Context, Result};
use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
};
use tokio::task::JoinHandle;
use tonic_health::{ServingStatus, server::HealthReporter};

/// A TLS acceptor with a fresh self-signed certificate for `ip`.
pub(crate) fn self_signed_acceptor(ip: IpAddr) -> Result<tokio_rustls::TlsAcceptor> {
    let params = rcgen::CertificateParams::new(vec![ip.to_string()])?;
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .context("a TLS server configuration for the self-signed certificate")?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// tonic-health's grpc.health.v1 server on one pod address; statuses
/// change at runtime. A service never set is unknown to it (`NOT_FOUND`).
pub struct GrpcHealthServer {
    addr: SocketAddr,
    reporter: HealthReporter,
    task: JoinHandle<()>,
}

impl GrpcHealthServer {
    pub async fn start(addr: impl Into<IpAddr>, port: u16) -> Result<Self> {
        let addr = SocketAddr::new(addr.into(), port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr} (inside tests/netns?)"))?;
        let (reporter, service) = tonic_health::server::health_reporter();
        let task = tokio::spawn(async move {
            // TCP_NODELAY as gRPC servers in the field set it (grpc-go
            // does): without it, Nagle holds the trailers behind the data
            // frame for a delayed ACK and every probe waits tens of ms.
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(GrpcHealthServer {
            addr,
            reporter,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets `service`'s status (`""`: the server as a whole).
    pub async fn set(&self, service: &str, serving: bool) {
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.reporter.set_service_status(service, status).await;
    }
}

impl Drop for GrpcHealthServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
