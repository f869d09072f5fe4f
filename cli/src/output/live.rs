//! The live view of a running job, shared by `submit --wait` and `watch` on a
//! terminal: one line for the job, then one line per rank with its phase,
//! progress, headline figure, GPU and how long ago it last reported (LAST). A rank
//! silent for [`stale_ms`] is marked `stale` and listed first, so a stuck
//! rank is the first thing a person sees. Every line fits [`WIDTH`] columns;
//! on a short terminal the list is cut with a count of what is not shown.

use std::collections::BTreeMap;
use std::io::Write;

use gpuctl_proto::pb;

/// Progress is sent about once a second (less often in big jobs, as the
/// coordinator asks): five missed reports is stale.
pub fn stale_ms(job: &pb::Job) -> u64 {
    let world = job.plan.as_ref().map_or(0, |p| p.world_size);
    let spec = job.spec.clone().unwrap_or_default();
    5 * gpuctl_core::spec::progress_interval_ms(world, &spec)
}
/// Lines never grow past this, whatever the terminal.
pub const WIDTH: usize = 80;

/// Rank rows shown when the terminal's height is unknown.
const DEFAULT_ROWS: usize = 40;

/// The live view's lines (each at most [`WIDTH`] columns); `rows` bounds the
/// rank lines (None: [`DEFAULT_ROWS`]).
pub fn render(
    job: &pb::Job,
    now: u64,
    latest: &[pb::TelemetryBatch],
    rows: Option<usize>,
) -> Vec<String> {
    let world = job.plan.as_ref().map_or(0, |p| p.world_size);
    let spec = job.spec.clone().unwrap_or_default();
    let mut lines = vec![fit(&format!(
        "{}  {}  {}  {}  results {}/{}",
        job.id,
        super::dash(&spec.workload),
        super::job_state(job),
        super::fmt_duration_opt(super::job_duration_ms(job, now)),
        job.results_in,
        world
    ))];
    let ranks = rank_lines(job, now, latest);
    if ranks.is_empty() {
        lines.push("waiting for ranks to start…".into());
        return lines;
    }
    let stale = ranks.iter().filter(|r| r.stale).count();
    if stale > 0 {
        lines.push(fit(&format!(
            "{stale} of {} ranks silent for {}s or more (marked stale)",
            ranks.len(),
            stale_ms(job) / 1000
        )));
    }
    if job.ranks_left_out > 0 {
        lines.push(fit(&format!(
            "the {} ranks furthest behind of {}",
            ranks.len(),
            ranks.len() as u32 + job.ranks_left_out
        )));
    }
    lines.push(format!(
        "{:>4} {:<14} {:<17} {:>4} {:<15} {:<10} {}",
        "RANK", "NODE", "PHASE", "DONE", "FIGURE", "GPU", "LAST"
    ));
    let room = rows.unwrap_or(DEFAULT_ROWS).max(1);
    let shown = if ranks.len() > room {
        room - 1
    } else {
        ranks.len()
    };
    for r in ranks.iter().take(shown) {
        lines.push(fit(&r.line));
    }
    if shown < ranks.len() {
        lines.push(fit(&format!(
            "… {} more ranks (`gpuctl status {}` lists all)",
            ranks.len() - shown,
            job.id
        )));
    }
    lines
}

struct RankLine {
    stale: bool,
    line: String,
}

/// Stale ranks first, then by rank.
fn rank_lines(job: &pb::Job, now: u64, latest: &[pb::TelemetryBatch]) -> Vec<RankLine> {
    let stale_after = stale_ms(job);
    let progress: BTreeMap<u32, &pb::RankProgress> =
        job.progress.iter().map(|p| (p.rank, p)).collect();
    let mut placed: BTreeMap<u32, (String, Option<&pb::RankPlacement>)> = BTreeMap::new();
    if let Some(plan) = &job.plan {
        for r in &plan.ranks {
            placed.insert(r.rank, (r.node.clone(), Some(r)));
        }
    }
    for p in progress.values() {
        placed.entry(p.rank).or_insert((p.node.clone(), None));
    }
    let running = job.state() == pb::JobState::Running;
    let mut out: Vec<(bool, u32, String)> = placed
        .into_iter()
        .map(|(rank, (node, placement))| {
            let p = progress.get(&rank).copied();
            let seen = p.map_or(0, |p| p.unix_ms);
            // Only a running job's ranks can be stale; one that never
            // reported is stale once the job has run that long.
            let since = if seen > 0 { seen } else { job.started_unix_ms };
            let stale = running && since > 0 && now.saturating_sub(since) >= stale_after;
            let seen_cell = match (seen, stale) {
                (0, true) => "- stale".to_string(),
                (0, false) => "-".to_string(),
                (t, s) => {
                    let a = secs(now.saturating_sub(t));
                    if s {
                        format!("{a} stale")
                    } else {
                        a
                    }
                }
            };
            let line = format!(
                "{:>4} {:<14} {:<17} {:>4} {:<15} {:<10} {}",
                rank,
                super::truncate(&node, 14),
                super::truncate(&super::dash(p.map_or("", |p| p.phase.as_str())), 17),
                p.map_or("-".into(), |p| format!(
                    "{:.0}%",
                    p.fraction.clamp(0.0, 1.0) * 100.0
                )),
                super::truncate(&p.map_or("-".into(), figure), 15),
                super::truncate(&gpu_cell(placement, latest), 10),
                seen_cell
            );
            (stale, rank, line)
        })
        .collect();
    out.sort_by_key(|(stale, rank, _)| (!*stale, *rank));
    out.into_iter()
        .map(|(stale, _, line)| RankLine { stale, line })
        .collect()
}

