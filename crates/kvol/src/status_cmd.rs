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
            print!("{}", render_pods(pods.as_deref(), volumes_only(&args.state_dir, &report).as_deref()));
        }
        StatusFormat::Json => {
            let mut json = serde_json::to_value(&report)?;
            if let (Some(pods), Some(object)) = (pods, json.as_object_mut()) {
                object.insert("pods".into(), Value::Array(pods));
            } else if let (Some(why), Some(object)) =
                (volumes_only(&args.state_dir, &report), json.as_object_mut())
            {
                object.insert("volumesOnly".into(), Value::String(why));
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

/// Why this agent run has no runner though one was asked for (`embedded` where it cannot run).
fn volumes_only(state_dir: &Path, report: &StatusReport) -> Option<String> {
    let file = state_dir.join("runner").join(crate::runner_cmd::VOLUMES_ONLY_FILE);
    let modified = std::fs::metadata(&file).ok()?.modified().ok()?;
    let modified_ms = modified.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
    (modified_ms + 1000 >= report.started_unix_ms).then(|| std::fs::read_to_string(&file).ok()).flatten()
}

/// The pods' lines of the table and what each container printed (the last 20 lines of its
/// log): what a demo shows once it has settled.
pub fn pods_with_logs(state_dir: &Path, report: &StatusReport) -> String {
    let pods = runner_pods(state_dir, report);
    let mut out = render_pods(pods.as_deref(), volumes_only(state_dir, report).as_deref());
    for pod in pods.iter().flatten() {
        for container in ["initContainers", "containers"]
            .iter()
            .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
        {
            let restarts = container["restartCount"].as_u64().unwrap_or(0);
            let Some(text) = crate::pod_logs_cmd::container_log(state_dir, pod, &container, restarts) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "{} {} said:\n",
                pod["pod"].as_str().unwrap_or_default(),
                container["name"].as_str().unwrap_or_default()
            ));
            for line in &lines[lines.len().saturating_sub(20)..] {
                out.push_str(&format!("  | {line}\n"));
            }
        }
    }
    out
}

/// Each container's state (`pod/container` → its state and reason, and whether it is
/// somewhere a demo can stop waiting: started, ended, or waiting for a reason of its own or of
/// its pod's), when this agent run's runner has written its status.
pub fn pod_states(state_dir: &Path, report: &StatusReport) -> Option<Vec<(String, (String, bool))>> {
    let pods = runner_pods(state_dir, report)?;
    let mut states = Vec::new();
    for pod in &pods {
        let pod_waits = pod["message"].as_str().is_some_and(|m| !m.is_empty());
        for c in ["initContainers", "containers"]
            .iter()
            .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
        {
            let (state, reason) =
                (c["state"].as_str().unwrap_or_default(), c["reason"].as_str().unwrap_or_default());
            let starting =
                state == "waiting" && matches!(reason, "" | "ContainerCreating" | "PodInitializing");
            let key = format!(
                "{}/{}",
                pod["pod"].as_str().unwrap_or_default(),
                c["name"].as_str().unwrap_or_default()
            );
            states.push((key, (format!("{state} {reason}"), pod_waits || !starting)));
        }
    }
    Some(states)
}

/// The pods' lines of the table: one per pod, one per container beneath it.
fn render_pods(pods: Option<&[Value]>, volumes_only: Option<&str>) -> String {
    let Some(pods) = pods else {
        return match volumes_only {
            Some(why) => format!("pods: volumes only (the embedded container runtime cannot run here: {why})\n"),
            None => "pods: volumes only (no container runtime: start the agent with --container-runtime-endpoint)\n"
                .to_string(),
        };
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
        type Case<'a> = (&'a str, Option<&'a [Value]>, Option<&'a str>, &'a str);
        let cases: [Case; 3] = [
            (
                "pods",
                Some(&pods),
                None,
                "pods: 2\n  default/web Running ready\n    main running restarts=0\n  default/crash Running not ready\n    \
                 init setup terminated restarts=0 Completed\n    main waiting restarts=3 CrashLoopBackOff: back-off 20s \
                 restarting failed container=main\n",
            ),
            (
                "no runner",
                None,
                None,
                "pods: volumes only (no container runtime: start the agent with --container-runtime-endpoint)\n",
            ),
            (
                "embedded asked for, not possible",
                None,
                Some("runc is not on PATH"),
                "pods: volumes only (the embedded container runtime cannot run here: runc is not on PATH)\n",
            ),
        ];
        for (name, pods, why, want) in cases {
            assert_eq!(render_pods(pods, why), want, "{name}");
        }
    }
}
