//! `gpuctl report JOB -o html`: one self-contained HTML file (inline CSS, inline
//! SVG plots drawn by plotters, one small inline script, no URL) that a person
//! opens in a browser or attaches to a ticket. Verdict first, then the
//! findings, the job's facts, the per-node verdicts, p2p's GPU pair heat
//! maps, the plots that apply to the job, and the long tables folded away.
//! Every string from the report is escaped.

pub mod cert;
mod chart;
mod lines;
mod loader;
mod p2p;
mod plots;
mod style;
mod telemetry;

use anyhow::Result;
use gpuctl_proto::pb;
use html_escape::{encode_double_quoted_attribute as attr, encode_text as text};

use self::chart::{Plot, Swatch};
use self::plots::Figure;
use super::table::Table;
use crate::output::plan;
use crate::output::report::{collectives, gpu, header, ranks};

/// The whole page for `r`, with `timeline`'s telemetry plots.
pub fn page(r: &pb::Report, timeline: &pb::Timeline) -> Result<String> {
    let verdict = r.verdict().label();
    let mut s = page_start(&format!(
        "{} {}: {}",
        r.job_id,
        r.workload,
        verdict.to_uppercase()
    ));
    s.push_str(&banner(r));
    s.push_str(&findings(r));
    s.push_str(&facts(r, timeline));
    if !r.nodes.is_empty() {
        s.push_str("<h2 id=\"nodes\">Nodes</h2>\n");
        s.push_str(&table(&ranks::nodes_grid(r)));
        s.push_str(&folded("Ranks", &table(&ranks::ranks_grid(r))));
    }
    // ddp/fsdp: the models side by side (`--model a,b,c`).
    if let Some(models) = crate::output::models::grid(r) {
        s.push_str("<h2 id=\"models\">Models</h2>\n");
        s.push_str(&table(&models));
    }
    // p2p: the GPU pairs of each node as a heat map, the host copies.
    s.push_str(&p2p::section(r));
    s.push_str("<h2 id=\"plots\">Plots</h2>\n");
    let figures = figures(r, timeline)?;
    if figures.is_empty() {
        s.push_str("<p class=\"note\">No plot applies to this job.</p>\n");
    }
    for f in &figures {
        s.push_str(&figure(f));
    }
    s.push_str(&tables(r));
    s.push_str(&page_end(""));
    Ok(s)
}

/// A self-contained page's head up to `<body>`: `title` (escaped here) and
/// the one style sheet every page of gpuctl's shares.
fn page_start(title: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{}</style>\n</head>\n<body>\n",
        text(title),
        style::CSS
    )
}

/// The page's footer, `more` (already HTML) after the version and the
/// self-contained line, then the script and the closing tags.
fn page_end(more: &str) -> String {
    format!(
        "<footer>gpuctl {} · this file is self-contained: it needs no network.{more}</footer>\n         <script>{}</script>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION"),
        style::CHECK
    )
}

/// The plots that apply to the job, in the page's order.
fn figures(r: &pb::Report, timeline: &pb::Timeline) -> Result<Vec<Figure>> {
    let mut out = Vec::new();
    out.extend(plots::busbw(&r.collectives)?);
    out.extend(plots::links(&r.links)?);
    out.extend(plots::tflops(r)?);
    out.extend(telemetry::figures(timeline, r.started_unix_ms)?);
    out.extend(plots::maxbatch(r)?);
    out.extend(plots::step_times(r)?);
    out.extend(loader::figures(r)?);
    Ok(out)
}

fn banner(r: &pb::Report) -> String {
    let verdict = r.verdict().label();
    let mut sub = vec![
        format!("job {}", r.job_id),
        crate::output::dash(&r.workload),
        r.state().label().to_string(),
        gpuctl_core::units::format_duration_ms(r.duration_ms),
    ];
    let nodes = r.nodes.len();
    sub.push(format!(
        "{nodes} node{}, {} rank{}",
        if nodes == 1 { "" } else { "s" },
        r.world_size,
        if r.world_size == 1 { "" } else { "s" }
    ));
    format!(
        "<header class=\"banner v-{verdict}\" id=\"verdict\">\n<h1>VERDICT {}</h1>\n<p>{}</p>\n<p class=\"sub\">{}</p>\n</header>\n",
        verdict.to_uppercase(),
        text(&crate::output::dash(&r.reason)),
        text(&sub.join(" · "))
    )
}

