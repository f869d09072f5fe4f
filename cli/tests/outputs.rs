//! The report's other formats on real processes: a short stress job on two
//! CPU nodes, then its report as CSV (read back with the `csv` crate),
//! Markdown and JUnit XML (read back with quick-xml), the listings as CSV and
//! Markdown, the shell completions, and `logs --rank` past the job's ranks.
//! A second job under a floor the CPU cannot reach gives JUnit its failures.

mod common;

use std::time::Duration;

use common::*;
use quick_xml::events::Event;

fn finish(c: &Cluster, args: &[&str]) -> String {
    let id = c.submit(args);
    c.wait_state(
        &id,
        &["succeeded", "failed", "cancelled"],
        Duration::from_secs(120),
    );
    id
}

fn stdout(c: &Cluster, args: &[&str]) -> String {
    let out = c.gpuctl(args);
    let text = String::from_utf8(out.stdout.clone()).expect("utf-8");
    assert!(
        !text.is_empty(),
        "no output from {args:?} ({:?}): {}",
        out.status,
        stderr(&out)
    );
    text
}

/// The CSV sections of a report by title: header row, then the records.
fn csv_sections(text: &str) -> Vec<(String, Vec<csv::StringRecord>)> {
    let mut out = Vec::new();
    for chunk in text.split("\n\n") {
        let (title, body) = chunk.split_once('\n').expect("a `# title` line");
        let title = title.strip_prefix("# ").expect("`# ` before the title");
        let rows: Vec<csv::StringRecord> = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(body.as_bytes())
            .records()
            .map(|r| r.expect("a CSV record"))
            .collect();
        out.push((title.to_string(), rows));
    }
    out
}

