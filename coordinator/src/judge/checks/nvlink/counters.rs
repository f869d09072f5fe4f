//! NVLink's error counters read one way for the rule, the report's summaries
//! and the peer rule: the flit CRC counter where the agent splits them, an
//! older agent's sum where not.

use crate::judge::series::Counters;

/// NVLink flit CRC errors between two counter readings, link by link; an
/// older agent's summed total where it sent no split.
pub fn nvlink_crc_flit(first: &Counters, last: &Counters) -> u64 {
    if has_split(first) || has_split(last) {
        last.nvlink_crc_flit.saturating_sub(first.nvlink_crc_flit)
    } else {
        last.nvlink_crc_errors
            .saturating_sub(first.nvlink_crc_errors)
    }
}

fn has_split(c: &Counters) -> bool {
    c.nvlink_crc_flit + c.nvlink_crc_data > 0
}

/// NVLink CRC errors (flit and data) between two counter readings: the
/// link-by-link sums where the agent sent them, else (an older agent) its
/// summed total.
pub fn nvlink_crc(first: &Counters, last: &Counters) -> u64 {
    let split = last.nvlink_crc_flit + last.nvlink_crc_data;
    if split > 0 || first.nvlink_crc_flit + first.nvlink_crc_data > 0 {
        last.nvlink_crc_flit.saturating_sub(first.nvlink_crc_flit)
            + last.nvlink_crc_data.saturating_sub(first.nvlink_crc_data)
    } else {
        last.nvlink_crc_errors
            .saturating_sub(first.nvlink_crc_errors)
    }
}
