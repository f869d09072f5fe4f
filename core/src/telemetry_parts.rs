//! A job's telemetry as an agent sends it on its session: in messages of at
//! most [`MESSAGE_BYTES`] encoded, which the coordinator's inbox joins again.
//!
//! The coordinator reads each session through tonic's `Streaming`, whose
//! buffer grows to hold the largest message it has read and never shrinks.
//! Held for the pace and sent as one message, a job's samples (8 s of 8
//! GPUs, ~16 KB) left every session of a 16,384-node fleet with a buffer of
//! ~47 KB: 0.77 GB of the coordinator's heap, held for as long as the
//! sessions last (heap profile, issue 51). In parts of a few KB, and read
//! in pieces smaller still (the coordinator's `service::pieces`), the buffer
//! stays at the 8 KB it starts with. Here because `gpuctl-agent` and the
//! simulated agents of `gpuctl-sim` both send telemetry.

use prost::Message;

use gpuctl_proto::pb::TelemetryBatch;

/// The most one telemetry message holds encoded, but for a single sample
/// larger than this, which goes alone.
pub const MESSAGE_BYTES: usize = 3 * 1024;

/// `batch` cut into batches of the same node, job and attempt, in order,
/// each encoding to at most [`MESSAGE_BYTES`] (a sample larger than that
/// alone); `batch` itself when it fits.
pub fn parts(batch: TelemetryBatch) -> Vec<TelemetryBatch> {
    if batch.encoded_len() <= MESSAGE_BYTES {
        return vec![batch];
    }
    let TelemetryBatch {
        node,
        job_id,
        attempt,
        samples,
    } = batch;
    let empty = |samples| TelemetryBatch {
        node: node.clone(),
        job_id: job_id.clone(),
        attempt,
        samples,
    };
    let head = empty(Vec::new()).encoded_len();
    let mut out = Vec::new();
    let mut part = Vec::new();
    let mut bytes = head;
    for s in samples {
        // As a field of the batch: its tag, its length and itself.
        let len = prost::encoding::message::encoded_len(4, &s);
        if !part.is_empty() && bytes + len > MESSAGE_BYTES {
            out.push(empty(std::mem::take(&mut part)));
            bytes = head;
        }
        bytes += len;
        part.push(s);
    }
    if !part.is_empty() {
        out.push(empty(part));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuctl_proto::pb::GpuSample;

    fn sample(index: u32, unix_ms: u64) -> GpuSample {
        GpuSample {
            index,
            uuid: format!("GPU-{index:02}-0000-0000-0000-000000000000"),
            unix_ms,
            util_gpu: 99.5,
            temperature_c: 61.0,
            power_w: 690.5,
            mem_used_bytes: 70 << 30,
            mem_total_bytes: 80 << 30,
            xids: vec![79; 4],
            ..Default::default()
        }
    }

    fn batch(samples: Vec<GpuSample>) -> TelemetryBatch {
        TelemetryBatch {
            node: "node-00017".into(),
            job_id: "job-000042".into(),
            attempt: 2,
            samples,
        }
    }

    #[test]
    fn a_held_batch_goes_in_parts_under_the_bound_keeping_every_sample_in_order() {
        // 16 s of 8 GPUs, as a paced agent of a large fleet holds them.
        let all: Vec<GpuSample> = (0..16u64)
            .flat_map(|t| (0..8).map(move |g| sample(g, 1_000 * t)))
            .collect();
        assert!(batch(all.clone()).encoded_len() > 3 * MESSAGE_BYTES);
        let parts = parts(batch(all.clone()));
        assert!(parts.len() > 3, "{} parts", parts.len());
        for p in &parts {
            assert!(p.encoded_len() <= MESSAGE_BYTES, "{}", p.encoded_len());
            assert_eq!(
                (p.node.as_str(), p.job_id.as_str(), p.attempt),
                ("node-00017", "job-000042", 2)
            );
        }
        // Full parts: the next sample would not have fitted.
        let one = prost::encoding::message::encoded_len(4, &all[0]);
        assert!(parts[0].encoded_len() + one > MESSAGE_BYTES);
        let joined: Vec<GpuSample> = parts.into_iter().flat_map(|p| p.samples).collect();
        assert_eq!(joined, all);
    }

    #[test]
    fn a_batch_that_fits_goes_whole_and_a_sample_past_the_bound_alone() {
        let small = batch(vec![sample(0, 1), sample(1, 1)]);
        assert_eq!(parts(small.clone()), vec![small]);
        let mut big = sample(3, 5);
        big.xids = vec![13; MESSAGE_BYTES];
        let parts = parts(batch(vec![sample(0, 5), big.clone(), sample(1, 5)]));
        let sizes: Vec<usize> = parts.iter().map(|p| p.samples.len()).collect();
        assert_eq!(sizes, [1, 1, 1]);
        assert_eq!(parts[1].samples[0], big);
    }
}
