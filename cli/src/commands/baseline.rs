//! `gpuctl baseline save|list|show|delete`: a finished job's figures kept
//! under a name, so that later jobs are judged against them
//! (`gpuctl submit ... --baseline NAME`).

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuctl_core::clock::Clock;

use crate::client::Coordinator;
use crate::exit::Exit;
use crate::output::{self, OutputFormat};

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

pub async fn run(
    c: &mut Coordinator,
    cmd: BaselineCommand,
    out: OutputFormat,
    clock: &Clock,
) -> Result<Exit> {
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
                    output::print_text(&output::baseline::figures_table(&b));
                }
            }
        }
        BaselineCommand::List => {
            let all = c.list_baselines().await?;
            match out {
                OutputFormat::Json => output::print_json(&serde_json::Value::Array(
                    all.iter().map(output::json::baseline).collect(),
                )),
                _ => output::print_text(&output::baseline::list_table(&all, clock.now_ms())),
            }
        }
        BaselineCommand::Show(a) => {
            let b = c.get_baseline(&a.name).await?;
            match out {
                OutputFormat::Json => output::print_json(&output::json::baseline(&b)),
                _ => output::print_text(&output::baseline::render(&b, clock.now_ms())),
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
