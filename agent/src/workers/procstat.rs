//! A worker's process as /proc shows it: its state letter and CPU time, sent
//! with each heartbeat. That is what lets the coordinator tell the rank that
//! hung (stopped, traced, uninterruptible, zombie) from the ranks blocked
//! waiting on it, which sleep.

use gpuctl_proto::pb::RankProcess;

/// The words for /proc's state letters, as `RankProcess.state_name` has them.
pub fn state_name(state: char) -> &'static str {
    match state {
        'R' => "running",
        'S' | 'I' => "sleeping",
        'D' => "uninterruptible",
        'T' => "stopped",
        't' => "traced",
        'Z' => "zombie",
        'X' | 'x' => "dead",
        _ => "unknown",
    }
}

/// (state letter, user + system CPU time in clock ticks) from the text of
/// /proc/PID/stat. The process name may hold spaces and parentheses, so the
/// fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    // Fields 14 and 15 of stat(5) are utime and stime; `rest` starts at field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((state, utime + stime))
}

/// The process `pid` of `rank` as it is now; `None` once it is gone.
pub fn read(rank: u32, pid: u32) -> Option<RankProcess> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (state, ticks) = parse_stat(&text)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some(RankProcess {
        rank,
        pid,
        state: state.to_string(),
        state_name: state_name(state).to_string(),
        cpu_ms: ticks.saturating_mul(1000) / hz,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_even_with_odd_names() {
        let line = "4242 (gpuctl (w) 1) T 4200 4242 4200 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 123 0 0";
        assert_eq!(parse_stat(line), Some(('T', 300)));
        assert_eq!(parse_stat("1 (x) S 0"), None);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(state_name('T'), "stopped");
        assert_eq!(state_name('D'), "uninterruptible");
        assert_eq!(state_name('Z'), "zombie");
    }

    #[test]
    fn a_stopped_child_reads_as_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // SAFETY: signals to our own child.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        let mut seen = String::new();
        for _ in 0..100 {
            seen = read(7, pid).map(|p| p.state_name).unwrap_or_default();
            if seen == "stopped" {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(seen, "stopped");
        let me = read(1, std::process::id()).unwrap();
        // The test harness's main thread waits for this test: it sleeps.
        assert_eq!((me.rank, me.state_name.as_str()), (1, "sleeping"));
        assert!(read(1, u32::MAX).is_none());
    }
}
