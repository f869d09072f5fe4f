//! Acceptance certificates from the coordinator's side (issue 50): the
//! signing key it holds ([`Authority`]), a certificate built for each node
//! of a suite that ended ([`issue`]), and where they, their evidence and
//! the revocations are kept ([`records`]). The format, signing and
//! verification are `gpuctl-cert`'s, which the CLI uses offline.

pub mod identity;
pub mod issue;
pub mod records;

use std::path::Path;

use gpuctl_cert::envelope;
use gpuctl_cert::SigningKey;

/// The key file beside the data dir's store: never in the store, so that a
/// store backup or an etcd reader does not hold the signing key.
pub const KEY_FILE: &str = "cert.key";

/// How long a certificate holds: a node is to be accepted again within it.
pub const VALIDITY_MS: u64 = 90 * 24 * 3600 * 1000;

/// What signs certificates, and who it says it is.
pub struct Authority {
    pub key: SigningKey,
    /// The coordinator's host name and URL, as certificates name their issuer.
    pub issuer: String,
    pub validity_ms: u64,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Authority({}, key {})", self.issuer, self.key_id())
    }
}

impl Authority {
    /// The key in `dir/cert.key`, made (0600) on first use.
    pub fn load(dir: &Path, issuer: String) -> anyhow::Result<Authority> {
        std::fs::create_dir_all(dir)?;
        let key = envelope::load_or_create_key(&dir.join(KEY_FILE))?;
        Ok(Authority {
            key,
            issuer,
            validity_ms: VALIDITY_MS,
        })
    }

    pub fn key_id(&self) -> String {
        envelope::key_id(&self.key.verifying_key())
    }

    pub fn public_pem(&self) -> String {
        envelope::public_pem(&self.key.verifying_key())
    }
}
