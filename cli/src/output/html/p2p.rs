//! `p2p` in the HTML report: per node the GPU pairs as a heat map (a row per
//! sender, a column per receiver; a cell's colour its ratio to the pair the
//! job judged against: green for a pass, red for a slow pair, none without a
//! reference), each cell's passes in its tooltip; then the host↔device table.

use gpuctl_proto::pb;
use html_escape::{encode_double_quoted_attribute as attr, encode_text as text};

use crate::output::p2p::{self, Matrix};

/// The page's p2p section; empty for a job without p2p results.
pub fn section(r: &pb::Report) -> String {
    let matrices = p2p::matrices(r);
    let host = p2p::host_grid(r);
    if matrices.is_empty() && host.is_none() {
        return String::new();
    }
    let mut s = String::from("<h2 id=\"p2p\">GPU pairs</h2>\n");
    for m in &matrices {
        s.push_str(&format!(
            "<h3 class=\"pairs\">{}</h3>\n",
            text(&p2p::title(m.node).replacen("GPU PAIRS ", "", 1))
        ));
        s.push_str(&heat_map(m));
        s.push_str(&format!(
            "<p class=\"note\">{}; a pass is green, deeper the nearer the reference, a slow pair red, deeper the slower.</p>\n",
            text(&p2p::legend(m))
        ));
    }
    if let Some(t) = host {
        s.push_str("<h3 class=\"pairs\">Host ↔ device</h3>\n");
        s.push_str(&super::table(&t));
        s.push_str(&format!(
            "<p class=\"note\">{}</p>\n",
            text(&p2p::HOST_TITLE.replacen("HOST <-> DEVICE ", "", 1))
        ));
    }
    s
}

/// A cell's background: its ratio to the reference, green from pale (just
/// above slow) to full (at the reference or above) for a pass, red from pale
/// to deep (the slower) for a slow pair; none when nothing judged it.
pub fn shade(p: &pb::GpuPair) -> Option<String> {
    let fail = p.verdict() == pb::Verdict::Fail;
    if p.reference_gbps <= 0.0 {
        return fail.then(|| "hsl(4, 75%, 80%)".to_string());
    }
    let ratio = (p.gbps / p.reference_gbps).clamp(0.0, 1.0);
    Some(if fail {
        // 0.8x and above: pale; nothing: deep.
        format!("hsl(4, 75%, {:.0}%)", 68.0 + 18.0 * ratio)
    } else {
        // 0.8x: pale; 1.0x: full.
        let depth = ((ratio - 0.8) / 0.2).clamp(0.0, 1.0);
        format!("hsl(135, 45%, {:.0}%)", 93.0 - 13.0 * depth)
    })
}

fn tooltip(from: &str, to: &str, p: &pb::GpuPair) -> String {
    let mut s = format!(
        "{from} -> {to}: {} GB/s (passes {} and {})",
        p2p::gbps(p.gbps),
        p2p::gbps(p.first_gbps),
        p2p::gbps(p.repeat_gbps)
    );
    if p.reference_gbps > 0.0 {
        s.push_str(&format!(
            ", {:.2}x the job's upper-quartile pair {} GB/s",
            p.gbps / p.reference_gbps,
            p2p::gbps(p.reference_gbps)
        ));
    }
    if p.wrong > 0 {
        s.push_str(&format!(", {} wrong elements", p.wrong));
    }
    s
}

