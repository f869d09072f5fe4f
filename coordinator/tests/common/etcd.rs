//! A real etcd for the tests of `--store etcd` (Debian's `etcd-server`,
//! started as a child process on free loopback ports, killed on drop).
//! etcd must be installed: tests that use it fail (they do not skip) without it.

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpuctl_coordinator::store::etcd::EtcdStore;

const INSTALL: &str = "etcd is not installed (no `etcd` on PATH): these tests need a real etcd. \
     Install it with `apt-get install -y etcd-server` (Debian/Ubuntu; .ci/run does this), \
     or put an etcd v3 binary on PATH";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One etcd server, killed on drop.
pub struct Etcd {
    pub url: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl Etcd {
    pub async fn start() -> Etcd {
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
        let url = format!("http://127.0.0.1:{client}");
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
        let mut etcd = Etcd { url, child, dir };
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
            if EtcdStore::connect(&self.url, "/").await.is_ok() {
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
