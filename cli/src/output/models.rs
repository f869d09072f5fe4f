//! The model comparison of a ddp/fsdp report (`--model cnn,resnet18,...`):
//! one row per model, in the order trained, with what the old suite's
//! "compare three models' memory" task printed: parameters, batch, peak memory
//! as the allocator and as the driver saw it, step times, samples/s for the job
//! and per rank, scaling efficiency, and the communication per step with the
//! part compute waited for and the share hidden under compute, and a GPT's
//! model FLOPs utilisation against its GPU's peak. One model gets
//! one row: still the summary of the run. A GPT is named with its size
//! (`gpt 1.3b`).

use gpuctl_core::stats::{median, quantile_sorted};
use gpuctl_core::units::format_bytes;
use gpuctl_proto::pb;
use gpuctl_proto::pb::rank_result::Detail;

use super::table::Table;

/// Every model's result of one rank, in the order trained.
pub fn train_results(r: &pb::RankResult) -> impl Iterator<Item = &pb::TrainResult> {
    let first = match &r.detail {
        Some(Detail::Train(t)) => Some(t),
        _ => None,
    };
    first.into_iter().chain(&r.more_train)
}

/// One model's results over the ranks that reported it.
struct ModelRow<'a> {
    /// `gpt 1.3b`, `resnet50`.
    model: String,
    ranks: Vec<&'a pb::TrainResult>,
    /// Each of `ranks`' GPU as NVML names it (empty: a CPU rank).
    devices: Vec<&'a str>,
}

/// A rank's model FLOPs utilisation (`gpuctl_core::mfu`): a GPT on a GPU
/// of the peak table; `None` otherwise (unknown, not zero).
pub fn mfu(t: &pb::TrainResult, device_name: &str, seq_len: u64) -> Option<f64> {
    if t.model != "gpt" || t.samples_per_s <= 0.0 {
        return None;
    }
    let peak = gpuctl_core::mfu::peak_tflops(device_name, &t.precision)?;
    let per_token = gpuctl_core::mfu::gpt_flops_per_token(&t.variant, t.parameters, seq_len)?;
    Some(gpuctl_core::mfu::mfu(t.samples_per_s, per_token, peak))
}

