//! Process groups: spawning a worker as the leader of its own group, and
//! killing the whole group (SIGTERM, SIGKILL after a grace period).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Spawns `cmd` as the leader of a new process group, with piped stdout and
/// stderr, killed if its `Child` is dropped and (through the kernel) if the
/// agent dies.
pub fn spawn_in_group(mut cmd: Command) -> std::io::Result<Child> {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let agent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (prctl, getppid), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            // A SIGKILLed agent (OOM killer) cannot kill its workers; the
            // kernel does it instead. Tokio's runtime threads, which spawn
            // workers, live as long as the agent, so the "parent thread
            // exited" subtlety of PDEATHSIG does not bite.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != agent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `sig` to every process of the group (no-op for pgid 0; ESRCH, a
/// group already gone, is fine).
pub fn signal_group(pgid: i32, sig: libc::c_int) {
    if pgid > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group.
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// Whether any process (zombies included) is left in the group.
fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    pgid > 0 && unsafe { libc::kill(-pgid, 0) } == 0
}

/// SIGTERM to the group, SIGKILL after `grace`; returns the leader's status.
/// Whatever is left of the group once the grace period is over is SIGKILLed
/// too, so a grandchild that ignores SIGTERM does not outlive the worker.
pub async fn kill_group(
    pgid: i32,
    child: &mut Child,
    grace: Duration,
) -> std::io::Result<ExitStatus> {
    signal_group(pgid, libc::SIGTERM);
    let until = Instant::now() + grace;
    let status = match tokio::time::timeout_at(until, child.wait()).await {
        Ok(s) => s,
        Err(_) => {
            signal_group(pgid, libc::SIGKILL);
            child.wait().await
        }
    };
    while group_alive(pgid) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal_group(pgid, libc::SIGKILL);
    // SIGKILL is delivered asynchronously: members the child left behind
    // (orphans) may still be running for a moment. Return once they are gone
    // (bounded), so that "no worker left" holds when this returns.
    let killed = Instant::now() + KILL_SETTLE;
    while group_alive(pgid) && Instant::now() < killed {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    status
}

/// How long `kill_group` waits for SIGKILLed members to disappear.
const KILL_SETTLE: Duration = Duration::from_secs(1);

/// `SIGTERM` for 15, and so on; `SIG<n>` for the rest.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn group_members(pgid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after ')'.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() > 2 && f[0] != "Z" && f[2].parse::<i32>() == Ok(pgid) {
                out.push(pid);
            }
        }
        out
    }

    async fn wait_for_members(pgid: i32, n: usize) -> Vec<i32> {
        for _ in 0..200 {
            let m = group_members(pgid);
            if m.len() >= n {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "group {pgid} never had {n} members: {:?}",
            group_members(pgid)
        );
    }

    #[tokio::test]
    async fn kill_group_kills_the_whole_group() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 100 & sleep 100"]);
        let mut child = spawn_in_group(cmd).unwrap();
        let pgid = child.id().unwrap() as i32;
        let members = wait_for_members(pgid, 3).await; // sh and both sleeps
        assert!(members.contains(&pgid));
        let status = kill_group(pgid, &mut child, Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert_eq!(
            group_members(pgid),
            Vec::<i32>::new(),
            "every process of the group died"
        );
    }

    #[tokio::test]
    async fn sigterm_ignored_means_sigkill_after_grace() {
        let mut cmd = Command::new("sh");
        // The trap makes sh and its background child ignore SIGTERM.
        cmd.args(["-c", "trap '' TERM; sleep 100 & wait"]);
        let mut child = spawn_in_group(cmd).unwrap();
        let pgid = child.id().unwrap() as i32;
        wait_for_members(pgid, 2).await;
        let t0 = std::time::Instant::now();
        let status = kill_group(pgid, &mut child, Duration::from_millis(300))
            .await
            .unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert_eq!(group_members(pgid), Vec::<i32>::new());
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(64), "SIG64");
    }
}
