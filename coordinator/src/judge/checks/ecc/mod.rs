//! The GPU's memory: ECC errors, retired pages and row remapping. Errors
//! counted before the run are told apart from those during it, since the
//! first were there before this job and the second came with it.

pub mod defaults;

use super::health::rules::HealthRules;
use super::health::run::{Run, Sink};

pub(super) fn check(r: &HealthRules, run: &Run, out: &mut Sink) {
    let ecc_u = run.delta(|c| c.ecc_uncorrected);
    if ecc_u > 0 {
        out.fire(
            r.ecc_uncorrected,
            "ecc_uncorrected",
            format!("{ecc_u} uncorrectable ECC errors during the run"),
        );
    }
    if run.first.ecc_uncorrected > 0 {
        out.fire(
            r.ecc_uncorrected_before,
            "ecc_uncorrected",
            format!(
                "{} uncorrectable ECC errors counted before the run started",
                run.first.ecc_uncorrected
            ),
        );
    }
    let ecc_c = run.delta(|c| c.ecc_corrected);
    if ecc_c > r.ecc_corrected_limit {
        out.fire(
            r.ecc_corrected,
            "ecc_corrected",
            format!("{ecc_c} corrected ECC errors during the run"),
        );
    }
    if run.last.retired_pages >= r.retired_pages_limit && r.retired_pages_limit > 0 {
        out.fire(
            r.retired_pages,
            "retired_pages",
            format!(
                "{} retired pages (limit {}): the GPU needs service",
                run.last.retired_pages, r.retired_pages_limit
            ),
        );
    }
    let retired = run.delta(|c| c.retired_pages);
    if retired > 0 {
        out.fire(
            r.retired_pages_growth,
            "retired_pages",
            format!("{retired} pages retired during the run"),
        );
    }
    if run.t.remap_failed {
        out.fire(
            r.row_remap_failed,
            "row_remap",
            "row remapping failed: the GPU needs service".into(),
        );
    }
}

#[cfg(test)]
mod tests;
