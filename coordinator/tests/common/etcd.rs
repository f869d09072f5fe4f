//! A real etcd for the tests of `--store etcd` (Debian's `etcd-server`,
//! started as a child process on free loopback ports, killed on drop), and
//! `gpuctl-coordinator --store etcd` processes on it.
//! etcd must be installed: tests that use it fail (they do not skip) without it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_coordinator::store::etcd::EtcdStore;
use gpuctl_coordinator::store::etcd_access::EtcdAccess;

const INSTALL: &str = "etcd is not installed (no `etcd` on PATH): these tests need a real etcd. \
     Install it with `apt-get install -y etcd-server` (Debian/Ubuntu; .ci/run does this), \
     or put an etcd v3 binary on PATH";

pub use gpuctl_testkit::free_port;

/// One etcd server, killed on drop.
pub struct Etcd {
    pub url: String,
    child: Child,
    dir: tempfile::TempDir,
    /// How a client reaches it (TLS files, a user).
    pub access: EtcdAccess,
    /// The coordinator flags that say the same.
    pub coordinator_args: Vec<String>,
}

/// Files of an etcd served over TLS: its CA, its server certificate and
/// key, and a client certificate and key the CA signed.
pub struct EtcdTls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Etcd {
    pub async fn start() -> Etcd {
        Self::start_with(None).await
    }

    /// Over TLS, with `--client-cert-auth`: only clients with a certificate
    /// of `tls.ca` are answered.
    pub async fn start_with(tls: Option<&EtcdTls>) -> Etcd {
        match Command::new("etcd").arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!(
                "{INSTALL}\n(`etcd --version` failed: {})",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => panic!("{INSTALL}\n({e})"),
        }
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://127.0.0.1:{client}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        let mut cmd = Command::new("etcd");
        if std::env::consts::ARCH == "aarch64" {
            // etcd 3.4 runs on arm64 only when told to.
            cmd.env("ETCD_UNSUPPORTED_ARCH", "arm64");
        }
        let child = cmd
            .arg("--name")
            .arg("gpuctl-test")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(tls.map_or_else(Vec::new, |t| {
                vec![
                    "--cert-file".into(),
                    t.server_cert.display().to_string(),
                    "--key-file".into(),
                    t.server_key.display().to_string(),
                    "--trusted-ca-file".into(),
                    t.ca.display().to_string(),
                    "--client-cert-auth".into(),
                ]
            }))
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer}"),
                "--initial-cluster",
                &format!("gpuctl-test=http://127.0.0.1:{peer}"),
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{INSTALL}\n({e})"));
        let access = tls.map_or_else(EtcdAccess::default, |t| EtcdAccess {
            ca: Some(t.ca.clone()),
            cert: Some(t.client_cert.clone()),
            key: Some(t.client_key.clone()),
            ..Default::default()
        });
        let coordinator_args = tls.map_or_else(Vec::new, |t| {
            vec![
                "--etcd-ca".into(),
                t.ca.display().to_string(),
                "--etcd-cert".into(),
                t.client_cert.display().to_string(),
                "--etcd-key".into(),
                t.client_key.display().to_string(),
            ]
        });
        let mut etcd = Etcd {
            url,
            child,
            dir,
            access,
            coordinator_args,
        };
        etcd.wait_ready().await;
        etcd
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    async fn wait_ready(&mut self) {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("etcd exited ({status}) at start:\n{}", self.log());
            }
            if EtcdStore::connect_with(&self.url, "/", &self.access)
                .await
                .is_ok()
            {
                return;
            }
            if started.elapsed() > Duration::from_secs(30) {
                panic!(
                    "etcd did not answer on {} in 30 s:\n{}",
                    self.url,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn coordinator_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpuctl-coordinator"))
}

/// Where cargo put the workspace's other binaries (the agent, the CLI).
pub fn bin(name: &str) -> PathBuf {
    let p = coordinator_bin().parent().unwrap().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` before this test",
        p.display()
    );
    p
}

/// `gpuctl --coordinator URLS ARGS...`, with nothing from the test's environment.
pub fn gpuctl(urls: &str, args: &[&str]) -> std::process::Output {
    Command::new(bin("gpuctl"))
        .args(["--coordinator", urls])
        .args(args)
        .env_remove("GPUCTL_COORDINATOR")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run gpuctl")
}

/// A `gpuctl-coordinator --store etcd` process; stderr goes to `log`.
pub struct Coordinator {
    pub child: Child,
    log: PathBuf,
    /// The `listening on` line, once printed (once it leads).
    pub url: std::sync::mpsc::Receiver<String>,
}

impl Coordinator {
    pub fn start(etcd: &Etcd, prefix: &str, dir: &Path, name: &str) -> Coordinator {
        Self::start_on(etcd, prefix, dir, name, "127.0.0.1:0")
    }

    /// Listening on `listen` (a fixed port, to be asked while it stands by).
    pub fn start_on(
        etcd: &Etcd,
        prefix: &str,
        dir: &Path,
        name: &str,
        listen: &str,
    ) -> Coordinator {
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(coordinator_bin())
            .args(["--listen", listen, "--metrics-listen", "off"])
            .args([
                "--store",
                "etcd",
                "--etcd",
                &etcd.url,
                "--etcd-prefix",
                prefix,
            ])
            .args(&etcd.coordinator_args)
            .arg("--data-dir")
            .arg(dir.join(name))
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start gpuctl-coordinator");
        let stdout = child.stdout.take().unwrap();
        let (tx, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(u) = line.strip_prefix("listening on ") {
                    let _ = tx.send(u.trim().to_string());
                }
            }
        });
        Coordinator { child, log, url }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the `listening on` line.
    pub fn serving(&mut self, within: Duration) -> String {
        match self.url.recv_timeout(within) {
            Ok(url) => url,
            Err(_) => {
                let status = self.child.try_wait().ok().flatten();
                panic!(
                    "coordinator did not start serving within {within:?} (exited: {status:?}):\n{}",
                    self.log()
                )
            }
        }
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "coordinator did not stop on SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
