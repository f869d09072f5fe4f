//! Pre-started workers: one idle `gpuctl-worker --prestarted` per free slot.
//!
//! A cold worker spends about half a second in the dynamic loader (libtorch)
//! before it does anything; a prestarted worker has done that already and waits on
//! stdin for one line of JSON with what a cold worker gets on its command
//! line and in its environment (worker/src/prestart.rs). A rank takes a live
//! prestarted worker when there is one and runs cold otherwise, so a prestarted worker that died
//! or was never started only costs the time it would have saved.
//!
//! There are as many prestarted workers as slots (GPUs, or CPU ranks) minus the ranks
//! running: a slot gets its prestarted worker back when its rank ends, not while it
//! runs, so that loading one (CPU, page cache) never competes with a job on
//! that slot; an idle prestarted worker sleeps in `read` and costs memory only. It does
//! not touch CUDA, so it holds no GPU memory and is no GPU process.
//!
//! A prestarted worker is spawned like a worker (its own process group, killed with the
//! agent) and is one of the agent's own processes for preflight, but no
//! running worker: heartbeats, telemetry and `live_workers` do not see it.
//! One that exits by itself is replaced after a back-off that doubles up to a
//! minute, so a broken worker binary does not make the agent spawn in a loop
//! (ranks then start cold, which reports the error as before). Prestarted workers of a
//! worker binary replaced since they started (an upgrade) are ended and
//! started again from the new one, so that no job runs the old binary.

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::{signal_group, spawn_in_group, WorkerSettings, Workers};
use std::sync::Arc;

/// The worker's flag (worker/src/prestart.rs `FLAG`).
const FLAG: &str = "--prestarted";
/// Room for the real arguments in the prestarted worker's `/proc/PID/cmdline`: the
/// worker writes them over `--prestarted PAD`.
const ARG_PAD: usize = 4096;
/// Room for the job's variables in `/proc/PID/environ` (worker/src/prestart.rs
/// `PAD_ENV`).
const PAD_ENV: &str = "GPUCTL_PRESTART_PAD";
const ENV_PAD: usize = 16 * 1024;
/// First wait before replacing a prestarted worker that exited by itself, doubled for
/// each one after it up to `BACKOFF_MAX`.
const BACKOFF_START: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// How often dead prestarted workers are noticed and missing ones started.
pub(super) const TICK: Duration = Duration::from_secs(1);

/// What a rank's worker is told: arguments (without the program name),
/// environment over the agent's own (in order; later wins) and working folder.
#[derive(Debug, Clone)]
pub(super) struct Launch {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub dir: std::path::PathBuf,
}

struct Idle {
    child: Child,
    /// Also its process group.
    pid: u32,
    started: Instant,
    /// The worker binary it runs (`binary_id`).
    binary: Option<BinaryId>,
}

/// Device, inode, size and modification time of a file: a worker binary
/// replaced (an upgrade) reads different, and its idle prestarted workers, still
/// running the old one, are replaced rather than given jobs.
type BinaryId = (u64, u64, u64, i64, i64);

fn binary_id(path: &std::path::Path) -> Option<BinaryId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

#[derive(Default)]
struct State {
    /// Slots of this agent; 0 = pre-starting is off.
    slots: usize,
    idle: Vec<Idle>,
    /// Prestarted workers that exited by themselves since one was last used.
    failures: u32,
    /// No prestarted worker is started before this (back-off).
    not_before: Option<Instant>,
}

/// The idle prestarted workers of one agent.
pub(super) struct Pool {
    settings: WorkerSettings,
    state: Mutex<State>,
}

impl Pool {
    pub fn new(settings: WorkerSettings) -> Pool {
        Pool {
            settings,
            state: Mutex::new(State::default()),
        }
    }

    /// Turns pre-starting on for `slots` slots (0 turns it off).
    pub fn set_slots(&self, slots: usize) {
        self.state.lock().unwrap().slots = slots;
    }

    pub fn enabled(&self) -> bool {
        self.state.lock().unwrap().slots > 0
    }

    /// Process ids of the idle prestarted workers.
    pub fn pids(&self) -> Vec<u32> {
        let s = self.state.lock().unwrap();
        s.idle.iter().map(|i| i.pid).collect()
    }

