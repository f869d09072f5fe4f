//! Serving the Chrome traces of profiled ranks (`gpuctl profile --trace`)
//! to the coordinator, one piece per `FetchTrace`, so that a trace on any
//! node reaches the operator's machine through the connection the agent
//! already holds.
//!
//! The coordinator names the file by the path the rank reported; the agent
//! serves it only when it is a `profile-*.json` directly inside one of that
//! job's folders under its own jobs folder, symlinks resolved. A session is
//! not a way to read any other file of the host, nor to learn whether one
//! exists: every refusal reads the same.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use flate2::Compression;
use gpuctl_core::limits::MAX_TRACE_PIECE;
use gpuctl_proto::pb::{FetchTrace, TraceChunk};
use tokio::sync::Semaphore;

use crate::workers::job_folder;

/// Pieces read and compressed at once: a fetch of every rank's trace must
/// not take the host's cores from the workers or the heartbeats.
static READERS: Semaphore = Semaphore::const_new(2);

/// Answers one request: the piece, or why it cannot be read.
pub async fn serve(jobs_dir: PathBuf, req: FetchTrace) -> TraceChunk {
    let id = req.request_id;
    let _permit = READERS.acquire().await;
    let answer = tokio::task::spawn_blocking(move || piece(&jobs_dir, &req))
        .await
        .unwrap_or_else(|e| Err(format!("reading the trace failed: {e}")));
    match answer {
        Ok(mut c) => {
            c.request_id = id;
            c
        }
        Err(error) => TraceChunk {
            request_id: id,
            error,
            ..Default::default()
        },
    }
}

/// The file `path` names, when it is a trace of job `job_id` in
/// `jobs_dir`. Every refusal reads the same, whether the file is missing,
/// elsewhere or not a trace: told apart, they would say which files exist
/// on the host to anyone who may fetch traces.
pub fn trace_file(jobs_dir: &Path, job_id: &str, path: &str) -> Result<PathBuf, String> {
    let root = std::fs::canonicalize(jobs_dir)
        .map_err(|e| format!("the jobs folder {}: {e}", jobs_dir.display()))?;
    let refuse = || {
        format!(
            "{path}: not a trace of job {job_id} on this node (a profile-*.json file in a folder of the job under {})",
            root.display()
        )
    };
    if path.is_empty() {
        return Err(refuse());
    }
    let file = std::fs::canonicalize(path).map_err(|_| refuse())?;
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let folder = file.parent().filter(|d| d.parent() == Some(root.as_path()));
    let of_job = folder
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(&format!("{}-a", job_folder(job_id))))
        .is_some_and(|attempt| !attempt.is_empty() && attempt.bytes().all(|b| b.is_ascii_digit()));
    let trace = name.starts_with("profile-") && name.ends_with(".json");
    if !(trace && of_job && file.is_file()) {
        return Err(refuse());
    }
    Ok(file)
}

