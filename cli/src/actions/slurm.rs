//! The Slurm effector of `gpuctl accept --drain`: reads the nodes' states with
//! `sinfo` and takes the [`decide::Step`]s with `scontrol`, the commands an
//! operator would type, so Slurm's own configuration (SLURM_CONF, munge) and
//! permissions apply as they would to them. Every failure is reported naming
//! the node and the command and goes no further: the suite's verdict, report
//! and exit code never depend on the scheduler answering.

use super::decide::{SlurmNode, Step};
use std::collections::BTreeMap;

/// `sinfo` for `nodes`: one line per node, `NAME|STATE|REASON`.
pub fn query(nodes: &[String]) -> Vec<String> {
    vec![
        "sinfo".into(),
        "--noheader".into(),
        "--Node".into(),
        format!("--nodes={}", nodes.join(",")),
        "--format=%N|%T|%E".into(),
    ]
}

/// Parses [`query`]'s output; a node Slurm does not know is absent.
pub fn parse(text: &str) -> BTreeMap<String, SlurmNode> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, '|');
            let (name, state, reason) = (f.next()?.trim(), f.next()?.trim(), f.next()?.trim());
            if name.is_empty() {
                return None;
            }
            // sinfo prints `none` for no reason.
            let reason = if reason == "none" { "" } else { reason };
            Some((
                name.to_string(),
                SlurmNode {
                    drained: state.to_ascii_lowercase().contains("drain"),
                    reason: reason.to_string(),
                },
            ))
        })
        .collect()
}

/// The `scontrol` command of a step (none for [`Step::Leave`]).
pub fn command(step: &Step) -> Option<Vec<String>> {
    match step {
        Step::Drain { node, reason } => Some(vec![
            "scontrol".into(),
            "update".into(),
            format!("nodename={node}"),
            "state=drain".into(),
            format!("reason={reason}"),
        ]),
        Step::Resume { node } => Some(vec![
            "scontrol".into(),
            "update".into(),
            format!("nodename={node}"),
            "state=resume".into(),
        ]),
        Step::Leave { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::shown;
    use super::*;

    #[test]
    fn sinfo_lines_parse_with_bars_in_reasons_and_none_for_no_reason() {
        let h = parse(
            "n1|idle|none\nn2|drained|gpuctl: acc-1 quick/stress: a|b\nn3|draining|disk swap\nn4|mixed|none\n",
        );
        assert_eq!(h.len(), 4);
        assert!(!h["n1"].drained && h["n1"].reason.is_empty());
        assert!(h["n2"].ours(), "{:?}", h["n2"]);
        assert_eq!(h["n2"].reason, "gpuctl: acc-1 quick/stress: a|b");
        assert!(h["n3"].drained && !h["n3"].ours());
        assert!(!h["n4"].drained);
    }

    #[test]
    fn commands_print_as_typed() {
        let c = command(&Step::Drain {
            node: "n2".into(),
            reason: "gpuctl: acc-1 quick/stress: it's slow".into(),
        })
        .unwrap();
        assert_eq!(
            shown(&c),
            r"scontrol update nodename=n2 state=drain 'reason=gpuctl: acc-1 quick/stress: it'\''s slow'"
        );
        assert_eq!(
            shown(&command(&Step::Resume { node: "n2".into() }).unwrap()),
            "scontrol update nodename=n2 state=resume"
        );
        let e = super::super::run(&["/nonexistent/scontrol".to_string()]).unwrap_err();
        assert!(
            e.contains("/nonexistent/scontrol") && e.contains("could not start"),
            "{e}"
        );
    }
}
