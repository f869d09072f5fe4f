//! Signed per-node acceptance certificates (issue 50): the format
//! ([`model`]), the DSSE envelope and keys ([`envelope`]), re-judging a
//! figure from what the certificate records ([`judge`]), a live node
//! against its certificate ([`identity`]) and offline verification
//! ([`verify`]). Pure and free of gRPC: the coordinator issues with it, and
//! `gpuctl cert verify`/`show` use it with no coordinator at all. A crate of
//! its own so that the Ed25519 code links only into those two.

pub mod envelope;
pub mod identity;
pub mod judge;
pub mod model;
pub mod verify;

#[cfg(test)]
mod tests;

pub use ed25519_dalek::{SigningKey, VerifyingKey};
pub use model::{
    Certificate, EvidenceRecord, FigureRecord, FindingRecord, GpuIdentity, Identity, Issuer,
    RulesRecord, StageRecord, SuiteRecord,
};

/// What can go wrong reading a certificate or a key.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate: {0}")]
    Form(String),
    #[error("key: {0}")]
    Key(String),
}
