//! The coordinator's `/metrics`: Prometheus text exposition (format 0.0.4) of
//! the fleet and job counts and the ingest counters, on `--metrics-listen`.
//! Values come from the scheduler task at scrape time (one event), so the
//! numbers are one consistent snapshot. The HTTP side is a few lines over
//! tokio: a scrape is one GET with no body, and a dependency on a web
//! framework would buy nothing here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::debug;

use crate::scheduler::{Event, SchedulerHandle, Snapshot};

const NODE_STATES: &[&str] = &["ready", "busy", "lost"];
const JOB_STATES: &[&str] = &["pending", "running", "succeeded", "failed", "cancelled"];

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl Snapshot {
    pub fn render(&self) -> String {
        let mut o = String::new();
        // Zero series stay present so that dashboards and alerts see a value.
        let by_state = |o: &mut String, name: &str, all: &[&str], m: &BTreeMap<&str, u64>| {
            for s in all {
                let _ = writeln!(o, "{name}{{state=\"{s}\"}} {}", m.get(s).unwrap_or(&0));
            }
            for (s, n) in m.iter().filter(|(s, _)| !all.contains(s)) {
                let _ = writeln!(o, "{name}{{state=\"{s}\"}} {n}");
            }
        };
        family(
            &mut o,
            "gpuctl_nodes",
            "gauge",
            "Registered nodes by state.",
        );
        by_state(&mut o, "gpuctl_nodes", NODE_STATES, &self.nodes);
        family(&mut o, "gpuctl_jobs", "gauge", "Jobs by state.");
        by_state(&mut o, "gpuctl_jobs", JOB_STATES, &self.jobs);
        for (name, help, v) in [
            (
                "gpuctl_jobs_submitted_total",
                "Jobs accepted by Submit since the coordinator started.",
                self.submitted,
            ),
            (
                "gpuctl_results_ingested_total",
                "Rank results stored since the coordinator started.",
                self.results,
            ),
            (
                "gpuctl_telemetry_samples_ingested_total",
                "GPU telemetry samples taken into running jobs since the coordinator started.",
                self.samples,
            ),
            (
                "gpuctl_worker_logs_lines_total",
                "Worker log lines received since the coordinator started.",
                self.log_lines,
            ),
        ] {
            family(&mut o, name, "counter", help);
            let _ = writeln!(o, "{name} {v}");
        }
        family(
            &mut o,
            "gpuctl_rendezvous_keys",
            "gauge",
            "Rendezvous keys held for running jobs.",
        );
        let _ = writeln!(o, "gpuctl_rendezvous_keys {}", self.rendezvous_keys);
        o
    }
}

/// Serves `/metrics` on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    sched: SchedulerHandle,
    mut shutdown: watch::Receiver<bool>,
) {
    // The `Ref` that `wait_for` yields is not Send: drop it inside this future.
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    tokio::pin!(stop);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => {
                    let sched = sched.clone();
                    tokio::spawn(async move {
                        if let Err(e) = answer(conn, sched).await {
                            debug!("metrics connection: {e}");
                        }
                    });
                }
                Err(e) => {
                    debug!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = &mut stop => return,
        }
    }
}

/// Reads one request head and answers it; the connection then closes.
async fn answer(mut conn: TcpStream, sched: SchedulerHandle) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            let n = conn.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    // A client that never finishes its request does not hold a task forever.
    if tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .is_err()
    {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&head);
    let mut words = text.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => match sched.ask(|reply| Event::Metrics { reply }).await {
            Ok(snap) => ("200 OK", snap.render()),
            Err(_) => ("503 Service Unavailable", "coordinator stopping\n".into()),
        },
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "gpuctl-coordinator serves /metrics\n".into(),
        ),
        _ => ("405 Method Not Allowed", "GET /metrics\n".into()),
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        resp.push_str(&body);
    }
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_has_help_type_and_zero_states() {
        let mut s = Snapshot {
            submitted: 3,
            rendezvous_keys: 2,
            ..Default::default()
        };
        s.nodes.insert("ready", 2);
        s.jobs.insert("failed", 1);
        let t = s.render();
        for line in [
            "gpuctl_nodes{state=\"ready\"} 2",
            "gpuctl_nodes{state=\"lost\"} 0",
            "gpuctl_jobs{state=\"failed\"} 1",
            "gpuctl_jobs{state=\"running\"} 0",
            "gpuctl_jobs_submitted_total 3",
            "gpuctl_results_ingested_total 0",
            "gpuctl_telemetry_samples_ingested_total 0",
            "gpuctl_worker_logs_lines_total 0",
            "gpuctl_rendezvous_keys 2",
            "# TYPE gpuctl_jobs_submitted_total counter",
            "# TYPE gpuctl_nodes gauge",
        ] {
            assert!(t.lines().any(|l| l == line), "missing `{line}` in\n{t}");
        }
    }
}