    /// Starts prestarted workers until there is one per slot not taken by one of the
    /// `busy` ranks running, unless in back-off.
    pub fn refill(&self, busy: usize) {
        let mut s = self.state.lock().unwrap();
        self.reap(&mut s);
        let want = s.slots.saturating_sub(busy);
        while s.idle.len() < want && s.not_before.is_none_or(|t| Instant::now() >= t) {
            let binary = binary_id(&self.settings.worker_bin);
            match self.spawn() {
                Ok(child) => {
                    let pid = child.id().unwrap_or(0);
                    tracing::debug!(pid, "prestarted worker started");
                    s.idle.push(Idle {
                        child,
                        pid,
                        started: Instant::now(),
                        binary,
                    });
                }
                Err(e) => {
                    let wait = note_failure(&mut s);
                    tracing::warn!(
                        "cannot start a prestarted worker ({}): {e}; next try in {wait:?}",
                        self.settings.worker_bin.display()
                    );
                }
            }
        }
    }

    /// Starts the rank's worker from a prestarted worker: `None` when there is none
    /// alive, or when the job needs what a prestarted worker cannot give it (see
    /// `usable`); the caller then starts it cold.
    pub fn launch(&self, l: &Launch) -> Option<Child> {
        if !self.enabled() || !self.usable(l) {
            return None;
        }
        let line = serde_json::json!({ "args": l.args, "env": l.env, "cwd": l.dir }).to_string();
        loop {
            let mut child = self.take()?;
            match hand_off(&mut child, &line) {
                Ok(()) => {
                    self.state.lock().unwrap().failures = 0;
                    return Some(child);
                }
                Err(e) => {
                    // Died between the check and the write: try the next.
                    tracing::warn!(
                        "a prestarted worker did not take its job ({e}); trying another"
                    );
                    signal_group(child.id().unwrap_or(0) as i32, libc::SIGKILL);
                }
            }
        }
    }

    /// Ends every idle prestarted worker and starts no more (agent shutdown).
    pub async fn close(&self) {
        let idle = {
            let mut s = self.state.lock().unwrap();
            s.slots = 0;
            std::mem::take(&mut s.idle)
        };
        for mut i in idle {
            signal_group(i.pid as i32, libc::SIGKILL);
            let _ = i.child.wait().await;
        }
    }

    /// Forgets prestarted workers that exited (reaping them), counting each as a
    /// failure for the back-off.
    /// Prestarted workers of a worker binary since replaced are ended (not a failure).
    fn reap(&self, s: &mut State) {
        let binary = binary_id(&self.settings.worker_bin);
        let mut i = 0;
        while i < s.idle.len() {
            let status = match s.idle[i].child.try_wait() {
                Ok(None) if s.idle[i].binary == binary => {
                    i += 1;
                    continue;
                }
                Ok(None) => {
                    let old = s.idle.swap_remove(i);
                    tracing::info!(
                        pid = old.pid,
                        "{} changed: replacing a prestarted worker",
                        self.settings.worker_bin.display()
                    );
                    signal_group(old.pid as i32, libc::SIGKILL);
                    continue;
                }
                Ok(Some(st)) => match (st.code(), st.signal()) {
                    (Some(c), _) => format!("exit code {c}"),
                    (_, Some(sig)) => super::signal_name(sig),
                    _ => "unknown status".into(),
                },
                Err(e) => e.to_string(),
            };
            let gone = s.idle.swap_remove(i);
            // Anything it started goes with it.
            signal_group(gone.pid as i32, libc::SIGKILL);
            if gone.started.elapsed() > BACKOFF_MAX {
                // It had been fine for long: not a broken binary.
                s.failures = 0;
            }
            let wait = note_failure(s);
            tracing::warn!(
                "a prestarted worker ended by itself ({status}) after {:?}; replacing it in {wait:?} (ranks start cold meanwhile)",
                gone.started.elapsed()
            );
        }
    }

    /// A live idle prestarted worker, if any (dead ones met on the way are reaped).
    fn take(&self) -> Option<Child> {
        let mut s = self.state.lock().unwrap();
        self.reap(&mut s);
        s.idle.pop().map(|i| i.child)
    }

    /// Whether a prestarted worker, started with the agent's environment, can be this
    /// rank's worker: the job's arguments must fit in its command line, and
    /// variables read while the libraries load must be as it had them.
    fn usable(&self, l: &Launch) -> bool {
        let args: usize = l.args.iter().map(|a| a.len() + 1).sum();
        if args > FLAG.len() + 1 + ARG_PAD + 1 {
            return false;
        }
        l.env.iter().filter(|(k, _)| read_at_load(k)).all(|(k, _)| {
            // The last value wins, as when the worker applies them.
            let job = l.env.iter().rev().find(|(o, _)| o == k).map(|(_, v)| v);
            let own = self.prestarted_env(k);
            job.map(String::as_str) == own.as_deref()
        })
    }

