//! A real OCI registry for the tests: the CNCF distribution registry
//! (tests/registry/build), inside the test network namespace on a pod-range
//! address, serving TLS with a certificate signed by the test control
//! plane's CA and asking for htpasswd (bcrypt) credentials; and a pusher
//! that lays WebAssembly components out as the WebAssembly OCI artifact
//! conventions say (`application/vnd.wasm.config.v0+json` config, one
//! `application/wasm` layer), as `wkg oci push` does.
//!
//! ```no_run
//! # async fn demo(cp: &'static portwise_tests::ControlPlane) -> anyhow::Result<()> {
//! use portwise_tests::registry::Registry;
//! let reg = Registry::start(cp).await?;
//! let digest = reg.push("guests/ready-role", "v1", b"\0asm...").await?;
//! let module = reg.module("guests/ready-role", &digest); // oci://10.244.x.y:5000/...@sha256:...
//! # Ok(()) }
//! ```

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use oci_client::{
    Client, Reference,
    client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer},
    manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE},
    secrets::RegistryAuth,
};
use sha2::{Digest, Sha256};
use tokio::process::Child;

use crate::ControlPlane;

/// The config media type of a WebAssembly OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type: the component itself.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";

/// What cosign attaches a sigstore bundle as (artifact and layer type),
/// written out here rather than taken from portwise: the wire value.
pub const SIGSTORE_BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// The user the registry's htpasswd knows, and its password.
pub const USER: &str = "portwise-puller";
pub const PASSWORD: &str = "s3cret-for-tests";

/// tests/registry/build: the cached registry binary, built if need be.
pub fn registry_binary() -> Result<PathBuf> {
    crate::control_plane::built_tool("tests/registry/build")
}

/// A running registry (stopped on drop).
pub struct Registry {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    bin: PathBuf,
    child: Option<Child>,
    /// USER's password today ([`Registry::rotate_password`]).
    password: String,
}

impl Registry {
    /// Starts a registry on a fresh pod-range address, port 5000.
    pub async fn start(cp: &'static ControlPlane) -> Result<Registry> {
        Self::start_signed_by(&cp.dir().join("pki")).await
    }

    /// As [`Registry::start`], its certificate signed by the CA in `pki`
    /// (`ca.crt`, `ca.key`, as tests/control-plane/tools.go writes them):
    /// the real node's control plane has one of its own.
    pub async fn start_signed_by(pki: &Path) -> Result<Registry> {
        let bin = tokio::task::spawn_blocking(registry_binary).await??;
        let dir = tempfile::Builder::new().prefix("registry-").tempdir()?;
        let ip: Ipv4Addr = crate::next_ips().v4;
        let addr = SocketAddr::from((ip, 5000));
        write_tls(pki, dir.path(), ip)?;
        let hash = bcrypt::hash(PASSWORD, 5)?;
        std::fs::write(dir.path().join("htpasswd"), format!("{USER}:{hash}\n"))?;
        std::fs::create_dir_all(dir.path().join("storage"))?;
        let p = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(
            dir.path().join("config.yml"),
            format!(
                "version: 0.1\n\
                 log:\n  level: info\n  formatter: json\n  accesslog:\n    disabled: false\n\
                 storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n\
                 http:\n  addr: {addr}\n  secret: portwise-test-secret\n  tls:\n    certificate: {crt}\n    key: {key}\n\
                 auth:\n  htpasswd:\n    realm: portwise-test\n    path: {htpasswd}\n",
                storage = p("storage"),
                crt = p("registry.crt"),
                key = p("registry.key"),
                htpasswd = p("htpasswd"),
            ),
        )?;
        let mut reg = Registry {
            dir,
            addr,
            bin,
            child: None,
            password: PASSWORD.to_string(),
        };
        reg.start_again().await?;
        Ok(reg)
    }

