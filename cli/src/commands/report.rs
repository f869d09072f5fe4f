//! `gpuctl report JOB`: the aggregated verdict of a job — header, nodes, ranks
//! with their workload figures, the collective bandwidth table laid out like
//! nccl-tests' output, and the environment plan with a reason per variable.
//! `submit --wait` prints the same thing when the job ends.

use std::collections::BTreeMap;

use anyhow::Result;
use gpuctl_core::pb::{self, rank_result::Detail};
use gpuctl_core::units::format_duration_ms;

use crate::args::OutputFormat;
use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, findings, table::Table};

pub async fn run(c: &mut Coordinator, id: &str, out: OutputFormat) -> Result<Exit> {
    let report = c.report(id).await?;
    if out == OutputFormat::Html {
        // The page plots the job's telemetry over time, which the report
        // itself only summarises.
        let timeline = c.timeline(id).await?;
        output::print_text(&output::html::page(&report, &timeline)?);
    } else {
        print(&report, out)?;
    }
    // Like `submit --wait`, the exit code carries the verdict, so a script can
    // gate on `gpuctl report JOB` alone.
    Ok(Exit::of_report(&report))
}

pub fn print(report: &pb::Report, out: OutputFormat) -> Result<()> {
    match out {
        OutputFormat::Json => output::print_json(&output::json::report(report)),
        OutputFormat::Table => output::print_text(&render(report)),
        OutputFormat::Csv => output::print_text(&output::report_grid::csv(report)?),
        OutputFormat::Md => output::print_text(&output::report_grid::markdown(report)),
        OutputFormat::Junit => output::print_text(&output::junit::report(report)?),
        // Only `report` takes html (commands::check_format) and its `run`
        // passes the telemetry timeline; with no connection here, none.
        OutputFormat::Html => {
            output::print_text(&output::html::page(report, &pb::Timeline::default())?)
        }
    }
    Ok(())
}

fn backend(r: &pb::Report) -> String {
    match (r.backend.trim(), r.nccl_version.trim()) {
        ("", "") => "-".into(),
        (b, "") => b.into(),
        ("", v) => v.into(),
        (b, v) if b == v => b.into(),
        (b, v) => format!("{b} {v}"),
    }
}

