//! Where certificates live in the store: each node's latest envelope (and
//! its [`Summary`]), the
//! evidence (each stage job's report, encoded once when the suite's
//! certificates were issued, so that its hash holds whatever the store does
//! to reports later) and the revocations. Raw keys under `certs/`, built in
//! `store::keys`.

use gpuctl_cert::verify::Revocation;
use gpuctl_cert::Certificate;
use serde::{Deserialize, Serialize};

use crate::store::{keys, StateStore, StoreError, StoreResult};

/// Each node's latest certificate, as signed.
pub async fn latest(store: &StateStore, node: &str) -> StoreResult<Option<String>> {
    let bytes = store.raw().get(keys::cert_latest(node)).await?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// What `gpuctl fleet` and the evidence's upkeep need of a node's latest
/// certificate, kept beside it: a few hundred bytes, where the certificate
/// is tens of KiB to read and parse (4,096 of them at every `fleet`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: String,
    pub id: String,
    pub suite: String,
    pub verdict: String,
    pub issued_unix_ms: u64,
    pub expires_unix_ms: u64,
}

impl Summary {
    fn of(c: &Certificate) -> Summary {
        Summary {
            node: c.node.clone(),
            id: c.id.clone(),
            suite: c.suite.id.clone(),
            verdict: c.verdict.clone(),
            issued_unix_ms: c.issued_unix_ms,
            expires_unix_ms: c.expires_unix_ms,
        }
    }
}

/// Every node's latest certificate, summed up.
pub async fn summaries(store: &StateStore) -> StoreResult<Vec<Summary>> {
    let entries = store.raw().scan_prefix(keys::CERTS_SUMMARY.into()).await?;
    entries
        .into_iter()
        .map(|(k, v)| {
            serde_json::from_slice(&v).map_err(|e| {
                StoreError::Backend(format!("`{k}` is not a certificate summary: {e}"))
            })
        })
        .collect()
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
    // The suites whose evidence these certificates supersede; a node
    // already certified by a later suite (issued first: each suite's
    // certificates are signed on a task of their own) keeps that one.
    let mut before = std::collections::BTreeSet::new();
    let mut newer = Vec::new();
    let all = summaries(store).await?;
    let suite_of: std::collections::BTreeMap<&str, &str> = all
        .iter()
        .map(|s| (s.node.as_str(), s.suite.as_str()))
        .collect();
    for (node, _) in &certs {
        if let Some(&s) = suite_of.get(node.as_str()) {
            if later(s, suite) {
                newer.push(node.clone());
            } else {
                before.insert(s.to_string());
            }
        }
    }
    if newer.len() == certs.len() {
        // No certificate of this suite is anyone's latest: no evidence either.
        return Ok(());
    }
    for (node, env) in certs.into_iter().filter(|(node, _)| !newer.contains(node)) {
        if let Some(c) = read(&env) {
            let summary = serde_json::to_vec(&Summary::of(&c)).expect("a summary serialises");
            entries.push((keys::cert_summary(&node), summary));
        }
        entries.push((keys::cert_latest(&node), env.into_bytes()));
    }
    store.raw().put_many(entries).await?;
    // Evidence is kept while a node's latest certificate refers to it:
    // one copy of each stage report per suite still certifying a node.
    let kept: std::collections::BTreeSet<String> = summaries(store)
        .await?
        .into_iter()
        .map(|s| s.suite)
        .collect();
    for old in before.difference(&kept) {
        store
            .raw()
            .delete_prefix(keys::cert_evidence_of(old))
            .await?;
    }
    Ok(())
}

/// Whether suite `a` was submitted after suite `b` (`acc-000010` after
/// `acc-000009`; a longer number after a shorter one).
pub fn later(a: &str, b: &str) -> bool {
    (a.len(), a) > (b.len(), b)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpuctl_cert::{envelope, Certificate};

    use super::*;
    use crate::store::RedbStore;

    fn signed(node: &str, suite: &str) -> String {
        let text = format!(
            r#"{{"schema":"{}","id":"cert-{suite}-{node}","issued_unix_ms":1,"expires_unix_ms":2,
            "issuer":{{"coordinator":"c","key_id":"k"}},"node":"{node}","status":"PASS","verdict":"pass",
            "remediation":"","identity":{{"hostname":"{node}","product_serial":"","board_serial":"",
            "boot_id":"","os":"","kernel":"","cpu_model":"","cpu_count":1,"cpu_ranks":1,
            "memory_total_bytes":1,"driver_version":"","cuda_driver_version":"","nccl_version":"",
            "torch_version":"","agent_version":"","ib_devices":[],"gpus":[]}},
            "suite":{{"id":"{suite}","name":"quick","state":"succeeded","started_unix_ms":0,
            "finished_unix_ms":0,"stages":[]}},"rules":{{"sha256":"","effective":"","suite_rules":""}},
            "figures":[],"findings":[],"evidence":[]}}"#,
            gpuctl_cert::model::SCHEMA
        );
        let cert: Certificate = serde_json::from_str(&text).unwrap();
        envelope::sign(&cert, &gpuctl_cert::SigningKey::from_bytes(&[1; 32]))
    }

    #[tokio::test]
    async fn evidence_goes_once_no_latest_certificate_refers_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let raw = RedbStore::open(&dir.path().join("s.redb")).unwrap();
        let store = StateStore::new(Arc::new(raw));
        let ev = |job: &str| vec![(job.to_string(), vec![1u8, 2, 3])];
        let both = |s: &str| {
            vec![
                ("n0".into(), signed("n0", s)),
                ("n1".into(), signed("n1", s)),
            ]
        };
        put(&store, "acc-1", ev("job-1"), both("acc-1"))
            .await
            .unwrap();
        put(
            &store,
            "acc-2",
            ev("job-2"),
            vec![("n0".into(), signed("n0", "acc-2"))],
        )
        .await
        .unwrap();
        // n1 still holds acc-1's certificate: its evidence stays.
        assert!(evidence(&store, "acc-1", "job-1").await.unwrap().is_some());
        put(&store, "acc-3", ev("job-3"), both("acc-3"))
            .await
            .unwrap();
        assert!(evidence(&store, "acc-1", "job-1").await.unwrap().is_none());
        assert!(evidence(&store, "acc-2", "job-2").await.unwrap().is_none());
        assert!(evidence(&store, "acc-3", "job-3").await.unwrap().is_some());
        let certs = summaries(&store).await.unwrap();
        assert_eq!(certs.len(), 2);
        assert!(certs.iter().all(|c| c.suite == "acc-3"));
        let n0 = read(&latest(&store, "n0").await.unwrap().unwrap()).unwrap();
        assert_eq!(certs[0], Summary::of(&n0));
        // An earlier suite's certificates written late replace nothing,
        // and leave no evidence behind.
        put(&store, "acc-2", ev("job-2"), both("acc-2"))
            .await
            .unwrap();
        let certs = summaries(&store).await.unwrap();
        assert!(certs.iter().all(|c| c.suite == "acc-3"));
        assert!(evidence(&store, "acc-2", "job-2").await.unwrap().is_none());
        assert!(later("acc-000010", "acc-000009") && !later("acc-1", "acc-2"));
    }
}
