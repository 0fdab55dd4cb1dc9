//! `kvol status`: what the node agent last reported, from `<state-dir>/status.json`, as a table or JSON; with `--container-runtime-endpoint`, the pods the runner runs too (`<state-dir>/runner/pods.json`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use kvol_node::report::status::{StatusReport, read_status, render_table};
use serde_json::Value;

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
    let pods = runner_pods(&args.state_dir, &report);
    match args.output {
        StatusFormat::Table => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
            print!("{}", render_table(&report, now));
            print!("{}", render_pods(pods.as_deref()));
        }
        StatusFormat::Json => {
            let mut json = serde_json::to_value(&report)?;
            if let (Some(pods), Some(object)) = (pods, json.as_object_mut()) {
                object.insert("pods".into(), Value::Array(pods));
            }
            println!("{}", serde_json::to_string_pretty(&json)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The runner's pods, when this agent run has a runner (its file written since the agent
/// started; an older one is a previous run's).
fn runner_pods(state_dir: &Path, report: &StatusReport) -> Option<Vec<Value>> {
    let file = state_dir.join("runner").join(kvol_runner::runner::STATUS_FILE);
    let modified = std::fs::metadata(&file).ok()?.modified().ok()?;
    let modified_ms = modified.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
    if modified_ms + 1000 < report.started_unix_ms {
        return None;
    }
    let status: kvol_runner::runner::StatusFile = serde_json::from_slice(&std::fs::read(&file).ok()?).ok()?;
    Some(status.pods)
}

/// The pods' lines of the table: one per pod, one per container beneath it.
fn render_pods(pods: Option<&[Value]>) -> String {
    let Some(pods) = pods else {
        return "pods: volumes only (no container runtime: start the agent with --container-runtime-endpoint)\n"
            .to_string();
    };
    let mut out = format!("pods: {}\n", pods.len());
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    for pod in pods {
        let ready = if pod["ready"] == true { "ready" } else { "not ready" };
        out.push_str(&format!("  {} {} {ready}", text(&pod["pod"]), text(&pod["phase"])));
        if let Some(message) = pod["message"].as_str() {
            out.push_str(&format!(": {message}"));
        }
        out.push('\n');
        let containers = pod["initContainers"].as_array().into_iter().flatten().map(|c| ("init ", c));
        for (kind, c) in containers.chain(pod["containers"].as_array().into_iter().flatten().map(|c| ("", c)))
        {
            out.push_str(&format!(
                "    {kind}{} {} restarts={}",
                text(&c["name"]),
                text(&c["state"]),
                c["restartCount"].as_u64().unwrap_or(0)
            ));
            if let Some(reason) = c["reason"].as_str() {
                out.push_str(&format!(" {reason}"));
            }
            if let Some(message) = c["message"].as_str() {
                out.push_str(&format!(": {message}"));
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pods_in_the_table() {
        let pods = vec![
            json!({"pod": "default/web", "uid": "u", "phase": "Running", "ready": true,
                "containers": [{"name": "main", "state": "running", "restartCount": 0, "ready": true}]}),
            json!({"pod": "default/crash", "uid": "v", "phase": "Running", "ready": false,
                "initContainers": [{"name": "setup", "state": "terminated", "reason": "Completed", "restartCount": 0}],
                "containers": [{"name": "main", "state": "waiting", "reason": "CrashLoopBackOff",
                    "message": "back-off 20s restarting failed container=main", "restartCount": 3}]}),
        ];
        // (case, pods, expected)
        let cases: [(&str, Option<&[Value]>, &str); 2] = [
            (
                "pods",
                Some(&pods),
                "pods: 2\n  default/web Running ready\n    main running restarts=0\n  default/crash Running not ready\n    \
                 init setup terminated restarts=0 Completed\n    main waiting restarts=3 CrashLoopBackOff: back-off 20s \
                 restarting failed container=main\n",
            ),
            (
                "no runner",
                None,
                "pods: volumes only (no container runtime: start the agent with --container-runtime-endpoint)\n",
            ),
        ];
        for (name, pods, want) in cases {
            assert_eq!(render_pods(pods), want, "{name}");
        }
    }
}
