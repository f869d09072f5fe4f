//! How results reach the user: aligned tables for people, JSON for scripts,
//! CSV, Markdown and JUnit for spreadsheets, tickets and CI, HTML with plots
//! for people to open and share, and the small formatting helpers (ages,
//! durations, metrics) they share. A module per thing shown (`report/`,
//! `plan`, `status`, `jobs`, `fleet`, ...); none of them talks to the
//! coordinator or knows the verbs, so `commands/` calls in and nothing
//! here calls back.

pub mod baseline;
pub mod doctor;
pub mod findings;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod fleet;
pub mod grid;
pub mod hang;
pub mod html;
pub mod jobs;
pub mod json;
pub mod junit;
pub mod links;
pub mod live;
pub mod loader;
pub mod logs;
pub mod maxbatch;
pub mod models;
pub mod nodes;
pub mod p2p;
pub mod plan;
pub mod profile;
pub mod progress;
pub mod report;
pub mod status;
pub mod table;
pub mod trace;

use std::collections::HashMap;
use std::io::Write;

use gpuctl_core::units::format_duration_ms;
use gpuctl_proto::pb;

/// How a command prints what it got (`-o`, `--output`): the variants' doc
/// comments are the flag's help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    /// Comma-separated tables for a spreadsheet (report, jobs, nodes, fleet);
    /// a report gives one table per section, each under a `# section` line.
    Csv,
    /// GitHub pipe tables (report, jobs, nodes, fleet); a report's verdict comes first.
    #[value(alias = "markdown")]
    Md,
    /// JUnit XML of a report: a test case per node and per rank, for CI dashboards.
    Junit,
    /// One self-contained HTML file of a report (`report` only), with plots:
    /// redirect it to a file and open it in a browser.
    Html,
}

impl OutputFormat {
    /// The table-like formats: csv and md render the same tables as `table`.
    pub fn is_grid(self) -> bool {
        matches!(self, OutputFormat::Csv | OutputFormat::Md)
    }
}

/// Prints pretty JSON and a newline to stdout.
pub fn print_json(v: &serde_json::Value) {
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) is not worth a panic.
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".into())
    );
}

/// Prints text to stdout as is (tables already end in a newline).
pub fn print_text(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

/// The latest sample of a rank's GPU: matched by UUID, else by NVML index,
/// on the rank's node.
pub fn gpu_sample<'a>(
    r: &pb::RankPlacement,
    latest: &'a [pb::TelemetryBatch],
) -> Option<&'a pb::GpuSample> {
    latest
        .iter()
        .filter(|b| b.node == r.node)
        .flat_map(|b| &b.samples)
        .find(|s| {
            if !r.gpu_uuid.is_empty() && !s.uuid.is_empty() {
                s.uuid == r.gpu_uuid
            } else {
                r.gpu_index == Some(s.index)
            }
        })
}

/// `-` for empty cells, so columns never collapse.
pub fn dash(s: &str) -> String {
    if s.trim().is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// "4s ago", "3m ago": how long since a Unix-ms timestamp; "-" for never.
pub fn age(unix_ms: u64, now_ms: u64) -> String {
    if unix_ms == 0 {
        return "-".into();
    }
    let s = now_ms.saturating_sub(unix_ms) / 1000;
    match s {
        0..=59 => format!("{s}s ago"),
        60..=3599 => format!("{}m ago", s / 60),
        3600..=86_399 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

/// Cuts long free text for table cells; JSON always has the whole text.
pub fn truncate(s: &str, max: usize) -> String {
    let one_line = s.lines().next().unwrap_or("");
    if one_line.chars().count() <= max && one_line.len() == s.trim_end().len() {
        return one_line.to_string();
    }
    let mut t: String = one_line.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// How long a job has run (still running: until now); None before it started.
pub fn job_duration_ms(job: &pb::Job, now_ms: u64) -> Option<u64> {
    if job.started_unix_ms == 0 {
        return None;
    }
    let end = if job.finished_unix_ms > 0 {
        job.finished_unix_ms
    } else {
        now_ms
    };
    Some(end.saturating_sub(job.started_unix_ms))
}

pub fn fmt_duration_opt(ms: Option<u64>) -> String {
    ms.map(format_duration_ms).unwrap_or_else(|| "-".into())
}

/// TFLOP/s with enough digits to tell CPU ranks (hundredths) from GPUs (hundreds).
pub fn fmt_tflops(v: f64) -> String {
    if v == 0.0 || v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// One progress metric the way people say it.
pub fn fmt_metric(key: &str, v: f64) -> String {
    match key {
        "tflops" => format!("{} TFLOP/s", fmt_tflops(v)),
        "busbw_gbps" => format!("busbw {v:.2} GB/s"),
        "algbw_gbps" => format!("algbw {v:.2} GB/s"),
        "samples_per_s" => format!("{v:.1} samples/s"),
        _ => format!("{key}={v:.3}"),
    }
}

/// Metrics in a stable order: the headline ones first, the rest by name.
pub fn fmt_metrics(m: &HashMap<String, f64>) -> String {
    const FIRST: [&str; 4] = ["tflops", "busbw_gbps", "algbw_gbps", "samples_per_s"];
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort_by_key(|k| {
        (
            FIRST.iter().position(|f| f == k).unwrap_or(FIRST.len()),
            (*k).clone(),
        )
    });
    keys.iter()
        .map(|k| fmt_metric(k, m[*k]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Job state as a word (prost keeps enums as i32; unknown numbers read "unknown").
pub fn job_state(job: &pb::Job) -> &'static str {
    job.state().label()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_naturally() {
        assert_eq!(age(0, 10_000), "-");
        assert_eq!(age(9_000, 10_000), "1s ago");
        assert_eq!(age(1, 3_600_001), "1h ago");
        assert_eq!(age(1, 120_001), "2m ago");
    }

    #[test]
    fn metrics_headline_first() {
        let mut m = HashMap::new();
        m.insert("zeta".to_string(), 1.0);
        m.insert("busbw_gbps".to_string(), 3.1234);
        m.insert("tflops".to_string(), 12.34);
        assert_eq!(fmt_metrics(&m), "12.3 TFLOP/s, busbw 3.12 GB/s, zeta=1.000");
    }

    #[test]
    fn truncation_marks_cut() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdefghijkl", 5), "abcd…");
        assert_eq!(truncate("two\nlines", 10), "two…");
    }
}
