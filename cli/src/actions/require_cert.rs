//! `accept --drain/--kubernetes --require-cert`: a node the suite accepted
//! is resumed or untainted only with a valid certificate of this suite:
//! signed by the coordinator's key, not expired, not revoked, its verdict a
//! pass, and its identity still the live node's. A node without one is
//! left as it is (its verdict made `incomplete` for the actions, with the
//! reason), never drained for it: the suite did not blame it.

use std::time::{Duration, Instant};

use gpuctl_cert::envelope::{open, read_public_pem};
use gpuctl_cert::verify::{verify, Inputs, Revocation};
use gpuctl_cert::{identity, Identity};
use gpuctl_proto::pb;

use crate::client::Coordinator;

/// How long to wait for the certificates: the coordinator signs them just
/// after the suite ends.
const WAIT: Duration = Duration::from_secs(60);

/// Why `envelope` does not let `node` back in after `suite_id`, if it does not.
pub fn judge(
    envelope: &str,
    key_pem: &str,
    revoked: &[Revocation],
    live: Option<&Identity>,
    suite_id: &str,
    now_ms: u64,
) -> Result<(), String> {
    let key = read_public_pem(key_pem).map_err(|e| e.to_string())?;
    let opened = open(envelope.as_bytes()).map_err(|e| e.to_string())?;
    let cert = &opened.cert;
    if cert.suite.id != suite_id {
        return Err(format!(
            "its latest certificate is of suite {}, not {suite_id}",
            cert.suite.id
        ));
    }
    let failed: Vec<String> = verify(
        &opened,
        &Inputs {
            key: &key,
            now_unix_ms: now_ms,
            revoked: Some(revoked),
            evidence: None,
        },
    )
    .into_iter()
    .filter(|c| !c.ok)
    .map(|c| format!("{}: {}", c.name, c.detail))
    .collect();
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    if cert.verdict != "pass" && cert.verdict != "warn" {
        return Err(format!("{} says {}", cert.id, cert.verdict));
    }
    let Some(live) = live else {
        return Err("the node is not registered now".into());
    };
    let diffs = identity::differences(&cert.identity, live);
    if !diffs.is_empty() {
        return Err(format!("{} no longer holds: {}", cert.id, diffs.join("; ")));
    }
    Ok(())
}

