//! `gpuctl-worker --prestarted`: a worker started before its job.
//!
//! Starting a worker costs about half a second of the dynamic loader
//! relocating libtorch, before `main` runs. The agent therefore keeps one
//! worker per idle slot started in advance: it has loaded its libraries and
//! waits on stdin for one line of JSON, [`StartLine`], holding what the agent
//! would otherwise have put on a cold worker's command line and environment.
//! From there it runs exactly as a worker started cold. End of input (the
//! agent went away, or no longer wants it) ends it quietly.
//!
//! Nothing here touches CUDA or NCCL (both initialise lazily, on first use),
//! so a prestarted worker holds no GPU memory and is no GPU process; the environment,
//! `CUDA_VISIBLE_DEVICES` included, is in place before anything could.
//!
//! So that `ps` and `/proc/PID/{cmdline,environ}` show the rank a prestarted worker
//! became, as for a cold worker, the agent starts it with padding in both
//! (`--prestarted PAD`, [`PAD_ENV`]) and the worker writes its real command line
//! and environment over them, the way `setproctitle` does.

use std::io::BufRead;
use std::path::PathBuf;

use clap::Parser;
use serde::Deserialize;

use crate::context::Args;

/// The flag that makes a worker a prestarted worker (first argument).
pub const FLAG: &str = "--prestarted";
/// Padding in the prestarted worker's starting environment, room for the job's
/// environment in `/proc/PID/environ`; removed from the real environment.
pub const PAD_ENV: &str = "GPUCTL_PRESTART_PAD";

/// The line the agent sends: the cold worker's arguments (without the
/// program name), environment (applied in order over the prestarted worker's own;
/// later wins) and working folder.
#[derive(Debug, Deserialize)]
pub struct StartLine {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
}

/// Whether this process was started as a prestarted worker.
pub fn requested() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == FLAG)
}

/// The prestarted worker's whole life; returns the exit code.
pub fn run() -> i32 {
    let mut line = String::new();
    match std::io::stdin().lock().read_line(&mut line) {
        Ok(0) => return 0,
        Ok(_) => {}
        Err(e) => {
            eprintln!("gpuctl-worker --prestarted: cannot read the start line: {e}");
            return 2;
        }
    }
    let start: StartLine = match serde_json::from_str(&line) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpuctl-worker --prestarted: the start line is not valid: {e}");
            return 2;
        }
    };
    let argv0 = std::env::args()
        .next()
        .unwrap_or_else(|| "gpuctl-worker".into());
    // No thread exists yet (the loaded libraries start none before use), so
    // changing the environment here is safe.
    // (A variable of the agent's that is not UTF-8 is not kept.)
    let own = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let env = final_env(own, &start.env);
    apply_env(&env);
    let mut argv = vec![argv0];
    argv.extend(start.args);
    retitle(&argv, &env);
    if let Err(e) = std::env::set_current_dir(&start.cwd) {
        eprintln!(
            "gpuctl-worker: cannot enter the working folder {}: {e}",
            start.cwd.display()
        );
        return 2;
    }
    crate::init_logging();
    // libgomp read OMP_NUM_THREADS when it loaded, before the job's was
    // there: a cold worker's thread count is applied through torch instead.
    if let Some(n) = std::env::var("OMP_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
        .filter(|n| *n > 0)
    {
        tch::set_num_threads(n);
    }
    let args = Args::parse_from(argv);
    crate::run_worker(args)
}

/// The environment a cold worker would have: the prestarted worker's own without the
/// padding, then `job` in order (later wins). The job's entries come first,
/// so that they are the ones kept should `/proc` not have room for all.
fn final_env(own: Vec<(String, String)>, job: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in job.iter().rev() {
        if !out.iter().any(|(o, _)| o == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    out.reverse();
    for (k, v) in own {
        if k != PAD_ENV && !out.iter().any(|(o, _)| *o == k) {
            out.push((k, v));
        }
    }
    out
}

fn apply_env(env: &[(String, String)]) {
    // Every variable is set anew, so that the environment lives on the heap
    // and the memory the kernel shows as /proc/PID/environ can be rewritten.
    // SAFETY: single-threaded (see `run`).
    unsafe { libc::clearenv() };
    for (k, v) in env {
        if !k.is_empty() && !k.contains('=') && !k.contains('\0') && !v.contains('\0') {
            std::env::set_var(k, v);
        }
    }
}

/// Writes `argv` and `env` over the process's original argument and
/// environment strings (which nothing points into any more: `apply_env`
/// moved the environment, and the arguments were copied), within their
/// bounds; what does not fit is left out.
fn retitle(argv: &[String], env: &[(String, String)]) {
    let Some((args, envs)) = regions() else {
        return;
    };
    let env_strings: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    write_strings(args, argv.iter().map(String::as_str));
    write_strings(envs, env_strings.iter().map(String::as_str));
}

/// `[start, end)` of the argument and the environment strings, from
/// /proc/self/stat (fields 48 to 51).
fn regions() -> Option<((usize, usize), (usize, usize))> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<usize> = rest
        .split_whitespace()
        .skip(45)
        .take(4)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    (f.len() == 4 && f[0] < f[1] && f[2] < f[3]).then(|| ((f[0], f[1]), (f[2], f[3])))
}

/// NUL-terminated strings from `start`, whole ones only, then NULs to `end`.
fn write_strings<'a>((start, end): (usize, usize), strings: impl Iterator<Item = &'a str>) {
    let mut buf: Vec<u8> = Vec::with_capacity(end - start);
    for s in strings {
        if buf.len() + s.len() + 1 > end - start {
            break;
        }
        buf.extend_from_slice(s.as_bytes());
        buf.push(0);
    }
    buf.resize(end - start, 0);
    // SAFETY: the kernel reports [start, end) as this process's own argument
    // or environment strings, mapped and writable (the top of the main
    // stack); nothing else refers to them any more (see `retitle`).
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), start as *mut u8, buf.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn the_job_environment_wins_and_the_padding_goes() {
        let own = vec![kv("PATH", "/bin"), kv(PAD_ENV, "   "), kv("RANK", "9")];
        let job = vec![kv("RANK", "1"), kv("A", "x"), kv("RANK", "2")];
        assert_eq!(
            final_env(own, &job),
            vec![kv("A", "x"), kv("RANK", "2"), kv("PATH", "/bin")]
        );
    }
}
