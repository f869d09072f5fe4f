//! A coordinator out of file descriptors (each agent holds a connection,
//! each worker one for its job): a real coordinator process under a low
//! open-files limit, more connections than it can take. It must say so,
//! naming the limit and the fix, wait between attempts instead of retrying
//! at full CPU, and serve again once connections close.

mod common;

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::etcd::coordinator_bin;
use gpuctl_proto::pb::job_service_client::JobServiceClient;
use gpuctl_proto::pb::ListNodesRequest;

const LIMIT: u64 = 64;

/// Kills the coordinator when the test ends, passed or not.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU seconds the process has used (user + system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf reads a constant.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_it_warns_naming_the_limit_waits_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("coordinator.log");
    let mut cmd = Command::new(coordinator_bin());
    cmd.args(["--listen", "127.0.0.1:0", "--metrics-listen", "off"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: setrlimit is async-signal-safe, and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = Killed(cmd.spawn().expect("start gpuctl-coordinator"));
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let url = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(u) = l.strip_prefix("listening on ") {
                    break u.trim().to_string();
                }
            }
            _ => panic!(
                "the coordinator did not start under {LIMIT} open files:\n{}",
                read_log()
            ),
        }
    };
    let addr = url.trim_start_matches("http://").to_string();
    let pid = child.0.id();

    // Bare TCP connections: each one the coordinator takes costs it a
    // descriptor, and the kernel completes the rest from its listen backlog
    // (so not many more than the limit: past the backlog, connecting hangs).
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let held: Vec<TcpStream> = (0..LIMIT + 32)
        .map(|i| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("connection {i}: {e}"))
        })
        .collect();
    let t = Instant::now();
    while !read_log().contains("cannot accept connections") {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "no warning after {} connections to a coordinator allowed {LIMIT} files:\n{}",
            held.len(),
            read_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let warning = read_log();
    let warning = warning
        .lines()
        .find(|l| l.contains("cannot accept connections"))
        .unwrap()
        .to_string();
    assert!(
        warning.contains(&format!("open_files_limit={LIMIT}")) && warning.contains("ulimit -n"),
        "the warning names the limit and how to raise it: {warning}"
    );

    // Out of descriptors, the accept loop waits between attempts: retried
    // at once (tonic's own loop), it took a whole CPU.
    let before = cpu_seconds(pid);
    let wall = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used = cpu_seconds(pid) - before;
    let share = used / wall.elapsed().as_secs_f64();
    assert!(
        share < 0.3,
        "the coordinator used {used:.2} CPU s in {:.1} s while it could accept nothing",
        wall.elapsed().as_secs_f64()
    );

    // Connections gone, it serves again.
    drop(held);
    if let Err(e) = answers_within(&url, Duration::from_secs(15)).await {
        panic!(
            "no answer 15 s after the connections closed: {e}\n{}",
            read_log()
        );
    }

    // Issue 35: connections that never say anything, held open by their
    // peer, are closed by the coordinator (10 s to send a first byte), and
    // it serves again while their peer still holds them.
    let silent: Vec<TcpStream> = (0..LIMIT + 32)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok())
        .collect();
    if let Err(e) = answers_within(&url, Duration::from_secs(30)).await {
        panic!(
            "no answer 30 s after {} silent connections were opened, still held: {e}",
            silent.len()
        );
    }
    drop(silent);
}

/// Whether the coordinator at `url` answers `ListNodes` within `limit`,
/// asking again on a fresh connection every half second; the last error.
async fn answers_within(url: &str, limit: Duration) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let answer = async {
            let ch = gpuctl_core::client::builder(url)
                .request_timeout(Duration::from_secs(2))
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            JobServiceClient::new(ch)
                .list_nodes(ListNodesRequest::default())
                .await
                .map_err(|s| s.to_string())
        }
        .await;
        match answer {
            Ok(_) => return Ok(()),
            Err(e) if t.elapsed() >= limit => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}
