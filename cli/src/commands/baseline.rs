//! `gpuctl baseline save|list|show|delete`: a finished job's figures kept
//! under a name, so that later jobs are judged against them
//! (`gpuctl submit ... --baseline NAME`).

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuctl_core::pb;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, table::Table, OutputFormat};

#[derive(Debug, Subcommand)]
pub enum BaselineCommand {
    /// Keep a finished job's figures (per device class) under NAME.
    Save(BaselineSaveArgs),
    /// List the saved baselines.
    List,
    /// Show one baseline's figures.
    Show(BaselineName),
    /// Delete a baseline (jobs judged against it keep their copy).
    Delete(BaselineName),
}

#[derive(Debug, Args)]
pub struct BaselineSaveArgs {
    /// The job whose figures to keep; it must have succeeded.
    pub job: String,
    /// Name to save it under: letters, digits, `-`, `_`, `.`.
    #[arg(long)]
    pub name: String,
    /// Overwrite a baseline of that name.
    #[arg(long)]
    pub replace: bool,
}

#[derive(Debug, Args)]
pub struct BaselineName {
    pub name: String,
}

pub async fn run(c: &mut Coordinator, cmd: BaselineCommand, out: OutputFormat) -> Result<Exit> {
    match cmd {
        BaselineCommand::Save(a) => {
            let b = c.save_baseline(&a.job, &a.name, a.replace).await?;
            match out {
                OutputFormat::Json => output::print_json(&output::json::baseline(&b)),
                _ => {
                    output::print_text(&format!(
                        "baseline `{}` saved from {}: {} figures\n",
                        b.name,
                        b.job_id,
                        b.figures.len()
                    ));
                    output::print_text(&figures_table(&b));
                }
            }
        }
        BaselineCommand::List => {
            let all = c.list_baselines().await?;
            match out {
                OutputFormat::Json => output::print_json(&serde_json::Value::Array(
                    all.iter().map(output::json::baseline).collect(),
                )),
                _ => output::print_text(&list_table(&all)),
            }
        }
        BaselineCommand::Show(a) => {
            let b = c.get_baseline(&a.name).await?;
            match out {
                OutputFormat::Json => output::print_json(&output::json::baseline(&b)),
                _ => output::print_text(&render(&b)),
            }
        }
        BaselineCommand::Delete(a) => {
            let b = c.delete_baseline(&a.name).await?;
            match out {
                OutputFormat::Json => output::print_json(&output::json::baseline(&b)),
                _ => output::print_text(&format!(
                    "baseline `{}` deleted; jobs judged against it keep their copy\n",
                    b.name
                )),
            }
        }
    }
    Ok(Exit::Ok)
}

fn list_table(all: &[pb::Baseline]) -> String {
    let mut t = Table::new(&[
        "NAME",
        "JOB",
        "WORKLOAD",
        "FIGURES",
        "DEVICE CLASSES",
        "SAVED",
    ])
    .right(&[3]);
    for b in all {
        let mut classes: Vec<&str> = b.figures.iter().map(|f| f.device_class.as_str()).collect();
        classes.sort();
        classes.dedup();
        t.row([
            b.name.clone(),
            b.job_id.clone(),
            b.workload.clone(),
            b.figures.len().to_string(),
            output::dash(&classes.join("; ")),
            output::age(b.created_unix_ms, gpuctl_core::now_ms()),
        ]);
    }
    t.render()
}

fn figures_table(b: &pb::Baseline) -> String {
    let mut t = Table::new(&["DEVICE CLASS", "METRIC", "KEY", "VALUE", "RANKS"]).right(&[3, 4]);
    for f in &b.figures {
        t.row([
            f.device_class.clone(),
            f.metric.clone(),
            f.key.clone(),
            format!("{:.3}", f.value),
            if f.ranks == 0 {
                "job".to_string()
            } else {
                f.ranks.to_string()
            },
        ]);
    }
    t.render()
}

fn render(b: &pb::Baseline) -> String {
    let mut s = output::table::key_values(&[
        ("NAME", b.name.clone()),
        ("FROM JOB", b.job_id.clone()),
        ("WORKLOAD", b.workload.clone()),
        (
            "SAVED",
            output::age(b.created_unix_ms, gpuctl_core::now_ms()),
        ),
    ]);
    s.push_str("\nFIGURES\n");
    s.push_str(&figures_table(b));
    s
}