/// The rank's headline figure, short: TFLOP/s, busbw, samples/s.
fn figure(p: &pb::RankProgress) -> String {
    let m = &p.metrics;
    if let Some(v) = m.get("tflops") {
        return format!("{} TFLOP/s", super::fmt_tflops(*v));
    }
    if let Some(v) = m.get("busbw_gbps") {
        return format!("{v:.2} GB/s bus");
    }
    if let Some(v) = m.get("samples_per_s") {
        return format!("{v:.1} samples/s");
    }
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    keys.first()
        .map_or("-".into(), |k| super::fmt_metric(k, m[*k]))
}

/// Utilisation and temperature of the rank's GPU from the latest samples.
fn gpu_cell(r: Option<&pb::RankPlacement>, latest: &[pb::TelemetryBatch]) -> String {
    match r.and_then(|r| super::gpu_sample(r, latest)) {
        Some(s) => format!("{:.0}% {:.0}°C", s.util_gpu, s.temperature_c),
        None => "-".into(),
    }
}

fn secs(ms: u64) -> String {
    let s = ms / 1000;
    if s < 600 {
        format!("{s}s")
    } else {
        format!("{}m", s / 60)
    }
}

fn fit(s: &str) -> String {
    super::truncate(s, WIDTH)
}

/// Redraws the view in place: moves the cursor up over what it drew last
/// and clears to the end of the screen, so the lines above (the submit
/// message) stay and nothing scrolls away.
#[derive(Default)]
pub struct Screen {
    drawn: usize,
}

impl Screen {
    pub fn draw(&mut self, w: &mut impl Write, lines: &[String]) {
        let mut s = String::new();
        if self.drawn > 0 {
            s.push_str(&format!("\x1b[{}A\r", self.drawn));
        }
        s.push_str("\x1b[J");
        for l in lines {
            s.push_str(l);
            s.push('\n');
        }
        let _ = w.write_all(s.as_bytes());
        let _ = w.flush();
        self.drawn = lines.len();
    }

    /// Forgets what was drawn: the next draw starts below it.
    pub fn keep(&mut self) {
        self.drawn = 0;
    }
}

/// Rank lines that fit a terminal of `height` rows, leaving room for the
/// job line, the header, the stale note and the hint below.
pub fn rows_for(height: Option<u16>) -> Option<usize> {
    // A pseudo-terminal nobody sized reads 0 rows: unknown, not tiny.
    height
        .filter(|&h| h > 0)
        .map(|h| (h as usize).saturating_sub(6).max(3))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn job(now: u64) -> pb::Job {
        let ranks = (0..4)
            .map(|i| pb::RankPlacement {
                rank: i,
                node: format!("a-rather-long-node-name-{}", i / 2),
                gpu_index: Some(i % 2),
                ..Default::default()
            })
            .collect();
        let progress = (0..4)
            .map(|i| pb::RankProgress {
                rank: i,
                node: format!("a-rather-long-node-name-{}", i / 2),
                phase: "gemm bf16 8192 with a long tail".into(),
                fraction: 0.42,
                metrics: HashMap::from([("tflops".to_string(), 712.345)]),
                // Rank 2 last reported 12 s ago.
                unix_ms: if i == 2 { now - 12_000 } else { now - 800 },
                ..Default::default()
            })
            .collect();
        pb::Job {
            id: "job-000042".into(),
            state: pb::JobState::Running as i32,
            spec: Some(pb::JobSpec {
                workload: "stress".into(),
                ..Default::default()
            }),
            started_unix_ms: now - 60_000,
            plan: Some(pb::Plan {
                world_size: 4,
                ranks,
                ..Default::default()
            }),
            progress,
            results_in: 1,
            ..Default::default()
        }
    }

    #[test]
    fn lines_fit_80_columns_and_a_silent_rank_is_stale_and_first() {
        let now = 1_000_000;
        let latest = vec![pb::TelemetryBatch {
            node: "a-rather-long-node-name-0".into(),
            samples: vec![pb::GpuSample {
                index: 1,
                util_gpu: 99.0,
                temperature_c: 71.0,
                ..Default::default()
            }],
            ..Default::default()
        }];
        let lines = render(&job(now), now, &latest, None);
        for l in &lines {
            assert!(
                l.chars().count() <= WIDTH,
                "{} columns: {l}",
                l.chars().count()
            );
        }
        let text = lines.join("\n");
        assert!(
            lines[0].starts_with("job-000042  stress  running  1m"),
            "{text}"
        );
        assert!(lines[0].ends_with("results 1/4"), "{text}");
        assert!(
            text.contains("1 of 4 ranks silent for 5s or more"),
            "{text}"
        );
        // The stale rank leads the list.
        let first = &lines[3];
        assert!(first.trim_start().starts_with("2 "), "{text}");
        assert!(first.ends_with("12s stale"), "{text}");
        let r1 = lines.iter().find(|l| l.starts_with("   1 ")).unwrap();
        assert!(r1.contains("712.3 TFLOP/s") && r1.contains("42%"), "{r1}");
        assert!(r1.contains("99% 71°C") && r1.ends_with(" 0s"), "{r1}");
        assert!(!r1.contains("stale"), "{r1}");
    }

    #[test]
    fn a_short_terminal_cuts_the_list_with_a_count() {
        let now = 1_000_000;
        let lines = render(&job(now), now, &[], Some(3));
        let text = lines.join("\n");
        assert!(text.contains("… 2 more ranks"), "{text}");
        assert_eq!(lines.len(), 1 + 1 + 1 + 2 + 1, "{text}");
    }

    #[test]
    fn a_finished_job_has_no_stale_rank() {
        let now = 1_000_000;
        let mut j = job(now);
        j.state = pb::JobState::Succeeded as i32;
        let text = render(&j, now, &[], None).join("\n");
        assert!(!text.contains("stale"), "{text}");
    }
}
