//! The HTML report in a real browser: five short jobs on a local fleet of
//! three CPU nodes (a stress, an nccl size sweep, an nccl `--pattern pairs`
//! for the link matrix, a maxbatch and a ddp), each report rendered with
//! `gpuctl report JOB -o html` and opened in headless Chromium (Debian's
//! `chromium`). The page's own check counts the plots that drew data marks
//! (`body[data-plots]`) and logs `empty plot: ID` otherwise; the test fails on
//! any console message, on a plot count other than the job's, on a blank
//! screenshot and on any URL in the page.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const CHROMIUM: &str = "/usr/bin/chromium";

fn chromium() -> PathBuf {
    let p = PathBuf::from(CHROMIUM);
    assert!(
        p.exists(),
        "{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium); \
         scripts/test.sh does"
    );
    p
}

/// What Chromium made of a page: the DOM after the scripts ran, every console
/// message, and the screenshot.
struct Opened {
    dom: String,
    console: Vec<String>,
    png: PathBuf,
}

/// Runs headless Chromium on `page` with `mode` (`--dump-dom` or
/// `--screenshot=...`) and returns (stdout, console lines). This Chromium
/// logs every console call, error or not, as `INFO:CONSOLE` on stderr.
fn run_chromium(page: &Path, dir: &Path, mode: &str) -> (String, Vec<String>) {
    let profile = tempfile::tempdir_in(dir).expect("profile folder");
    let out_path = dir.join("chromium.out");
    let err_path = dir.join("chromium.err");
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,4000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(mode)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("start chromium");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium {mode} did not finish in 90 s on {}",
                page.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        status.success(),
        "chromium {mode} failed ({status}):\n{stderr}"
    );
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(String::from)
        .collect();
    (stdout, console)
}

fn open(page: &Path, dir: &Path) -> Opened {
    let (dom, mut console) = run_chromium(page, dir, "--dump-dom");
    let png = page.with_extension("png");
    let (_, more) = run_chromium(page, dir, &format!("--screenshot={}", png.display()));
    console.extend(more);
    assert!(png.exists(), "no screenshot of {}", page.display());
    Opened { dom, console, png }
}

/// (distinct colours, share of pixels that are not white) of a PNG.
fn png_colours(path: &Path) -> (usize, f64) {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    let px = info.color_type.samples();
    assert!(px >= 3, "an RGB screenshot, got {:?}", info.color_type);
    let bytes = &buf[..info.buffer_size()];
    let mut colours = BTreeSet::new();
    let mut inked = 0usize;
    let pixels = bytes.len() / px;
    for p in bytes.chunks_exact(px) {
        colours.insert((p[0], p[1], p[2]));
        if p[..3].iter().any(|c| *c < 245) {
            inked += 1;
        }
    }
    (colours.len(), inked as f64 / pixels as f64)
}

/// Waits for the job, then renders its report to HTML in `dir`.
fn render(c: &Cluster, id: &str, dir: &Path) -> (Value, String, PathBuf) {
    c.wait_state(
        id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(240),
    );
    // `report` exits 1 for a job that failed: the JSON is there all the same.
    let json = c.gpuctl(&["report", id, "-o", "json"]);
    let report: Value = serde_json::from_slice(&json.stdout)
        .unwrap_or_else(|e| panic!("{id}: no report JSON ({e}): {}", stderr(&json)));
    let out = c.gpuctl(&["report", id, "-o", "html"]);
    // The exit code carries the verdict as for every report format.
    let want = if report["verdict"] == "pass" && report["state"] == "succeeded" {
        0
    } else {
        1
    };
    assert_eq!(out.status.code(), Some(want), "{}", stderr(&out));
    let html = String::from_utf8(out.stdout).expect("utf-8 HTML");
    let path = dir.join(format!("{id}.html"));
    std::fs::write(&path, &html).unwrap();
    (report, html, path)
}

