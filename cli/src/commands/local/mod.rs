//! `gpuctl local up`: a whole fleet on one machine — one coordinator and N agents
//! as child processes on loopback — for trying gpuctl out and for tests. Stays
//! in the foreground; Ctrl-C or SIGTERM stops the agents first (so they can kill
//! their workers), then the coordinator. No child outlives it: every child is in
//! its own process group (so a terminal's Ctrl-C reaches only us and we stop them
//! in order) and gets SIGTERM from the kernel if we die without cleaning up.
//! With `--netns` each agent runs in its own network namespace ([`netns`]).

pub mod args;
mod netns;

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gpuctl_core::clock::Clock;
use gpuctl_core::shutdown::Shutdown;
use gpuctl_proto::pb;

use super::parse::parse_interval;
use crate::client::Coordinator;
use crate::error::UsageError;

pub use self::args::{LocalCommand, LocalUpArgs};

/// How long each kind of child gets between SIGTERM and SIGKILL. Agents need a
/// little over their own 2 s worker grace (architecture.md).
const AGENT_GRACE: Duration = Duration::from_secs(5);
const COORDINATOR_GRACE: Duration = Duration::from_secs(5);
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);

struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
    exited: bool,
}

/// Owns the children; dropping it stops them, so an early error leaves nothing behind.
#[derive(Default)]
struct Supervisor {
    coordinator: Option<Proc>,
    agents: Vec<Proc>,
    /// Removed after every process that uses it has stopped.
    net: Option<netns::Network>,
}

impl Proc {
    fn running(&mut self) -> bool {
        if self.exited {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(_)) | Err(_) => {
                self.exited = true;
                false
            }
            Ok(None) => true,
        }
    }

    fn exit_text(&mut self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.child.try_wait() {
            Ok(Some(st)) => match (st.code(), st.signal()) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(sig)) => format!("was killed by signal {sig}"),
                _ => "exited".into(),
            },
            _ => "exited".into(),
        }
    }

    fn signal(&self, sig: libc::c_int) {
        let pid = self.child.id() as libc::pid_t;
        // The child leads its own process group; signal the group so helpers it
        // left in it go too.
        unsafe {
            if libc::kill(-pid, sig) != 0 {
                libc::kill(pid, sig);
            }
        }
    }
}

