//! A plan (`gpuctl plan`, the dry run) as tables: ranks in order, the
//! environment with a reason per variable, the preflight checks that did not
//! pass. The report reuses the environment and check tables. A big plan
//! comes bounded: the tables say what was left out and that JSON has it all.

use gpuctl_proto::pb;

use crate::output::{self, table::Table};

pub fn rank_table(ranks: &[pb::RankPlacement]) -> String {
    let mut t = Table::new(&["RANK", "NODE", "LOCAL RANK", "DEVICE", "DEVICE NAME"]).right(&[0, 2]);
    let mut ranks: Vec<&pb::RankPlacement> = ranks.iter().collect();
    ranks.sort_by_key(|r| r.rank);
    for r in ranks {
        t.row([
            r.rank.to_string(),
            r.node.clone(),
            r.local_rank.to_string(),
            r.device_label(),
            output::dash(&r.device_name),
        ]);
    }
    t.render()
}

pub fn env_table(env: &[pb::EnvVar]) -> String {
    env_grid(env).render()
}

/// The environment plan's table before layout (the HTML report's too).
pub(crate) fn env_grid(env: &[pb::EnvVar]) -> Table {
    let mut t = Table::new(&["NAME", "VALUE", "REASON"]);
    for e in env {
        t.row([
            e.name.clone(),
            output::dash(&e.value),
            output::dash(&e.reason),
        ]);
    }
    t
}

/// Checks that are not a pass, one a row, under one line for those that pass.
pub fn checks_table(checks: &[pb::PreflightCheck]) -> String {
    let (passing, rest) = output::findings::fold_checks(checks);
    let mut s = passing.map(|l| format!("{l}\n")).unwrap_or_default();
    if rest.is_empty() {
        return s;
    }
    let mut t = Table::new(&["NODE", "CHECK", "VERDICT", "DETAIL", "FIX"]);
    for ch in rest {
        t.row([
            ch.node.clone(),
            ch.name.clone(),
            ch.verdict().label().to_string(),
            output::dash(&ch.detail),
            output::dash(&ch.fix),
        ]);
    }
    s.push_str(&t.render());
    s
}

pub fn render(p: &pb::Plan) -> String {
    let mut s = output::table::key_values(&[
        ("NODES", nodes_cell(&p.nodes)),
        ("WORLD SIZE", p.world_size.to_string()),
        (
            "MASTER",
            format!("{}:{}", output::dash(&p.master_addr), p.master_port),
        ),
    ]);
    s.push_str("\nRANKS\n");
    s.push_str(&rank_table(&p.ranks));
    if p.ranks_left_out > 0 {
        s.push_str(&format!(
            "the first {} of {} ranks; -o json for all\n",
            p.ranks.len(),
            p.ranks.len() as u32 + p.ranks_left_out
        ));
    }
    s.push_str("\nENVIRONMENT\n");
    s.push_str(&env_table(&p.env));
    if !p.checks.is_empty() || p.passes_left_out > 0 || p.faults_left_out > 0 {
        s.push_str("\nPREFLIGHT\n");
        s.push_str(&left_out_checks(p));
        s.push_str(&checks_table(&p.checks));
    }
    s
}

/// Names the nodes of a small plan; a big one's count and its first few.
fn nodes_cell(nodes: &[String]) -> String {
    const NAMED: usize = 8;
    if nodes.len() <= NAMED {
        return output::dash(&nodes.join(", "));
    }
    format!(
        "{} ({}, … and {} more; -o json for all)",
        nodes.len(),
        nodes[..NAMED].join(", "),
        nodes.len() - NAMED
    )
}

/// What a bounded plan counted instead of sending, a line each.
fn left_out_checks(p: &pb::Plan) -> String {
    let mut s = String::new();
    if p.passes_left_out > 0 {
        s.push_str(&format!(
            "{} check{} pass (-o json lists them)\n",
            p.passes_left_out,
            if p.passes_left_out == 1 { "" } else { "s" }
        ));
    }
    if p.faults_left_out > 0 {
        s.push_str(&format!(
            "{} more checks did not pass, not shown (-o json lists them)\n",
            p.faults_left_out
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_tables_list_ranks_in_order_and_env_reasons() {
        let p = pb::Plan {
            nodes: vec!["a".into(), "b".into()],
            world_size: 2,
            master_addr: "10.0.0.1".into(),
            master_port: 29500,
            ranks: vec![
                pb::RankPlacement {
                    rank: 1,
                    node: "b".into(),
                    node_rank: 1,
                    ..Default::default()
                },
                pb::RankPlacement {
                    rank: 0,
                    node: "a".into(),
                    ..Default::default()
                },
            ],
            env: vec![pb::EnvVar {
                name: "NCCL_IB_DISABLE".into(),
                value: "1".into(),
                reason: "node b has no InfiniBand device".into(),
            }],
            ..Default::default()
        };
        let s = render(&p);
        let a = s.find("\n   0   a").expect(&s);
        let b = s.find("\n   1   b").expect(&s);
        assert!(a < b, "{s}");
        assert!(
            s.contains("NCCL_IB_DISABLE   1       node b has no InfiniBand device"),
            "{s}"
        );
        assert!(s.contains("10.0.0.1:29500"));
        assert!(
            !s.contains("-o json"),
            "a whole plan says nothing is left out: {s}"
        );
    }

    #[test]
    fn a_bounded_plan_says_what_it_left_out() {
        let p = pb::Plan {
            nodes: (0..4096).map(|k| format!("sim-{k:05}")).collect(),
            world_size: 32_768,
            ranks: vec![pb::RankPlacement {
                node: "sim-00000".into(),
                ..Default::default()
            }],
            ranks_left_out: 32_767,
            passes_left_out: 4_095,
            faults_left_out: 3,
            checks: vec![pb::PreflightCheck {
                node: "sim-00007".into(),
                name: "shm".into(),
                verdict: pb::Verdict::Fail as i32,
                detail: "/dev/shm is 64 MiB".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let s = render(&p);
        assert!(
            s.contains("the first 1 of 32768 ranks; -o json for all"),
            "{s}"
        );
        assert!(s.contains("4095 checks pass (-o json lists them)"), "{s}");
        assert!(s.contains("3 more checks did not pass"), "{s}");
        assert!(s.contains("sim-00007"), "{s}");
        assert!(
            s.contains("4096 (sim-00000, sim-00001, sim-00002, sim-00003, sim-00004, sim-00005, sim-00006, sim-00007, … and 4088 more; -o json for all)"),
            "{s}"
        );
        assert!(!s.contains("sim-00008"), "{s}");
    }
}
