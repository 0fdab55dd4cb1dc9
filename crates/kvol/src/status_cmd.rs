//! `kvol status`: what the node agent last reported, from `<state-dir>/status.json`, as a table or JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use kvol_node::report::status::{read_status, render_table};

/// Output format of `kvol status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent's state directory (its `--state-dir`, or its `--root`); the status is
    /// `<state-dir>/status.json`.
    #[arg(long, visible_alias = "root", default_value = crate::components_common::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: StatusFormat,
}

/// Prints the report; an error (exit 1) when there is none or it cannot be read.
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let report = read_status(&args.state_dir).map_err(anyhow::Error::msg)?;
    match args.output {
        StatusFormat::Table => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            print!("{}", render_table(&report, now));
        }
        StatusFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}