/// (testcase name, its failure message) for every `<testcase>` of the XML.
fn junit_cases(xml: &str) -> Vec<(String, Option<String>)> {
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut cases = Vec::new();
    let mut suites = 0;
    loop {
        match reader.read_event().expect("well-formed XML") {
            Event::Start(e) | Event::Empty(e) => {
                let attr = |name: &[u8]| {
                    e.attributes()
                        .map(|a| a.unwrap())
                        .find(|a| a.key.as_ref() == name)
                        .map(|a| String::from_utf8(a.value.to_vec()).unwrap())
                };
                match e.name().as_ref() {
                    b"testsuite" => suites += 1,
                    b"testcase" => cases.push((attr(b"name").unwrap(), None)),
                    b"failure" => {
                        cases.last_mut().expect("failure in a testcase").1 = attr(b"message")
                    }
                    _ => {}
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(suites, 1, "one suite per job: {xml}");
    cases
}

/// `logs -f`'s output has every rank's lines, each once, in order, as the
/// plain listing has them afterwards, to each stress worker's last line.
fn same_lines(c: &Cluster, id: &str, followed: &[u8]) {
    let all = stdout(c, &["logs", id]);
    let followed = String::from_utf8_lossy(followed).to_string();
    for r in 0..2 {
        let of = |text: &str| -> Vec<String> {
            let p = format!("[rank {r} ");
            text.lines()
                .filter(|l| l.starts_with(&p))
                .map(String::from)
                .collect()
        };
        assert_eq!(
            of(&followed),
            of(&all),
            "rank {r}'s lines, each once, in order"
        );
        let last = of(&all).pop().unwrap_or_default();
        assert!(last.contains("stress done"), "rank {r}'s last line: {all}");
    }
}

#[test]
fn report_as_csv_markdown_and_junit_and_the_listings_as_csv() {
    let c = Cluster::start(2, 1);
    let stress = ["stress", "--nodes", "2", "--duration", "3s"];
    let id = finish(&c, &stress);

    // CSV: the report's sections, one record per node and per rank.
    let csv = stdout(&c, &["report", &id, "-o", "csv"]);
    let sections = csv_sections(&csv);
    let titles: Vec<&str> = sections.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(&titles[..1], ["summary"], "{csv}");
    assert!(
        titles.contains(&"nodes") && titles.contains(&"ranks"),
        "{csv}"
    );
    for (title, rows) in &sections {
        match title.as_str() {
            "nodes" | "ranks" => {
                assert_eq!(rows.len(), 3, "header + 2 rows in {title}: {csv}");
                let verdict = rows[0].iter().position(|h| h == "VERDICT").unwrap();
                assert!(rows[1..].iter().all(|r| &r[verdict] == "pass"), "{csv}");
            }
            "summary" => assert!(rows.iter().any(|r| &r[0] == "JOB" && r[1] == *id), "{csv}"),
            _ => {}
        }
    }

    // Markdown: verdict first, then pipe tables.
    let md = stdout(&c, &["report", &id, "-o", "md"]);
    assert!(md.starts_with("**VERDICT PASS**"), "{md}");
    assert!(md.contains("\n| RANK | NODE |"), "{md}");
    assert!(md.contains("\n|---|"), "{md}");

    // JUnit: the job, each node, each rank; all pass.
    let xml = stdout(&c, &["report", &id, "-o", "junit"]);
    let cases = junit_cases(&xml);
    assert_eq!(cases.len(), 1 + 2 + 2, "{xml}");
    assert!(cases.iter().all(|(_, f)| f.is_none()), "{xml}");
    for i in 0..2 {
        let node = format!("node {}", Cluster::agent_name(i));
        assert!(cases.iter().any(|(n, _)| *n == node), "{node}: {xml}");
    }

    // The listings: jobs and nodes as CSV, fleet as Markdown.
    let jobs = stdout(&c, &["jobs", "-o", "csv"]);
    let rows: Vec<csv::StringRecord> = csv::Reader::from_reader(jobs.as_bytes())
        .records()
        .map(|r| r.unwrap())
        .collect();
    assert!(rows.iter().any(|r| r[0] == *id), "{jobs}");
    let nodes = stdout(&c, &["nodes", "-o", "csv"]);
    assert_eq!(
        csv::Reader::from_reader(nodes.as_bytes()).records().count(),
        2,
        "{nodes}"
    );
    let fleet = stdout(&c, &["fleet", "-o", "md"]);
    assert!(
        fleet.starts_with("| NODE | ACCEPTANCE | CERTIFICATE | LAST |"),
        "{fleet}"
    );
    // Not every verb has them: a usage error, before anything is sent.
    let bad = c.gpuctl(&["status", &id, "-o", "junit"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));

    // logs: a rank the job does not have is bad input, naming the job's ranks.
    let logs = c.gpuctl(&["logs", &id, "--rank", "99"]);
    assert_eq!(logs.status.code(), Some(2), "{}", stderr(&logs));
    assert!(stderr(&logs).contains("ranks 0-1"), "{}", stderr(&logs));
    let ok = c.gpuctl(&["logs", &id, "--rank", "1"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));

    // logs -f on a running job: returns when the job ends, having printed
    // every line once, as the plain listing has them afterwards.
    let running = c.submit(&stress);
    let followed = c.gpuctl(&["logs", &running, "-f"]);
    assert_eq!(followed.status.code(), Some(0), "{}", stderr(&followed));
    let state = c.job_state(&running);
    assert!(
        ["succeeded", "failed"].contains(&state.as_str()),
        "-f returned while the job was {state}"
    );
    same_lines(&c, &running, &followed.stdout);

    // A floor no CPU reaches fails every node: JUnit carries the reasons.
    let rules = unreachable_floor(c.dir.path(), &c.json(&["report", &id]));
    let mut args = stress.to_vec();
    args.extend(["--rules", rules.to_str().unwrap()]);
    let failed = finish(&c, &args);
    let out = c.gpuctl(&["report", &failed, "-o", "junit"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed verdict exits 1: {}",
        stderr(&out)
    );
    let xml = String::from_utf8(out.stdout).unwrap();
    let cases = junit_cases(&xml);
    for i in 0..2 {
        let node = format!("node {}", Cluster::agent_name(i));
        let (_, failure) = cases.iter().find(|(n, _)| *n == node).expect(&node);
        assert!(failure.is_some(), "{node} fails: {xml}");
    }
    assert!(
        xml.contains("stress_tflops") || xml.contains("out of reach"),
        "{xml}"
    );
}

#[test]
fn completions_name_the_verbs() {
    for shell in ["bash", "zsh", "fish"] {
        let out = gpuctl_at("http://127.0.0.1:1", &["completion", shell]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.contains("submit") && text.contains("report"),
            "{shell}: {text}"
        );
    }
}