/// Every failed or warned finding, worst first, each with its sentence.
fn findings(r: &pb::Report) -> String {
    if r.findings.is_empty() {
        return "<h2 id=\"findings\">Findings</h2>\n<p>No finding failed or warned.</p>\n".into();
    }
    let mut s = format!(
        "<h2 id=\"findings\">Findings ({})</h2>\n<ol class=\"findings\">\n",
        crate::output::findings::counts(&r.findings)
    );
    let grid = crate::output::findings::findings_grid(&r.findings);
    for (f, row) in r.findings.iter().zip(grid.rows()) {
        // LEVEL, NODE, WHERE, WHAT, VALUE, REFERENCE, RULE.
        let cell = |i: usize| row.get(i).map(String::as_str).unwrap_or("-");
        let level = crate::output::findings::level(f);
        let mut place = vec![cell(1)];
        place.extend([cell(2), cell(3)].into_iter().filter(|c| *c != "-"));
        let sentence = if f.detail.is_empty() {
            cell(6)
        } else {
            &f.detail
        };
        let mut figures = String::new();
        if cell(4) != "-" {
            figures = format!(" (value {}, reference {})", cell(4), cell(5));
        }
        s.push_str(&format!(
            "<li><span class=\"badge v-{level}\">{level}</span><span class=\"where\">{}</span>: {}{}</li>\n",
            text(&place.join(" · ")),
            text(sentence),
            text(&figures)
        ));
    }
    s.push_str("</ol>\n");
    s
}

