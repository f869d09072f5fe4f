//! The DSSE envelope around an in-toto Statement v1 whose subject is the
//! node and whose predicate is the certificate, signed with Ed25519: a
//! standard form, so that tools that already check in-toto attestations
//! (cosign, in-toto-golang) can read ours; and the signing key's files.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::model::{Certificate, Identity, SCHEMA};
use crate::CertError;

/// DSSE's payload type for in-toto statements.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// in-toto's Statement v1.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// Largest envelope read: a certificate of a node with 8 GPUs and a few
/// hundred figures is tens of KiB.
pub const MAX_ENVELOPE_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub payload: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeSignature {
    pub keyid: String,
    pub sig: String,
}

/// DSSE's pre-authentication encoding: what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key id: SHA-256 of the public key's 32 bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    sha256_hex(key.as_bytes())
}

/// The subject's digest: SHA-256 of the identity's JSON.
pub fn identity_digest(id: &Identity) -> String {
    sha256_hex(&serde_json::to_vec(id).expect("an identity serialises"))
}

/// The statement's bytes: one serialisation, so that a verifier that
/// re-serialises what it read gets the signed bytes back.
pub fn statement_bytes(cert: &Certificate) -> Vec<u8> {
    let statement = json!({
        "_type": STATEMENT_TYPE,
        "subject": [{
            "name": format!("node/{}", cert.node),
            "digest": { "sha256": identity_digest(&cert.identity) },
        }],
        "predicateType": SCHEMA,
        "predicate": cert.to_json(),
    });
    serde_json::to_vec(&statement).expect("a statement serialises")
}

/// The certificate signed: the envelope's JSON, pretty-printed for people
/// (the signature covers the payload, not the envelope's layout).
pub fn sign(cert: &Certificate, key: &SigningKey) -> String {
    let payload = statement_bytes(cert);
    let sig: Signature = key.sign(&pae(PAYLOAD_TYPE, &payload));
    let env = Envelope {
        payload_type: PAYLOAD_TYPE.into(),
        payload: B64.encode(&payload),
        signatures: vec![EnvelopeSignature {
            keyid: key_id(&key.verifying_key()),
            sig: B64.encode(sig.to_bytes()),
        }],
    };
    serde_json::to_string_pretty(&env).expect("an envelope serialises")
}

/// The envelope's parts, read but not yet trusted.
pub struct Opened {
    pub envelope: Envelope,
    pub payload: Vec<u8>,
    pub cert: Certificate,
}

/// Reads an envelope and the certificate in it, checking its form only.
pub fn open(text: &[u8]) -> Result<Opened, CertError> {
    if text.len() > MAX_ENVELOPE_BYTES {
        return Err(CertError::Form(format!(
            "{} bytes; an envelope is at most {MAX_ENVELOPE_BYTES}",
            text.len()
        )));
    }
    let envelope: Envelope = serde_json::from_slice(text)
        .map_err(|e| CertError::Form(format!("not a DSSE envelope: {e}")))?;
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(CertError::Form(format!(
            "payloadType `{}`; expected `{PAYLOAD_TYPE}`",
            envelope.payload_type
        )));
    }
    let payload = B64
        .decode(&envelope.payload)
        .map_err(|e| CertError::Form(format!("payload: not base64: {e}")))?;
    let statement: serde_json::Value = serde_json::from_slice(&payload)
        .map_err(|e| CertError::Form(format!("payload: not JSON: {e}")))?;
    if statement["_type"] != STATEMENT_TYPE || statement["predicateType"] != SCHEMA {
        return Err(CertError::Form(format!(
            "payload: not an in-toto {STATEMENT_TYPE} with predicateType {SCHEMA}"
        )));
    }
    let cert: Certificate = serde_json::from_value(statement["predicate"].clone())
        .map_err(|e| CertError::Form(format!("predicate: {e}")))?;
    Ok(Opened {
        envelope,
        payload,
        cert,
    })
}

/// Whether one of the envelope's signatures is `key`'s over its payload.
pub fn signed_by(opened: &Opened, key: &VerifyingKey) -> Result<(), String> {
    let message = pae(&opened.envelope.payload_type, &opened.payload);
    let mut why = format!("no signature by key {}", key_id(key));
    for s in &opened.envelope.signatures {
        let Ok(bytes) = B64.decode(&s.sig) else {
            why = format!("signature of keyid {}: not base64", s.keyid);
            continue;
        };
        let Ok(sig) = Signature::from_slice(&bytes) else {
            why = format!("signature of keyid {}: not 64 bytes", s.keyid);
            continue;
        };
        match key.verify(&message, &sig) {
            Ok(()) => return Ok(()),
            Err(_) => {
                why = format!(
                    "the signature of keyid {} does not match the payload under key {}",
                    s.keyid,
                    key_id(key)
                )
            }
        }
    }
    Err(why)
}

/// The signing key in `path` (PKCS#8 PEM), made there (0600) when absent.
pub fn load_or_create_key(path: &Path) -> Result<SigningKey, CertError> {
    let io = |e: std::io::Error| CertError::Key(format!("{}: {e}", path.display()));
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mode = std::fs::metadata(path).map_err(io)?.permissions().mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                    .map_err(io)?;
            }
            SigningKey::from_pkcs8_pem(&text).map_err(|e| {
                CertError::Key(format!(
                    "{}: not an Ed25519 PKCS#8 PEM key: {e}",
                    path.display()
                ))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = [0u8; 32];
            getrandom::fill(&mut seed)
                .map_err(|e| CertError::Key(format!("no random bytes for a key: {e}")))?;
            let key = SigningKey::from_bytes(&seed);
            let pem = key
                .to_pkcs8_pem(LineEnding::LF)
                .map_err(|e| CertError::Key(format!("encoding the key: {e}")))?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
            f.write_all(pem.as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

/// A public key as PEM (SubjectPublicKeyInfo), what `gpuctl cert key` prints.
pub fn public_pem(key: &VerifyingKey) -> String {
    key.to_public_key_pem(LineEnding::LF)
        .expect("an Ed25519 public key encodes")
}

/// Reads a public key's PEM.
pub fn read_public_pem(text: &str) -> Result<VerifyingKey, CertError> {
    VerifyingKey::from_public_key_pem(text.trim())
        .map_err(|e| CertError::Key(format!("not an Ed25519 public key PEM: {e}")))
}
