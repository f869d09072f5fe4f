//! Who may call what (docs/operations.md, "Security"): CLI bearer tokens with
//! the roles `read` and `operate`, an agent's node name against its client
//! certificate, and a worker's per-rank secret against the job, attempt and
//! rank it speaks for. Checks return the `Status` the caller gets, worded so
//! that the refused party learns why.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context};
use gpuctl_core::auth::{RankKey, AUTHORIZATION, RANK_SECRET};
use gpuctl_core::server::ServerTls;
use subtle::ConstantTimeEq;
use tonic::{Request, Status};
use tracing::{info, warn};

use crate::config::Config;
use crate::store::StateStore;

/// What a token allows. `Operate` includes `Read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Nodes, jobs, reports, logs, fleet, baselines (list and show), plans.
    Read,
    /// Submit, cancel, save and delete baselines, remove nodes.
    Operate,
}

impl Role {
    fn parse(text: &str) -> Option<Role> {
        match text {
            "read" => Some(Role::Read),
            "operate" => Some(Role::Operate),
            _ => None,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
        }
    }
}

/// One line of the tokens file.
#[derive(Debug, Clone)]
struct Token {
    role: Role,
    secret: String,
    name: String,
}

/// The `--tokens` file: lines `ROLE TOKEN [NAME]`; `#` starts a comment.
#[derive(Debug, Clone, Default)]
pub struct Tokens(Vec<Token>);

impl Tokens {
    pub fn load(path: &Path) -> anyhow::Result<Tokens> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--tokens: cannot read {}", path.display()))?;
        Tokens::parse(&text).with_context(|| format!("--tokens {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Tokens> {
        let mut tokens = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (role, secret) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            let Some(role) = Role::parse(role) else {
                bail!("line {}: `{role}` is not a role; write `read TOKEN [NAME]` or `operate TOKEN [NAME]`", i + 1);
            };
            if secret.len() < 16 {
                bail!(
                    "line {}: the token is shorter than 16 characters; use e.g. `openssl rand -hex 24`",
                    i + 1
                );
            }
            let name = words.collect::<Vec<_>>().join(" ");
            tokens.push(Token {
                role,
                secret: secret.to_string(),
                name: if name.is_empty() {
                    format!("line {}", i + 1)
                } else {
                    name
                },
            });
        }
        if tokens.is_empty() {
            bail!("no tokens in the file: every CLI call would be refused");
        }
        Ok(Tokens(tokens))
    }

    /// The token whose secret is `presented`, compared in constant time.
    fn find(&self, presented: &str) -> Option<&Token> {
        let mut found = None;
        for t in &self.0 {
            if bool::from(t.secret.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(t);
            }
        }
        found
    }
}

/// Everything the services check, loaded once at start.
#[derive(Clone)]
pub struct Security {
    /// `None`: the JobService is open to anyone who reaches the port.
    tokens: Option<Arc<Tokens>>,
    /// A client CA is configured: agents must present a certificate for their name.
    agent_certs: bool,
    tls: bool,
    rank_key: RankKey,
}

/// A client's certificate chain, as `tonic::Request::peer_certs` gives it.
pub type PeerCerts = Arc<Vec<tonic::transport::CertificateDer<'static>>>;

impl Security {
    /// Reads the tokens file and the secrets key (creating it in the store
    /// on the first start), and says at start what is and is not protected.
    pub async fn load(cfg: &Config, store: &StateStore, addr: SocketAddr) -> anyhow::Result<Self> {
        let tokens = match &cfg.tokens {
            Some(path) => {
                let t = Tokens::load(path)?;
                info!(file = %path.display(), tokens = t.0.len(), "CLI calls need a token");
                Some(Arc::new(t))
            }
            None => {
                warn!("no --tokens: anyone who reaches {addr} may submit and cancel jobs");
                None
            }
        };
        if cfg.tls_cert.is_none() && !addr.ip().is_loopback() {
            warn!(
                "PLAINTEXT on {addr}, a non-loopback address: tokens and worker secrets travel in clear text and agents are not authenticated; pass --tls-cert/--tls-key/--client-ca (`gpuctl certs init` makes them)"
            );
        }
        let rank_key = store
            .rank_key()
            .await
            .context("reading the worker secrets key from the store")?;
        Ok(Security {
            tokens,
            agent_certs: cfg.client_ca.is_some(),
            tls: cfg.tls_cert.is_some(),
            rank_key,
        })
    }

    /// The server's TLS from `--tls-cert/--tls-key/--client-ca`, if any.
    pub fn server_tls(cfg: &Config) -> anyhow::Result<Option<ServerTls>> {
        match (&cfg.tls_cert, &cfg.tls_key) {
            (Some(cert), Some(key)) => {
                gpuctl_core::server::tls_config(cert, key, cfg.client_ca.as_deref())
                    .map(Some)
                    .map_err(anyhow::Error::msg)
            }
            (None, None) if cfg.client_ca.is_some() => {
                bail!("--client-ca needs --tls-cert and --tls-key")
            }
            (None, None) => Ok(None),
            _ => bail!("--tls-cert and --tls-key go together"),
        }
    }

