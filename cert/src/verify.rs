//! Offline verification: every check `gpuctl cert verify` makes, each with
//! its name and what it found, so that a failure says what does not hold
//! (the signature, the expiry, a revocation, a figure, an evidence file).

use std::path::Path;

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::envelope::{self, sha256_hex, Opened};
use crate::judge;

/// One revoked certificate, as the coordinator lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revocation {
    pub id: String,
    pub reason: String,
    pub revoked_unix_ms: u64,
}

/// Largest evidence file read: a job report of a large fleet.
pub const MAX_EVIDENCE_BYTES: u64 = 256 << 20;

/// One check and its outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

fn check(name: &str, result: Result<String, String>) -> Check {
    let (ok, detail) = match result {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    Check {
        name: name.into(),
        ok,
        detail,
    }
}

/// What verification needs besides the envelope.
pub struct Inputs<'a> {
    pub key: &'a VerifyingKey,
    pub now_unix_ms: u64,
    pub revoked: Option<&'a [Revocation]>,
    pub evidence: Option<&'a Path>,
}

/// Every check on an opened envelope; it holds when all are `ok`.
pub fn verify(opened: &Opened, inp: &Inputs) -> Vec<Check> {
    let cert = &opened.cert;
    let mut out = vec![check(
        "signature",
        envelope::signed_by(opened, inp.key)
            .map(|()| format!("signed by key {}", envelope::key_id(inp.key))),
    )];
    let canonical = envelope::statement_bytes(cert) == opened.payload;
    out.push(check(
        "form",
        if canonical {
            Ok("the statement is in its one serialisation".into())
        } else {
            Err("the statement does not re-serialise to the signed bytes".into())
        },
    ));
    out.push(check(
        "expiry",
        if inp.now_unix_ms < cert.expires_unix_ms {
            Ok(format!("valid until {} (unix ms)", cert.expires_unix_ms))
        } else {
            Err(format!("expired at {} (unix ms)", cert.expires_unix_ms))
        },
    ));
    if let Some(list) = inp.revoked {
        out.push(check(
            "revocation",
            match list.iter().find(|r| r.id == cert.id) {
                Some(r) => Err(format!(
                    "{} was revoked at {} (unix ms): {}",
                    cert.id, r.revoked_unix_ms, r.reason
                )),
                None => Ok(format!("not among {} revoked", list.len())),
            },
        ));
    }
    let wrong = judge::disagreements(cert);
    out.push(check(
        "figures",
        if wrong.is_empty() {
            Ok(format!(
                "{} figures re-judged to the same verdicts",
                cert.figures.len()
            ))
        } else {
            Err(wrong.join("; "))
        },
    ));
    // The node's verdict is the suite's, which weighs more than figures (a
    // rank that failed, health, preflight): only its status word is checked.
    out.push(check(
        "verdict",
        if cert.status != crate::Certificate::status_of(&cert.verdict) {
            Err(format!(
                "status {} does not match verdict {}",
                cert.status, cert.verdict
            ))
        } else {
            Ok(format!("{} ({})", cert.verdict, cert.status))
        },
    ));
    if let Some(dir) = inp.evidence {
        out.extend(evidence(cert, dir));
    }
    out
}

/// Each evidence file's size and hash against the certificate's record,
/// and every figure's job among them.
fn evidence(cert: &crate::Certificate, dir: &Path) -> Vec<Check> {
    let mut out = Vec::new();
    for e in &cert.evidence {
        let name = format!("evidence {}", e.file);
        if e.file.contains('/') || e.file.starts_with('.') {
            out.push(check(&name, Err("the file name leaves the folder".into())));
            continue;
        }
        let path = dir.join(&e.file);
        let result = match std::fs::metadata(&path) {
            Err(err) => Err(format!("{}: {err}", path.display())),
            Ok(m) if m.len() > MAX_EVIDENCE_BYTES => Err(format!(
                "{} bytes; evidence files are read up to {MAX_EVIDENCE_BYTES}",
                m.len()
            )),
            Ok(_) => match std::fs::read(&path) {
                Err(err) => Err(format!("{}: {err}", path.display())),
                Ok(bytes) => {
                    let got = sha256_hex(&bytes);
                    if got == e.sha256 && bytes.len() as u64 == e.bytes {
                        Ok(format!("{} bytes, sha256 {got}", bytes.len()))
                    } else {
                        Err(format!(
                            "{} bytes with sha256 {got}; the certificate records {} bytes with sha256 {}",
                            bytes.len(),
                            e.bytes,
                            e.sha256
                        ))
                    }
                }
            },
        };
        out.push(check(&name, result));
    }
    let uncovered: Vec<&str> = cert
        .figures
        .iter()
        .map(|f| f.job_id.as_str())
        .filter(|j| !cert.evidence.iter().any(|e| e.job_id == *j))
        .collect();
    out.push(check(
        "evidence coverage",
        if uncovered.is_empty() {
            Ok("every figure's job report is in the evidence".into())
        } else {
            Err(format!(
                "figures of jobs without evidence: {}",
                uncovered.join(", ")
            ))
        },
    ));
    out
}
