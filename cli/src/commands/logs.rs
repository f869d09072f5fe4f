//! `gpuctl logs JOB [--rank N] [--tail N]`: worker output stored by the
//! coordinator, prefixed with the rank when more than one rank is shown.

use anyhow::Result;

use crate::args::OutputFormat;
use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output;

pub async fn run(
    c: &mut Coordinator,
    id: &str,
    rank: Option<u32>,
    tail: Option<u32>,
    out: OutputFormat,
) -> Result<Exit> {
    let lines = c.logs(id, rank, tail.unwrap_or(0)).await?;
    match out {
        OutputFormat::Json => output::print_json(&serde_json::Value::Array(
            lines.iter().map(output::json::log_line).collect(),
        )),
        OutputFormat::Table => {
            let mut text = String::new();
            for l in &lines {
                if rank.is_some() {
                    text.push_str(&l.line);
                } else {
                    // Like `docker compose logs`: who said it, then what.
                    text.push_str(&format!("[rank {} {}] {}", l.rank, l.node, l.line));
                }
                text.push('\n');
            }
            output::print_text(&text);
            if lines.is_empty() {
                eprintln!(
                    "no log lines for {id}{}",
                    rank.map(|r| format!(" rank {r}")).unwrap_or_default()
                );
            }
        }
    }
    Ok(Exit::Ok)
}
