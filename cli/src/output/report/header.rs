//! The report's header: the job, its verdict, duration and backend as
//! key/value lines (the CSV and Markdown `summary` and the HTML page's too).

use std::collections::BTreeMap;

use gpuctl_core::units::format_duration_ms;
use gpuctl_proto::pb;

use crate::output;

fn backend(r: &pb::Report) -> String {
    match (r.backend.trim(), r.nccl_version.trim()) {
        ("", "") => "-".into(),
        (b, "") => b.into(),
        ("", v) => v.into(),
        (b, v) if b == v => b.into(),
        (b, v) => format!("{b} {v}"),
    }
}

pub(super) fn header(r: &pb::Report) -> String {
    output::table::key_values(&header_pairs(r))
}

/// The report's header as key/value pairs (the CSV and Markdown `summary` too).
pub(crate) fn header_pairs(r: &pb::Report) -> Vec<(&'static str, String)> {
    let spec = r.spec.clone().unwrap_or_default();
    let mut pairs = vec![("JOB", r.job_id.clone())];
    if !spec.name.is_empty() {
        pairs.push(("NAME", spec.name.clone()));
    }
    pairs.extend([
        ("WORKLOAD", output::dash(&r.workload)),
        ("STATE", r.state().label().to_string()),
        ("VERDICT", r.verdict().label().to_uppercase()),
        ("DURATION", format_duration_ms(r.duration_ms)),
        ("WORLD SIZE", r.world_size.to_string()),
        ("BACKEND", backend(r)),
        ("REASON", output::dash(&r.reason)),
    ]);
    if !spec.params.is_empty() {
        let params: BTreeMap<_, _> = spec.params.iter().collect();
        let text: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.push(("PARAMS", text.join(" ")));
    }
    if !r.sdc_note.is_empty() {
        pairs.push(("SDC CHECK", r.sdc_note.clone()));
    }
    pairs
}
