//! The certificate RPCs of `JobService` (issue 50): the public key, a node's
//! latest certificate with its evidence and the node's live identity, every
//! node's latest for `gpuctl fleet`, revocation. Certificates are issued by
//! the scheduler when a suite ends (`crate::cert::issue`); here they are
//! only read, and revoked.

use gpuctl_cert::verify::Revocation as Revoked;
use gpuctl_proto::pb::{
    CertKey, CertResponse, CertSummary, EvidenceFile, GetCertRequest, ListRevokedResponse,
    Revocation, RevokeCertRequest,
};

use crate::cert::{identity, records, Authority};
use crate::error::CoordinatorError;
use crate::scheduler::SchedulerHandle;
use crate::store::StateStore;

fn store_err(e: crate::store::StoreError) -> CoordinatorError {
    CoordinatorError::store("could not read the certificates", e)
}

pub fn key(a: &Authority) -> CertKey {
    CertKey {
        public_pem: a.public_pem(),
        key_id: a.key_id(),
    }
}

pub async fn get(
    store: &StateStore,
    sched: &SchedulerHandle,
    req: GetCertRequest,
) -> Result<CertResponse, CoordinatorError> {
    let node = req.node.trim();
    if node.is_empty() || node.len() > gpuctl_core::limits::MAX_NODE_NAME {
        return Err(CoordinatorError::InvalidField {
            field: "node".into(),
            message: format!(
                "give a node's name as `gpuctl nodes` lists it (1 to {} bytes)",
                gpuctl_core::limits::MAX_NODE_NAME
            ),
        });
    }
    let Some(envelope) = records::latest(store, node).await.map_err(store_err)? else {
        return Err(CoordinatorError::CertNotFound(node.to_string()));
    };
    let mut evidence = Vec::new();
    // One this coordinator signed always opens; a store edited by hand
    // offers no evidence.
    if let Some(cert) = records::read(&envelope).filter(|_| req.evidence) {
        for e in &cert.evidence {
            if let Some(data) = records::evidence(store, &cert.suite.id, &e.job_id)
                .await
                .map_err(store_err)?
            {
                evidence.push(EvidenceFile {
                    name: e.file.clone(),
                    data,
                });
            }
        }
    }
    let live_identity = sched
        .node(node)
        .await?
        .map(|n| serde_json::to_string(&identity::of_node(&n)).expect("an identity serialises"))
        .unwrap_or_default();
    Ok(CertResponse {
        envelope,
        evidence,
        live_identity,
    })
}

pub async fn list(store: &StateStore) -> Result<Vec<CertSummary>, CoordinatorError> {
    let revoked = records::revoked(store).await.map_err(store_err)?;
    Ok(records::summaries(store)
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|c| CertSummary {
            revoked: revoked.iter().any(|r| r.id == c.id),
            node: c.node,
            id: c.id,
            verdict: c.verdict,
            issued_unix_ms: c.issued_unix_ms,
            expires_unix_ms: c.expires_unix_ms,
        })
        .collect())
}

pub async fn revoke(
    store: &StateStore,
    req: RevokeCertRequest,
    now_ms: u64,
) -> Result<Revocation, CoordinatorError> {
    let id = req.id.trim();
    let bad = |m: &str| CoordinatorError::InvalidField {
        field: "id".into(),
        message: m.into(),
    };
    // Ids are `cert-<suite>-<node>`: anything else was never issued.
    if !id.starts_with("cert-acc-") || id.len() > 256 || id.contains('/') {
        return Err(bad(
            "give a certificate id as `gpuctl cert show` prints it (cert-acc-000001-NODE)",
        ));
    }
    if req.reason.len() > gpuctl_core::limits::MAX_TEXT {
        return Err(CoordinatorError::InvalidField {
            field: "reason".into(),
            message: format!("at most {} bytes", gpuctl_core::limits::MAX_TEXT),
        });
    }
    let r = Revoked {
        id: id.to_string(),
        reason: req.reason.trim().to_string(),
        revoked_unix_ms: now_ms,
    };
    records::revoke(store, &r).await.map_err(store_err)?;
    Ok(Revocation {
        id: r.id,
        reason: r.reason,
        revoked_unix_ms: r.revoked_unix_ms,
    })
}

pub async fn revoked(store: &StateStore) -> Result<ListRevokedResponse, CoordinatorError> {
    Ok(ListRevokedResponse {
        revoked: records::revoked(store)
            .await
            .map_err(store_err)?
            .into_iter()
            .map(|r| Revocation {
                id: r.id,
                reason: r.reason,
                revoked_unix_ms: r.revoked_unix_ms,
            })
            .collect(),
    })
}