/// SIGTERM to all, wait up to `grace`, SIGKILL the rest, reap.
fn stop_all(procs: &mut [&mut Proc], grace: Duration) {
    for p in procs.iter_mut() {
        if p.running() {
            p.signal(libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && procs.iter_mut().any(|p| p.running()) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in procs.iter_mut() {
        if p.running() {
            eprintln!("{} did not stop within {grace:?}; killing it", p.name);
            p.signal(libc::SIGKILL);
        }
        let _ = p.child.wait();
        p.exited = true;
    }
}

impl Supervisor {
    fn stop(&mut self) {
        let mut agents: Vec<&mut Proc> = self.agents.iter_mut().collect();
        stop_all(&mut agents, AGENT_GRACE);
        if let Some(c) = self.coordinator.as_mut() {
            stop_all(&mut [c], COORDINATOR_GRACE);
        }
        if let Some(n) = self.net.as_mut() {
            n.teardown();
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last lines of a child's log, for errors about it.
fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    if tail.is_empty() {
        String::from("  (log is empty)")
    } else {
        tail.iter()
            .map(|l| format!("  | {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn died(p: &mut Proc, while_: &str) -> anyhow::Error {
    let how = p.exit_text();
    anyhow!(
        "{} {how} {while_}; its log {}:\n{}",
        p.name,
        p.log.display(),
        log_tail(&p.log, 20)
    )
}

/// A sibling binary: the override, else the file next to this executable.
fn find_bin(over: Option<PathBuf>, name: &str, flag: &str) -> Result<PathBuf> {
    if let Some(p) = over {
        if p.is_file() {
            return Ok(p);
        }
        return Err(UsageError(format!("{flag}: {} is not a file", p.display())).into());
    }
    let exe = std::env::current_exe().context("finding the gpuctl executable")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let p = dir.join(name);
    if p.is_file() {
        return Ok(p);
    }
    bail!(
        "cannot find {name} next to gpuctl in {}; build it (`cargo build -p {name}`) or pass {flag} PATH",
        dir.display()
    )
}

/// Where the children's logs go. It carries the clock so that the line each
/// log opens with is stamped by the CLI's one clock, not by the system's
/// behind its back.
struct Logs {
    dir: PathBuf,
    clock: Clock,
}

impl Logs {
    /// Opens (appends to) `file` in the folder, stamped with what runs.
    fn open(&self, file: &str, cmd: &Command) -> Result<(PathBuf, File)> {
        let path = self.dir.join(file);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening log {}", path.display()))?;
        let _ = writeln!(
            f,
            "--- gpuctl local up, unix_ms {}: {:?}",
            self.clock.now_ms(),
            cmd
        );
        Ok((path, f))
    }
}

/// Own process group, and SIGTERM when this (single-threaded runtime's main)
/// thread dies, whatever the cause.
fn detach_but_tie(cmd: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

fn start_coordinator(
    a: &LocalUpArgs,
    bin: &Path,
    host: std::net::Ipv4Addr,
    data_dir: &Path,
    logs: &Logs,
) -> Result<(Proc, String)> {
    let mut cmd = Command::new(bin);
    cmd.arg("--listen")
        .arg(format!("{host}:{}", a.port))
        .arg("--data-dir")
        .arg(data_dir.join("coordinator"))
        .arg("--node-timeout")
        .arg(&a.node_timeout);
    pass_through(&mut cmd, &a.coordinator_arg);
    // Its output goes to a file: no colour escapes there.
    cmd.env("NO_COLOR", "1");
    let (log, mut log_file) = logs.open("coordinator.log", &cmd)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file.try_clone()?));
    detach_but_tie(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    // Keep draining stdout into the log after the first line, or the coordinator
    // would block on a full pipe.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !sent {
                if let Some(url) = line.trim().strip_prefix("listening on ") {
                    let _ = tx.send(url.trim().to_string());
                    sent = true;
                }
            }
            let _ = writeln!(log_file, "{line}");
        }
    });
    let mut proc = Proc {
        name: "gpuctl-coordinator".into(),
        child,
        log,
        exited: false,
    };
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(url) => return Ok((proc, url)),
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                if !proc.running() {
                    let e = died(&mut proc, "before it listened");
                    stop_all(&mut [&mut proc], COORDINATOR_GRACE);
                    return Err(e);
                }
            }
            Err(_) => {
                let e = if proc.running() {
                    anyhow!(
                        "gpuctl-coordinator printed no `listening on` line within {LISTEN_TIMEOUT:?}; its log {}:\n{}",
                        proc.log.display(),
                        log_tail(&proc.log, 20)
                    )
                } else {
                    died(&mut proc, "before it listened")
                };
                stop_all(&mut [&mut proc], COORDINATOR_GRACE);
                return Err(e);
            }
        }
    }
}

fn start_agent(
    a: &LocalUpArgs,
    bin: &Path,
    url: &str,
    name: &str,
    net: Option<&netns::Network>,
    data_dir: &Path,
    logs: &Logs,
) -> Result<Proc> {
    let work = data_dir.join("agents").join(name);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let mut cmd = match net {
        Some(n) => n.command(name, bin),
        None => Command::new(bin),
    };
    cmd.arg("--coordinator")
        .arg(url)
        .arg("--name")
        .arg(name)
        .arg("--cpu-ranks")
        .arg(a.cpu_ranks.to_string())
        .arg("--work-dir")
        .arg(&work);
    pass_through(&mut cmd, &a.agent_arg);
    cmd.env("NO_COLOR", "1");
    let (log, f) = logs.open(&format!("{name}.log"), &cmd)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(f.try_clone()?))
        .stderr(Stdio::from(f));
    detach_but_tie(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {} as {name}", bin.display()))?;
    Ok(Proc {
        name: name.into(),
        child,
        log,
        exited: false,
    })
}

fn ready(state: pb::NodeState) -> bool {
    matches!(state, pb::NodeState::Ready | pb::NodeState::Busy)
}

async fn wait_for_agents(
    sup: &mut Supervisor,
    c: &mut Coordinator,
    names: &[String],
    timeout: Duration,
    shutdown: Option<&Shutdown>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if shutdown.is_some_and(|s| s.is_cancelled()) {
            bail!("stopped by a signal before every agent registered");
        }
        for p in sup.agents.iter_mut() {
            if !p.running() {
                return Err(died(p, "before it registered"));
            }
        }
        if let Some(p) = sup.coordinator.as_mut() {
            if !p.running() {
                return Err(died(p, "while agents were starting"));
            }
        }
        let nodes = c.node_table().await.unwrap_or_default();
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !nodes.rows().any(|x| x.name == n.as_str() && ready(x.state)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let p = sup
                .agents
                .iter()
                .find(|p| &p.name == missing[0])
                .expect("agent");
            bail!(
                "{} of {} agents did not register within {timeout:?} ({}); the first one's log {}:\n{}",
                missing.len(),
                names.len(),
                missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                p.log.display(),
                log_tail(&p.log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn up(a: LocalUpArgs, clock: &Clock) -> Result<i32> {
    // Check what we can before starting anything.
    parse_interval("--node-timeout", &a.node_timeout)?;
    if a.netns && a.agents > netns::MAX_AGENTS {
        return Err(UsageError(format!(
            "--netns takes at most {} agents, not {}",
            netns::MAX_AGENTS,
            a.agents
        ))
        .into());
    }
    let ready_timeout = parse_interval("--ready-timeout", &a.ready_timeout)?;
    let coordinator_bin = find_bin(
        a.coordinator_bin.clone(),
        "gpuctl-coordinator",
        "--coordinator-bin",
    )?;
    let agent_bin = if a.agents > 0 {
        Some(find_bin(
            a.agent_bin.clone(),
            "gpuctl-agent",
            "--agent-bin",
        )?)
    } else {
        None
    };
    let data_dir = a.data_dir.clone().unwrap_or_else(|| {
        // Port 0 means several may run at once; keep them apart.
        let tag = if a.port == 0 {
            format!("pid{}", std::process::id())
        } else {
            a.port.to_string()
        };
        std::env::temp_dir().join(format!("gpuctl-local-{tag}"))
    });
    let logs = Logs {
        dir: data_dir.join("logs"),
        clock: clock.clone(),
    };
    for d in [
        data_dir.join("coordinator"),
        data_dir.join("agents"),
        logs.dir.clone(),
    ] {
        fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    }

    let names: Vec<String> = (0..a.agents).map(|i| format!("local-{i}")).collect();
    let mut sup = Supervisor::default();
    // Without namespaces, handlers come only once the fleet is up: before that
    // a Ctrl-C kills us by default and the children follow through PDEATHSIG.
    // Namespaces would outlive us, so then a signal must reach our cleanup.
    let early_shutdown = if a.netns {
        let s = gpuctl_core::shutdown::on_signals()?;
        sup.net = Some(netns::Network::create(&names)?);
        Some(s)
    } else {
        None
    };
    let host = if a.netns {
        netns::host_addr()
    } else {
        std::net::Ipv4Addr::LOCALHOST
    };
    let (coord, url) = start_coordinator(&a, &coordinator_bin, host, &data_dir, &logs)?;
    sup.coordinator = Some(coord);
    tracing::info!("coordinator listening on {url}");
    let mut client = Coordinator::connect(&url).await?;

    if let Some(bin) = &agent_bin {
        for name in &names {
            let p = start_agent(&a, bin, &url, name, sup.net.as_ref(), &data_dir, &logs)?;
            sup.agents.push(p);
        }
    }
    eprintln!("waiting for {} agent(s) to register...", names.len());
    wait_for_agents(
        &mut sup,
        &mut client,
        &names,
        ready_timeout,
        early_shutdown.as_ref(),
    )
    .await?;
    let shutdown = match early_shutdown {
        Some(s) => s,
        None => gpuctl_core::shutdown::on_signals()?,
    };

    println!("coordinator: {url}");
    println!("export GPUCTL_COORDINATOR={url}");
    std::io::stdout().flush()?;
    eprintln!(
        "{} agent(s) up ({} cpu rank(s) each without GPUs); data in {}, logs in {}",
        names.len(),
        a.cpu_ranks,
        data_dir.display(),
        logs.dir.display()
    );
    if a.netns && a.agents > 0 {
        eprintln!(
            "agents local-0 .. local-{} run in network namespaces gpl-local-i ({} .. {}), each behind host link gpl-local-i on bridge {}; slow one down with e.g. `tc qdisc add dev gpl-local-0 root tbf rate 50mbit burst 64kb latency 50ms`",
            a.agents - 1,
            netns::agent_addr(0),
            netns::agent_addr(a.agents - 1),
            netns::BRIDGE
        );
    }
    eprintln!("try: gpuctl --coordinator {url} nodes    (Ctrl-C stops everything)");

    let code = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break 0,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if let Some(c) = sup.coordinator.as_mut() {
                    if !c.running() {
                        eprintln!("error: {:#}", died(c, "unexpectedly"));
                        break 1;
                    }
                }
                for p in sup.agents.iter_mut() {
                    // An agent that dies is reported once; the rest keep running.
                    if !p.exited && !p.running() {
                        eprintln!("warning: {:#}", died(p, "unexpectedly"));
                    }
                }
            }
        }
    };
    eprintln!("stopping agents, then the coordinator...");
    sup.stop();
    eprintln!("stopped");
    Ok(code)
}

/// Appends the user's extra arguments for a child. Every process of a local
/// fleet takes a free loopback /metrics port (logged in its log) rather than
/// the host-wide default they would fight over, unless the user chose one.
fn pass_through(cmd: &mut Command, extra: &[String]) {
    if !extra.iter().any(|x| x.starts_with("--metrics-listen")) {
        cmd.args(["--metrics-listen", "127.0.0.1:0"]);
    }
    cmd.args(extra);
}