fn header(r: &pb::Report) -> String {
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

fn nodes_table(r: &pb::Report) -> String {
    nodes_grid(r).render()
}

pub(crate) fn nodes_grid(r: &pb::Report) -> Table {
    let mut t = Table::new(&["NODE", "VERDICT", "RANKS", "REASON"]).right(&[2]);
    for n in &r.nodes {
        let pass = n
            .ranks
            .iter()
            .filter(|x| x.verdict() == pb::Verdict::Pass)
            .count();
        t.row([
            n.name.clone(),
            n.verdict().label().to_string(),
            format!("{pass}/{} pass", n.ranks.len()),
            output::dash(&n.reason),
        ]);
    }
    t
}

/// Which workload figures appear in the rank table: the union over the ranks,
/// so a mixed or partly-reported job still lines up.
#[derive(Default)]
struct Kinds {
    stress: bool,
    train: bool,
    maxbatch: bool,
}

fn kinds(r: &pb::Report) -> Kinds {
    let mut k = Kinds::default();
    for rank in r.nodes.iter().flat_map(|n| &n.ranks) {
        match rank.result.as_ref().and_then(|x| x.detail.as_ref()) {
            Some(Detail::Stress(_)) => k.stress = true,
            Some(Detail::Train(_)) => k.train = true,
            Some(Detail::Maxbatch(_)) => k.maxbatch = true,
            _ => {}
        }
    }
    k
}

/// The SDC cell of a stress rank: its own stability, then the cross-rank verdict.
/// (A rank fails for other reasons too, a slow GPU say: the coordinator's
/// digest vote is what the reason says.)
fn sdc_cell(rank: &pb::RankReport, s: &pb::StressResult, ok: bool) -> String {
    let outvoted =
        rank.reason.contains("silent data corruption") || rank.reason.contains("digests disagree");
    if s.self_mismatches > 0 {
        format!("{} of {} checks changed", s.self_mismatches, s.checks)
    } else if ok && outvoted {
        "differs from group".into()
    } else {
        format!("ok ({} checks)", s.checks)
    }
}

fn short_digest(d: &str) -> String {
    output::dash(&d.chars().take(12).collect::<String>())
}

fn ranks_table(r: &pb::Report) -> String {
    ranks_grid(r).render()
}

pub(crate) fn ranks_grid(r: &pb::Report) -> Table {
    let k = kinds(r);
    let mut headers = vec!["RANK", "NODE", "LOCAL", "DEVICE", "DEVICE NAME", "VERDICT"];
    let mut right = vec![0, 2];
    if k.stress {
        right.extend(headers.len()..headers.len() + 3);
        headers.extend(["TFLOP/S MIN", "MEDIAN", "MAX", "DIGEST", "SDC"]);
    }
    if k.train {
        right.extend(headers.len()..headers.len() + 4);
        headers.extend(["SAMPLES/S", "P50 MS", "P99 MS", "LOSS", "SCALING"]);
        right.extend(headers.len()..headers.len() + 3);
        headers.extend(["COMM MS", "EXPOSED MS", "OVERLAP"]);
    }
    if k.maxbatch {
        right.extend(headers.len()..headers.len() + 2);
        headers.extend(["MAX BATCH", "RECOMMENDED"]);
    }
    right.push(headers.len());
    headers.push("PEAK MEM");
    headers.push("REASON");
    let mut t = Table::new(&headers).right(&right);
    for (node, rank) in ranks_in_order(r) {
        let res = rank.result.as_ref();
        let detail = res.and_then(|x| x.detail.as_ref());
        let mut row = vec![
            rank.rank.to_string(),
            node.to_string(),
            rank.local_rank.to_string(),
            output::dash(&rank.device),
            output::dash(&rank.device_name),
            rank.verdict().label().to_string(),
        ];
        if k.stress {
            match detail {
                Some(Detail::Stress(s)) => row.extend([
                    crate::output::fmt_tflops(s.tflops_min),
                    crate::output::fmt_tflops(s.tflops_median),
                    crate::output::fmt_tflops(s.tflops_max),
                    short_digest(&s.digest),
                    sdc_cell(rank, s, res.is_some_and(|x| x.ok)),
                ]),
                _ => row.extend(std::iter::repeat_n("-".to_string(), 5)),
            }
        }
        if k.train {
            match detail {
                Some(Detail::Train(t)) => row.extend([
                    if t.unit.is_empty() {
                        format!("{:.1}", t.samples_per_s)
                    } else {
                        format!("{:.1} {}", t.samples_per_s, t.unit)
                    },
                    format!("{:.1}", t.step_ms_p50),
                    format!("{:.1}", t.step_ms_p99),
                    format!("{:.4}", t.final_loss),
                    // Against this rank's own no-communication rate.
                    if t.baseline_samples_per_s > 0.0 {
                        format!("{:.1}%", t.scaling_efficiency * 100.0)
                    } else {
                        "-".to_string()
                    },
                ]),
                _ => row.extend(std::iter::repeat_n("-".to_string(), 5)),
            }
            // Per step of the first model; `-` without communication.
            match detail {
                Some(Detail::Train(t)) => {
                    row.extend(output::models::comm_cells(output::models::comm(t)))
                }
                _ => row.extend(std::iter::repeat_n("-".to_string(), 3)),
            }
        }
        if k.maxbatch {
            match detail {
                Some(Detail::Maxbatch(m)) => {
                    row.extend([m.max_batch.to_string(), m.recommended.to_string()])
                }
                _ => row.extend(std::iter::repeat_n("-".to_string(), 2)),
            }
        }
        // Train results carry the allocator's peak (the highest model's with
        // `--model a,b`); others the device's (or VmHWM on CPU).
        let peak = match (detail, res) {
            (Some(Detail::Train(t)), Some(x)) if t.peak_memory_bytes > 0 => {
                let models = output::models::train_results(x);
                models.map(|t| t.peak_memory_bytes).max().unwrap_or(0)
            }
            _ => res.map(|x| x.peak_memory_bytes).unwrap_or(0),
        };
        row.push(if peak > 0 {
            gpuctl_core::units::format_bytes(peak)
        } else {
            "-".to_string()
        });
        row.push(output::truncate(&output::dash(&rank_reason(rank)), 80));
        t.row(row);
    }
    t
}

/// Every rank with its node's name, by rank number.
pub(crate) fn ranks_in_order(r: &pb::Report) -> Vec<(&str, &pb::RankReport)> {
    let mut ranks: Vec<(&str, &pb::RankReport)> = r
        .nodes
        .iter()
        .flat_map(|n| n.ranks.iter().map(move |x| (n.name.as_str(), x)))
        .collect();
    ranks.sort_by_key(|(_, x)| x.rank);
    ranks
}

/// Why a rank got its verdict: the coordinator's reason, else the worker's error.
pub(crate) fn rank_reason(rank: &pb::RankReport) -> String {
    if rank.reason.is_empty() {
        rank.result
            .as_ref()
            .map(|x| x.error.clone())
            .unwrap_or_default()
    } else {
        rank.reason.clone()
    }
}

/// nccl-tests prints times with fewer decimals as they grow; so do we, to match line by line.
fn nccl_time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// Bytes before the out-of-place block: size, count, type, redop, root.
const NCCL_PREFIX: usize = 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6;

/// One table per collective, laid out like nccl-tests' `*_perf` output so the
/// two can be compared line by line.
pub fn collectives_table(rows: &[pb::CollectiveRow]) -> String {
    let mut ops: Vec<&str> = Vec::new();
    for r in rows {
        if !ops.contains(&r.op.as_str()) {
            ops.push(&r.op);
        }
    }
    let mut s = String::new();
    for op in ops {
        let mut mine: Vec<&pb::CollectiveRow> = rows.iter().filter(|r| r.op == op).collect();
        mine.sort_by(|a, b| a.dtype.cmp(&b.dtype).then(a.bytes.cmp(&b.bytes)));
        s.push_str(&format!("# {op}\n"));
        let top = format!(
            "#{:w$}{:^32}{:^32}",
            "",
            "out-of-place",
            "in-place",
            w = NCCL_PREFIX - 1
        );
        s.push_str(top.trim_end());
        s.push('\n');
        s.push_str(&format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}\n",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        ));
        let units = format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
        s.push_str(units.trim_end());
        s.push('\n');
        let mut bw_sum = 0.0;
        for r in &mine {
            let redop = if r.redop.is_empty() {
                "none"
            } else {
                r.redop.as_str()
            };
            s.push_str(&format!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {:>6.2}  {:>6.2}  {:>5}  {}  {:>6.2}  {:>6.2}  {:>5}\n",
                r.bytes,
                r.count,
                r.dtype,
                redop,
                r.root,
                nccl_time(r.time_us),
                r.algbw_gbps,
                r.busbw_gbps,
                r.wrong,
                nccl_time(r.time_us_ip),
                r.algbw_gbps_ip,
                r.busbw_gbps_ip,
                r.wrong_ip
            ));
            bw_sum += r.busbw_gbps + r.busbw_gbps_ip;
        }
        // As nccl-tests: the mean over every size, out-of-place and in-place.
        if !mine.is_empty() {
            let avg = bw_sum / (2 * mine.len()) as f64;
            let wrong: u64 = mine.iter().map(|r| r.wrong + r.wrong_ip).sum();
            s.push_str(&format!(
                "# Out of bounds values : {wrong} {}\n",
                if wrong == 0 { "OK" } else { "FAILED" }
            ));
            s.push_str(&format!("# Avg bus bandwidth    : {avg:.4}\n"));
        }
        s.push('\n');
    }
    s
}

