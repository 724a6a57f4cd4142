//! sigstore's cosign for the tests (tests/cosign/build), signing modules in
//! the test registry the way users do, offline: `cosign sign --key` with a
//! key pair from `cosign generate-key-pair`, no transparency log, no TUF.
//!
//! ```no_run
//! # async fn demo(reg: &portwise_tests::registry::Registry) -> anyhow::Result<()> {
//! use portwise_tests::cosign::{Cosign, Form};
//! let cosign = Cosign::new(reg)?;
//! let key = cosign.generate_key_pair("release")?; // release.key, release.pub
//! cosign.sign(reg, "guests/ready-role", "0123...", &key, Form::Bundle)?;
//! # Ok(()) }
//! ```

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::registry::{self, Registry};

/// tests/cosign/build: the cached cosign binary, built if need be.
pub fn cosign_binary() -> Result<PathBuf> {
    crate::control_plane::built_tool("tests/cosign/build")
}

/// The two forms `cosign sign` stores a signature in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// cosign 3's default: a sigstore bundle as an OCI referrer.
    Bundle,
    /// cosign 2's default (`--new-bundle-format=false`): the
    /// `sha256-<hex>.sig` tag with a simple-signing payload.
    SimpleSigning,
}

/// A key pair from `cosign generate-key-pair`.
#[derive(Clone, Debug)]
pub struct KeyPair {
    /// The encrypted private key (empty password).
    pub private: PathBuf,
    /// The PEM public key, what portwise's `moduleSignatures.keys` names.
    pub public: PathBuf,
}

/// cosign, with a home of its own and the registry's credentials and CA.
pub struct Cosign {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Cosign {
    pub fn new(reg: &Registry) -> Result<Cosign> {
        let bin = cosign_binary()?;
        let dir = tempfile::Builder::new().prefix("cosign-").tempdir()?;
        std::fs::create_dir_all(dir.path().join("docker"))?;
        std::fs::create_dir_all(dir.path().join("home"))?;
        reg.write_auth(
            &dir.path().join("docker/config.json"),
            registry::USER,
            registry::PASSWORD,
        )?;
        // A signing config with no transparency log or timestamp service,
        // and an empty trusted root: what keeps `cosign sign` from asking
        // Sigstore's TUF repository for either (there is no network here).
        std::fs::write(
            dir.path().join("signing-config.json"),
            r#"{"mediaType":"application/vnd.dev.sigstore.signingconfig.v0.2+json","rekorTlogConfig":{},"tsaConfig":{}}"#,
        )?;
        std::fs::write(
            dir.path().join("trusted-root.json"),
            r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}"#,
        )?;
        std::fs::copy(reg.ca_file(), dir.path().join("ca.crt"))?;
        Ok(Cosign { bin, dir })
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.bin);
        let d = self.dir.path();
        c.current_dir(d)
            .env_clear()
            .env("HOME", d.join("home"))
            .env("PATH", "/usr/bin:/bin")
            .env("DOCKER_CONFIG", d.join("docker"))
            .env("SSL_CERT_FILE", d.join("ca.crt"))
            .env("COSIGN_PASSWORD", "");
        c
    }

    fn run(&self, what: &str, mut c: Command) -> Result<String> {
        let out = c
            .output()
            .with_context(|| format!("running cosign {what}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!("cosign {what} failed ({}):\n{text}", out.status);
        }
        Ok(text)
    }

    /// `cosign generate-key-pair --output-key-prefix NAME`.
    pub fn generate_key_pair(&self, name: &str) -> Result<KeyPair> {
        let mut c = self.command();
        c.args(["generate-key-pair", "--output-key-prefix", name]);
        self.run("generate-key-pair", c)?;
        Ok(KeyPair {
            private: self.dir.path().join(format!("{name}.key")),
            public: self.dir.path().join(format!("{name}.pub")),
        })
    }

    /// Signs `REPO@sha256:DIGEST` in `reg` with `key`, in `form`.
    pub fn sign(
        &self,
        reg: &Registry,
        repo: &str,
        digest: &str,
        key: &KeyPair,
        form: Form,
    ) -> Result<String> {
        let mut c = self.command();
        let image = format!("{}/{repo}@sha256:{digest}", reg.host());
        c.args(["sign", "--yes", "--key"]).arg(&key.private);
        match form {
            Form::Bundle => {
                c.arg("--signing-config")
                    .arg(self.path("signing-config.json"))
                    .arg("--trusted-root")
                    .arg(self.path("trusted-root.json"));
            }
            Form::SimpleSigning => {
                c.args([
                    "--new-bundle-format=false",
                    "--use-signing-config=false",
                    "--tlog-upload=false",
                ]);
            }
        }
        c.arg(&image);
        self.run(&format!("sign {image} ({form:?})"), c)
    }

    /// `cosign ARGS` with this home, the registry's credentials and CA:
    /// its output (stdout and stderr), or an error with it.
    pub fn run_args(&self, args: &[&str]) -> Result<String> {
        let mut c = self.command();
        c.args(args);
        self.run(&args.join(" "), c)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The directory keys and configs are written to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
