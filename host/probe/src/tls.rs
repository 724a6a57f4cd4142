//! TLS for HTTPS probes: either the kubelet's rule (encrypt, verify
//! nothing) or a CA bundle the pod's certificate must chain to.
//!
//! A [`Tls`] is built once, where the configuration is read (or once per
//! process for guests), and shared by every probe: building a rustls client
//! configuration parses roots and allocates, which no probe should pay for.

use std::{fmt, net::IpAddr, sync::Arc};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature},
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};

/// Why a [`Tls`] cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS setup: {0}")]
    Setup(#[source] rustls::Error),
    #[error("not a PEM certificate bundle: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("a certificate in the bundle is unusable: {0}")]
    Certificate(#[source] rustls::Error),
    #[error("the bundle holds no PEM certificate")]
    NoCertificate,
    #[error("server name {name:?} is not a DNS name: {source}")]
    ServerName {
        name: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
}

/// How an HTTPS probe sets up its session.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
    /// The name for SNI and verification; `None` uses the pod's address.
    server_name: Option<ServerName<'static>>,
    verifies: bool,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .field("verifies", &self.verifies)
            .finish()
    }
}

impl Tls {
    /// The kubelet's HTTPS probe: the session is encrypted, the
    /// certificate is not checked (pods commonly serve self-signed ones, and
    /// the probe asks whether the pod answers, not who it is). The
    /// handshake's signatures are still checked, so the peer must hold the
    /// key of the certificate it shows.
    pub fn without_verification(server_name: Option<&str>) -> Result<Tls, TlsError> {
        let provider = provider();
        let config = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth();
        Tls::new(config, server_name, false)
    }

    /// Verifies the pod's certificate against the PEM certificates in
    /// `ca_pem`, for `server_name` or else the pod's address (an IP SAN).
    pub fn verifying(ca_pem: &[u8], server_name: Option<&str>) -> Result<Tls, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            let cert = cert.map_err(TlsError::Pem)?;
            roots.add(cert).map_err(TlsError::Certificate)?;
        }
        if roots.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Setup)?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Tls::new(config, server_name, true)
    }

    fn new(
        mut config: ClientConfig,
        server_name: Option<&str>,
        verifies: bool,
    ) -> Result<Tls, TlsError> {
        // The probe speaks HTTP/1.1 only; say so, so that a server that
        // negotiates by ALPN does not pick h2.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = server_name
            .map(|n| {
                ServerName::try_from(n.to_owned()).map_err(|source| TlsError::ServerName {
                    name: n.to_owned(),
                    source,
                })
            })
            .transpose()?;
        Ok(Tls {
            config: Arc::new(config),
            server_name,
            verifies,
        })
    }

    /// True when the pod's certificate is checked.
    pub fn verifies(&self) -> bool {
        self.verifies
    }

    pub(crate) fn connector(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.config.clone())
    }

    /// The name the session is for: the configured one, else `ip`.
    pub(crate) fn server_name(&self, ip: IpAddr) -> ServerName<'static> {
        self.server_name
            .clone()
            .unwrap_or_else(|| ServerName::IpAddress(ip.into()))
    }
}

/// ring, the provider kube and the module supply use, named here rather
/// than taken from a process default so that the probe never depends on
/// which crate installed one first.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Accepts any certificate but checks the handshake's signatures with it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