/// The job's GPT sequence length: its spec's, else the GPU default.
fn seq_len(r: &pb::Report) -> u64 {
    r.spec
        .as_ref()
        .and_then(|s| s.params.get("seq_len"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// A model as the report names it: with its size where it has one.
pub fn label(t: &pb::TrainResult) -> String {
    gpuctl_core::catalogue::model_label(&t.model, &t.variant)
}

/// A rank's communication per timed step: all of it, the part compute
/// stood waiting for, and the share hidden under compute (0..1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comm {
    pub ms: f64,
    pub exposed_ms: f64,
    pub overlap: f64,
}

/// `None` where the rank measured no communication (one rank). A worker
/// that does not measure overlap reports neither the exposed part nor the
/// share: it communicates between computations, so all of it is exposed.
pub fn comm(t: &pb::TrainResult) -> Option<Comm> {
    if !(t.comm_ms_per_step.is_finite() && t.comm_ms_per_step > 0.0) {
        return None;
    }
    let unmeasured = t.comm_exposed_ms_per_step == 0.0 && t.overlap_share == 0.0;
    Some(Comm {
        ms: t.comm_ms_per_step,
        exposed_ms: if unmeasured {
            t.comm_ms_per_step
        } else {
            t.comm_exposed_ms_per_step
        },
        overlap: t.overlap_share.clamp(0.0, 1.0),
    })
}

/// The cells COMM MS, EXPOSED MS and OVERLAP; `-` each without communication.
pub fn comm_cells(c: Option<Comm>) -> [String; 3] {
    match c {
        Some(c) => [
            format!("{:.1}", c.ms),
            format!("{:.1}", c.exposed_ms),
            format!("{:.0}%", c.overlap * 100.0),
        ],
        None => ["-", "-", "-"].map(String::from),
    }
}

/// The ranks' median of each figure, over the ranks that communicated.
fn median_comm(ts: &[&pb::TrainResult]) -> Option<Comm> {
    let cs: Vec<Comm> = ts.iter().filter_map(|t| comm(t)).collect();
    let of = |f: fn(&Comm) -> f64| median(cs.iter().map(f).collect());
    Some(Comm {
        ms: of(|c| c.ms)?,
        exposed_ms: of(|c| c.exposed_ms)?,
        overlap: of(|c| c.overlap)?,
    })
}

/// The models in the order trained (the first rank's order, then any model
/// only later ranks reported), each with every rank's result.
fn rows(r: &pb::Report) -> Vec<ModelRow<'_>> {
    let mut out: Vec<ModelRow> = Vec::new();
    let mut ranks: Vec<&pb::RankReport> = r.nodes.iter().flat_map(|n| &n.ranks).collect();
    ranks.sort_by_key(|x| x.rank);
    for (rank, res) in ranks.iter().filter_map(|x| Some((x, x.result.as_ref()?))) {
        for t in train_results(res) {
            let model = label(t);
            let device = rank.device_name.as_str();
            match out.iter_mut().find(|m| m.model == model) {
                Some(m) => {
                    m.ranks.push(t);
                    m.devices.push(device);
                }
                None => out.push(ModelRow {
                    model,
                    ranks: vec![t],
                    devices: vec![device],
                }),
            }
        }
    }
    out
}

/// Step time p50 and p99 (ms) over every rank's steps; from the ranks' own
/// percentiles when the results carry no step times.
fn step_ms(ts: &[&pb::TrainResult]) -> (Option<f64>, Option<f64>) {
    let mut all: Vec<f64> = ts.iter().flat_map(|t| t.step_ms.iter().copied()).collect();
    if all.is_empty() {
        let p50 = median(ts.iter().map(|t| t.step_ms_p50).collect());
        let p99 = ts.iter().map(|t| t.step_ms_p99).reduce(f64::max);
        return (p50, p99);
    }
    all.sort_by(|a, b| a.total_cmp(b));
    (median(all.clone()), quantile_sorted(&all, 0.99))
}

fn bytes(v: u64) -> String {
    if v == 0 {
        "-".into()
    } else {
        format_bytes(v)
    }
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) if x.is_finite() && x > 0.0 => format!("{x:.decimals$}"),
        _ => "-".into(),
    }
}

/// The comparison as a table; `None` when no rank reported a training result.
pub fn grid(r: &pb::Report) -> Option<Table> {
    let rows = rows(r);
    if rows.is_empty() {
        return None;
    }
    let mut t = Table::new(&[
        "MODEL",
        "PARAMS",
        "BATCH",
        "PEAK MEM ALLOC",
        "PEAK MEM DRIVER",
        "STEP MS P50",
        "P99",
        "SAMPLES/S JOB",
        "PER RANK",
        "UNIT",
        "SCALING",
        "MFU",
        "COMM MS",
        "EXPOSED MS",
        "OVERLAP",
        "RANKS",
    ])
    .right(&[1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15]);
    let seq = seq_len(r);
    for m in rows {
        let ts = &m.ranks;
        let (p50, p99) = step_ms(ts);
        let job: f64 = ts.iter().map(|t| t.samples_per_s).sum();
        let per_rank = median(ts.iter().map(|t| t.samples_per_s).collect());
        let scaling = median(
            ts.iter()
                .map(|t| t.scaling_efficiency)
                .filter(|e| *e > 0.0)
                .collect(),
        );
        let params = ts.iter().map(|t| t.parameters).max().unwrap_or(0);
        let mut batches: Vec<u32> = ts.iter().map(|t| t.batch_size).collect();
        batches.sort();
        batches.dedup();
        let [comm_ms, exposed, overlap] = comm_cells(median_comm(ts));
        // The ranks' median; a rank whose MFU is unknown is left out.
        let mfu = median(
            ts.iter()
                .zip(&m.devices)
                .filter_map(|(t, d)| mfu(t, d, seq))
                .collect(),
        );
        t.row([
            m.model,
            if params == 0 {
                "-".into()
            } else {
                params.to_string()
            },
            batches
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("/"),
            bytes(ts.iter().map(|t| t.peak_memory_bytes).max().unwrap_or(0)),
            bytes(
                ts.iter()
                    .map(|t| t.driver_peak_memory_bytes)
                    .max()
                    .unwrap_or(0),
            ),
            num(p50, 1),
            num(p99, 1),
            num(Some(job), 1),
            num(per_rank, 1),
            super::dash(&ts[0].unit),
            scaling.map_or("-".into(), |e| format!("{:.1}%", e * 100.0)),
            mfu.map_or("-".into(), |u| format!("{:.1}%", u * 100.0)),
            comm_ms,
            exposed,
            overlap,
            ts.len().to_string(),
        ]);
    }
    Some(t)
}

