//! The certificate calls (`gpuctl cert`, issue 50), beside the others'
//! retry and error handling.

use anyhow::Result;
use gpuctl_proto::pb;

use super::Coordinator;

impl Coordinator {
    pub async fn cert_key(&mut self) -> Result<pb::CertKey> {
        self.call(true, move |mut c| async move {
            c.get_cert_key(pb::GetCertKeyRequest {}).await
        })
        .await
        .map_err(|s| self.status("cert key", s))
    }

    pub async fn cert(&mut self, node: &str, evidence: bool) -> Result<pb::CertResponse> {
        let req = pb::GetCertRequest {
            node: node.to_string(),
            evidence,
        };
        self.call(true, move |mut c| {
            let req = req.clone();
            async move { c.get_cert(req).await }
        })
        .await
        .map_err(|s| self.status("cert export", s))
    }

    pub async fn certs(&mut self) -> Result<Vec<pb::CertSummary>> {
        self.call(true, move |mut c| async move {
            c.list_certs(pb::ListCertsRequest {}).await
        })
        .await
        .map(|r| r.certs)
        .map_err(|s| self.status("cert list", s))
    }

    pub async fn revoke_cert(&mut self, id: &str, reason: &str) -> Result<pb::Revocation> {
        let req = pb::RevokeCertRequest {
            id: id.to_string(),
            reason: reason.to_string(),
        };
        self.call(false, move |mut c| {
            let req = req.clone();
            async move { c.revoke_cert(req).await }
        })
        .await
        .map_err(|s| self.status("cert revoke", s))
    }

    pub async fn revoked_certs(&mut self) -> Result<Vec<pb::Revocation>> {
        self.call(true, move |mut c| async move {
            c.list_revoked(pb::ListRevokedRequest {}).await
        })
        .await
        .map(|r| r.revoked)
        .map_err(|s| self.status("cert revoked", s))
    }
}