    /// Refuses a CLI call whose token is missing, unknown or of a lesser role.
    pub fn allow<T>(&self, req: &Request<T>, need: Role) -> Result<(), Status> {
        let Some(tokens) = &self.tokens else {
            return Ok(());
        };
        let presented = req
            .metadata()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|v| !v.is_empty());
        let Some(presented) = presented else {
            return Err(Status::unauthenticated(
                "this coordinator needs a token: set GPUCTL_TOKEN (ask its operator for one)",
            ));
        };
        let Some(token) = tokens.find(presented) else {
            return Err(Status::unauthenticated(
                "the token in GPUCTL_TOKEN is not one this coordinator knows",
            ));
        };
        if token.role < need {
            return Err(Status::permission_denied(super::clip(format!(
                "this needs a token with the `{}` role; `{}` has `{}`",
                need.label(),
                token.name,
                token.role.label()
            ))));
        }
        Ok(())
    }

    /// Whether gRPC is served over TLS (the URL workers get is `https://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// With a client CA: refuses an agent whose certificate (`peer_certs`
    /// of its request) is missing or names another node.
    pub fn check_agent(&self, certs: Option<&PeerCerts>, node: &str) -> Result<(), Status> {
        if !self.agent_certs {
            return Ok(());
        }
        let certs = certs.filter(|c| !c.is_empty()).ok_or_else(|| {
            Status::permission_denied(super::clip(format!(
                "agent `{node}` presented no client certificate; this coordinator needs one naming the node (gpuctl-agent --tls-cert/--tls-key, made by `gpuctl certs init`)"
            )))
        })?;
        let der = certs[0].as_ref();
        if node_roles(der).iter().any(|n| n == node) {
            return Ok(());
        }
        let names = cert_names(der);
        if names.iter().any(|n| n == node) {
            return Err(Status::permission_denied(super::clip(format!(
                "agent `{node}` presented a certificate named `{node}` that is not a node's (no {}{node} in it: an operator's or server's certificate is no node identity); make the node's with `gpuctl certs init --nodes {node}`",
                gpuctl_core::auth::NODE_URI_PREFIX
            ))));
        }
        Err(Status::permission_denied(super::clip(format!(
            "agent `{node}` presented the certificate of `{}`; a node registers only with its own certificate",
            names.first().map(String::as_str).unwrap_or("(no name)")
        ))))
    }

    /// The secret of one rank of a job attempt, for its assignment.
    pub fn rank_key(&self) -> &RankKey {
        &self.rank_key
    }

    /// Refuses a worker call without a secret of this job attempt, or (with
    /// `rank`) without that rank's secret. Returns the secret's rank.
    pub fn check_worker<T>(
        &self,
        req: &Request<T>,
        job: &str,
        attempt: u32,
        rank: Option<u32>,
    ) -> Result<u32, Status> {
        let whose = || match rank {
            Some(r) => format!("rank {r}'s worker"),
            None => "a worker of the job".to_string(),
        };
        let presented = req
            .metadata()
            .get(RANK_SECRET)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let Some(owner) = self.rank_key.verify(job, attempt, presented) else {
            return Err(Status::permission_denied(super::clip(format!(
                "refused, not from {}: {} ({job} attempt {attempt})",
                whose(),
                if presented.is_empty() {
                    "the call carries no worker secret"
                } else {
                    "the worker secret is not one of this job attempt"
                }
            ))));
        };
        match rank {
            Some(r) if r != owner => Err(Status::permission_denied(super::clip(format!(
                "refused, not from rank {r}'s worker: the secret is rank {owner}'s ({job} attempt {attempt})"
            )))),
            _ => Ok(owner),
        }
    }
}

/// The nodes a certificate is made for: its `urn:gpuctl:node:NAME` URIs.
fn node_roles(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::*;
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => u.strip_prefix(gpuctl_core::auth::NODE_URI_PREFIX),
            _ => None,
        })
        .map(str::to_string)
        .collect()
}

/// The names a certificate carries: subject common names, then DNS names of
/// its subject alternative names.
fn cert_names(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::*;
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let GeneralName::DNSName(d) = n {
                names.push(d.to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_roles_and_refuse_bad_lines() {
        let t = Tokens::parse(
            "# who may do what\nread  0123456789abcdef0123 alice\noperate fedcba9876543210fedc\n",
        )
        .unwrap();
        assert_eq!(t.find("0123456789abcdef0123").unwrap().role, Role::Read);
        assert_eq!(t.find("0123456789abcdef0123").unwrap().name, "alice");
        assert_eq!(t.find("fedcba9876543210fedc").unwrap().name, "line 3");
        assert!(t.find("nope").is_none());
        let e = Tokens::parse("admin 0123456789abcdef0123").unwrap_err();
        assert!(e.to_string().contains("`admin` is not a role"), "{e}");
        let e = Tokens::parse("read short").unwrap_err();
        assert!(e.to_string().contains("shorter than 16"), "{e}");
        assert!(Tokens::parse("# nothing\n").is_err());
    }
}