/// The comparison as the table report prints it, with its title line.
pub fn section(r: &pb::Report) -> Option<String> {
    let t = grid(r)?;
    Some(format!(
        "\nMODELS (in the order trained; peaks: the highest rank's; step times: every rank's steps; communication per step and MFU: the ranks' median; MFU of a GPT by 6N + 12LdT FLOPs a token against the GPU's dense peak, - where unknown)\n{}",
        t.render()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(model: &str, per_s: f64, steps: &[f64], peak: u64) -> pb::TrainResult {
        pb::TrainResult {
            model: model.into(),
            batch_size: 32,
            samples_per_s: per_s,
            unit: "img".into(),
            parameters: if model == "cnn" { 94_538 } else { 3_504_872 },
            peak_memory_bytes: peak,
            driver_peak_memory_bytes: peak * 2,
            step_ms: steps.to_vec(),
            scaling_efficiency: 0.9,
            baseline_samples_per_s: per_s / 0.9,
            ..Default::default()
        }
    }

    fn report(ranks: Vec<pb::RankResult>) -> pb::Report {
        pb::Report {
            workload: "ddp".into(),
            nodes: vec![pb::NodeReport {
                name: "a".into(),
                ranks: ranks
                    .into_iter()
                    .enumerate()
                    .map(|(i, r)| pb::RankReport {
                        rank: i as u32,
                        result: Some(Box::new(r)),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn rank(first: pb::TrainResult, more: Vec<pb::TrainResult>) -> pb::RankResult {
        pb::RankResult {
            ok: true,
            detail: Some(Detail::Train(first)),
            more_train: more,
            ..Default::default()
        }
    }

    #[test]
    fn one_row_per_model_in_order_over_every_rank() {
        let r = report(vec![
            rank(
                train("mobilenet_v2", 10.0, &[100.0, 110.0], 5 << 20),
                vec![train("cnn", 400.0, &[2.0, 3.0], 1 << 20)],
            ),
            rank(
                train("mobilenet_v2", 12.0, &[90.0, 300.0], 6 << 20),
                vec![train("cnn", 600.0, &[2.5, 4.0], 2 << 20)],
            ),
        ]);
        let t = grid(&r).unwrap();
        let rows = t.rows();
        assert_eq!(rows.len(), 2);
        let cell = |row: usize, h: &str| {
            let c = t.headers().iter().position(|x| x == h).unwrap();
            rows[row][c].clone()
        };
        assert_eq!(cell(0, "MODEL"), "mobilenet_v2");
        assert_eq!(cell(1, "MODEL"), "cnn");
        assert_eq!(cell(0, "PARAMS"), "3504872");
        assert_eq!(cell(0, "BATCH"), "32");
        assert_eq!(cell(0, "PEAK MEM ALLOC"), format_bytes(6 << 20));
        assert_eq!(cell(0, "PEAK MEM DRIVER"), format_bytes(12 << 20));
        // Pooled steps 90, 100, 110, 300: p50 is the median, the mean of 100 and 110.
        assert_eq!(cell(0, "STEP MS P50"), "105.0");
        assert_eq!(cell(0, "P99"), "300.0");
        assert_eq!(cell(1, "SAMPLES/S JOB"), "1000.0");
        assert_eq!(cell(1, "PER RANK"), "500.0");
        assert_eq!(cell(1, "SCALING"), "90.0%");
        assert_eq!(cell(1, "RANKS"), "2");
        let text = section(&r).unwrap();
        assert!(text.contains("MODELS (") && text.contains("cnn"), "{text}");
    }

    #[test]
    fn no_training_no_table_and_old_results_use_their_percentiles() {
        assert!(grid(&report(vec![])).is_none());
        let mut old = train("cnn", 100.0, &[], 0);
        old.step_ms_p50 = 5.0;
        old.step_ms_p99 = 9.0;
        old.parameters = 0;
        old.driver_peak_memory_bytes = 0;
        let t = grid(&report(vec![rank(old, vec![])])).unwrap();
        let row = &t.rows()[0];
        assert_eq!(
            row[1..7],
            ["-", "32", "-", "-", "5.0", "9.0"].map(String::from)
        );
    }

    #[test]
    fn a_gpt_is_named_with_its_size_and_communication_is_shown_per_step() {
        let mut a = train("gpt", 100.0, &[10.0], 1 << 30);
        a.variant = "1.3b".into();
        (
            a.comm_ms_per_step,
            a.comm_exposed_ms_per_step,
            a.overlap_share,
        ) = (8.0, 2.0, 0.75);
        let mut b = a.clone();
        (
            b.comm_ms_per_step,
            b.comm_exposed_ms_per_step,
            b.overlap_share,
        ) = (10.0, 5.0, 0.5);
        let t = grid(&report(vec![rank(a, vec![]), rank(b, vec![])])).unwrap();
        let cell = |h: &str| {
            let c = t.headers().iter().position(|x| x == h).unwrap();
            t.rows()[0][c].clone()
        };
        assert_eq!(cell("MODEL"), "gpt 1.3b");
        // Medians of two ranks: the mean of the two (gpuctl_core::stats).
        assert_eq!(
            [cell("COMM MS"), cell("EXPOSED MS"), cell("OVERLAP")],
            ["9.0", "3.5", "62%"].map(String::from)
        );
    }

    #[test]
    fn a_gpts_mfu_is_the_ranks_median_against_its_gpus_peak_and_unknown_elsewhere() {
        let mut t = train("gpt", 45_949.0, &[10.0], 1 << 30);
        (t.variant, t.precision, t.parameters, t.unit) =
            ("1.3b".into(), "bf16".into(), 1_313_722_368, "tok".into());
        let mut r = report(vec![rank(t.clone(), vec![]), rank(t, vec![])]);
        r.nodes[0].ranks[0].device_name = "NVIDIA H200".into();
        let mfu_cell = |r: &pb::Report| {
            let g = grid(r).unwrap();
            let c = g.headers().iter().position(|x| x == "MFU").unwrap();
            g.rows()[0][c].clone()
        };
        // Rank 1 is a CPU rank (no device name): left out of the median.
        assert_eq!(mfu_cell(&r), "39.4%");
        r.spec = Some(pb::JobSpec {
            params: [("seq_len".to_string(), "2048".to_string())].into(),
            ..Default::default()
        });
        // Longer sequences cost more attention FLOPs a token.
        assert_eq!(mfu_cell(&r), "42.2%");
        let cnn = report(vec![rank(
            train("resnet50", 900.0, &[10.0], 1 << 30),
            vec![],
        )]);
        assert_eq!(mfu_cell(&cnn), "-");
    }

    #[test]
    fn communication_reads_well_without_overlap_figures_or_without_communication() {
        // A worker that measures no overlap: all of its communication waited.
        let mut old = train("cnn", 100.0, &[1.0], 0);
        old.comm_ms_per_step = 4.0;
        assert_eq!(
            comm_cells(comm(&old)),
            ["4.0", "4.0", "0%"].map(String::from)
        );
        // Everything hidden: nothing exposed, 100%.
        old.overlap_share = 1.0;
        assert_eq!(
            comm_cells(comm(&old)),
            ["4.0", "0.0", "100%"].map(String::from)
        );
        // One rank: no communication, dashes.
        let solo = train("cnn", 100.0, &[1.0], 0);
        assert_eq!(comm(&solo), None);
        assert_eq!(comm_cells(None), ["-", "-", "-"].map(String::from));
        let t = grid(&report(vec![rank(solo, vec![])])).unwrap();
        let c = t.headers().iter().position(|x| x == "OVERLAP").unwrap();
        assert_eq!(t.rows()[0][c], "-");
    }
}