pub fn render(r: &pb::Report) -> String {
    // The verdict first and last, the findings right under it: the lines a
    // person reads before anything else.
    let mut s = findings::verdict_line(r);
    if !r.findings.is_empty() {
        let fails = r
            .findings
            .iter()
            .filter(|f| f.level() == pb::Verdict::Fail)
            .count();
        s.push_str(&format!(
            "\nFINDINGS ({fails} fail, {} warn)\n",
            r.findings.len() - fails
        ));
        s.push_str(&findings::findings_table(&r.findings));
    }
    s.push('\n');
    s.push_str(&header(r));
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    if !r.nodes.is_empty() {
        s.push_str("\nNODES\n");
        s.push_str(&nodes_table(r));
        s.push_str("\nRANKS\n");
        s.push_str(&ranks_table(r));
        if output::hang::hung(r) {
            s.push_str(&format!(
                "\nLAST PROGRESS (the job hung: no progress for the hang timeout of {}; ! = blamed)\n",
                format_duration_ms(r.hang_timeout_ms)
            ));
            s.push_str(&output::hang::last_progress_table(r));
        }
    }
    if let Some(models) = output::models::section(r) {
        s.push_str(&models);
    }
    if let Some(loader) = output::loader::section(r) {
        s.push_str(&loader);
    }
    if let Some(profile) = output::profile::section(r) {
        s.push_str(&profile);
    }
    if let Some(curve) = output::maxbatch::curve(r) {
        s.push_str("\nMAXBATCH (each trial: batch -> peak memory; OOM = out of memory)\n");
        s.push_str(&curve);
    }
    // p2p: per node the GPU pairs' matrix, then the host<->device copies.
    if let Some(p2p) = output::p2p::section(r) {
        s.push_str(&p2p);
    }
    if !r.links.is_empty() {
        s.push_str("\nLINKS (every pair of nodes; the slowest rank of each pair)\n");
        s.push_str(&output::links::matrix(&r.links));
    }
    let search = r
        .spec
        .as_ref()
        .and_then(|sp| sp.params.get("pattern"))
        .is_some_and(|p| p == "search");
    if !r.bisect.is_empty() && search {
        s.push_str("\nSEARCH (groups measured at the same time; a slow one is split, a suspect confirmed with two cleared nodes)\n");
        s.push_str(&output::links::bisect(&r.bisect));
    } else if !r.bisect.is_empty() {
        s.push_str("\nBISECT (halves measured at the same time; the slower one is split again)\n");
        s.push_str(&output::links::bisect(&r.bisect));
    }
    if !r.collectives.is_empty() {
        s.push_str("\nCOLLECTIVES (across ranks: slowest rank's time, #wrong summed)\n");
        s.push_str(&collectives_table(&r.collectives));
    }
    if !r.health.is_empty() {
        s.push_str("\nGPU HEALTH\n");
        s.push_str(&health_table(&r.health));
    }
    if !r.telemetry.is_empty() {
        s.push_str("\nGPU TELEMETRY (over the run)\n");
        s.push_str(&telemetry_table(&r.telemetry));
    }
    if !r.env.is_empty() {
        if r.collectives.is_empty() {
            s.push('\n');
        }
        s.push_str("ENVIRONMENT\n");
        s.push_str(&super::plan::env_table(&r.env));
    }
    if !r.preflight.is_empty() {
        s.push_str("\nPREFLIGHT (at job start)\n");
        s.push_str(&super::plan::checks_table(&r.preflight));
    }
    s.push('\n');
    s.push_str(&findings::verdict_line(r));
    s
}

