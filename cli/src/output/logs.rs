//! A job's worker log lines as text: as written for one rank, else each
//! prefixed with its rank and node.

use gpuctl_proto::pb::LogLine;

pub fn text(lines: &[LogLine], one_rank: bool) -> String {
    let mut text = String::new();
    for l in lines {
        if one_rank {
            text.push_str(&l.line);
        } else {
            // Like `docker compose logs`: who said it, then what.
            text.push_str(&format!("[rank {} {}] {}", l.rank, l.node, l.line));
        }
        text.push('\n');
    }
    text
}
