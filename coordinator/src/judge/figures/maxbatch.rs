//! `maxbatch`: the largest batch that fits in the GPU's memory, a figure of
//! one rank.

use gpuctl_core::catalogue::MaxBatchParams;
use gpuctl_proto::pb::MaxBatchResult;

use super::{Expected, Figure, Metric};

pub fn maxbatch_key(model: &str, precision: &str) -> String {
    format!("{model} {precision}")
}

/// Empty when no batch fitted (`max_batch` 0): there is no size to judge.
pub(super) fn rank_figures(m: &MaxBatchResult) -> Vec<Figure> {
    if m.max_batch == 0 {
        return Vec::new();
    }
    vec![Figure {
        metric: Metric::MaxBatch,
        key: maxbatch_key(&m.model, &m.precision).into(),
        value: m.max_batch as f64,
    }]
}

pub(super) fn expected(m: &MaxBatchParams, out: &mut Expected) {
    out.insert((
        Metric::MaxBatch,
        maxbatch_key(&m.model.model, &m.model.precision),
    ));
}
