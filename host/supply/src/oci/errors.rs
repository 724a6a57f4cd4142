//! How a fetch failed, and oci-client's errors as messages that say what
//! to do.

use oci_client::errors::OciDistributionError;
use portwise_core::config::OciRef;

use super::auth::Auths;
use crate::error::PullError;

/// Why a fetch failed: the registry said no (or sent something wrong), or
/// it could not be asked.
pub(super) enum Failure {
    Refused(PullError),
    Unreachable(String),
}

impl Failure {
    /// A refusal the registry's answer explains ([`PullError::Refused`]).
    pub(super) fn refused(why: String) -> Failure {
        Failure::Refused(PullError::Refused(why))
    }
}

/// The registry has nothing at that name (as opposed to: refused, failed).
pub(super) fn is_not_found(e: &OciDistributionError) -> bool {
    use OciDistributionError as E;
    match e {
        E::ImageManifestNotFoundError(_) | E::ServerError { code: 404, .. } => true,
        E::RegistryError { envelope, .. } => envelope.errors.iter().any(|x| {
            matches!(
                x.code,
                oci_client::errors::OciErrorCode::ManifestUnknown
                    | oci_client::errors::OciErrorCode::NameUnknown
                    | oci_client::errors::OciErrorCode::BlobUnknown
            )
        }),
        _ => false,
    }
}

/// `e` with its sources, which carry the useful part (connection refused,
/// certificate unknown...).
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// An oci-client error as a message that says what to do.
pub(super) fn explain(auths: &Auths, r: &OciRef, doing: &str, e: OciDistributionError) -> Failure {
    use OciDistributionError as E;
    let who = auths.describe(&r.registry.to_ascii_lowercase());
    match &e {
        E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => Failure::refused(format!(
            "{} refused the credentials {doing} {who}: {e}",
            r.registry
        )),
        E::ServerError { code: 401, .. } | E::ServerError { code: 403, .. } => {
            Failure::refused(format!("{} refused access {doing} {who}: {e}", r.registry))
        }
        _ if is_not_found(&e) => {
            Failure::refused(format!("{doing}: {} has no such artifact: {e}", r.registry))
        }
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::Unauthorized
                        | oci_client::errors::OciErrorCode::Denied
                )
            }) =>
        {
            Failure::refused(format!(
                "{} refused the credentials {doing} {who}: {e}",
                r.registry
            ))
        }
        _ => Failure::Unreachable(format!(
            "{doing} from {} failed: {}",
            r.registry,
            error_chain(&e)
        )),
    }
}
