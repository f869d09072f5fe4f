//! `gpuctl certs init`: the certificates of a fleet with mutual TLS (rcgen).
//! A CA; the coordinator's server certificate (its names, localhost and
//! 127.0.0.1); one client certificate per node whose common name and DNS
//! name are the node name (the coordinator checks an agent's name against
//! it); one for the operator's CLI. A CA already in the folder is reused, so
//! running it again with new `--nodes` adds their certificates; files that
//! exist are kept, never overwritten. Keys are written 0600.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

use crate::error::UsageError;
use crate::exit::Exit;

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a CA, the coordinator's certificate and one per node (and the CLI's).
    Init(CertsInitArgs),
}

#[derive(Debug, Args)]
pub struct CertsInitArgs {
    /// Folder for the files (ca.pem, coordinator.pem/.key, node-NAME.pem/.key, cli.pem/.key);
    /// a CA already there is reused and existing files are kept.
    #[arg(long)]
    pub dir: PathBuf,
    /// Node names, comma-separated: one client certificate each.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Host names and IP addresses agents and the CLI reach the coordinator at,
    /// comma-separated (localhost and 127.0.0.1 are always included).
    #[arg(long, value_delimiter = ',')]
    pub coordinator_names: Vec<String>,
}

/// The operator's client certificate's name; no node may take it.
pub const OPERATOR: &str = "gpuctl-operator";

/// Years a certificate is valid from the start of this year.
const YEARS: i32 = 5;

pub fn init(a: &CertsInitArgs) -> Result<Exit> {
    let nodes = names("--nodes", &a.nodes)?;
    if let Some(n) = nodes.iter().find(|n| *n == OPERATOR) {
        return Err(
            UsageError(format!("--nodes: `{n}` is the operator certificate's name")).into(),
        );
    }
    let mut server_names = names("--coordinator-names", &a.coordinator_names)?;
    for default in ["localhost", "127.0.0.1"] {
        if !server_names.iter().any(|n| n == default) {
            server_names.push(default.to_string());
        }
    }
    std::fs::create_dir_all(&a.dir)
        .with_context(|| format!("cannot create --dir {}", a.dir.display()))?;
    let out = Out { dir: &a.dir };

    let (ca_cert, ca_key) = (out.path("ca.pem"), out.path("ca.key"));
    let issuer = if ca_cert.exists() && ca_key.exists() {
        let key = KeyPair::from_pem(&read(&ca_key)?).context("ca.key")?;
        let issuer = Issuer::from_ca_cert_pem(&read(&ca_cert)?, key).context("ca.pem")?;
        println!("using the CA in {}", ca_cert.display());
        issuer
    } else {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "gpuctl CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        validity(&mut params, 2 * YEARS);
        let cert = params.self_signed(&key)?;
        out.write("ca.pem", &cert.pem(), false)?;
        out.write("ca.key", &key.serialize_pem(), true)?;
        Issuer::new(params, key)
    };

    out.leaf(
        &issuer,
        "coordinator",
        "gpuctl coordinator",
        &server_names,
        &[ExtendedKeyUsagePurpose::ServerAuth],
        None,
    )?;
    for node in &nodes {
        // Server too: an agent's `--metrics-tls` serves /metrics with it.
        out.leaf(
            &issuer,
            &format!("node-{node}"),
            node,
            std::slice::from_ref(node),
            &[
                ExtendedKeyUsagePurpose::ClientAuth,
                ExtendedKeyUsagePurpose::ServerAuth,
            ],
            Some(node),
        )?;
    }
    out.leaf(
        &issuer,
        "cli",
        OPERATOR,
        &[OPERATOR.to_string()],
        &[ExtendedKeyUsagePurpose::ClientAuth],
        None,
    )?;

    let d = a.dir.display();
    println!(
        "\ncoordinator: gpuctl-coordinator --listen 0.0.0.0:7070 --tls-cert {d}/coordinator.pem --tls-key {d}/coordinator.key --client-ca {d}/ca.pem [--tokens FILE]\n\
         agent NAME:  gpuctl-agent --coordinator https://HOST:7070 --name NAME --tls-ca {d}/ca.pem --tls-cert {d}/node-NAME.pem --tls-key {d}/node-NAME.key\n\
         CLI:         export GPUCTL_COORDINATOR=https://HOST:7070 GPUCTL_TLS_CA={d}/ca.pem GPUCTL_TOKEN=...\n\
         Copy each node only its own node-NAME.key; ca.key stays with whoever issues certificates."
    );
    Ok(Exit::Ok)
}

/// A comma-separated list of names, each checked.
fn names(flag: &str, list: &[String]) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for n in list.iter().flat_map(|s| s.split(',')).map(str::trim) {
        if n.is_empty() {
            continue;
        }
        let ok = n.len() <= 253
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'));
        if !ok {
            return Err(UsageError(format!(
                "{flag}: `{n}` is not a host or node name (letters, digits, `-`, `.`, `_`)"
            ))
            .into());
        }
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

/// From the start of last year (clocks disagree) for `years`.
fn validity(params: &mut CertificateParams, years: i32) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let year = 1970 + (now / 31_556_952) as i32;
    params.not_before = rcgen::date_time_ymd(year - 1, 1, 1);
    params.not_after = rcgen::date_time_ymd(year + years, 1, 1);
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

struct Out<'a> {
    dir: &'a Path,
}

impl Out<'_> {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes a new file; one that exists is kept and said so.
    fn write(&self, name: &str, text: &str, secret: bool) -> Result<()> {
        let path = self.path(name);
        let mut f = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(if secret { 0o600 } else { 0o644 })
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                println!("kept    {} (exists)", path.display());
                return Ok(());
            }
            Err(e) => bail!("cannot create {}: {e}", path.display()),
        };
        f.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote   {}", path.display());
        Ok(())
    }

    /// `{stem}.pem` and `{stem}.key`, unless the certificate exists. A
    /// node's certificate (`node`) also carries its role,
    /// `urn:gpuctl:node:NAME`: the coordinator takes no other as a node's
    /// identity.
    fn leaf(
        &self,
        issuer: &Issuer<'_, KeyPair>,
        stem: &str,
        common_name: &str,
        sans: &[String],
        usages: &[ExtendedKeyUsagePurpose],
        node: Option<&str>,
    ) -> Result<()> {
        let (pem, key_file) = (format!("{stem}.pem"), format!("{stem}.key"));
        if self.path(&pem).exists() || self.path(&key_file).exists() {
            println!("kept    {} (exists)", self.path(&pem).display());
            return Ok(());
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(sans.to_vec())
            .with_context(|| format!("a certificate for {sans:?}"))?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        if let Some(node) = node {
            let uri = format!("{}{node}", gpuctl_core::auth::NODE_URI_PREFIX);
            params.subject_alt_names.push(SanType::URI(
                uri.as_str()
                    .try_into()
                    .with_context(|| format!("`{uri}` as a certificate URI"))?,
            ));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        validity(&mut params, YEARS);
        let cert = params.signed_by(&key, issuer)?;
        self.write(&key_file, &key.serialize_pem(), true)?;
        self.write(&pem, &cert.pem(), false)?;
        Ok(())
    }
}
