//! What the supply hands the runtime: a module's bytes as stored, where
//! they came from, and their sha256 (what `sha256` pins compare with).

use std::path::PathBuf;

use sha2::{Digest, Sha256};

/// A module's content, read or pulled and verified as far as the supply
/// verifies anything (see the crate docs): the bytes as stored (for a
/// `.wasm.gz`, still compressed) and their digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    /// The file the bytes were read from (for a pulled module, its cached
    /// layer, or the reference when the cache could not keep it).
    pub source: PathBuf,
    pub bytes: Vec<u8>,
    /// sha256 of `bytes`, 64 lowercase hex digits.
    pub sha256: String,
}

impl Content {
    /// `bytes` from `source`, hashed here.
    pub fn new(source: PathBuf, bytes: Vec<u8>) -> Content {
        let sha256 = sha256_hex(&bytes);
        Content {
            source,
            bytes,
            sha256,
        }
    }
}

/// sha256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