/// The suite with each accepted node that has no valid certificate made
/// `incomplete` (saying why), for the actions to leave alone.
pub async fn gate(c: &mut Coordinator, suite: &pb::Suite, now_ms: u64) -> pb::Suite {
    let mut out = suite.clone();
    let key = match c.cert_key().await {
        Ok(k) => k.public_pem,
        Err(e) => return undecided(out, &format!("no certificate key: {e}")),
    };
    let revoked: Vec<Revocation> = match c.revoked_certs().await {
        Ok(list) => list
            .into_iter()
            .map(|r| Revocation {
                id: r.id,
                reason: r.reason,
                revoked_unix_ms: r.revoked_unix_ms,
            })
            .collect(),
        Err(e) => return undecided(out, &format!("no revocation list: {e}")),
    };
    let start = Instant::now();
    for n in out.verdicts.iter_mut() {
        if !matches!(n.verdict(), pb::Verdict::Pass | pb::Verdict::Warn) {
            continue;
        }
        let verdict = loop {
            let r = match c.cert(&n.node, false).await {
                Ok(r) => r,
                Err(e) if start.elapsed() < WAIT => {
                    tracing::debug!("waiting for {}'s certificate: {e}", n.node);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
                Err(e) => break Err(e.to_string()),
            };
            let live: Option<Identity> = serde_json::from_str(&r.live_identity).ok();
            let v = judge(
                &r.envelope,
                &key,
                &revoked,
                live.as_ref(),
                &suite.id,
                now_ms,
            );
            if v.is_err() && start.elapsed() < WAIT && !of_suite(&r.envelope, &suite.id) {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
            break v;
        };
        match verdict {
            Ok(()) => eprintln!(
                "require-cert: {}: certificate of {} valid",
                n.node, suite.id
            ),
            Err(why) => {
                eprintln!(
                    "require-cert: {}: left as it is: no valid certificate: {why}",
                    n.node
                );
                n.verdict = pb::Verdict::Incomplete as i32;
                n.reason = format!("no valid certificate: {why}");
            }
        }
    }
    out
}

/// Whether the certificate read is already this suite's (so waiting longer
/// changes nothing).
fn of_suite(envelope: &str, suite_id: &str) -> bool {
    open(envelope.as_bytes()).is_ok_and(|o| o.cert.suite.id == suite_id)
}

fn undecided(mut suite: pb::Suite, why: &str) -> pb::Suite {
    for n in suite.verdicts.iter_mut() {
        if matches!(n.verdict(), pb::Verdict::Pass | pb::Verdict::Warn) {
            eprintln!("require-cert: {}: left as it is: {why}", n.node);
            n.verdict = pb::Verdict::Incomplete as i32;
            n.reason = why.to_string();
        }
    }
    suite
}

#[cfg(test)]
mod tests {
    use gpuctl_cert::envelope::{public_pem, sign};
    use gpuctl_cert::model::SCHEMA;
    use gpuctl_cert::*;

    use super::*;

    fn cert(verdict: &str) -> Certificate {
        Certificate {
            schema: SCHEMA.into(),
            id: "cert-acc-000002-n1".into(),
            issued_unix_ms: 10,
            expires_unix_ms: 1_000,
            issuer: Issuer {
                coordinator: "c".into(),
                key_id: "k".into(),
            },
            node: "n1".into(),
            status: Certificate::status_of(verdict).into(),
            verdict: verdict.into(),
            remediation: String::new(),
            identity: Identity {
                hostname: "h".into(),
                cpu_ranks: 1,
                ..Default::default()
            },
            suite: SuiteRecord {
                id: "acc-000002".into(),
                ..Default::default()
            },
            rules: Default::default(),
            figures: vec![],
            findings: vec![],
            evidence: vec![],
        }
    }

    #[test]
    fn only_a_valid_passing_certificate_of_this_suite_matching_the_node_lets_it_back() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let pem = public_pem(&key.verifying_key());
        let ok = sign(&cert("pass"), &key);
        let live = cert("pass").identity;
        let j = |env: &str, revoked: &[Revocation], live: Option<&Identity>, suite: &str, now| {
            judge(env, &pem, revoked, live, suite, now)
        };
        assert_eq!(j(&ok, &[], Some(&live), "acc-000002", 100), Ok(()));
        assert!(j(&ok, &[], Some(&live), "acc-000003", 100)
            .unwrap_err()
            .contains("of suite acc-000002"));
        assert!(j(&ok, &[], Some(&live), "acc-000002", 1_000)
            .unwrap_err()
            .contains("expiry"));
        let revoked = [Revocation {
            id: "cert-acc-000002-n1".into(),
            reason: "swapped".into(),
            revoked_unix_ms: 50,
        }];
        assert!(j(&ok, &revoked, Some(&live), "acc-000002", 100)
            .unwrap_err()
            .contains("swapped"));
        let moved = Identity {
            cpu_ranks: 2,
            ..live.clone()
        };
        assert!(j(&ok, &[], Some(&moved), "acc-000002", 100)
            .unwrap_err()
            .contains("cpu_ranks"));
        assert!(j(&ok, &[], None, "acc-000002", 100).is_err());
        let failed = sign(&cert("fail"), &key);
        assert!(j(&failed, &[], Some(&live), "acc-000002", 100)
            .unwrap_err()
            .contains("says fail"));
        let other = sign(&cert("pass"), &SigningKey::from_bytes(&[4; 32]));
        assert!(j(&other, &[], Some(&live), "acc-000002", 100)
            .unwrap_err()
            .contains("signature"));
    }
}
