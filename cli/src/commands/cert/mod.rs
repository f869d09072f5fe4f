//! `gpuctl cert`: signed per-node acceptance certificates (issue 50). The
//! coordinator issues one per node when an acceptance suite ends; here they
//! are exported with their evidence, verified and shown offline (no
//! coordinator: `offline.rs`), checked against the live node, and revoked.
//! Not `gpuctl certs`, which makes the TLS certificates of a fleet.

mod offline;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use gpuctl_core::clock::Clock;
use serde_json::json;

use crate::client::Coordinator;
use crate::error::UsageError;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

pub const EXAMPLES: &str = "\
Examples:
  gpuctl cert key > coordinator-cert.pub                 # the public key certificates are signed with
  gpuctl cert export gpu-017 --out gpu-017.cert.json --evidence gpu-017.evidence
  gpuctl cert verify gpu-017.cert.json --key coordinator-cert.pub --evidence gpu-017.evidence
  gpuctl cert revoked -o json > revoked.json; gpuctl cert verify gpu-017.cert.json --key coordinator-cert.pub --revoked revoked.json
  gpuctl cert show gpu-017.cert.json                     # for a person; -o json for machines
  gpuctl cert check --node gpu-017                       # does the live node still match it?
  gpuctl cert revoke cert-acc-000003-gpu-017 --reason \"GPU 3 replaced\"

`verify` exits 1 when a check fails (each printed), `check` when the node no longer matches.
Not to be confused with `gpuctl certs`, which makes TLS certificates.";

#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Print the coordinator's public key (PEM) that certificates are signed with.
    Key,
    /// Write a node's latest certificate (stdout without --out), and its evidence with --evidence.
    Export(ExportArgs),
    /// Check a certificate offline: signature, expiry, figures re-judged; evidence and revocations when given.
    Verify(VerifyArgs),
    /// Print a certificate for a person (-o json: the certificate itself; -o html: a page, with the evidence's plots).
    Show(ShowArgs),
    /// Compare a live node with its latest certificate; exit 1 naming each difference.
    Check(CheckArgs),
    /// Revoke a certificate by id; `verify --revoked` then fails it.
    Revoke(RevokeArgs),
    /// List revoked certificates (-o json: the list `verify --revoked` reads).
    Revoked,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    pub node: String,
    /// Write the certificate here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write the job reports it covers into this folder (made if missing).
    #[arg(long)]
    pub evidence: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    pub file: PathBuf,
    /// The coordinator's public key (`gpuctl cert key`); without it the
    /// coordinator is asked for it, which is not an offline check.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The folder `export --evidence` wrote: its files' hashes are checked.
    #[arg(long)]
    pub evidence: Option<PathBuf>,
    /// The list `gpuctl cert revoked -o json` wrote.
    #[arg(long)]
    pub revoked: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    pub file: PathBuf,
    /// With -o html: the folder `export --evidence` wrote, to plot each stage's report.
    #[arg(long)]
    pub evidence: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[arg(long)]
    pub node: String,
}

#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The certificate's id, as `gpuctl cert show` prints it.
    pub id: String,
    /// Why, kept with the revocation and shown by `verify`.
    #[arg(long)]
    pub reason: String,
}

/// Verbs that need no coordinator run without connecting.
pub async fn run(url: &str, cmd: CertCommand, out: OutputFormat, clock: &Clock) -> Result<Exit> {
    match cmd {
        CertCommand::Show(a) => offline::show(&a, out, clock.now_ms()),
        CertCommand::Verify(a) => {
            let key = match &a.key {
                Some(p) => {
                    std::fs::read_to_string(p).with_context(|| format!("--key {}", p.display()))?
                }
                None => {
                    Coordinator::connect(url)
                        .await?
                        .cert_key()
                        .await?
                        .public_pem
                }
            };
            offline::verify(&a, &key, out, clock.now_ms())
        }
        cmd => online(&mut Coordinator::connect(url).await?, cmd, out).await,
    }
}

async fn online(c: &mut Coordinator, cmd: CertCommand, out: OutputFormat) -> Result<Exit> {
    match cmd {
        CertCommand::Key => {
            let k = c.cert_key().await?;
            match out {
                OutputFormat::Json => {
                    output::print_json(&json!({ "public_pem": k.public_pem, "key_id": k.key_id }))
                }
                _ => output::print_text(&k.public_pem),
            }
        }
        CertCommand::Export(a) => {
            let r = c.cert(&a.node, a.evidence.is_some()).await?;
            if let Some(dir) = &a.evidence {
                write_evidence(dir, &r.evidence)?;
            }
            match &a.out {
                Some(p) => std::fs::write(p, format!("{}\n", r.envelope))
                    .with_context(|| format!("--out {}", p.display()))?,
                None => output::print_text(&format!("{}\n", r.envelope)),
            }
        }
        CertCommand::Check(a) => {
            let r = c.cert(&a.node, false).await?;
            return offline::check(&a.node, &r, out);
        }
        CertCommand::Revoke(a) => {
            if a.reason.trim().is_empty() {
                return Err(UsageError("--reason: say why it is revoked".into()).into());
            }
            let r = c.revoke_cert(&a.id, &a.reason).await?;
            match out {
                OutputFormat::Json => output::print_json(&offline::revocation_json(&r)),
                _ => output::print_text(&format!("{} revoked: {}\n", r.id, r.reason)),
            }
        }
        CertCommand::Revoked => {
            let list = c.revoked_certs().await?;
            match out {
                OutputFormat::Json => output::print_json(&serde_json::Value::Array(
                    list.iter().map(offline::revocation_json).collect(),
                )),
                _ => {
                    let mut s = String::new();
                    for r in &list {
                        s.push_str(&format!("{}  {}\n", r.id, r.reason));
                    }
                    if list.is_empty() {
                        s.push_str("no certificate is revoked\n");
                    }
                    output::print_text(&s)
                }
            }
        }
        CertCommand::Show(_) | CertCommand::Verify(_) => unreachable!("offline verbs"),
    }
    Ok(Exit::Ok)
}

/// The evidence files into `dir`: names from the coordinator are checked
/// (a plain file name) before anything is written.
fn write_evidence(dir: &Path, files: &[gpuctl_proto::pb::EvidenceFile]) -> Result<()> {
    for f in files {
        let plain = !f.name.is_empty()
            && !f.name.starts_with('.')
            && f.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !plain {
            anyhow::bail!(
                "the coordinator named an evidence file `{}`: refused",
                f.name
            );
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("--evidence {}", dir.display()))?;
    for f in files {
        let path = dir.join(&f.name);
        std::fs::write(&path, &f.data).with_context(|| format!("{}", path.display()))?;
    }
    Ok(())
}
