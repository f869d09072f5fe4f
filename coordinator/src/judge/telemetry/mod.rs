//! GPU telemetry of a job while the coordinator holds it: the newest sample
//! of each GPU (for `gpuctl watch`) and, per GPU, a downsampled [`GpuSeries`]
//! that is stored with the job and summarised into the report with health
//! findings ([`super::checks::health`]).
//!
//! Here, the holding: batches in, changed series out to the store. The
//! summaries and findings a report takes of them are [`summary`].

mod slot;
mod summary;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};

use gpuctl_proto::pb::{GpuSample, TelemetryBatch};

use super::series::GpuSeries;
use crate::store::keys;
use slot::Slot;

pub use crate::judge::checks::idle::Windows;

/// A job's telemetry while the coordinator holds it.
#[derive(Debug, Default, Clone)]
pub struct Telemetry {
    latest: BTreeMap<String, TelemetryBatch>,
    series: BTreeMap<(String, u32), Slot>,
    /// How many series changed since they were last stored.
    dirty: usize,
    /// The last series `take_dirty_some` took.
    cursor: Option<(String, u32)>,
}

impl Telemetry {
    /// Series read back from the store (a finished job, or after a restart).
    pub fn from_stored(series: Vec<GpuSeries>) -> Telemetry {
        Telemetry {
            series: series
                .into_iter()
                .map(|s| ((s.node.clone(), s.index), Slot::new(s, false)))
                .collect(),
            ..Default::default()
        }
    }

    /// Adds a batch from `node`; returns how many samples it held.
    ///
    /// Runs on the scheduler's task for every node every second (32,768
    /// GPUs at 4,096 nodes): the node's series are found once per batch,
    /// where a lookup, a key and a mark per sample took an eighth of the
    /// coordinator's CPU.
    pub fn add(&mut self, node: &str, batch: TelemetryBatch, now_ms: u64) -> usize {
        // The job's GPUs so far share the per-job budget.
        let max = super::series::buckets_per_gpu(self.series.len().max(batch.samples.len()));
        let first = (node.to_string(), 0);
        let last = (first.0.clone(), u32::MAX);
        let mut fresh = Vec::new();
        {
            let mut mine: Vec<&mut Slot> = self
                .series
                .range_mut(first..=last)
                .map(|(_, slot)| slot)
                .collect();
            for s in &batch.samples {
                let at = if s.unix_ms > 0 { s.unix_ms } else { now_ms };
                match mine.iter_mut().find(|slot| slot.index() == s.index) {
                    Some(slot) => {
                        slot.add_within(s, at, max);
                        if !slot.dirty {
                            slot.dirty = true;
                            self.dirty += 1;
                        }
                    }
                    // A joined batch holds several seconds of a GPU.
                    None => match fresh.iter_mut().find(|g: &&mut Slot| g.index() == s.index) {
                        Some(g) => g.add_within(s, at, max),
                        None => {
                            let mut g = Slot::new(GpuSeries::new(node, s.index, &s.uuid), true);
                            g.add_within(s, at, max);
                            fresh.push(g);
                        }
                    },
                }
            }
        }
        self.dirty += fresh.len();
        for g in fresh {
            self.series.insert((node.to_string(), g.index()), g);
        }
        let n = batch.samples.len();
        match self.latest.get_mut(node) {
            Some(kept) => newest_into(&mut kept.samples, batch.samples),
            None => {
                let mut kept = batch;
                let samples = std::mem::take(&mut kept.samples);
                newest_into(&mut kept.samples, samples);
                self.latest.insert(node.to_string(), kept);
            }
        }
        n
    }

    /// The newest sample of each GPU of every node, a batch a node.
    pub fn latest(&self) -> Vec<TelemetryBatch> {
        self.latest.values().cloned().collect()
    }

    /// Lets go of the newest samples, which only `gpuctl watch` shows and no
    /// report or store takes: 28 MB at 16,384 nodes × 8 GPUs, held through a
    /// job's judging beside its series otherwise.
    pub fn forget_latest(&mut self) {
        self.latest = BTreeMap::new();
    }

    /// The series changed since they were last taken, encoded, by value: a
    /// job's last write frees each series once it is encoded (32,768 GPUs'
    /// are ~60 MB), not after all of them are.
    pub fn into_dirty(self) -> impl Iterator<Item = Encoded> {
        self.series
            .into_values()
            .filter(|slot| slot.dirty)
            .map(|slot| Encoded::of(&slot))
    }

    /// Series changed since the last call, to be stored; marks them clean.
    pub fn take_dirty(&mut self) -> Vec<Encoded> {
        self.take_dirty_some(usize::MAX)
    }

    /// At most `max` of the changed series, taken round the GPUs in key
    /// order from where the last call stopped, so that writing a job's
    /// telemetry can be spread over several calls without starving any GPU.
    pub fn take_dirty_some(&mut self, max: usize) -> Vec<Encoded> {
        let bounds = |c: &Option<(String, u32)>| match c {
            Some(c) => (
                (Excluded(c.clone()), Unbounded),
                (Unbounded, Included(c.clone())),
            ),
            None => ((Unbounded, Unbounded), (Unbounded, Unbounded)),
        };
        let (after, before) = bounds(&self.cursor);
        let wrap = self.cursor.is_some();
        let mut out = Vec::new();
        let mut last = None;
        let mut take = |range: std::collections::btree_map::RangeMut<'_, (String, u32), Slot>,
                        out: &mut Vec<Encoded>| {
            for (key, slot) in range {
                if out.len() >= max {
                    return;
                }
                if slot.dirty {
                    slot.dirty = false;
                    out.push(Encoded::of(slot));
                    last = Some(key.clone());
                }
            }
        };
        take(self.series.range_mut(after), &mut out);
        if out.len() < max && wrap {
            take(self.series.range_mut(before), &mut out);
        }
        self.dirty -= out.len();
        if last.is_some() {
            self.cursor = last;
        }
        out
    }

    /// How many GPUs have a series.
    pub fn gpus(&self) -> usize {
        self.series.len()
    }

    /// What the series take in the store, keys included.
    pub fn stored_bytes(&self, job: &str) -> u64 {
        self.series
            .values()
            .map(|s| (keys::telemetry(job, s.node(), s.index()).len() + s.encoded_len()) as u64)
            .sum()
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty > 0
    }

    /// Each GPU's series, decoded one at a time.
    pub fn series(&self) -> impl Iterator<Item = GpuSeries> + '_ {
        self.series.values().map(Slot::series)
    }
}

/// Keeps in `kept` the newest sample of each GPU of `kept` and `fresh`.
/// Only these are shown (`gpuctl watch`, `status`): keeping each node's
/// whole last batch, 8 s of its GPUs when the fleet is paced, held ~20 KB
/// a node, 0.3 GB at 16,384 nodes (issue 51).
fn newest_into(kept: &mut Vec<GpuSample>, fresh: Vec<GpuSample>) {
    for s in fresh {
        match kept.iter_mut().find(|k| k.index == s.index) {
            Some(k) if k.unix_ms <= s.unix_ms => *k = s,
            Some(_) => {}
            None => kept.push(s),
        }
    }
}

/// One GPU's series as the store writes it, under `telemetry/{job}/{node}/{gpu}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub node: String,
    pub index: u32,
    /// A [`GpuSeries`], encoded.
    pub bytes: Vec<u8>,
}

impl Encoded {
    fn of(slot: &Slot) -> Encoded {
        Encoded {
            node: slot.node().to_string(),
            index: slot.index(),
            bytes: slot.encoded(),
        }
    }
}
