//! `gpuctl profile JOB`: the operator profile of a job run with `--profile`
//! (ddp, fsdp): every rank's top 10 operators by self CPU time, GPU time and
//! memory, and where each rank's Chrome trace lies. `--trace DIR` fetches
//! the traces through the coordinator from the agents whose nodes keep them
//! (in the agent's folder of the job), whatever host the CLI runs on, each
//! under a name gpuctl makes ([`trace_names`]), never one a node sent.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use futures::StreamExt;
use serde_json::json;

use gpuctl_core::units::format_bytes;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;
use crate::output::OutputFormat;

pub const EXAMPLES: &str = "\
Examples:
  gpuctl submit ddp --model mobilenet_v2 --profile --nodes 1 --wait
  gpuctl profile job-000042                    # top 10 operators per rank, trace paths
  gpuctl profile job-000042 --rank 0 --trace traces/   # and copy rank 0's Chrome trace
  gpuctl profile job-000042 -o json";

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// Job id, as `gpuctl submit` or `gpuctl jobs` print it.
    pub job: String,
    /// Only this rank.
    #[arg(long)]
    pub rank: Option<u32>,
    /// Fetch each rank's Chrome trace from its node into this folder (open them in https://ui.perfetto.dev).
    #[arg(long, value_name = "DIR")]
    pub trace: Option<PathBuf>,
}

pub async fn run(c: &mut Coordinator, a: &ProfileArgs, out: OutputFormat) -> Result<Exit> {
    let report = c.report(&a.job).await?;
    let all: Vec<_> = output::profile::profiles(&report)
        .into_iter()
        .filter(|(_, rank, _, _)| a.rank.is_none_or(|r| r == *rank))
        .collect();
    if all.is_empty() {
        eprintln!(
            "{}: no operator profile{} (submit ddp or fsdp with --profile)",
            a.job,
            a.rank.map(|r| format!(" of rank {r}")).unwrap_or_default()
        );
        return Ok(Exit::Failed);
    }
    let mut copied = Vec::new();
    if let Some(dir) = &a.trace {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--trace: cannot create {}", dir.display()))?;
        copied = fetch_all(c, &a.job, &report.workload, &all, dir).await;
    }
    match out {
        OutputFormat::Json => {
            let v: Vec<_> = all
                .iter()
                .zip(copied.iter().map(Some).chain(std::iter::repeat(None)))
                .map(|((node, rank, model, p), copied)| {
                    let t = gpuctl_proto::pb::TrainResult {
                        profile: Some(Box::new((*p).clone())),
                        ..Default::default()
                    };
                    json!({
                        "node": node,
                        "rank": rank,
                        "model": model,
                        "profile": output::profile::json(&t),
                        "copied_to": copied.and_then(|c| c.as_ref().ok()).map(|p| p.display().to_string()),
                    })
                })
                .collect();
            output::print_json(&json!(v));
        }
        _ => {
            let text: String = all
                .iter()
                .map(|(node, rank, model, p)| output::profile::rank_text(node, *rank, model, p))
                .collect();
            output::print_text(&text);
        }
    }
    let missing = copied.iter().any(|c| c.is_err());
    Ok(Exit::failed_if(missing))
}

/// Traces fetched at once: each is one stream on the one connection, and
/// the agent reads two pieces at a time however many ask.
const FETCHES_AT_ONCE: usize = 4;

type Profiled<'a> = (&'a str, u32, String, &'a gpuctl_proto::pb::OperatorProfile);

/// The file name of each rank's trace in `--trace DIR`, in the order of
/// `all`: `profile-WORKLOAD-MODEL-rankN.json`, as the worker names it on
/// its node, but made of the catalogue's words and the rank's number, so
/// that a node (whose result named its trace `/home/op/.bashrc`) chooses
/// no file of the operator's. A model the catalogue does not know is
/// `model`; a name met twice gets `-2`, `-3`.
fn trace_names(workload: &str, all: &[Profiled]) -> Vec<String> {
    use gpuctl_core::catalogue::{workloads, GPT_SIZES, MODELS};
    let workload = workloads()
        .into_iter()
        .find(|w| *w == workload)
        .unwrap_or("train");
    let model = |label: &str| {
        let (name, size) = label
            .split_once(' ')
            .map_or((label, None), |(n, s)| (n, Some(s)));
        let name = MODELS.iter().find(|m| **m == name);
        match (name, size.map(|s| GPT_SIZES.iter().find(|g| **g == s))) {
            (Some(m), None) => m.to_string(),
            (Some(m), Some(Some(s))) => format!("{m}-{s}"),
            _ => "model".to_string(),
        }
    };
    let mut seen = std::collections::HashSet::new();
    all.iter()
        .map(|(_, rank, label, _)| {
            let stem = format!("profile-{workload}-{}-rank{rank}", model(label));
            let mut name = format!("{stem}.json");
            let mut k = 1;
            while !seen.insert(name.clone()) {
                k += 1;
                name = format!("{stem}-{k}.json");
            }
            name
        })
        .collect()
}

