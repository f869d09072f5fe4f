//! Saved baselines as tables: the list, and one baseline's figures per
//! device class.

use gpuctl_proto::pb;

use crate::output::{self, table::Table};

/// `now`: the Unix ms each SAVED age is told from.
pub fn list_table(all: &[pb::Baseline], now: u64) -> String {
    let mut t = Table::new(&[
        "NAME",
        "JOB",
        "WORKLOAD",
        "FIGURES",
        "DEVICE CLASSES",
        "SAVED",
    ])
    .right(&[3]);
    for b in all {
        let mut classes: Vec<&str> = b.figures.iter().map(|f| f.device_class.as_str()).collect();
        classes.sort();
        classes.dedup();
        t.row([
            b.name.clone(),
            b.job_id.clone(),
            b.workload.clone(),
            b.figures.len().to_string(),
            output::dash(&classes.join("; ")),
            output::age(b.created_unix_ms, now),
        ]);
    }
    t.render()
}

pub fn figures_table(b: &pb::Baseline) -> String {
    let mut t = Table::new(&["DEVICE CLASS", "METRIC", "KEY", "VALUE", "RANKS"]).right(&[3, 4]);
    for f in &b.figures {
        t.row([
            f.device_class.clone(),
            f.metric.clone(),
            f.key.clone(),
            format!("{:.3}", f.value),
            if f.ranks == 0 {
                "job".to_string()
            } else {
                f.ranks.to_string()
            },
        ]);
    }
    t.render()
}

pub fn render(b: &pb::Baseline, now: u64) -> String {
    let mut s = output::table::key_values(&[
        ("NAME", b.name.clone()),
        ("FROM JOB", b.job_id.clone()),
        ("WORKLOAD", b.workload.clone()),
        ("SAVED", output::age(b.created_unix_ms, now)),
    ]);
    s.push_str("\nFIGURES\n");
    s.push_str(&figures_table(b));
    s
}
