//! The live view on a real terminal: `submit --wait` and `watch` run inside a
//! pseudo-terminal (util-linux `script`, sized 80×30 with `stty`) against a
//! real local fleet. Both draw the same view; every line fits 80 columns; a
//! worker stopped with SIGSTOP stops reporting and its rank, and only its
//! rank, is marked stale.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Runs `gpuctl ARGS` inside a pseudo-terminal of 80 columns and 30 rows and
/// returns everything the terminal received, and the exit code.
fn in_terminal(c: &Cluster, args: &[&str]) -> (String, Option<i32>) {
    let mut line = format!(
        "stty rows 30 cols 80; exec {}",
        bin("gpuctl").to_str().unwrap()
    );
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let out = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .env("GPUCTL_COORDINATOR", &c.url)
        .env("TERM", "xterm")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run util-linux `script` for a pseudo-terminal ({e}); install bsdutils")
        });
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.status.code(),
    )
}

/// The screens the view drew: split where it clears to the end of the
/// screen, escape sequences and carriage returns removed.
fn frames(raw: &str) -> Vec<String> {
    raw.split("\x1b[J")
        .skip(1)
        .map(|f| {
            // The view has no blank line; what follows one (the report) is not the view.
            let f = strip(f);
            match f.find("\n\n") {
                Some(i) => f[..i + 1].to_string(),
                None => f,
            }
        })
        .collect()
}

fn strip(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\x1b' => {
                // CSI: ESC [ params final-byte
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn rank_line(frame: &str, rank: u32) -> Option<&str> {
    let prefix = format!("{rank:>4} ");
    frame.lines().find(|l| l.starts_with(&prefix))
}

fn assert_fits(frames: &[String]) {
    for f in frames {
        for l in f.lines() {
            assert!(
                l.chars().count() <= 80,
                "{} columns: {l:?}\n{f}",
                l.chars().count()
            );
        }
    }
}

#[test]
fn wait_and_watch_draw_the_same_view_and_mark_a_silent_rank_stale() {
    let c = Cluster::start(2, 1);

    let (raw, code) = in_terminal(
        &c,
        &[
            "submit",
            "stress",
            "--nodes",
            "2",
            "--duration",
            "4s",
            "--wait",
        ],
    );
    assert_eq!(code, Some(0), "{raw}");
    let waited = frames(&raw);
    assert!(!waited.is_empty(), "no live view drawn: {raw}");
    assert_fits(&waited);
    let working = waited
        .iter()
        .find(|f| (0..2).all(|r| rank_line(f, r).is_some_and(|l| l.contains("TFLOP/s"))))
        .unwrap_or_else(|| panic!("no screen with both ranks' TFLOP/s: {raw}"));
    assert!(working.contains("RANK NODE"), "{working}");
    assert!(
        working.lines().next().unwrap().contains("stress  running"),
        "{working}"
    );
    // The report follows the view.
    assert!(strip(&raw).contains("VERDICT"), "{raw}");

    // watch, while one worker is stopped: its rank goes stale, the other not.
    let id = c.submit(&[
        "stress",
        "--nodes",
        "2",
        "--duration",
        "60s",
        "--hang-timeout",
        "8s",
    ]);
    c.wait_workers(&id, 2, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(2));
    let (pid, rank) = c
        .worker_pids(&id)
        .into_iter()
        .map(|pid| (pid, rank_and_node(pid).0 as u32))
        .find(|(_, rank)| *rank == 1)
        .expect("rank 1's worker");
    // SAFETY: a signal to a worker process this test started; the hang
    // timeout fails the job and the agent kills it.
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let (raw, code) = in_terminal(&c, &["watch", &id, "--interval", "500ms"]);
    // SAFETY: as above; lets it die if anything is left.
    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    assert_eq!(code, Some(1), "the hung job fails: {raw}");
    let watched = frames(&raw);
    assert_fits(&watched);
    let stale = watched
        .iter()
        .find(|f| rank_line(f, rank).is_some_and(|l| l.ends_with("stale")))
        .unwrap_or_else(|| panic!("rank {rank} never marked stale: {raw}"));
    assert!(stale.contains("1 of 2 ranks silent"), "{stale}");
    let other = rank_line(stale, 1 - rank).expect("the other rank's line");
    assert!(!other.contains("stale"), "{stale}");
    // The stale rank leads the list, right under the header.
    let header = stale.lines().position(|l| l.starts_with("RANK")).unwrap();
    assert_eq!(
        stale.lines().nth(header + 1),
        rank_line(stale, rank),
        "{stale}"
    );
}