/// Everything the test asks of one job's page; `plots` is how many plots
/// with data the job should get.
fn check(c: &Cluster, id: &str, dir: &Path, plots: impl Fn(&Value) -> usize) {
    let (report, html, path) = render(c, id, dir);
    let want = plots(&report);
    assert!(want > 0, "{id}: the test expects a plot of every job");

    // Self-contained: no URL at all, so nothing is fetched from anywhere.
    for bad in ["http://", "https://", "src=", "href=", "@import", "url("] {
        assert!(!html.contains(bad), "{id}: `{bad}` in the page");
    }
    // The verdict first, and the nodes by name.
    let verdict = report["verdict"].as_str().unwrap().to_uppercase();
    let first = html.find("VERDICT ").expect("a verdict");
    assert!(
        html[first..].starts_with(&format!("VERDICT {verdict}")),
        "{id}: the banner says {verdict}"
    );
    assert!(first < html.find("id=\"plots\"").unwrap());
    for n in report["nodes"].as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        assert!(html.contains(name), "{id}: node {name} in the page");
    }
    // CPU ranks: no GPU telemetry, and the page says so instead of plotting nothing.
    assert!(
        html.contains("No GPU telemetry"),
        "{id}: the telemetry note"
    );

    let opened = open(&path, dir);
    assert!(
        opened.console.is_empty(),
        "{id}: console messages in {}:\n{}",
        path.display(),
        opened.console.join("\n")
    );
    assert_eq!(
        opened.dom.matches("data-plot=\"\"").count(),
        want,
        "{id}: plots in the page"
    );
    assert!(
        opened.dom.contains(&format!("data-plots=\"{want}\"")),
        "{id}: the page's check did not count {want} plots with data marks: {}",
        opened
            .dom
            .lines()
            .find(|l| l.contains("<body"))
            .unwrap_or("no <body>")
    );
    let (colours, inked) = png_colours(&opened.png);
    assert!(
        colours > 64 && inked > 0.03,
        "{id}: the screenshot {} looks blank ({colours} colours, {:.1}% not white)",
        opened.png.display(),
        inked * 100.0
    );
}

fn ops_of_links(report: &Value) -> usize {
    let ops: BTreeSet<&str> = report["links"]
        .as_array()
        .map(|ls| ls.iter().filter_map(|l| l["op"].as_str()).collect())
        .unwrap_or_default();
    ops.len()
}

#[test]
fn html_reports_open_in_chromium_with_every_plot_drawn() {
    chromium();
    let c = Cluster::start(3, 1);
    let dir = tempfile::tempdir().unwrap();
    // Queued together: each waits for its nodes, none waits for the test.
    let stress = c.submit(&["stress", "--nodes", "3", "--duration", "3s"]);
    let sweep = c.submit(&[
        "nccl",
        "--nodes",
        "3",
        "--min-bytes",
        "1K",
        "--max-bytes",
        "64K",
        "--iters",
        "3",
        "--warmup",
        "1",
    ]);
    let pairs = c.submit(&[
        "nccl",
        "--pattern",
        "pairs",
        "--nodes",
        "3",
        "--max-bytes",
        "256K",
        "--iters",
        "3",
        "--warmup",
        "1",
    ]);
    let maxbatch = c.submit(&[
        "maxbatch", "--nodes", "2", "--model", "cnn", "--start", "4", "--limit", "16",
    ]);
    let ddp = c.submit(&[
        "ddp",
        "--nodes",
        "2",
        "--model",
        "cnn",
        "--steps",
        "12",
        "--batch-size",
        "16",
    ]);

    // Stress: TFLOP/s over time (CPU ranks: telemetry is a note, not a plot).
    check(&c, &stress, dir.path(), |_| 1);
    // The sweep: busbw against message size.
    check(&c, &sweep, dir.path(), |_| 1);
    // Pairs: a heat map per op measured.
    check(&c, &pairs, dir.path(), ops_of_links);
    // Maxbatch: the batch → peak memory curve.
    check(&c, &maxbatch, dir.path(), |_| 1);
    // ddp: the step-time distribution (or p50/p99 per rank).
    check(&c, &ddp, dir.path(), |_| 1);
    let (_, html, _) = render(&c, &ddp, dir.path());
    let models = html
        .find("id=\"models\"")
        .expect("a Models section for ddp");
    assert!(html[models..].contains("cnn"), "the model by name");

    // Only `report` makes a page: elsewhere a usage error naming the flag.
    let refused: [&[&str]; 3] = [
        &["jobs", "-o", "html"],
        &["nodes", "-o", "html"],
        &["submit", "stress", "--nodes", "1", "--wait", "-o", "html"],
    ];
    for args in refused {
        let out = c.gpuctl(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("--output html"), "{}", stderr(&out));
    }
}
