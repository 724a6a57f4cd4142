//! Manifests and referrer indexes, read under a byte limit.
//!
//! oci-client reads every manifest and index whole (`Response::bytes`), so
//! a registry, or whatever it lets a pusher store, decides how much memory
//! a pull takes. Here the body is read chunk by chunk and the read stops
//! past the limit, before the bytes are held. Authentication stays
//! oci-client's: [`oci_client::Client::auth`] answers the bearer token of
//! the registry's token service (or keeps the Basic credentials where the
//! registry asks for those), and the request carries what oci-client's own
//! would.

use oci_client::{Reference, RegistryOperation, secrets::RegistryAuth};
use portwise_core::config::OciRef;
use reqwest::{StatusCode, header::ACCEPT};

use crate::error::SetupError;

use super::{
    Puller,
    errors::{Failure, error_chain, explain},
};

/// The largest manifest or referrer index read (distribution's own limit
/// for a pushed manifest).
pub(super) const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// An HTTP client with the registry client's trust and timeouts.
pub(super) struct Http(reqwest::Client);

impl Http {
    pub(super) fn new(
        extra_roots_pem: Option<&[u8]>,
        connect_timeout: std::time::Duration,
        read_timeout: std::time::Duration,
        user_agent: &'static str,
    ) -> Result<Self, SetupError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(read_timeout)
            .user_agent(user_agent);
        if let Some(pem) = extra_roots_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| SetupError::CaPem(Box::new(e)))?;
            builder = builder.tls_certs_merge(certs);
        }
        builder
            .build()
            .map(Http)
            .map_err(|e| SetupError::Client(Box::new(e)))
    }
}

/// One read under a limit: of what `r` names, at `at`, accepting these
/// media types; `doing` names the step in messages ("fetching the
/// manifest").
pub(super) struct Read<'a> {
    pub r: &'a OciRef,
    pub auth: &'a RegistryAuth,
    pub at: &'a Reference,
    pub accept: &'a [&'a str],
    pub limit: u64,
    pub doing: &'a str,
}

impl Puller {
    /// `GET https://REGISTRY/v2/REPOSITORY/{path}` with the credentials for
    /// the registry, reading at most `read.limit` bytes of the body;
    /// `Ok(None)` when the registry has nothing there (404).
    pub(super) async fn get_bounded(
        &self,
        read: &Read<'_>,
        path: &str,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let Read {
            r,
            auth,
            at,
            accept,
            limit,
            doing,
        } = *read;
        let token = self
            .client
            .auth(at, auth, RegistryOperation::Pull)
            .await
            .map_err(|e| explain(&self.auths, r, doing, e))?;
        let url = format!(
            "https://{}/v2/{}/{path}",
            at.resolve_registry(),
            at.repository()
        );
        let mut request = self.http.0.get(&url).header(ACCEPT, accept.join(", "));
        request = match (token, auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            (None, _) => request,
        };
        let unreachable = |e: reqwest::Error| {
            Failure::Unreachable(format!(
                "{doing} from {} failed: {}",
                r.registry,
                error_chain(&e)
            ))
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let who = || self.auths.describe(&r.registry.to_ascii_lowercase());
        match response.status() {
            StatusCode::NOT_FOUND => return Ok(None),
            StatusCode::UNAUTHORIZED => {
                return Err(Failure::refused(format!(
                    "{} refused the credentials {doing} {}",
                    r.registry,
                    who()
                )));
            }
            StatusCode::FORBIDDEN => {
                return Err(Failure::refused(format!(
                    "{} refused access {doing} {}",
                    r.registry,
                    who()
                )));
            }
            s if s.is_client_error() => {
                return Err(Failure::refused(format!(
                    "{doing}: {} answered {s} for {url}",
                    r.registry
                )));
            }
            s if !s.is_success() => {
                return Err(Failure::Unreachable(format!(
                    "{doing}: {} answered {s}",
                    r.registry
                )));
            }
            _ => {}
        }
        if let Some(length) = response.content_length()
            && length > limit
        {
            return Err(Failure::refused(format!(
                "{doing}: the registry sends {length} bytes, over the {limit} read at most; \
                 not downloaded"
            )));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(Failure::refused(format!(
                    "{doing}: more than the {limit} bytes read at most; download stopped"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Some(body))
    }

    /// The manifest `read.at` names (by digest, else by tag).
    pub(super) async fn manifest_bounded(
        &self,
        read: &Read<'_>,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let at = read.at;
        let reference = at
            .digest()
            .or(at.tag())
            .ok_or_else(|| {
                Failure::refused(format!("{}: {at} names no tag or digest", read.doing))
            })?
            .to_string();
        self.get_bounded(read, &format!("manifests/{reference}"))
            .await
    }
}
