//! HTTPS and request headers, against a real TLS listener.

use std::{net::SocketAddr, sync::Arc};

use rcgen::{CertificateParams, CertifiedKey, KeyPair};
use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
};
use tokio::{io::AsyncWriteExt, net::TcpListener, sync::mpsc};

use super::*;
use crate::{
    HttpRequest, ProbeError, http_get,
    tests::{T, get, read_head},
};

/// A self-signed certificate for 127.0.0.1 (an IP SAN) and `pod.example`.
fn self_signed() -> CertifiedKey<KeyPair> {
    let params = CertificateParams::new(vec!["127.0.0.1".into(), "pod.example".into()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    CertifiedKey {
        cert,
        signing_key: key,
    }
}

/// An HTTPS server answering 200 with `cert`; sends each request head.
async fn https_server(
    cert: &CertifiedKey<KeyPair>,
) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let chain = vec![CertificateDer::from(cert.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else {
                    return;
                };
                let _ = tx.send(read_head(&mut tls).await);
                let _ = tls
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecure")
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, rx)
}

#[tokio::test]
async fn https_without_verification_accepts_a_self_signed_certificate() {
    let cert = self_signed();
    let (addr, _) = https_server(&cert).await;
    let request = get("/healthz").over(Tls::without_verification(None).unwrap());
    assert_eq!(request.scheme(), "https");
    let r = http_get(addr, &request, T, 1024).await.unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"secure"[..]));
    // Plain HTTP to the TLS port is not an answer.
    assert!(http_get(addr, &get("/healthz"), T, 1024).await.is_err());
}

#[tokio::test]
async fn https_with_a_ca_bundle_verifies_the_chain_and_the_name() {
    let cert = self_signed();
    let (addr, _) = https_server(&cert).await;
    let pem = cert.cert.pem();
    // The pod's IP is in the certificate.
    let by_ip = get("/").over(Tls::verifying(pem.as_bytes(), None).unwrap());
    assert_eq!(http_get(addr, &by_ip, T, 1024).await.unwrap().status, 200);
    let by_name = get("/").over(Tls::verifying(pem.as_bytes(), Some("pod.example")).unwrap());
    assert_eq!(http_get(addr, &by_name, T, 1024).await.unwrap().status, 200);
    // A name the certificate lacks fails.
    let wrong_name = get("/").over(Tls::verifying(pem.as_bytes(), Some("other.example")).unwrap());
    match http_get(addr, &wrong_name, T, 1024).await {
        Err(ProbeError::Io(m)) => assert!(m.starts_with("TLS: "), "{m}"),
        other => panic!("wrong name: {other:?}"),
    }
    // Another CA fails.
    let other = self_signed().cert.pem();
    let wrong_ca = get("/").over(Tls::verifying(other.as_bytes(), None).unwrap());
    match http_get(addr, &wrong_ca, T, 1024).await {
        Err(ProbeError::Io(m)) => assert!(m.contains("invalid peer certificate"), "{m}"),
        other => panic!("wrong CA: {other:?}"),
    }
}

#[test]
fn a_bundle_without_certificates_is_refused() {
    for bad in [
        &b""[..],
        b"not pem",
        b"-----BEGIN CERTIFICATE-----\nzz\n-----END CERTIFICATE-----\n",
    ] {
        assert!(Tls::verifying(bad, None).is_err(), "{bad:?}");
    }
    assert!(Tls::without_verification(Some("not a name!")).is_err());
}

#[tokio::test]
async fn headers_are_sent_and_replace_the_probe_s_own() {
    let cert = self_signed();
    let (addr, mut heads) = https_server(&cert).await;
    let request = get("/")
        .headers([
            ("Authorization", "Bearer t0ken"),
            ("Host", "admin.local"),
            ("X-Probe", "a"),
            ("X-Probe", "b"),
        ])
        .unwrap()
        .over(Tls::without_verification(None).unwrap());
    http_get(addr, &request, T, 1024).await.unwrap();
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.contains("authorization: bearer t0ken\r\n"), "{head}");
    assert!(head.contains("host: admin.local\r\n"), "{head}");
    assert!(!head.contains("host: 127.0.0.1"), "{head}");
    assert_eq!(head.matches("x-probe: ").count(), 2, "{head}");
    assert!(head.contains("user-agent: portwise-probe\r\n"), "{head}");
}

#[test]
fn hop_by_hop_and_invalid_headers_are_refused() {
    for (name, value) in [
        ("Connection", "keep-alive"),
        ("transfer-encoding", "chunked"),
        ("Upgrade", "h2c"),
        ("bad name", "x"),
        ("X-Ok", "line\r\nbreak"),
    ] {
        assert!(
            matches!(
                HttpRequest::get("/").unwrap().headers([(name, value)]),
                Err(ProbeError::Io(_))
            ),
            "{name}: {value:?}"
        );
    }
}