/// Findings worst first, so the reason a node failed is the first line.
pub fn health_table(findings: &[pb::HealthFinding]) -> String {
    let mut f: Vec<&pb::HealthFinding> = findings.iter().collect();
    f.sort_by_key(|x| {
        (
            x.verdict() != pb::Verdict::Fail,
            x.node.clone(),
            x.gpu_index,
        )
    });
    let mut t = Table::new(&["NODE", "GPU", "VERDICT", "RULE", "DETAIL"]).right(&[1]);
    for x in f {
        t.row([
            x.node.clone(),
            x.gpu_index.to_string(),
            x.verdict().label().to_string(),
            x.rule.clone(),
            output::dash(&x.detail),
        ]);
    }
    t.render()
}

/// One row per GPU: how busy, hot and hungry it was, how steady, and what its
/// error counters did during the run.
pub fn telemetry_table(summaries: &[pb::GpuTelemetrySummary]) -> String {
    telemetry_grid(summaries).render()
}

/// The telemetry table before layout (the HTML report's too).
pub(crate) fn telemetry_grid(summaries: &[pb::GpuTelemetrySummary]) -> Table {
    let mut t = Table::new(&[
        "NODE",
        "GPU",
        "VERDICT",
        "SAMPLES",
        "UTIL MEAN",
        "MAX",
        "STD",
        "<10%",
        "MEM MAX",
        "TEMP MEAN",
        "MAX",
        "POWER MEAN",
        "MAX",
        "SM MHZ",
        "ECC C/U",
        "PCIE REPLAYS",
        "NVLINK CRC",
        "XIDS",
    ])
    .right(&(1..17).filter(|c| *c != 2).collect::<Vec<_>>());
    for x in summaries {
        t.row([
            x.node.clone(),
            x.index.to_string(),
            x.verdict().label().to_string(),
            x.samples.to_string(),
            format!("{:.1}%", x.util_mean),
            format!("{:.0}%", x.util_max),
            format!("{:.1}", x.util_std),
            format!("{:.0}%", x.util_low_share * 100.0),
            gpuctl_core::units::format_bytes(x.mem_used_max_bytes),
            format!("{:.1}°C", x.temp_mean),
            format!("{:.0}°C", x.temp_max),
            format!("{:.0} W", x.power_mean_w),
            format!("{:.0} W", x.power_max_w),
            format!("{:.0}", x.sm_clock_mean_mhz),
            format!("{}/{}", x.ecc_corrected_delta, x.ecc_uncorrected_delta),
            x.pcie_replays_delta.to_string(),
            x.nvlink_crc_delta.to_string(),
            output::dash(
                &x.xids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]);
    }
    t
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn rank(rank: u32, local: u32, verdict: pb::Verdict, detail: Option<Detail>) -> pb::RankReport {
        pb::RankReport {
            rank,
            local_rank: local,
            device: format!("cuda:{local}"),
            device_name: "NVIDIA H200".into(),
            gpu_uuid: format!("GPU-{rank}"),
            verdict: verdict as i32,
            reason: if verdict == pb::Verdict::Fail {
                "silent data corruption: result digest ffff differs from abcdef0123456789 shared by 1 of 2 ranks".into()
            } else {
                String::new()
            },
            result: detail.map(|d| pb::RankResult {
                rank,
                ok: true,
                nccl_version: "2.28.9".into(),
                detail: Some(d),
                ..Default::default()
            }),
            gpu_index: Some(local),
            ..Default::default()
        }
    }

    fn stress(min: f64, digest: &str, self_mismatches: u64) -> Detail {
        Detail::Stress(pb::StressResult {
            dtype: "bf16".into(),
            matrix_size: 8192,
            tflops_min: min,
            tflops_median: min + 10.0,
            tflops_max: min + 20.0,
            digest: digest.into(),
            self_mismatches,
            checks: 12,
            device_class: "NVIDIA H200/cuBLAS".into(),
            ..Default::default()
        })
    }

    pub(crate) fn stress_report() -> pb::Report {
        pb::Report {
            job_id: "job-000042".into(),
            workload: "stress".into(),
            state: pb::JobState::Failed as i32,
            verdict: pb::Verdict::Fail as i32,
            reason: "rank 1 (node-b cuda:0): digest differs".into(),
            duration_ms: 30_500,
            world_size: 3,
            backend: "nccl".into(),
            nccl_version: "2.28.9".into(),
            sdc_note: "compared within 1 device class".into(),
            nodes: vec![
                pb::NodeReport {
                    name: "node-a".into(),
                    verdict: pb::Verdict::Pass as i32,
                    reason: String::new(),
                    ranks: vec![rank(
                        0,
                        0,
                        pb::Verdict::Pass,
                        Some(stress(700.0, "abcdef0123456789", 0)),
                    )],
                    findings: vec![],
                },
                pb::NodeReport {
                    name: "node-b".into(),
                    verdict: pb::Verdict::Fail as i32,
                    reason: "rank 1 failed".into(),
                    ranks: vec![
                        rank(1, 0, pb::Verdict::Fail, Some(stress(650.5, "ffff", 0))),
                        rank(2, 1, pb::Verdict::Incomplete, None),
                    ],
                    findings: vec![],
                },
            ],
            env: vec![pb::EnvVar {
                name: "NCCL_IB_DISABLE".into(),
                value: "1".into(),
                reason: "no InfiniBand on node-b".into(),
            }],
            spec: Some(pb::JobSpec {
                workload: "stress".into(),
                node_count: 2,
                duration_ms: 30_000,
                ..Default::default()
            }),
            telemetry: vec![pb::GpuTelemetrySummary {
                node: "node-b".into(),
                index: 1,
                uuid: "GPU-2".into(),
                samples: 30,
                util_mean: 97.25,
                util_max: 100.0,
                util_std: 1.5,
                util_low_share: 0.1,
                mem_used_max_bytes: 70 << 30,
                temp_mean: 71.0,
                temp_max: 93.0,
                power_mean_w: 640.0,
                power_max_w: 700.0,
                sm_clock_mean_mhz: 1980.0,
                ecc_uncorrected_delta: 2,
                xids: vec![48, 79],
                verdict: pb::Verdict::Fail as i32,
                ..Default::default()
            }],
            health: vec![
                pb::HealthFinding {
                    node: "node-b".into(),
                    gpu_index: 1,
                    verdict: pb::Verdict::Warn as i32,
                    rule: "temperature".into(),
                    detail: "reached 93 °C (warn at 90 °C)".into(),
                    ..Default::default()
                },
                pb::HealthFinding {
                    node: "node-b".into(),
                    gpu_index: 1,
                    verdict: pb::Verdict::Fail as i32,
                    rule: "xid".into(),
                    detail: "critical XID 48, 79 during the run".into(),
                    ..Default::default()
                },
            ],
            preflight: vec![pb::PreflightCheck {
                node: "node-b".into(),
                name: "shm".into(),
                verdict: pb::Verdict::Pass as i32,
                detail: "/dev/shm is 16 GiB".into(),
                fix: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn telemetry_health_and_preflight_in_table_and_json() {
        let r = stress_report();
        let s = render(&r);
        let health = s.find("GPU HEALTH\n").expect(&s);
        let xid = s.find("xid ").expect(&s);
        let temp = s.find("temperature ").expect(&s);
        assert!(health < xid && xid < temp, "failures first:\n{s}");
        let row = s
            .lines()
            .find(|l| l.starts_with("node-b") && l.contains("97.2%"))
            .expect(&s);
        for cell in [
            "fail", "30", "100%", "10%", "70 GiB", "93°C", "640 W", "0/2", "48,79",
        ] {
            assert!(row.contains(cell), "`{cell}` missing in {row}");
        }
        assert!(s.contains("PREFLIGHT (at job start)\n"), "{s}");
        // A passing check is folded into one line; its detail is in the JSON.
        assert!(s.contains("1 check pass"), "{s}");
        assert!(!s.contains("/dev/shm is 16 GiB"), "{s}");

        let v = output::json::report(&r);
        assert_eq!(v["telemetry"][0]["node"], "node-b");
        assert_eq!(v["telemetry"][0]["verdict"], "fail");
        assert_eq!(v["telemetry"][0]["util_mean"], 97.25);
        assert_eq!(v["telemetry"][0]["xids"], serde_json::json!([48, 79]));
        assert_eq!(v["telemetry"][0]["ecc_uncorrected_delta"], 2);
        assert_eq!(v["health"].as_array().unwrap().len(), 2);
        assert_eq!(v["health"][1]["rule"], "xid");
        assert_eq!(v["health"][1]["verdict"], "fail");
        assert_eq!(v["health"][1]["gpu_index"], 1);
        assert_eq!(v["preflight"][0]["name"], "shm");
        assert_eq!(v["preflight"][0]["verdict"], "pass");
        // A report without telemetry still has the keys, empty.
        let v = output::json::report(&nccl_report());
        assert_eq!(v["telemetry"], serde_json::json!([]));
        assert_eq!(v["health"], serde_json::json!([]));
    }

    fn nccl_report() -> pb::Report {
        let row = |op: &str, bytes: u64, t: f64| pb::CollectiveRow {
            op: op.into(),
            bytes,
            count: bytes / 4,
            dtype: "float".into(),
            redop: if op == "all_gather" {
                String::new()
            } else {
                "sum".into()
            },
            root: -1,
            time_us: t,
            algbw_gbps: bytes as f64 / t / 1e3,
            busbw_gbps: bytes as f64 / t / 1e3,
            wrong: 0,
            time_us_ip: t,
            algbw_gbps_ip: bytes as f64 / t / 1e3,
            busbw_gbps_ip: bytes as f64 / t / 1e3,
            wrong_ip: if op == "all_gather" { 3 } else { 0 },
        };
        pb::Report {
            job_id: "job-000043".into(),
            workload: "nccl".into(),
            state: pb::JobState::Succeeded as i32,
            verdict: pb::Verdict::Pass as i32,
            world_size: 2,
            backend: "tcp-ring".into(),
            collectives: vec![
                row("all_reduce", 1 << 20, 39.49),
                row("all_reduce", 1 << 10, 12.5),
                row("all_gather", 1 << 20, 12345.0),
            ],
            nodes: vec![pb::NodeReport {
                name: "local-0".into(),
                verdict: pb::Verdict::Pass as i32,
                ranks: vec![rank(
                    0,
                    0,
                    pb::Verdict::Pass,
                    Some(Detail::Collectives(pb::CollectiveResult {
                        backend: "tcp-ring".into(),
                        world_size: 2,
                        rows: vec![],
                        ..Default::default()
                    })),
                )],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn report_json_has_the_documented_keys() {
        let v = output::json::report(&stress_report());
        assert_eq!(v["job_id"], "job-000042");
        assert_eq!(v["state"], "failed");
        assert_eq!(v["verdict"], "fail");
        assert_eq!(v["workload"], "stress");
        assert_eq!(v["duration_ms"], 30_500);
        assert_eq!(v["world_size"], 3);
        assert!(v["reason"].as_str().unwrap().contains("digest differs"));
        let nodes = v["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1]["name"], "node-b");
        assert_eq!(nodes[1]["verdict"], "fail");
        let r1 = &nodes[1]["ranks"][0];
        assert_eq!(r1["rank"], 1);
        assert_eq!(r1["local_rank"], 0);
        assert_eq!(r1["device"], "cuda:0");
        assert_eq!(r1["device_name"], "NVIDIA H200");
        assert_eq!(r1["verdict"], "fail");
        assert_eq!(r1["stress"]["tflops_min"], 650.5);
        assert_eq!(r1["stress"]["tflops_median"], 660.5);
        assert_eq!(r1["stress"]["tflops_max"], 670.5);
        assert_eq!(r1["stress"]["digest"], "ffff");
        assert_eq!(r1["stress"]["self_mismatches"], 0);
        let r2 = &nodes[1]["ranks"][1];
        assert_eq!(r2["verdict"], "incomplete");
        assert_eq!(r2["reported"], false);
        assert!(r2.get("stress").is_none());
        assert_eq!(v["env"][0]["name"], "NCCL_IB_DISABLE");
        assert_eq!(v["env"][0]["reason"], "no InfiniBand on node-b");
        assert_eq!(v["collectives"].as_array().unwrap().len(), 0);
    }

    /// Two ranks of an fsdp gpt run: rank 0 with overlap figures and shard
    /// digests, rank 1 as a worker that measures neither.
    fn train_report() -> pb::Report {
        let t = |comm: f64, exposed: f64, share: f64, own: &str, gathered: &[&str]| {
            Detail::Train(pb::TrainResult {
                model: "gpt".into(),
                variant: "1.3b".into(),
                mode: "fsdp".into(),
                unit: "tok".into(),
                samples_per_s: 1000.0,
                comm_ms_per_step: comm,
                comm_exposed_ms_per_step: exposed,
                overlap_share: share,
                shard_digest: own.into(),
                gathered_shard_digests: gathered.iter().map(|d| d.to_string()).collect(),
                ..Default::default()
            })
        };
        pb::Report {
            workload: "fsdp".into(),
            nodes: vec![pb::NodeReport {
                name: "node-a".into(),
                ranks: vec![
                    rank(
                        0,
                        0,
                        pb::Verdict::Pass,
                        Some(t(12.0, 3.0, 0.75, "aa", &["aa", "bb"])),
                    ),
                    rank(1, 1, pb::Verdict::Pass, Some(t(9.0, 0.0, 0.0, "", &[]))),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn training_shows_communication_overlap_and_shards_per_rank() {
        let r = train_report();
        let g = ranks_grid(&r);
        let col = |h: &str| g.headers().iter().position(|x| x == h).unwrap();
        let cells = |row: usize| -> Vec<&str> {
            ["COMM MS", "EXPOSED MS", "OVERLAP"]
                .iter()
                .map(|h| g.rows()[row][col(h)].as_str())
                .collect()
        };
        assert_eq!(cells(0), ["12.0", "3.0", "75%"]);
        // No overlap measured: everything waited.
        assert_eq!(cells(1), ["9.0", "9.0", "0%"]);
        assert!(col("OVERLAP") > col("SCALING"));
        let v = output::json::report(&r);
        let t0 = &v["nodes"][0]["ranks"][0]["train"];
        assert_eq!(t0["variant"], "1.3b");
        assert_eq!(t0["comm_ms_per_step"], 12.0);
        assert_eq!(t0["comm_exposed_ms_per_step"], 3.0);
        assert_eq!(t0["overlap_share"], 0.75);
        assert_eq!(t0["shard_digest"], "aa");
        assert_eq!(
            t0["gathered_shard_digests"],
            serde_json::json!(["aa", "bb"])
        );
        let t1 = &v["nodes"][0]["ranks"][1]["train"];
        assert_eq!(t1["gathered_shard_digests"], serde_json::json!([]));
        let text = render(&r);
        assert!(text.contains("gpt 1.3b"), "{text}");
    }

    #[test]
    fn collectives_json_rows() {
        let v = output::json::report(&nccl_report());
        let c = &v["collectives"][0];
        for key in [
            "op",
            "bytes",
            "count",
            "dtype",
            "time_us",
            "algbw_gbps",
            "busbw_gbps",
            "wrong",
            "time_us_ip",
            "algbw_gbps_ip",
            "busbw_gbps_ip",
            "wrong_ip",
        ] {
            assert!(c.get(key).is_some(), "missing {key}");
        }
        assert_eq!(c["op"], "all_reduce");
        assert_eq!(c["bytes"], 1 << 20);
        assert_eq!(v["collectives"][2]["wrong_ip"], 3);
        assert_eq!(
            v["nodes"][0]["ranks"][0]["collectives"]["backend"],
            "tcp-ring"
        );
    }

    #[test]
    fn stress_table_shows_figures_and_names_the_failure() {
        let s = render(&stress_report());
        assert!(s.contains("job-000042"), "{s}");
        assert!(s.contains("VERDICT     FAIL"), "{s}");
        assert!(s.starts_with("VERDICT  FAIL"), "{s}");
        assert!(
            s.trim_end()
                .lines()
                .last()
                .unwrap()
                .starts_with("VERDICT  FAIL"),
            "{s}"
        );
        assert!(s.contains("BACKEND     nccl 2.28.9"), "{s}");
        assert!(s.contains("DURATION    30.5s"), "{s}");
        let rank1 = s
            .lines()
            .find(|l| l.trim_start().starts_with("1   node-b"))
            .expect(&s);
        assert!(
            rank1.contains("650.5") && rank1.contains("660.5") && rank1.contains("670.5"),
            "{rank1}"
        );
        assert!(rank1.contains("differs from group"), "{rank1}");
        let rank0 = s
            .lines()
            .find(|l| l.trim_start().starts_with("0   node-a"))
            .expect(&s);
        assert!(
            rank0.contains("abcdef012345 ") && !rank0.contains("abcdef0123456"),
            "{rank0}"
        );
        assert!(rank0.contains("ok (12 checks)"), "{rank0}");
        let rank2 = s
            .lines()
            .find(|l| l.trim_start().starts_with("2   node-b"))
            .expect(&s);
        assert!(rank2.contains("incomplete"), "{rank2}");
        assert!(
            s.contains("node-b   fail      0/2 pass   rank 1 failed"),
            "{s}"
        );
        assert!(
            s.contains("NCCL_IB_DISABLE   1       no InfiniBand on node-b"),
            "{s}"
        );
        assert!(!s.contains("COLLECTIVES"));
    }

    #[test]
    fn collectives_table_is_laid_out_like_nccl_tests() {
        let s = render(&nccl_report());
        assert!(s.contains("BACKEND     tcp-ring\n"), "{s}");
        let ar = s.find("# all_reduce").expect(&s);
        let ag = s.find("# all_gather").expect(&s);
        assert!(ar < ag, "ops keep their order");
        // nccl-tests' row format: %12li  %12li  %8s  %6s  %6i  %7s  %6.2f  %6.2f  %5s ...
        let line = "     1048576        262144     float     sum      -1    39.49   26.55   26.55      0    39.49   26.55   26.55      0";
        assert!(s.contains(line), "{s}");
        // Sizes sorted within an op.
        assert!(
            s.find("        1024           256     float     sum")
                .unwrap()
                < s.find(line).unwrap()
        );
        // Large times lose decimals; unrooted redop-less ops print `none`.
        assert!(
            s.contains("     1048576        262144     float    none      -1    12345   "),
            "{s}"
        );
        assert!(s.contains("# Out of bounds values : 3 FAILED"), "{s}");
        // Header columns line up with the rows.
        let hdr = s
            .lines()
            .find(|l| l.starts_with("#") && l.contains("#wrong"))
            .unwrap();
        let row = s.lines().find(|l| l.starts_with("     1048576")).unwrap();
        assert_eq!(hdr.len(), row.len(), "\n{hdr}\n{row}");
        assert_eq!(
            hdr.find("busbw").unwrap() + 5,
            row.find("26.55   26.55").unwrap() + 13
        );
    }

    #[test]
    fn exit_code_needs_success_and_pass() {
        assert_eq!(Exit::of_report(&nccl_report()), Exit::Ok);
        assert_eq!(Exit::of_report(&stress_report()), Exit::Failed);
        let mut r = nccl_report();
        r.state = pb::JobState::Cancelled as i32;
        assert_eq!(Exit::of_report(&r), Exit::Failed);
    }
}
