//! The jobs' listing (`gpuctl jobs`): a row per job with its state, nodes,
//! age and duration; also `-o csv|md`.

use gpuctl_proto::pb;

use crate::output::{self, table::Table};

/// Planned node names when there are few, else a count; the asked count before planning.
pub fn nodes_cell(j: &pb::Job) -> String {
    if let Some(p) = j.plan.as_ref().filter(|p| !p.nodes.is_empty()) {
        if p.nodes.len() <= 3 && j.nodes_left_out == 0 {
            return p.nodes.join(",");
        }
        return (p.nodes.len() + j.nodes_left_out as usize).to_string();
    }
    match &j.spec {
        Some(s) if s.all_nodes => "all".into(),
        Some(s) => s.node_count.to_string(),
        None => "-".into(),
    }
}

pub fn render(jobs: &[pb::Job], now: u64) -> String {
    grid(jobs, now).render()
}

/// The jobs' table before layout (also `-o csv|md`).
pub fn grid(jobs: &[pb::Job], now: u64) -> Table {
    let mut t = Table::new(&[
        "ID", "WORKLOAD", "STATE", "NODES", "CREATED", "DURATION", "NAME", "MESSAGE",
    ]);
    for j in jobs {
        let spec = j.spec.clone().unwrap_or_default();
        t.row([
            j.id.clone(),
            spec.workload,
            output::job_state(j).to_string(),
            nodes_cell(j),
            output::age(j.created_unix_ms, now),
            output::fmt_duration_opt(output::job_duration_ms(j, now)),
            output::dash(&spec.name),
            output::truncate(&output::dash(&j.message), 60),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(nodes: &[&str], left_out: u32) -> pb::Job {
        pb::Job {
            plan: Some(pb::Plan {
                nodes: nodes.iter().map(|n| n.to_string()).collect(),
                ..Default::default()
            }),
            nodes_left_out: left_out,
            ..Default::default()
        }
    }

    #[test]
    fn a_few_nodes_are_named_and_a_listing_s_big_job_is_counted_whole() {
        assert_eq!(nodes_cell(&planned(&["a", "b"], 0)), "a,b");
        assert_eq!(nodes_cell(&planned(&["a", "b", "c", "d"], 0)), "4");
        // A listing names 8 of a 4,096-node job's nodes.
        let named = ["a", "b", "c", "d", "e", "f", "g", "h"];
        assert_eq!(nodes_cell(&planned(&named, 4088)), "4096");
        assert_eq!(nodes_cell(&planned(&["a"], 1)), "2");
    }
}
