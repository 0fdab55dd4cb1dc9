//! `kvol pod logs NS/NAME [-c C] [--previous] [-f]`: a container's log as the runtime wrote it in kubelet's layout, found through the runner's status, without the CRI line prefixes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The pod, `namespace/name` (`name` alone: in `default`).
    pub pod: String,
    /// The container (needed when the pod has more than one).
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// The previous instance's log (the one before the last restart).
    #[arg(short = 'p', long)]
    pub previous: bool,
    /// Keep printing what the container writes until it stops.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// The agent's state directory (its `--state-dir`, or its `--root`).
    #[arg(long, visible_alias = "root", default_value = crate::components_common::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
}

pub fn run(args: &LogsArgs) -> anyhow::Result<ExitCode> {
    let key = if args.pod.contains('/') { args.pod.clone() } else { format!("default/{}", args.pod) };
    let (pod, container) = find(&args.state_dir, &key, args.container.as_deref())?;
    let restarts = container["restartCount"].as_u64().unwrap_or(0);
    let name = container["name"].as_str().unwrap_or_default();
    let attempt = match (args.previous, restarts) {
        (false, n) => n,
        (true, 0) => anyhow::bail!("previous terminated container \"{name}\" in pod \"{key}\" not found"),
        (true, n) => n - 1,
    };
    let file = log_file(&args.state_dir, &pod, name, attempt);
    let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    print!("{}", kvol_runner::cri_view::log_text(&text));
    if args.follow && !args.previous {
        follow(&file, text.len(), &args.state_dir, &key, name)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `<logs>/<ns>_<name>_<uid>/<container>/<attempt>.log`, kubelet's layout.
fn log_file(state_dir: &Path, pod: &Value, container: &str, attempt: u64) -> PathBuf {
    let key = pod["pod"].as_str().unwrap_or_default();
    let (namespace, pod_name) = key.split_once('/').unwrap_or(("default", key));
    let uid = pod["uid"].as_str().unwrap_or_default();
    logs_root(state_dir)
        .join(format!("{namespace}_{pod_name}_{uid}"))
        .join(container)
        .join(format!("{attempt}.log"))
}

/// What a container's `attempt`th run printed, its CRI line prefixes taken off (none when
/// there is no log).
pub fn container_log(state_dir: &Path, pod: &Value, container: &Value, attempt: u64) -> Option<String> {
    let name = container["name"].as_str()?;
    let text = std::fs::read_to_string(log_file(state_dir, pod, name, attempt)).ok()?;
    Some(kvol_runner::cri_view::log_text(&text))
}

/// The pod's status and the container's, from the runner's status file.
pub(crate) fn find(state_dir: &Path, key: &str, container: Option<&str>) -> anyhow::Result<(Value, Value)> {
    let file = state_dir.join("runner").join(kvol_runner::runner::STATUS_FILE);
    let text = std::fs::read(&file).with_context(|| {
        format!(
            "no runner status at {}: does the agent run with --container-runtime-endpoint?",
            file.display()
        )
    })?;
    let status: kvol_runner::runner::StatusFile = serde_json::from_slice(&text)?;
    let pod = status
        .pods
        .into_iter()
        .find(|p| p["pod"] == key)
        .with_context(|| format!("pod \"{key}\" not found"))?;
    let containers: Vec<Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
        .collect();
    let names: Vec<&str> = containers.iter().filter_map(|c| c["name"].as_str()).collect();
    let chosen = match container {
        Some(name) => containers.iter().find(|c| c["name"] == name),
        None if containers.len() == 1 => containers.first(),
        None => anyhow::bail!(
            "a container name must be specified for pod {key}, choose one of: [{}]",
            names.join(" ")
        ),
    };
    let chosen = chosen
        .cloned()
        .with_context(|| format!("container {} is not valid for pod {key}", container.unwrap_or_default()))?;
    Ok((pod, chosen))
}

/// `<state dir>/logs/pods` under `--root` (where the agent puts them then), else kubelet's.
fn logs_root(state_dir: &Path) -> PathBuf {
    let embedded = state_dir.join("logs/pods");
    if embedded.is_dir() { embedded } else { PathBuf::from("/var/log/pods") }
}

/// Prints what is appended to `file` from `offset` on, whole lines at a time, until the
/// container no longer runs.
fn follow(file: &Path, mut offset: usize, state_dir: &Path, key: &str, name: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let bytes = std::fs::read(file).unwrap_or_default();
        if let Some(end) = bytes.get(offset..).and_then(|rest| rest.iter().rposition(|b| *b == b'\n')) {
            let chunk = String::from_utf8_lossy(&bytes[offset..offset + end + 1]);
            write!(out, "{}", kvol_runner::cri_view::log_text(&chunk))?;
            out.flush()?;
            offset += end + 1;
        }
        let running = find(state_dir, key, Some(name)).map(|(_, c)| c["state"] == "running").unwrap_or(false);
        if !running {
            return Ok(());
        }
    }
}