    /// (Re)starts the registry on the same address and storage.
    pub async fn start_again(&mut self) -> Result<()> {
        ensure!(self.child.is_none(), "the registry is already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = tokio::process::Command::new(&self.bin)
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            // No tracing exporter: nothing to send traces to.
            .env("OTEL_TRACES_EXPORTER", "none")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return Ok(());
            }
            if let Some(c) = &mut self.child
                && let Some(status) = c.try_wait()?
            {
                bail!(
                    "the registry exited ({status}) before listening:\n{}",
                    self.logs()
                );
            }
            ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the registry did not listen on {} within 30s:\n{}",
                self.addr,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Gives USER a new password, as an operator rotates a credential: a
    /// new htpasswd, and the registry restarted on it (so that the old
    /// password is refused from now on, whether or not the registry would
    /// notice the file change). Pushes use the new password.
    pub async fn rotate_password(&mut self, password: &str) -> Result<()> {
        let hash = bcrypt::hash(password, 5)?;
        std::fs::write(self.dir.path().join("htpasswd"), format!("{USER}:{hash}\n"))?;
        self.password = password.to_string();
        self.stop().await?;
        self.start_again().await
    }

    fn basic(&self) -> RegistryAuth {
        RegistryAuth::Basic(USER.into(), self.password.clone())
    }

    /// Stops the registry (its storage stays).
    pub async fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().await?;
        }
        Ok(())
    }

    /// `10.244.x.y:5000`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `oci://HOST/REPO@sha256:DIGEST`.
    pub fn module(&self, repo: &str, digest: &str) -> String {
        format!("oci://{}/{repo}@sha256:{digest}", self.host())
    }

    /// The test CA, for portwise's `registryCA`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A Docker config JSON with `user:password` for this registry.
    pub fn write_auth(&self, path: &Path, user: &str, password: &str) -> Result<()> {
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&serde_json::json!({
                "auths": {self.host(): {"auth": auth}}
            }))?,
        )?;
        Ok(())
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Bytes the registry wrote in answer to GETs of a blob, from its
    /// access log (`http.response.written` of each completed request).
    pub fn blob_bytes_served(&self, digest_hex: &str) -> u64 {
        let needle = format!("/blobs/sha256:{digest_hex}");
        self.logs()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| {
                v["http.request.method"] == "GET"
                    && v["http.request.uri"]
                        .as_str()
                        .is_some_and(|u| u.contains(&needle))
            })
            .filter_map(|v| v["http.response.written"].as_u64())
            .sum()
    }

    /// Where the registry stores a blob (to damage it on purpose).
    pub fn blob_path(&self, digest_hex: &str) -> PathBuf {
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&digest_hex[..2])
            .join(digest_hex)
            .join("data")
    }

    fn client(&self) -> Result<Client> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Ok(Client::try_from(ClientConfig {
            protocol: ClientProtocol::Https,
            extra_root_certificates: vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: std::fs::read(self.ca_file())?,
            }],
            ..ClientConfig::default()
        })?)
    }

    /// The manifest or index `REPO:REFERENCE` (a tag or `sha256:…`), as
    /// JSON, with its digest (`sha256:…`).
    pub async fn manifest(
        &self,
        repo: &str,
        reference: &str,
    ) -> Result<(serde_json::Value, String)> {
        use oci_client::RegistryOperation;
        let client = self.client()?;
        let sep = if reference.starts_with("sha256:") {
            '@'
        } else {
            ':'
        };
        let r: Reference = format!("{}/{repo}{sep}{reference}", self.host()).parse()?;
        let auth = self.basic();
        client.auth(&r, &auth, RegistryOperation::Pull).await?;
        let (bytes, digest) = client
            .pull_manifest_raw(
                &r,
                &auth,
                &[OCI_IMAGE_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE],
            )
            .await
            .with_context(|| format!("pulling the manifest {r}"))?;
        Ok((serde_json::from_slice(&bytes)?, digest))
    }

    /// The blob `sha256:…` of `repo`, its digest checked.
    pub async fn blob(&self, repo: &str, digest: &str) -> Result<Vec<u8>> {
        use oci_client::RegistryOperation;
        let client = self.client()?;
        let r: Reference = format!("{}/{repo}@{digest}", self.host()).parse()?;
        let auth = self.basic();
        client.auth(&r, &auth, RegistryOperation::Pull).await?;
        let mut out = Vec::new();
        client
            .pull_blob(&r, digest, &mut out)
            .await
            .with_context(|| format!("pulling the blob {digest} of {repo}"))?;
        let got = format!("sha256:{}", hex::encode(Sha256::digest(&out)));
        ensure!(got == digest, "blob {digest} of {repo} has digest {got}");
        Ok(out)
    }

    /// Pushes `wasm` as `REPO:TAG`, a WebAssembly artifact; returns the
    /// manifest's sha256 (hex).
    pub async fn push(&self, repo: &str, tag: &str, wasm: &[u8]) -> Result<String> {
        let layer_digest = format!("sha256:{}", hex::encode(Sha256::digest(wasm)));
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer_digest],
        }))?;
        self.push_layers(
            repo,
            tag,
            vec![ImageLayer::new(
                wasm.to_vec(),
                WASM_LAYER_MEDIA_TYPE.to_string(),
                None,
            )],
            Config::new(config, WASM_CONFIG_MEDIA_TYPE.to_string(), None),
        )
        .await
    }

    /// Pushes a referrer of manifest `subject_hex` in `repo`: an artifact of
    /// type `artifact_type` whose one layer (`layer_media_type`) holds
    /// `layer`, as a signing tool attaches a signature. Returns its
    /// manifest's sha256. Anyone with push access can do this, key or not.
    pub async fn push_referrer(
        &self,
        repo: &str,
        subject_hex: &str,
        artifact_type: &str,
        layer_media_type: &str,
        layer: &[u8],
    ) -> Result<String> {
        use oci_client::RegistryOperation;
        const EMPTY: &str = "application/vnd.oci.empty.v1+json";
        let client = self.client()?;
        let subject: Reference = format!("{}/{repo}@sha256:{subject_hex}", self.host()).parse()?;
        let auth = self.basic();
        client
            .auth(&subject, &auth, RegistryOperation::Push)
            .await
            .with_context(|| format!("authenticating to push beside {subject}"))?;
        let (subject_manifest, _) = client
            .pull_manifest_raw(&subject, &auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await?;
        let digest_of = |b: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(b)));
        for blob in [layer, b"{}".as_slice()] {
            client
                .push_blob(&subject, blob.to_vec(), &digest_of(blob))
                .await
                .with_context(|| format!("pushing a {} byte blob to {repo}", blob.len()))?;
        }
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "artifactType": artifact_type,
            "config": {"mediaType": EMPTY, "digest": digest_of(b"{}"), "size": 2},
            "layers": [{"mediaType": layer_media_type, "digest": digest_of(layer), "size": layer.len()}],
            "subject": {"mediaType": OCI_IMAGE_MEDIA_TYPE, "digest": format!("sha256:{subject_hex}"), "size": subject_manifest.len()},
        }))?;
        let digest = digest_of(&manifest);
        let size = manifest.len();
        let at: Reference = format!("{}/{repo}@{digest}", self.host()).parse()?;
        client
            .push_manifest_raw(&at, manifest, OCI_IMAGE_MEDIA_TYPE.parse()?)
            .await
            .with_context(|| format!("pushing a referrer of {subject}"))?;
        // This registry has no referrers API: a pusher keeps the tag
        // schema's index (`sha256-<hex>`) itself, as cosign and oras do.
        let index_at: Reference = format!("{}/{repo}:sha256-{subject_hex}", self.host()).parse()?;
        let mut index = match client
            .pull_manifest_raw(&index_at, &auth, &[OCI_IMAGE_INDEX_MEDIA_TYPE])
            .await
        {
            Ok((bytes, _)) => serde_json::from_slice::<serde_json::Value>(&bytes)?,
            Err(_) => serde_json::json!({
                "schemaVersion": 2, "mediaType": OCI_IMAGE_INDEX_MEDIA_TYPE, "manifests": [],
            }),
        };
        index["manifests"]
            .as_array_mut()
            .context("the referrers index has no manifests list")?
            .push(serde_json::json!({
                "mediaType": OCI_IMAGE_MEDIA_TYPE, "digest": digest, "size": size,
                "artifactType": artifact_type,
            }));
        client
            .push_manifest_raw(
                &index_at,
                serde_json::to_vec(&index)?,
                OCI_IMAGE_INDEX_MEDIA_TYPE.parse()?,
            )
            .await
            .with_context(|| format!("updating the referrers index {index_at}"))?;
        Ok(digest.trim_start_matches("sha256:").to_string())
    }

    /// Pushes an image manifest under `tag` whose annotations pad it to
    /// about `bytes` bytes (an empty config, no layers): what a pusher can
    /// store under a name portwise reads, such as a `.sig` tag. Returns
    /// the manifest's size.
    pub async fn push_padded_manifest(&self, repo: &str, tag: &str, bytes: usize) -> Result<usize> {
        const EMPTY: &str = "application/vnd.oci.empty.v1+json";
        let client = self.client()?;
        let at: Reference = format!("{}/{repo}:{tag}", self.host()).parse()?;
        let auth = self.basic();
        client
            .auth(&at, &auth, oci_client::RegistryOperation::Push)
            .await
            .with_context(|| format!("authenticating to push {at}"))?;
        let empty = format!("sha256:{}", hex::encode(Sha256::digest(b"{}")));
        client.push_blob(&at, b"{}".to_vec(), &empty).await?;
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "config": {"mediaType": EMPTY, "digest": empty, "size": 2},
            "layers": [],
            "annotations": {"padding": "x".repeat(bytes)},
        }))?;
        let size = manifest.len();
        client
            .push_manifest_raw(&at, manifest, OCI_IMAGE_MEDIA_TYPE.parse()?)
            .await
            .with_context(|| format!("pushing {at} ({size} bytes)"))?;
        Ok(size)
    }

    /// Pushes arbitrary layers and config; returns the manifest's sha256.
    pub async fn push_layers(
        &self,
        repo: &str,
        tag: &str,
        layers: Vec<ImageLayer>,
        config: Config,
    ) -> Result<String> {
        let client = self.client()?;
        let reference: Reference = format!("{}/{repo}:{tag}", self.host()).parse()?;
        let auth = self.basic();
        client
            .push(&reference, &layers, config, &auth, None)
            .await
            .with_context(|| format!("pushing {reference}"))?;
        let (manifest, _) = client
            .pull_manifest_raw(&reference, &auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await?;
        Ok(hex::encode(Sha256::digest(&manifest)))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.start_kill();
        }
    }
}

/// The registry's serving certificate for `ip`, signed by the test CA; the
/// CA beside it as ca.crt.
fn write_tls(pki: &Path, dir: &Path, ip: Ipv4Addr) -> Result<()> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, SanType};
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt"))
        .with_context(|| format!("the test CA in {}", pki.display()))?;
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key"))?)?;
    // The issuer's name byte for byte as tests/control-plane/tools.go
    // writes it (Go encodes a printable CN as a PrintableString; rustls
    // compares names as bytes).
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name.push(
        DnType::CommonName,
        rcgen::DnValue::PrintableString("portwise-test-ca".try_into()?),
    );
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "portwise-test-registry");
    params.subject_alt_names = vec![SanType::IpAddress(ip.into())];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &issuer)?;
    std::fs::write(dir.join("registry.crt"), cert.pem())?;
    std::fs::write(dir.join("registry.key"), key.serialize_pem())?;
    std::fs::write(dir.join("ca.crt"), ca_pem)?;
    Ok(())
}