/// Fetches every rank's trace through the coordinator into `dir`, saying
/// on stderr how each went as it ends.
async fn fetch_all(
    c: &Coordinator,
    job: &str,
    workload: &str,
    all: &[Profiled<'_>],
    dir: &Path,
) -> Vec<Result<PathBuf, String>> {
    let n = all.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let names = trace_names(workload, all);
    futures::stream::iter(all.iter().zip(&names))
        .map(|((node, rank, _, p), name)| {
            let done = &done;
            async move {
                let r = fetch(c, job, *rank, &p.trace_path, &dir.join(name)).await;
                let k = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                let r = r.map_err(|e| {
                    let e = if e.contains(&format!("rank {rank} "))
                        || e.contains(&format!("rank {rank}:"))
                    {
                        e
                    } else {
                        format!("rank {rank} on {node}: {e}")
                    };
                    if p.trace_path.is_empty() {
                        e
                    } else {
                        format!(
                            "{e}; fetch it with: scp {node}:{} {}",
                            p.trace_path,
                            dir.display()
                        )
                    }
                });
                match &r {
                    Ok(f) => eprintln!(
                        "[{k}/{n}] rank {rank} on {node}: {} ({} over the wire) in {:.1} s -> {}",
                        format_bytes(f.bytes),
                        format_bytes(f.wire),
                        f.secs,
                        f.to.display()
                    ),
                    Err(e) => eprintln!("[{k}/{n}] {e}"),
                }
                r.map(|f| f.to)
            }
        })
        .buffered(FETCHES_AT_ONCE)
        .collect()
        .await
}

struct Fetched {
    to: PathBuf,
    bytes: u64,
    wire: u64,
    secs: f64,
}

/// One rank's trace into the file `to` (of [`trace_names`]): written to a
/// hidden part file beside it and renamed once whole, so a file of that
/// name is a whole trace.
async fn fetch(
    c: &Coordinator,
    job: &str,
    rank: u32,
    path: &str,
    to: &Path,
) -> Result<Fetched, String> {
    if path.is_empty() {
        return Err(format!("rank {rank}: no trace was written"));
    }
    let to = to.to_path_buf();
    let name = to.file_name().unwrap_or_default().to_string_lossy();
    let part = to.with_file_name(format!(".{name}.part"));
    let t0 = std::time::Instant::now();
    let r = receive(c, job, rank, path, &part).await;
    let r = r.and_then(|(bytes, wire)| {
        std::fs::rename(&part, &to).map_err(|e| format!("{}: {e}", to.display()))?;
        Ok((bytes, wire))
    });
    match r {
        Ok((bytes, wire)) => Ok(Fetched {
            to,
            bytes,
            wire,
            secs: t0.elapsed().as_secs_f64(),
        }),
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            Err(e)
        }
    }
}

/// Writes the pieces into `part` in order; the trace's bytes and the
/// compressed bytes received.
async fn receive(
    c: &Coordinator,
    job: &str,
    rank: u32,
    path: &str,
    part: &Path,
) -> Result<(u64, u64), String> {
    let req = gpuctl_proto::pb::GetTraceRequest {
        job_id: job.to_string(),
        rank,
        path: path.to_string(),
        chunk_bytes: 0,
    };
    let mut stream = c.trace(req).await.map_err(|s| s.message().to_string())?;
    let mut file = std::fs::File::create(part).map_err(|e| format!("{}: {e}", part.display()))?;
    let (mut written, mut wire) = (0u64, 0u64);
    loop {
        let piece = match stream.message().await {
            Ok(Some(p)) => p,
            Ok(None) => {
                return Err(format!(
                    "the coordinator ended the fetch at {written} bytes, before the end"
                ))
            }
            Err(s) => return Err(s.message().to_string()),
        };
        if piece.offset != written {
            return Err(format!(
                "a piece came for offset {} after {written} bytes",
                piece.offset
            ));
        }
        let mut raw = Vec::with_capacity(piece.raw_bytes as usize);
        flate2::read::GzDecoder::new(&piece.gzip[..])
            .read_to_end(&mut raw)
            .map_err(|e| format!("a piece at offset {written} does not decompress: {e}"))?;
        if raw.len() != piece.raw_bytes as usize {
            return Err(format!(
                "a piece at offset {written} holds {} bytes, not the {} it says",
                raw.len(),
                piece.raw_bytes
            ));
        }
        file.write_all(&raw)
            .map_err(|e| format!("{}: {e}", part.display()))?;
        written += raw.len() as u64;
        wire += piece.gzip.len() as u64;
        if piece.eof {
            if written != piece.total_bytes {
                return Err(format!(
                    "got {written} bytes of a {}-byte trace",
                    piece.total_bytes
                ));
            }
            return Ok((written, wire));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::OperatorProfile;

    #[test]
    fn trace_files_are_named_by_gpuctl_not_by_the_node() {
        let p = OperatorProfile {
            trace_path: "/whatever/.bashrc".into(),
            ..Default::default()
        };
        let all: Vec<Profiled> = [
            (0, "cnn"),
            (1, "gpt 1.3b"),
            (2, "/whatever/.bashrc"),
            (3, "../../.ssh/authorized_keys"),
            (3, "resnet50 ../x"),
            (3, "cnn"),
            (3, "cnn"),
        ]
        .into_iter()
        .map(|(rank, model)| ("node-a", rank, model.to_string(), &p))
        .collect();
        assert_eq!(
            trace_names("ddp", &all),
            [
                "profile-ddp-cnn-rank0.json",
                "profile-ddp-gpt-1.3b-rank1.json",
                "profile-ddp-model-rank2.json",
                "profile-ddp-model-rank3.json",
                "profile-ddp-model-rank3-2.json",
                "profile-ddp-cnn-rank3.json",
                "profile-ddp-cnn-rank3-2.json",
            ]
        );
        let odd = trace_names("../../etc", &all[..1]);
        assert_eq!(odd, ["profile-train-cnn-rank0.json"]);
        for name in trace_names("fsdp", &all) {
            assert!(
                !name.contains('/') && name.starts_with("profile-fsdp-"),
                "{name}"
            );
        }
    }
}