    /// A variable's value in a prestarted worker's environment.
    fn prestarted_env(&self, k: &str) -> Option<String> {
        if k == "LD_LIBRARY_PATH" {
            if let Some(ld) = &self.settings.ld_library_path {
                return Some(ld.to_string_lossy().into_owned());
            }
        }
        std::env::var(k).ok()
    }

    fn spawn(&self) -> std::io::Result<Child> {
        std::fs::create_dir_all(&self.settings.work_dir)?;
        let mut cmd = Command::new(&self.settings.worker_bin);
        cmd.arg(FLAG)
            .arg(" ".repeat(ARG_PAD))
            .env(PAD_ENV, " ".repeat(ENV_PAD))
            .current_dir(&self.settings.work_dir)
            .stdin(Stdio::piped());
        if let Some(ld) = &self.settings.ld_library_path {
            cmd.env("LD_LIBRARY_PATH", ld);
        }
        spawn_in_group(cmd)
    }
}

impl Workers {
    /// Keeps one started, idle worker per slot not running a rank
    /// (`--prestart-workers`; `slots`: GPUs, or CPU ranks), which ranks then
    /// start from (prestart.rs).
    pub fn prestart(self: &Arc<Self>, slots: usize) {
        self.prestarted.set_slots(slots);
        self.prestarted.refill(self.jobs.busy_slots());
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(TICK).await;
                match me.upgrade() {
                    Some(w) if w.prestarted.enabled() => w.prestarted.refill(w.jobs.busy_slots()),
                    _ => return,
                }
            }
        });
    }
}

/// Counts a failure and sets the back-off; returns its length.
fn note_failure(s: &mut State) -> Duration {
    s.failures += 1;
    let wait = BACKOFF_START
        .saturating_mul(1 << (s.failures - 1).min(16))
        .min(BACKOFF_MAX);
    s.not_before = Some(Instant::now() + wait);
    wait
}

/// Variables the dynamic loader, glibc's allocator or libgomp read when the
/// worker starts, before a prestarted worker knows its job. OMP_NUM_THREADS is not one
/// of them: the worker applies it through torch.
fn read_at_load(k: &str) -> bool {
    ["LD_", "GLIBC_", "MALLOC_", "GOMP_", "KMP_", "OMP_"]
        .iter()
        .any(|p| k.starts_with(p))
        && k != "OMP_NUM_THREADS"
}