/// The header facts: job, workload, duration, nodes, world size, versions.
fn facts(r: &pb::Report, timeline: &pb::Timeline) -> String {
    // The banner already says the verdict and its reason.
    let mut pairs: Vec<(String, String)> = header::header_pairs(r)
        .into_iter()
        .filter(|(k, _)| !matches!(*k, "VERDICT" | "REASON"))
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    pairs.push(("NODES".into(), r.nodes.len().to_string()));
    let results = r
        .nodes
        .iter()
        .flat_map(|n| &n.ranks)
        .filter_map(|x| x.result.as_ref());
    let torch: std::collections::BTreeSet<&str> = results
        .map(|x| x.torch_version.as_str())
        .filter(|v| !v.is_empty())
        .collect();
    if !torch.is_empty() {
        pairs.push((
            "TORCH".into(),
            torch.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    pairs.push(("GPUCTL".into(), env!("CARGO_PKG_VERSION").into()));
    let gpus = telemetry::gpu_count(timeline);
    if gpus > 0 {
        pairs.push(("GPUS WITH TELEMETRY".into(), gpus.to_string()));
    }
    let mut s = String::from("<h2 id=\"job\">Job</h2>\n<dl class=\"facts\">\n");
    for (k, v) in pairs {
        s.push_str(&format!("<dt>{}</dt><dd>{}</dd>\n", text(&k), text(&v)));
    }
    s.push_str("</dl>\n");
    for n in &r.notes {
        s.push_str(&format!("<p class=\"note\">note: {}</p>\n", text(n)));
    }
    s
}

/// The long tables, folded: people open them when the plots raise a question.
fn tables(r: &pb::Report) -> String {
    let mut s = String::new();
    if !r.collectives.is_empty() {
        let t = collectives::collectives_table(&r.collectives);
        s.push_str(&folded(
            "Collectives (nccl-tests' layout: the slowest rank's time, #wrong summed)",
            &format!("<pre>{}</pre>\n", text(&t)),
        ));
    }
    if let Some(t) = crate::output::loader::grid(r) {
        s.push_str(&folded("Loader sweep (each rank alone)", &table(&t)));
    }
    if !r.telemetry.is_empty() {
        s.push_str(&folded(
            "GPU telemetry summary",
            &table(&gpu::telemetry_grid(&r.telemetry)),
        ));
    }
    if !r.env.is_empty() {
        s.push_str(&folded("Environment", &table(&plan::env_grid(&r.env))));
    }
    if s.is_empty() {
        return s;
    }
    format!("<h2 id=\"tables\">Tables</h2>\n{s}")
}

fn folded(summary: &str, body: &str) -> String {
    format!(
        "<details>\n<summary>{}</summary>\n{body}</details>\n",
        text(summary)
    )
}

/// A verdict word gets its colour; a figure is right-aligned.
fn cell_class(c: &str) -> &'static str {
    match c {
        "pass" => " class=\"c-pass\"",
        "warn" => " class=\"c-warn\"",
        "fail" => " class=\"c-fail\"",
        _ if c.starts_with(|ch: char| ch.is_ascii_digit()) && c.len() <= 16 => " class=\"num\"",
        _ => "",
    }
}

/// A CLI table as an HTML table, the same cells under the same headers.
fn table(t: &Table) -> String {
    let mut s = String::from("<div class=\"scroll\"><table>\n<thead><tr>");
    for h in t.headers() {
        s.push_str(&format!("<th>{}</th>", text(h)));
    }
    s.push_str("</tr></thead>\n<tbody>\n");
    for row in t.rows() {
        s.push_str("<tr>");
        for c in row {
            s.push_str(&format!("<td{}>{}</td>", cell_class(c), text(c)));
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</tbody></table></div>\n");
    s
}

fn figure(f: &Figure) -> String {
    match f {
        Figure::Plot(p) => plot(p),
        Figure::Note { title, text: note } => format!(
            "<div class=\"plot-note\"><h3>{}</h3><p class=\"note\">{}</p></div>\n",
            text(title),
            text(note)
        ),
    }
}

fn plot(p: &Plot) -> String {
    let mut s = format!(
        "<figure class=\"plot\" id=\"{}\" data-plot=\"\">\n<h3>{}</h3>\n{}",
        attr(&p.id),
        text(&p.title),
        p.svg.replacen(
            "role=\"img\"",
            &format!("role=\"img\" aria-label=\"{}\"", attr(&p.title)),
            1
        )
    );
    s.push_str("<ul class=\"legend\">");
    for k in &p.legend {
        let class = match k.swatch {
            Swatch::Line => "line",
            Swatch::Dot => "dot",
            Swatch::Cross => "cross",
            Swatch::Area => "area",
            Swatch::Outline => "outline",
        };
        let c = attr(&k.colour);
        s.push_str(&format!(
            "<li><span class=\"sw {class}\" style=\"background:{c};border-color:{c};--c:{c}\"></span>{}</li>",
            text(&k.label)
        ));
    }
    s.push_str("</ul>\n");
    if !p.note.is_empty() {
        s.push_str(&format!("<p class=\"note\">{}</p>\n", text(&p.note)));
    }
    s.push_str("</figure>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_leads_with_the_verdict_and_escapes_the_report() {
        let mut r = crate::output::fixtures::stress_report();
        r.reason = "<script>alert(1)</script> & more".into();
        r.nodes[0].name = "node-<b>".into();
        if let Some(pb::RankResult {
            detail: Some(pb::rank_result::Detail::Stress(s)),
            ..
        }) = r.nodes[0].ranks[0].result.as_deref_mut()
        {
            s.tflops_per_interval = vec![1.0, 1.2, 1.1];
            s.interval_s = 2.0;
        }
        let html = page(&r, &pb::Timeline::default()).unwrap();
        let verdict = html.find("VERDICT FAIL").expect("the verdict");
        let findings = html.find("id=\"findings\"").expect("the findings");
        let plots = html.find("id=\"plots\"").expect("the plots");
        assert!(verdict < findings && findings < plots);
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; more"));
        assert!(html.contains("node-&lt;b&gt;"));
        assert!(!html.contains("<script>alert"));
        assert!(!html.contains("http://") && !html.contains("https://"));
        // The stress ranks' TFLOP/s plot, and the CPU job's telemetry note.
        assert!(html.contains("id=\"plot-tflops\" data-plot"), "{html}");
        assert!(html.contains("No GPU telemetry"));
        assert_eq!(html.matches("<script>").count(), 1);
    }

    #[test]
    fn a_p2p_page_has_the_pair_heat_map_between_the_nodes_and_the_plots() {
        let r = crate::output::fixtures::p2p_report();
        let html = page(&r, &pb::Timeline::default()).unwrap();
        let nodes = html.find("id=\"nodes\"").expect("the nodes");
        let pairs = html.find("<table class=\"pairs\">").expect("the matrix");
        let plots = html.find("id=\"plots\"").expect("the plots");
        assert!(nodes < pairs && pairs < plots);
        assert!(html.contains(">150.0/148.5*</td>"), "{html}");
        assert!(html.contains("Host ↔ device"), "{html}");
        assert!(!html.contains("http://") && !html.contains("https://"));
        // A job without p2p has no such section.
        let other = page(
            &crate::output::fixtures::stress_report(),
            &pb::Timeline::default(),
        )
        .unwrap();
        assert!(!other.contains("id=\"p2p\""));
    }
}
