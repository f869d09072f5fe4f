//! Where certificates live in the store: each node's latest envelope, the
//! evidence (each stage job's report, encoded once when the suite's
//! certificates were issued, so that its hash holds whatever the store does
//! to reports later) and the revocations. Raw keys under `certs/`, built in
//! `store::keys`.

use gpuctl_cert::verify::Revocation;
use gpuctl_cert::Certificate;

use crate::store::{keys, StateStore, StoreError, StoreResult};

/// Each node's latest certificate, as signed.
pub async fn latest(store: &StateStore, node: &str) -> StoreResult<Option<String>> {
    let bytes = store.raw().get(keys::cert_latest(node)).await?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// Every node's latest certificate.
pub async fn all_latest(store: &StateStore) -> StoreResult<Vec<String>> {
    let entries = store.raw().scan_prefix(keys::CERTS_LATEST.into()).await?;
    Ok(entries
        .into_iter()
        .map(|(_, v)| String::from_utf8_lossy(&v).into_owned())
        .collect())
}

/// The evidence of one job of one suite.
pub async fn evidence(store: &StateStore, suite: &str, job: &str) -> StoreResult<Option<Vec<u8>>> {
    store.raw().get(keys::cert_evidence(suite, job)).await
}

/// A suite's evidence and its nodes' certificates, in one write.
pub async fn put(
    store: &StateStore,
    suite: &str,
    evidence: Vec<(String, Vec<u8>)>,
    certs: Vec<(String, String)>,
) -> StoreResult<()> {
    let mut entries: Vec<(String, Vec<u8>)> = evidence
        .into_iter()
        .map(|(job, bytes)| (keys::cert_evidence(suite, &job), bytes))
        .collect();
    entries.extend(
        certs
            .into_iter()
            .map(|(node, env)| (keys::cert_latest(&node), env.into_bytes())),
    );
    store.raw().put_many(entries).await
}

pub async fn revoke(store: &StateStore, r: &Revocation) -> StoreResult<()> {
    let bytes = serde_json::to_vec(r).expect("a revocation serialises");
    store.raw().put(keys::cert_revoked(&r.id), bytes).await
}

pub async fn revoked(store: &StateStore) -> StoreResult<Vec<Revocation>> {
    let entries = store.raw().scan_prefix(keys::CERTS_REVOKED.into()).await?;
    entries
        .into_iter()
        .map(|(k, v)| {
            serde_json::from_slice(&v)
                .map_err(|e| StoreError::Backend(format!("`{k}` is not a revocation: {e}")))
        })
        .collect()
}

/// The certificate inside a stored envelope (it was signed here; read
/// without checking again).
pub fn read(envelope: &str) -> Option<Certificate> {
    gpuctl_cert::envelope::open(envelope.as_bytes())
        .ok()
        .map(|o| o.cert)
}