/// Writes the start line and closes the prestarted worker's stdin.
fn hand_off(child: &mut Child, line: &str) -> std::io::Result<()> {
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    // One short line into an empty pipe: the write does not block.
    let mut f = std::fs::File::from(stdin.into_owned_fd()?);
    f.write_all(line.as_bytes())?;
    f.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_time_variables() {
        for k in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "OMP_PROC_BIND",
            "MALLOC_ARENA_MAX",
        ] {
            assert!(read_at_load(k), "{k}");
        }
        for k in [
            "OMP_NUM_THREADS",
            "RANK",
            "NCCL_DEBUG",
            "CUDA_VISIBLE_DEVICES",
        ] {
            assert!(!read_at_load(k), "{k}");
        }
    }

    #[test]
    fn back_off_doubles_up_to_a_minute() {
        let mut s = State::default();
        let waits: Vec<u64> = (0..9).map(|_| note_failure(&mut s).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
}

#[cfg(test)]
mod pool_tests {
    use super::super::tests::{assignment, collect, script, settings};
    use super::*;
    use gpuctl_proto::pb::agent_message::Msg;

    async fn wait_prestarted(w: &Workers, n: usize) -> Vec<u32> {
        for _ in 0..100 {
            let pids = w.prestarted.pids();
            if pids.len() == n {
                return pids;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never {n} prestarted workers: {:?}", w.prestarted.pids());
    }

    fn alive(pid: u32) -> bool {
        // SAFETY: signal 0 only checks for existence.
        unsafe { libc::kill(pid as i32, 0) == 0 }
    }

    #[tokio::test]
    async fn ranks_start_from_prestarted_workers_which_come_back() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = script(
            tmp.path(),
            r#"if [ "$1" = --prestarted ]; then read -r line || exit 0; echo "prestarted $$: $line"; exit 0; fi
echo "cold $$""#,
        );
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "http://coord:1".into());
        w.prestart(2);
        let before = wait_prestarted(&w, 2).await;
        assert!(before.iter().all(|p| w.worker_pids().contains(p)));
        assert!(w.running().is_empty());
        assert_eq!(w.live_workers(), 0);

        assert!(w.start(assignment(&[(2, None), (3, None)], 0)).ok);
        let (logs, exits) = collect(&mut events, 2).await;
        assert!(exits.iter().all(|e| e.exit_code == 0), "{exits:?}");
        let lines: Vec<String> = logs.into_iter().flat_map(|l| l.lines).collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        for pid in &before {
            let line = lines
                .iter()
                .find(|l| l.starts_with(&format!("prestarted {pid}: ")))
                .unwrap_or_else(|| panic!("prestarted {pid} did not run a rank: {lines:?}"));
            let start: serde_json::Value =
                serde_json::from_str(line.split_once(": ").unwrap().1).unwrap();
            assert_eq!(start["args"][3], "job-7", "{start}");
            assert!(start["cwd"].as_str().unwrap().ends_with("jobs/job-7-a2"));
            let env = start["env"].as_array().unwrap();
            assert!(env.iter().any(|kv| kv[0] == "RANK"), "{start}");
            assert!(env
                .iter()
                .any(|kv| kv[0] == "LD_LIBRARY_PATH" && kv[1] == "/shim:/torch/lib"));
        }

        // Both slots are free again: two new prestarted workers.
        let after = wait_prestarted(&w, 2).await;
        assert!(
            after.iter().all(|p| !before.contains(p)),
            "{before:?} {after:?}"
        );

        // A job that sets a variable read at load time starts cold.
        let mut a = assignment(&[(0, None)], 0);
        a.job_id = "job-8".into();
        a.env.insert("LD_PRELOAD".into(), "".into());
        assert!(w.start(a).ok);
        let (logs, _) = collect(&mut events, 1).await;
        assert!(logs[0].lines[0].starts_with("cold "), "{logs:?}");
        assert_eq!(w.prestarted.pids().len(), 2);

        // Shutdown ends the prestarted workers and starts none.
        assert!(
            w.kill_all_and_wait(
                super::super::StopReason::AgentShutdown,
                Duration::from_secs(5)
            )
            .await
        );
        assert!(w.prestarted.pids().is_empty());
        assert!(after.iter().all(|p| !alive(*p)));
        tokio::time::sleep(TICK * 2).await;
        assert!(w.prestarted.pids().is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), events.recv())
                .await
                .map_or(true, |m| !matches!(
                    m.and_then(|m| m.msg),
                    Some(Msg::WorkerExited(_))
                )),
            "prestarted workers are not workers"
        );
    }

    #[tokio::test]
    async fn a_broken_prestarted_backs_off_and_ranks_start_cold() {
        let tmp = tempfile::tempdir().unwrap();
        let spawns = tmp.path().join("spawns");
        let bin = script(
            tmp.path(),
            &format!(
                r#"if [ "$1" = --prestarted ]; then echo x >> {}; exit 1; fi
echo cold"#,
                spawns.display()
            ),
        );
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
        w.prestart(1);
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let n = std::fs::read_to_string(&spawns).unwrap().lines().count();
        // At 0 s, then 1 s and 2 s after each death is noticed (each tick).
        assert!(
            (2..=3).contains(&n),
            "{n} prestarted workers started in 3.5 s"
        );
        assert!(w.start(assignment(&[(0, None)], 0)).ok);
        let (logs, exits) = collect(&mut events, 1).await;
        assert_eq!(exits[0].exit_code, 0);
        assert_eq!(logs[0].lines, vec!["cold".to_string()]);
    }

    #[tokio::test]
    async fn prestarted_workers_of_a_replaced_worker_binary_are_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let body = |v: &str| {
            format!(
                r#"if [ "$1" = --prestarted ]; then read -r line || exit 0; fi
echo {v}"#
            )
        };
        let bin = script(tmp.path(), &body("old"));
        let (w, mut events) = Workers::new(settings(tmp.path(), bin), "u".into());
        w.prestart(1);
        let old = wait_prestarted(&w, 1).await;
        // An upgrade: the binary now reads differently (here: longer).
        script(tmp.path(), &body("newer"));
        let t0 = Instant::now();
        while w.prestarted.pids() == old || w.prestarted.pids().is_empty() {
            assert!(t0.elapsed() < TICK * 5, "prestarted {old:?} never replaced");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Killed and reaped (dropped children are reaped in the background).
        let t0 = Instant::now();
        while alive(old[0]) {
            assert!(
                t0.elapsed() < TICK * 5,
                "old prestarted {old:?} left behind"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(w.start(assignment(&[(0, None)], 0)).ok);
        let (logs, exits) = collect(&mut events, 1).await;
        assert_eq!(exits[0].exit_code, 0);
        assert_eq!(logs[0].lines, vec!["newer".to_string()]);
    }
}
