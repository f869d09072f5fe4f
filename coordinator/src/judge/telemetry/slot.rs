//! One GPU's series while its job runs, held small: the newest bucket
//! decoded (every sample of the next second joins it), the older ones as
//! the store will write them. A bucket decoded takes ~440 bytes (its fields,
//! its boxed counters, its throttle counts) and ~180 encoded; a job of
//! 131,072 GPUs holds six a GPU, ~400 MB decoded at its end, while judging
//! and building its report need more memory beside them.
//!
//! The buckets come out exactly as [`GpuSeries::add_within`] makes them:
//! a sample that starts a bucket while there is room, or joins the newest,
//! is taken here; anything else (a full series merged pairwise, a limit
//! that shrank) goes through `add_within` on the series decoded whole.

use prost::Message;

use gpuctl_proto::pb::GpuSample;

use crate::judge::series::{joins_newest, Bucket, GpuSeries};

/// `GpuSeries.buckets`' field number: the older buckets are kept as that
/// field's encoding, so a series' encoding is its head's and theirs joined.
const BUCKETS_FIELD: u32 = 5;

/// One GPU's series, and whether it changed since it was last stored.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    /// Node, GPU, UUID, bucket width, and the newest bucket (none before
    /// the first sample).
    head: GpuSeries,
    /// The buckets before the newest, each encoded as field
    /// [`BUCKETS_FIELD`] of a [`GpuSeries`], oldest first.
    older: Vec<u8>,
    /// How many buckets `older` holds.
    older_n: usize,
    /// Where slot 0 starts: the first bucket's start.
    origin_ms: u64,
    pub(super) dirty: bool,
}

impl Slot {
    /// `series` held as a slot.
    pub(super) fn new(series: GpuSeries, dirty: bool) -> Slot {
        let mut slot = Slot {
            head: series,
            older: Vec::new(),
            older_n: 0,
            origin_ms: 0,
            dirty,
        };
        slot.keep_newest_only();
        slot
    }

    pub(super) fn index(&self) -> u32 {
        self.head.index
    }

    /// Adds one sample taken at `t`, keeping at most `max_buckets`.
    pub(super) fn add_within(&mut self, s: &GpuSample, t: u64, max_buckets: usize) {
        if self.head.uuid.is_empty() {
            self.head.uuid = s.uuid.clone();
        }
        let most = max_buckets.max(2);
        let n = self.older_n + self.head.buckets.len();
        let joins = self.joins(t);
        if n == 0 {
            let b = Bucket::of(s, t);
            self.origin_ms = b.start_ms;
            self.head.buckets.push(b);
            return;
        }
        if joins && n <= most {
            if let Some(newest) = self.head.buckets.last_mut() {
                newest.merge(&Bucket::of(s, t));
            }
            return;
        }
        if !joins && n < most {
            if let Some(newest) = self.head.buckets.pop() {
                self.hold(&newest);
            }
            self.head.buckets.push(Bucket::of(s, t));
            return;
        }
        let mut whole = self.series();
        whole.add_within(s, t, max_buckets);
        self.head = whole;
        self.keep_newest_only();
    }

    fn joins(&self, t: u64) -> bool {
        self.head.buckets.last().is_some_and(|newest| {
            joins_newest(newest.start_ms, t, self.origin_ms, self.head.bucket_ms)
        })
    }

    /// The series whole, decoded.
    pub(super) fn series(&self) -> GpuSeries {
        let mut whole = self.head_fields();
        whole
            .buckets
            .reserve_exact(self.older_n + self.head.buckets.len());
        // Written here, from buckets that encoded: only a bug fails it.
        let older = GpuSeries::decode(self.older.as_slice())
            .expect("a series' older buckets decode as they were encoded");
        whole.buckets.extend(older.buckets);
        whole.buckets.extend(self.head.buckets.iter().cloned());
        whole
    }

    /// The series' head: node, GPU, UUID and bucket width, with the newest
    /// bucket.
    pub(super) fn head(&self) -> &GpuSeries {
        &self.head
    }

    /// Calls `f` with every bucket, oldest first, as [`Slot::series`] holds
    /// them, decoding the older ones one at a time into one bucket: a job's
    /// summary at its end made each GPU's series whole, and at 131,072 GPUs
    /// its allocations, copies and frees were as much again as the decoding.
    pub(super) fn for_each_bucket(&self, mut f: impl FnMut(&Bucket)) {
        let mut rest = self.older.as_slice();
        let mut b = Bucket::default();
        while !rest.is_empty() {
            // Written here, from buckets that encoded: only a bug fails these.
            let (field, _) = prost::encoding::decode_key(&mut rest)
                .expect("a series' older buckets decode as they were encoded");
            debug_assert_eq!(field, BUCKETS_FIELD);
            let len = prost::encoding::decode_varint(&mut rest)
                .expect("a series' older buckets decode as they were encoded")
                as usize;
            let (one, after) = rest.split_at(len);
            b.clear();
            Message::merge(&mut b, one)
                .expect("a series' older buckets decode as they were encoded");
            f(&b);
            rest = after;
        }
        self.head.buckets.iter().for_each(f);
    }

