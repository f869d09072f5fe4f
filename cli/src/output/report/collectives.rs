//! The report's collectives: one table per operation, laid out like
//! nccl-tests' own output so the two compare line by line.

use gpuctl_proto::pb;

/// nccl-tests prints times with fewer decimals as they grow; so do we, to match line by line.
fn nccl_time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:7.0}")
    } else if us >= 100.0 {
        format!("{us:7.1}")
    } else {
        format!("{us:7.2}")
    }
}

/// Bytes before the out-of-place block: size, count, type, redop, root.
const NCCL_PREFIX: usize = 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6;

/// One table per collective, laid out like nccl-tests' `*_perf` output so the
/// two can be compared line by line.
pub fn collectives_table(rows: &[pb::CollectiveRow]) -> String {
    let mut ops: Vec<&str> = Vec::new();
    for r in rows {
        if !ops.contains(&r.op.as_str()) {
            ops.push(&r.op);
        }
    }
    let mut s = String::new();
    for op in ops {
        let mut mine: Vec<&pb::CollectiveRow> = rows.iter().filter(|r| r.op == op).collect();
        mine.sort_by(|a, b| a.dtype.cmp(&b.dtype).then(a.bytes.cmp(&b.bytes)));
        s.push_str(&format!("# {op}\n"));
        let top = format!(
            "#{:w$}{:^32}{:^32}",
            "",
            "out-of-place",
            "in-place",
            w = NCCL_PREFIX - 1
        );
        s.push_str(top.trim_end());
        s.push('\n');
        s.push_str(&format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}\n",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        ));
        let units = format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6} {:>6}  {:>7}  {:>6}  {:>6} {:>6}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
        s.push_str(units.trim_end());
        s.push('\n');
        let mut bw_sum = 0.0;
        for r in &mine {
            let redop = if r.redop.is_empty() {
                "none"
            } else {
                r.redop.as_str()
            };
            s.push_str(&format!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {:>6.2}  {:>6.2}  {:>5}  {}  {:>6.2}  {:>6.2}  {:>5}\n",
                r.bytes,
                r.count,
                r.dtype,
                redop,
                r.root,
                nccl_time(r.time_us),
                r.algbw_gbps,
                r.busbw_gbps,
                r.wrong,
                nccl_time(r.time_us_ip),
                r.algbw_gbps_ip,
                r.busbw_gbps_ip,
                r.wrong_ip
            ));
            bw_sum += r.busbw_gbps + r.busbw_gbps_ip;
        }
        // As nccl-tests: the mean over every size, out-of-place and in-place.
        if !mine.is_empty() {
            let avg = bw_sum / (2 * mine.len()) as f64;
            let wrong: u64 = mine.iter().map(|r| r.wrong + r.wrong_ip).sum();
            s.push_str(&format!(
                "# Out of bounds values : {wrong} {}\n",
                if wrong == 0 { "OK" } else { "FAILED" }
            ));
            s.push_str(&format!("# Avg bus bandwidth    : {avg:.4}\n"));
        }
        s.push('\n');
    }
    s
}
