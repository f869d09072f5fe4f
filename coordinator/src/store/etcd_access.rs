//! How the etcd store reaches etcd safely: TLS (`--etcd-ca`, and a client
//! certificate with `--etcd-cert`/`--etcd-key` for an etcd started with
//! `--client-cert-auth`) and etcd's own authentication (`--etcd-user` with
//! the password in `--etcd-password-file`, never on the command line).
//! Without them anyone who reaches etcd reads and writes gpuctl's state.

use std::path::{Path, PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use super::backend::{StoreError, StoreResult};

/// The flags that say how to reach etcd; all optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// CA that signed etcd's server certificate: speak TLS (`https://` URLs).
    pub ca: Option<PathBuf>,
    /// This coordinator's client certificate and key for etcd.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// etcd user, with the password read from `password_file`.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
}

/// Longest password file read: a password, not a log.
const MAX_PASSWORD_BYTES: u64 = 4096;

fn read(path: &Path, flag: &str) -> StoreResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| StoreError::Backend(format!("{flag} {}: {e}", path.display())))
}

impl EtcdAccess {
    /// Whether etcd is reached over TLS.
    pub fn tls(&self) -> bool {
        self.ca.is_some() || self.cert.is_some()
    }

    /// `options` with TLS and credentials laid on, or the flag at fault.
    pub fn apply(&self, mut options: ConnectOptions) -> StoreResult<ConnectOptions> {
        if self.tls() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca {
                tls = tls.ca_certificate(Certificate::from_pem(read(ca, "--etcd-ca")?));
            }
            match (&self.cert, &self.key) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(Identity::from_pem(
                        read(cert, "--etcd-cert")?,
                        read(key, "--etcd-key")?,
                    ));
                }
                (None, None) => {}
                _ => {
                    return Err(StoreError::Backend(
                        "--etcd-cert and --etcd-key go together: give both or neither".into(),
                    ))
                }
            }
            options = options.with_tls(tls);
        }
        match (&self.user, &self.password_file) {
            (Some(user), Some(file)) => {
                let len = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
                if len > MAX_PASSWORD_BYTES {
                    return Err(StoreError::Backend(format!(
                        "--etcd-password-file {}: {len} bytes; a password file holds one line",
                        file.display()
                    )));
                }
                let text = String::from_utf8(read(file, "--etcd-password-file")?).map_err(|_| {
                    StoreError::Backend(format!(
                        "--etcd-password-file {}: not UTF-8 text",
                        file.display()
                    ))
                })?;
                let password = text.trim_end_matches(['\n', '\r']);
                if password.is_empty() {
                    return Err(StoreError::Backend(format!(
                        "--etcd-password-file {} is empty",
                        file.display()
                    )));
                }
                options = options.with_user(user.clone(), password.to_string());
            }
            (None, None) => {}
            (Some(_), None) => {
                return Err(StoreError::Backend(
                    "--etcd-user needs --etcd-password-file FILE (the password, never on the command line)".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(StoreError::Backend(
                    "--etcd-password-file needs --etcd-user NAME".into(),
                ))
            }
        }
        Ok(options)
    }

    /// What to tell the operator when etcd refused this coordinator.
    pub fn hint(&self, error: &str) -> &'static str {
        let e = error.to_ascii_lowercase();
        if e.contains("user name is empty")
            || e.contains("authentication failed")
            || e.contains("permission denied")
            || e.contains("invalid auth token")
        {
            if self.user.is_some() {
                "etcd refused the user: check --etcd-user, --etcd-password-file and the user's role on the prefix"
            } else {
                "etcd has authentication on: give --etcd-user NAME and --etcd-password-file FILE"
            }
        } else if !self.tls() {
            "if etcd serves TLS, give https:// URLs with --etcd-ca (and --etcd-cert/--etcd-key for client-cert-auth)"
        } else {
            "check --etcd-ca (the CA of etcd's server certificate) and --etcd-cert/--etcd-key"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_that_go_together_are_checked_and_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret\n").unwrap();
        let ok = EtcdAccess {
            user: Some("root".into()),
            password_file: Some(pw.clone()),
            ..Default::default()
        };
        assert!(ok.apply(ConnectOptions::new()).is_ok());
        let e = |a: EtcdAccess| match a.apply(ConnectOptions::new()) {
            Err(StoreError::Backend(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(e(EtcdAccess {
            user: Some("root".into()),
            ..Default::default()
        })
        .contains("--etcd-password-file"));
        assert!(e(EtcdAccess {
            password_file: Some(pw),
            ..Default::default()
        })
        .contains("--etcd-user"));
        assert!(e(EtcdAccess {
            cert: Some(dir.path().join("c.pem")),
            ..Default::default()
        })
        .contains("go together"));
        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        assert!(e(EtcdAccess {
            user: Some("root".into()),
            password_file: Some(dir.path().join("empty")),
            ..Default::default()
        })
        .contains("is empty"));
        let no_user = EtcdAccess::default();
        assert!(no_user
            .hint("etcdserver: user name is empty")
            .contains("--etcd-user"));
        assert!(no_user.hint("connection refused").contains("--etcd-ca"));
    }
}
