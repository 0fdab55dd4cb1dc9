//! `kvol status`: what the node agent last reported, from `<root>/status.json`, as a table or JSON.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use kvol_node::status::{read_status, render_table};

/// Output format of `kvol status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent's root directory (its `--root`); the status is `<root>/status.json`.
    #[arg(long, default_value = "/var/lib/kvol")]
    pub root: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: StatusFormat,
}

/// Prints the report; an error (exit 1) when there is none or it cannot be read.
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let report = read_status(&args.root).map_err(anyhow::Error::msg)?;
    match args.output {
        StatusFormat::Table => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            print!("{}", render_table(&report, now));
        }
        StatusFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}