/// The matrix as a table whose cells carry their colour.
fn heat_map(m: &Matrix) -> String {
    let mut s = String::from(
        "<div class=\"scroll\"><table class=\"pairs\">\n<thead><tr><th>FROM \\ TO</th>",
    );
    for x in &m.members {
        s.push_str(&format!("<th>{}</th>", text(&x.label)));
    }
    s.push_str("<th>MEDIAN</th></tr></thead>\n<tbody>\n");
    for a in &m.members {
        s.push_str(&format!("<tr><th>{}</th>", text(&a.label)));
        for b in &m.members {
            let cell = match m.pair(a.rank, b.rank) {
                _ if a.rank == b.rank => "<td class=\"num self\">-</td>".to_string(),
                None => "<td class=\"num\" title=\"not measured\">?</td>".to_string(),
                Some(p) => {
                    let class = if p.verdict() == pb::Verdict::Fail {
                        "num pair-fail"
                    } else {
                        "num pair-pass"
                    };
                    let style = shade(p)
                        .map(|c| format!(" style=\"background:{}\"", attr(&c)))
                        .unwrap_or_default();
                    format!(
                        "<td class=\"{class}\"{style} title=\"{}\">{}</td>",
                        attr(&tooltip(&a.label, &b.label, p)),
                        text(&p2p::cell(p))
                    )
                }
            };
            s.push_str(&cell);
        }
        let median = m.median_of(a.rank).map_or("-".into(), p2p::gbps);
        s.push_str(&format!("<td class=\"num\">{}</td></tr>\n", text(&median)));
    }
    s.push_str("</tbody></table></div>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_pair_is_red_and_the_others_green() {
        let r = crate::output::fixtures::p2p_report();
        let html = section(&r);
        assert!(html.starts_with("<h2 id=\"p2p\">GPU pairs</h2>"), "{html}");
        assert!(html.contains("<table class=\"pairs\">"), "{html}");
        // Twelve pairs: one slow, in red, with both passes and the mark.
        assert_eq!(html.matches("class=\"num pair-fail\"").count(), 1);
        assert_eq!(html.matches("class=\"num pair-pass\"").count(), 11);
        let slow = html
            .split("<td ")
            .find(|c| c.starts_with("class=\"num pair-fail\""))
            .unwrap();
        assert!(slow.contains("background:hsl(4, 75%"), "{slow}");
        assert!(slow.contains(">150.0/148.5*</td>"), "{slow}");
        assert!(
            slow.contains("title=\"GPU 1 -&gt; GPU 3: 150.0 GB/s"),
            "{slow}"
        );
        let fast = html
            .split("<td ")
            .find(|c| c.starts_with("class=\"num pair-pass\""))
            .unwrap();
        assert!(fast.contains("background:hsl(135, 45%, 80%)"), "{fast}");
        // The host copies follow the matrix.
        let host = html.find("Host ↔ device").expect(&html);
        assert!(html.find("<table class=\"pairs\">").unwrap() < host);
        assert!(html[host..].contains("53.1 (52.9/53.1)"), "{html}");
        assert_eq!(section(&pb::Report::default()), "");
    }

    #[test]
    fn shades_follow_the_ratio() {
        let pair = |gbps: f64, reference: f64, v: pb::Verdict| pb::GpuPair {
            gbps,
            reference_gbps: reference,
            verdict: v as i32,
            ..Default::default()
        };
        // Deeper red the slower.
        assert_eq!(
            shade(&pair(0.0, 360.0, pb::Verdict::Fail)).unwrap(),
            "hsl(4, 75%, 68%)"
        );
        assert_eq!(
            shade(&pair(180.0, 360.0, pb::Verdict::Fail)).unwrap(),
            "hsl(4, 75%, 77%)"
        );
        // Pale green just above slow, full at the reference and above.
        assert_eq!(
            shade(&pair(288.0, 360.0, pb::Verdict::Pass)).unwrap(),
            "hsl(135, 45%, 93%)"
        );
        assert_eq!(
            shade(&pair(400.0, 360.0, pb::Verdict::Pass)).unwrap(),
            "hsl(135, 45%, 80%)"
        );
        // Nothing to compare with: neutral, unless wrong elements failed it.
        assert_eq!(shade(&pair(100.0, 0.0, pb::Verdict::Pass)), None);
        assert!(shade(&pair(100.0, 0.0, pb::Verdict::Fail)).is_some());
    }
}
