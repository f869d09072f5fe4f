//! The pure model: signing and opening, tampering found and named,
//! re-judging, identity differences, keys on disk.

use base64::Engine;
use ed25519_dalek::SigningKey;

use crate::envelope::{self, open, sign};
use crate::judge::judged;
use crate::verify::{verify, Inputs, Revocation};
use crate::*;

fn figure(value: f64, reference: f64) -> FigureRecord {
    judged(FigureRecord {
        stage: "stress".into(),
        job_id: "job-000001".into(),
        rank: Some(0),
        gpu_uuid: "GPU-1".into(),
        metric: "stress_tflops".into(),
        key: "bf16 8192".into(),
        unit: "TFLOP/s".into(),
        value,
        reference_kind: "fleet".into(),
        reference,
        higher_is_better: true,
        fail_below: 0.9,
        warn_below: 0.95,
        margin: 0.0,
        verdict: String::new(),
    })
}

fn cert() -> Certificate {
    Certificate {
        schema: model::SCHEMA.into(),
        id: "cert-acc-000001-n1".into(),
        issued_unix_ms: 1_000,
        expires_unix_ms: 10_000,
        issuer: Issuer {
            coordinator: "c".into(),
            key_id: "k".into(),
        },
        node: "n1".into(),
        status: "PASS".into(),
        verdict: "pass".into(),
        remediation: String::new(),
        identity: Identity {
            hostname: "n1".into(),
            gpus: vec![GpuIdentity {
                uuid: "GPU-1".into(),
                vbios_version: "96.00.AF.00.01".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
        suite: SuiteRecord::default(),
        rules: RulesRecord::default(),
        figures: vec![figure(0.1 + 0.2, 0.3), figure(712.345678901, 700.0)],
        findings: vec![],
        evidence: vec![EvidenceRecord {
            job_id: "job-000001".into(),
            file: "job-000001.report.pb".into(),
            bytes: 3,
            sha256: envelope::sha256_hex(b"abc"),
        }],
    }
}

fn key() -> SigningKey {
    SigningKey::from_bytes(&[7u8; 32])
}

fn checks(text: &[u8], now: u64, revoked: Option<&[Revocation]>) -> Vec<verify::Check> {
    let opened = open(text).expect("it opens");
    verify(
        &opened,
        &Inputs {
            key: &key().verifying_key(),
            now_unix_ms: now,
            revoked,
            evidence: None,
        },
    )
}

fn failed(c: &[verify::Check]) -> Vec<String> {
    c.iter().filter(|c| !c.ok).map(|c| c.name.clone()).collect()
}

#[test]
fn a_signed_certificate_verifies_and_round_trips() {
    let text = sign(&cert(), &key());
    assert!(failed(&checks(text.as_bytes(), 5_000, Some(&[]))).is_empty());
    assert_eq!(open(text.as_bytes()).unwrap().cert, cert());
}

#[test]
fn a_changed_payload_fails_the_signature() {
    let text = sign(&cert(), &key());
    let mut env: envelope::Envelope = serde_json::from_str(&text).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let payload = String::from_utf8(b64.decode(&env.payload).unwrap()).unwrap();
    env.payload = b64.encode(payload.replace("96.00.AF.00.01", "96.00.AF.00.02"));
    let text = serde_json::to_string(&env).unwrap();
    assert_eq!(
        failed(&checks(text.as_bytes(), 5_000, None)),
        ["signature", "form"]
    );
}

#[test]
fn expiry_and_revocation_are_named() {
    let text = sign(&cert(), &key());
    assert_eq!(failed(&checks(text.as_bytes(), 10_000, None)), ["expiry"]);
    let list = [Revocation {
        id: "cert-acc-000001-n1".into(),
        reason: "GPU swapped".into(),
        revoked_unix_ms: 2,
    }];
    let c = checks(text.as_bytes(), 5_000, Some(&list));
    assert_eq!(failed(&c), ["revocation"]);
    assert!(c.iter().any(|c| c.detail.contains("GPU swapped")));
}

#[test]
fn a_figure_whose_verdict_was_edited_is_named_when_re_judged() {
    let mut c = cert();
    c.figures[1].verdict = "fail".into();
    let text = sign(&c, &key());
    assert_eq!(failed(&checks(text.as_bytes(), 5_000, None)), ["figures"]);
    assert_eq!(judged(figure(80.0, 100.0)).verdict, "fail");
    assert_eq!(judged(figure(93.0, 100.0)).verdict, "warn");
    let none = judged(FigureRecord {
        reference_kind: "none".into(),
        ..figure(1.0, 0.0)
    });
    assert_eq!(none.verdict, "unjudged");
}

#[test]
fn evidence_is_checked_file_by_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job-000001.report.pb"), b"abd").unwrap();
    let text = sign(&cert(), &key());
    let opened = open(text.as_bytes()).unwrap();
    let c = verify(
        &opened,
        &Inputs {
            key: &key().verifying_key(),
            now_unix_ms: 5_000,
            revoked: None,
            evidence: Some(dir.path()),
        },
    );
    assert_eq!(failed(&c), ["evidence job-000001.report.pb"]);
}

#[test]
fn identity_differences_are_named() {
    let a = cert().identity;
    let mut b = a.clone();
    b.gpus[0].vbios_version = "96.00.AF.00.09".into();
    b.gpus.push(GpuIdentity {
        index: 1,
        uuid: "GPU-2".into(),
        ..Default::default()
    });
    b.cpu_ranks = 3;
    let d = identity::differences(&a, &b);
    assert_eq!(d.len(), 3, "{d:?}");
    assert!(d[0].starts_with("cpu_ranks"));
    assert!(d[1].contains("vbios_version"));
    assert!(d[2].contains("GPU-2") && d[2].contains("new"));
    assert!(identity::differences(&a, &a).is_empty());
    // A link down: its remote end is gone from the list.
    let mut linked = a.clone();
    linked.gpus[0].nvlink_remotes = vec!["00000000:05:00.0x5".into(), "00000000:06:00.0x4".into()];
    let mut down = linked.clone();
    down.gpus[0].nvlink_remotes[1] = "00000000:06:00.0x3".into();
    let d = identity::differences(&linked, &down);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(d[0].contains("nvlink_remotes"), "{d:?}");
}

#[test]
fn the_key_file_is_made_once_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cert.key");
    let k1 = envelope::load_or_create_key(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let k2 = envelope::load_or_create_key(&path).unwrap();
    assert_eq!(k1.to_bytes(), k2.to_bytes());
    let pem = envelope::public_pem(&k1.verifying_key());
    assert_eq!(envelope::read_public_pem(&pem).unwrap(), k1.verifying_key());
}
