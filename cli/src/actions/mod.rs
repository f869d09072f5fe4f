//! Verdicts acting on the scheduler (`gpuctl accept --drain`, `--kubernetes`,
//! `--dry-run`; docs/operations.md "Slurm" and "Kubernetes labels and
//! taints"): once a suite has ended and its report is printed, each node
//! the suite blamed is drained in Slurm / labelled and tainted in
//! Kubernetes, and each node it accepted is resumed / untainted where gpuctl
//! had put it out. [`decide`] holds the rules; [`slurm`] and [`kubernetes`]
//! the commands. Everything here reports on stderr and returns nothing: a
//! scheduler that refuses or does not answer changes neither the verdict,
//! nor the report on stdout, nor the exit code.

pub mod decide;
pub mod kubernetes;
pub mod require_cert;
pub mod slurm;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuctl_proto::pb;

/// What `accept` was asked to do with its verdicts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Actions {
    /// Drain / resume in Slurm.
    pub drain: bool,
    /// Label / taint in Kubernetes.
    pub kubernetes: bool,
    /// Print the commands, run none.
    pub dry_run: bool,
    /// Resume / untaint only nodes with a valid certificate of the suite.
    pub require_cert: bool,
}

impl Actions {
    pub fn any(&self) -> bool {
        self.drain || self.kubernetes
    }
}

/// Takes (or prints) the actions for a finished suite, given its stages'
/// reports (for the findings a drain reason quotes); one stderr line per node.
pub async fn act(suite: &pb::Suite, reports: &[pb::Report], a: Actions) {
    if a.drain {
        act_slurm(suite, reports, a.dry_run);
    }
    if a.kubernetes {
        act_kubernetes(suite, a.dry_run).await;
    }
}

fn act_slurm(suite: &pb::Suite, reports: &[pb::Report], dry_run: bool) {
    let nodes: Vec<String> = suite.verdicts.iter().map(|n| n.node.clone()).collect();
    if nodes.is_empty() {
        return;
    }
    let tag = if dry_run { "drain (dry run)" } else { "drain" };
    // Reading is harmless, so a dry run reads too: it prints what would be done.
    let query = slurm::query(&nodes);
    let held = match run(&query) {
        Ok(text) => slurm::parse(&text),
        Err(e) => {
            // Without the states gpuctl cannot tell its drains from others':
            // it does nothing rather than guess.
            eprintln!(
                "warning: {tag}: cannot read the Slurm state of {}: {e}; nothing drained or resumed, the verdict stands",
                nodes.join(", ")
            );
            return;
        }
    };
    // Inside an allocation the reason names the Slurm job too.
    let slurm_job = std::env::var("SLURM_JOB_ID").unwrap_or_default();
    for step in decide::slurm_steps(suite, reports, &held, &slurm_job) {
        let node = step.node().to_string();
        let Some(cmd) = slurm::command(&step) else {
            if let decide::Step::Leave { why, .. } = &step {
                eprintln!("{tag}: {node}: {why}");
            }
            continue;
        };
        let shown = shown(&cmd);
        if dry_run {
            eprintln!("{tag}: {node}: would run: {shown}");
            continue;
        }
        match run(&cmd) {
            Ok(_) => eprintln!("{tag}: {node}: ran: {shown}"),
            Err(e) => eprintln!("warning: {tag}: {node}: {e}; the verdict stands"),
        }
    }
}

async fn act_kubernetes(suite: &pb::Suite, dry_run: bool) {
    let tag = if dry_run {
        "kubernetes (dry run)"
    } else {
        "kubernetes"
    };
    let steps = decide::kube_steps(suite);
    // A dry run reads nothing: it needs no cluster to print what it would do.
    let client = if dry_run || steps.is_empty() {
        None
    } else {
        match kubernetes::client().await {
            Ok(c) => Some(c),
            Err(e) => {
                let nodes: Vec<&str> = steps.iter().map(|s| s.node()).collect();
                eprintln!(
                    "warning: {tag}: {}: {e}; nothing labelled or tainted, the verdict stands",
                    nodes.join(", ")
                );
                return;
            }
        }
    };
    for step in &steps {
        let node = step.node();
        if let decide::KubeStep::Leave { why, .. } = step {
            eprintln!("{tag}: {node}: {why}");
            continue;
        }
        let what = kubernetes::describe(step);
        let Some(client) = &client else {
            eprintln!("{tag}: {node}: would {what}");
            continue;
        };
        match kubernetes::apply(client, step).await {
            Ok(()) => eprintln!("{tag}: {node}: {what}"),
            Err(e) => eprintln!("warning: {tag}: {node}: {e}; the verdict stands"),
        }
    }
}

/// A scheduler that does not answer: Slurm's clients retry for
/// MessageTimeout (10 s by default) themselves; this bounds one command
/// (scontrol, sinfo) on top of that.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// A command as a person would type it, to print and to name in errors.
pub fn shown(args: &[String]) -> String {
    args.iter()
        .map(|a| {
            if a.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=,%|:[]".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `args` (program first) with a time limit; stdout, or an error
/// naming the command and what it said.
pub fn run(args: &[String]) -> Result<String, String> {
    let mut child = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("`{}` could not start: {e}", shown(args)))?;
    // Readers on their own threads, so a chatty command cannot fill a pipe
    // and stall while this waits.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if start.elapsed() > COMMAND_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{}` did not answer within {}s",
                    shown(args),
                    COMMAND_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(format!("`{}`: {e}", shown(args))),
        }
    };
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    if !status.success() {
        let said = err.trim().replace('\n', "; ");
        return Err(format!(
            "`{}` failed ({status}): {}",
            shown(args),
            if said.is_empty() { "no message" } else { &said }
        ));
    }
    Ok(out)
}