fn piece(jobs_dir: &Path, req: &FetchTrace) -> Result<TraceChunk, String> {
    let path = trace_file(jobs_dir, &req.job_id, &req.path)?;
    let read_err = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut f = File::open(&path).map_err(read_err)?;
    let total = f.metadata().map_err(read_err)?.len();
    if req.offset > total {
        return Err(format!(
            "offset {} is past the end of {} ({total} bytes)",
            req.offset,
            path.display()
        ));
    }
    let want = req.max_bytes.clamp(1, MAX_TRACE_PIECE) as u64;
    f.seek(SeekFrom::Start(req.offset)).map_err(read_err)?;
    let mut raw = Vec::with_capacity(want.min(total - req.offset) as usize);
    f.take(want).read_to_end(&mut raw).map_err(read_err)?;
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&raw).map_err(read_err)?;
    let gzip = gz.finish().map_err(read_err)?;
    Ok(TraceChunk {
        offset: req.offset,
        raw_bytes: raw.len() as u32,
        total_bytes: total,
        eof: req.offset + raw.len() as u64 >= total,
        gzip,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;

    fn fetch(jobs: &Path, job: &str, path: &Path, offset: u64, max: u32) -> TraceChunk {
        let req = FetchTrace {
            request_id: 7,
            job_id: job.into(),
            path: path.display().to_string(),
            offset,
            max_bytes: max,
        };
        match piece(jobs, &req) {
            Ok(c) => c,
            Err(error) => TraceChunk {
                error,
                ..Default::default()
            },
        }
    }

    fn unzip(c: &TraceChunk) -> Vec<u8> {
        let mut out = Vec::new();
        GzDecoder::new(&c.gzip[..]).read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), c.raw_bytes as usize);
        out
    }

    #[test]
    fn a_trace_comes_back_whole_in_pieces() {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = tmp.path().join("jobs");
        let dir = jobs.join("job-000042-a1");
        std::fs::create_dir_all(&dir).unwrap();
        let body: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let file = dir.join("profile-ddp-cnn-rank1.json");
        std::fs::write(&file, &body).unwrap();
        let mut got = Vec::new();
        let mut pieces = 0;
        loop {
            let c = fetch(&jobs, "job-000042", &file, got.len() as u64, 4096);
            assert_eq!(c.error, "");
            assert_eq!(c.total_bytes, body.len() as u64);
            got.extend(unzip(&c));
            pieces += 1;
            if c.eof {
                break;
            }
        }
        assert_eq!(got, body);
        assert_eq!(pieces, body.len().div_ceil(4096));
        let past = fetch(&jobs, "job-000042", &file, body.len() as u64 + 1, 4096);
        assert!(past.error.contains("past the end"), "{}", past.error);
    }

    #[test]
    fn nothing_but_that_jobs_profile_traces_is_served() {
        let tmp = tempfile::tempdir().unwrap();
        let jobs = tmp.path().join("jobs");
        let mine = jobs.join("job-000042-a2");
        let other = jobs.join("job-000043-a1");
        for d in [&mine, &other] {
            std::fs::create_dir_all(d).unwrap();
        }
        let secret = tmp.path().join("profile-secret.json");
        std::fs::write(&secret, "{}").unwrap();
        std::fs::write(mine.join("profile-ok.json"), "{}").unwrap();
        std::fs::write(mine.join("worker.log"), "x").unwrap();
        std::fs::write(other.join("profile-x.json"), "{}").unwrap();
        std::os::unix::fs::symlink(&secret, mine.join("profile-link.json")).unwrap();
        std::fs::create_dir_all(mine.join("profile-dir.json")).unwrap();
        let nested = mine.join("sub");
        std::fs::create_dir_all(&nested).unwrap();
        std::fs::write(nested.join("profile-deep.json"), "{}").unwrap();

        assert!(trace_file(
            &jobs,
            "job-000042",
            &mine.join("profile-ok.json").display().to_string()
        )
        .is_ok());
        // Missing, elsewhere or not a trace: one answer, so that a fetch
        // says nothing of which files exist on the host.
        let refused = [
            secret.clone(),
            mine.join("worker.log"),
            other.join("profile-x.json"),
            mine.join("profile-link.json"),
            mine.join("profile-dir.json"),
            nested.join("profile-deep.json"),
            mine.join("../job-000043-a1/profile-x.json"),
            mine.join("profile-missing.json"),
            tmp.path().join("no-such-file"),
            PathBuf::from("/etc/hostname"),
        ];
        let root = std::fs::canonicalize(&jobs).unwrap();
        let same = format!(
            "not a trace of job job-000042 on this node (a profile-*.json file in a folder of the job under {})",
            root.display()
        );
        for path in refused {
            let p = path.display().to_string();
            let e = trace_file(&jobs, "job-000042", &p).unwrap_err();
            assert_eq!(e, format!("{p}: {same}"));
        }
        assert!(trace_file(&jobs, "job-000042", "").is_err());
        // A job id is never a way out of its folder's name.
        let e = trace_file(
            &jobs,
            "job-00004",
            &mine.join("profile-ok.json").display().to_string(),
        )
        .unwrap_err();
        assert!(e.contains("not a trace of job job-00004"), "{e}");
    }
}
