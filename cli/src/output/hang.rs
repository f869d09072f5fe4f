//! Where each rank was when a job hung: its last phase, the units of work it
//! had done, how long before the end it last made progress, and its process
//! as its agent read it. The blamed rank's reason starts with "hung:".

use gpuctl_core::units::format_duration_ms;
use gpuctl_proto::pb;

use super::table::Table;

/// Whether the report is of a job that failed because a rank hung.
pub fn hung(r: &pb::Report) -> bool {
    r.state() == pb::JobState::Failed
        && r.nodes
            .iter()
            .flat_map(|n| &n.ranks)
            .any(|x| x.reason.starts_with("hung:"))
}

/// One row per rank, the blamed one marked with `!`.
pub fn last_progress_table(r: &pb::Report) -> String {
    let end = r.finished_unix_ms;
    let mut t = Table::new(&[
        "RANK",
        "NODE",
        "LAST PHASE",
        "ITERATIONS",
        "LAST PROGRESS",
        "PROCESS",
    ])
    .right(&[0, 3]);
    for n in &r.nodes {
        for x in &n.ranks {
            let blamed = if x.reason.starts_with("hung:") {
                "!"
            } else {
                ""
            };
            let age = if x.last_progress_unix_ms == 0 {
                "never".to_string()
            } else if end == 0 {
                "-".to_string()
            } else {
                format!(
                    "{} before the end",
                    format_duration_ms(end.saturating_sub(x.last_progress_unix_ms))
                )
            };
            t.row([
                format!("{}{blamed}", x.rank),
                n.name.clone(),
                super::dash(&x.last_phase),
                x.iterations.to_string(),
                age,
                super::dash(&x.process_state),
            ]);
        }
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_marks_the_hung_rank_and_ages_progress() {
        let mut r = pb::Report {
            state: pb::JobState::Failed as i32,
            finished_unix_ms: 40_000,
            ..Default::default()
        };
        r.nodes.push(pb::NodeReport {
            name: "node-1".into(),
            ranks: vec![
                pb::RankReport {
                    rank: 2,
                    last_phase: "all_reduce 1MiB".into(),
                    iterations: 420,
                    last_progress_unix_ms: 28_000,
                    process_state: "sleeping".into(),
                    ..Default::default()
                },
                pb::RankReport {
                    rank: 3,
                    reason: "hung: no progress for 30s, its process is stopped (SIGSTOP?)".into(),
                    last_phase: "all_reduce 1MiB".into(),
                    iterations: 418,
                    last_progress_unix_ms: 0,
                    process_state: "stopped".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        assert!(hung(&r));
        let text = last_progress_table(&r);
        assert!(text.contains("12.0s before the end"), "{text}");
        let row3 = text
            .lines()
            .find(|l| l.contains("3!"))
            .expect("rank 3 marked");
        assert!(row3.contains("never") && row3.contains("stopped"), "{text}");
        r.state = pb::JobState::Cancelled as i32;
        assert!(!hung(&r));
    }
}