    /// The series as the store writes it, made without decoding the older
    /// buckets: prost writes fields in order, and the buckets come last.
    pub(super) fn encoded(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.head_fields().encode(&mut out).expect("a Vec grows");
        out.extend_from_slice(&self.older);
        for b in &self.head.buckets {
            prost::encoding::message::encode(BUCKETS_FIELD, b, &mut out);
        }
        out
    }

    /// What [`Slot::encoded`] makes, in bytes.
    pub(super) fn encoded_len(&self) -> usize {
        self.head.encoded_len() + self.older.len()
    }

    pub(super) fn node(&self) -> &str {
        &self.head.node
    }

    /// The head's fields without its bucket.
    fn head_fields(&self) -> GpuSeries {
        GpuSeries {
            node: self.head.node.clone(),
            index: self.head.index,
            uuid: self.head.uuid.clone(),
            bucket_ms: self.head.bucket_ms,
            buckets: Vec::new(),
        }
    }

    /// Encodes every bucket of `head` but the newest into `older`.
    fn keep_newest_only(&mut self) {
        let buckets = std::mem::take(&mut self.head.buckets);
        self.origin_ms = buckets.first().map_or(0, |b| b.start_ms);
        let older: usize = buckets
            .iter()
            .rev()
            .skip(1)
            .map(|b| prost::encoding::message::encoded_len(BUCKETS_FIELD, b))
            .sum();
        self.older = Vec::with_capacity(older);
        self.older_n = 0;
        let mut rest = buckets.into_iter().peekable();
        let mut newest = Vec::with_capacity(1);
        while let Some(b) = rest.next() {
            if rest.peek().is_none() {
                newest.push(b);
            } else {
                self.hold(&b);
            }
        }
        self.head.buckets = newest;
    }

    /// Appends `b` to the older buckets, growing them by its size alone: a
    /// `Vec` doubled as it grows would keep up to as much again unused, for
    /// every GPU of the job.
    fn hold(&mut self, b: &Bucket) {
        self.older
            .reserve_exact(prost::encoding::message::encoded_len(BUCKETS_FIELD, b));
        prost::encoding::message::encode(BUCKETS_FIELD, b, &mut self.older);
        self.older_n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(util: u32, at: u64) -> GpuSample {
        GpuSample {
            unix_ms: at,
            util_gpu: f64::from(util),
            power_w: 300.0 + f64::from(util),
            temperature_c: 40.0 + f64::from(util % 7),
            ..gpuctl_testkit::gpu::healthy(2)
        }
    }

    /// Samples each second (late ones, gaps, repeats), with a limit that
    /// shrinks as a job's GPUs join: the slot holds the same buckets as a
    /// series given the same samples, and encodes to the same bytes.
    #[test]
    fn a_slot_holds_the_buckets_a_series_makes() {
        let uuid = sample(0, 0).uuid;
        for most in [2, 3, 6, 300] {
            let mut series = GpuSeries::new("n1", 2, &uuid);
            let mut slot = Slot::new(GpuSeries::new("n1", 2, ""), true);
            let mut at = 1_000_000u64;
            for i in 0..700u64 {
                at += match i % 11 {
                    0 => 0,
                    3 => 4_000,
                    7 => 1_500,
                    _ => 1_000,
                };
                let t = if i % 13 == 5 { at - 2_500 } else { at };
                // Shrunk on samples that join the newest bucket (i % 11 == 0).
                let limit = match i {
                    550.. => most.min(3),
                    407.. => most.min(4),
                    _ => most,
                };
                let s = sample((i * 7 % 100) as u32, t);
                series.add_within(&s, t, limit);
                slot.add_within(&s, t, limit);
                assert_eq!(slot.series(), series, "limit {most}, sample {i}");
                assert_eq!(
                    slot.older.capacity(),
                    slot.older.len(),
                    "no room held unused"
                );
            }
            let mut each = Vec::new();
            slot.for_each_bucket(|b| each.push(b.clone()));
            assert_eq!(each, series.buckets, "limit {most}: bucket by bucket");
            assert_eq!(slot.encoded(), series.encode_to_vec(), "limit {most}");
            assert_eq!(slot.encoded_len(), series.encoded_len());
            assert!(series.buckets.len() > 1, "limit {most}: more than the head");
        }
    }

    #[test]
    fn a_stored_series_is_held_and_given_back_whole() {
        let mut series = GpuSeries::new("n1", 2, "GPU-2");
        for i in 0..40u64 {
            series.add_within(&sample(50, 1_000 + i * 1_000), 1_000 + i * 1_000, 6);
        }
        let slot = Slot::new(series.clone(), false);
        assert_eq!(slot.older_n, series.buckets.len() - 1);
        assert_eq!(slot.series(), series);
        assert_eq!(
            GpuSeries::decode(slot.encoded().as_slice()).unwrap(),
            series
        );
        let empty = Slot::new(GpuSeries::new("n1", 3, ""), false);
        assert_eq!(empty.series(), GpuSeries::new("n1", 3, ""));
        assert_eq!(empty.encoded(), GpuSeries::new("n1", 3, "").encode_to_vec());
    }
}
