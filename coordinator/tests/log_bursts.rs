//! A fleet that goes away at once: 60 agents' sessions end in the same
//! moment, and the coordinator's log says the first of them one by one and
//! the rest in a line that counts them, every node counted once.

mod common;

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use common::start;
use gpuctl_testkit::agent::register;
use gpuctl_testkit::{host, FakeAgent};

/// Everything the coordinator logged, as text.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Captured;

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap()).to_string()
}

/// The `count=N` of each summary line of sessions closed.
fn summarised(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains("more agent sessions closed"))
        .map(|l| {
            let at = l.find("count=").expect("a count") + "count=".len();
            let digits: String = l[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().expect("a number")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_going_away_is_said_in_a_few_lines_that_count_every_node() {
    tracing_subscriber::fmt()
        .with_writer(|| Captured)
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let dir = tempfile::tempdir().unwrap();
    let coord = start(dir.path(), Duration::from_secs(60)).await;
    let mut agents = Vec::new();
    for i in 0..60 {
        let name = format!("gone-{i:02}");
        let (client, _) = register(&coord.url, &name, host::cpu(&name, 1), vec![]).await;
        agents.push(FakeAgent::session(client, &name).await);
    }
    // Each agent's session ends with its last sender.
    for mut a in agents {
        a.stop_heartbeats();
    }
    let mut text = log();
    for _ in 0..100 {
        let each = text.matches("agent session closed").count() as u64;
        if each + summarised(&text).iter().sum::<u64>() >= 60 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        text = log();
    }
    let each = text.matches("agent session closed").count() as u64;
    let summaries = summarised(&text);
    // 20 a second said on their own: 60 ends that straddle a second's
    // turn may have 40 said so.
    assert!((20..=40).contains(&each), "{each} said one by one: {text}");
    assert!(!summaries.is_empty(), "no summary line: {text}");
    assert_eq!(
        each + summaries.iter().sum::<u64>(),
        60,
        "every node counted once: {text}"
    );
    assert!(
        text.contains("nodes=gone-"),
        "a summary names nodes: {text}"
    );
    coord.shutdown().await;
}
