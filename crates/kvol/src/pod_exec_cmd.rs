//! `kvol pod exec NS/NAME [-c C] -- CMD…`: a command run in a running container through the runtime's ExecSync, found through the runner's status; its output printed, its exit code kvol's.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// The pod, `namespace/name` (`name` alone: in `default`).
    pub pod: String,
    /// The container (needed when the pod has more than one).
    #[arg(short = 'c', long)]
    pub container: Option<String>,
    /// Give up on the command after this long (0: wait as long as it runs).
    #[arg(long, default_value = "0", value_name = "SECONDS")]
    pub timeout: i64,
    /// The agent's state directory (its `--state-dir`, or its `--root`).
    #[arg(long, visible_alias = "root", default_value = crate::components_common::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub async fn run(args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let key = if args.pod.contains('/') { args.pod.clone() } else { format!("default/{}", args.pod) };
    let (_, container) = crate::pod_logs_cmd::find(&args.state_dir, &key, args.container.as_deref())?;
    let name = container["name"].as_str().unwrap_or_default();
    if container["state"] != "running" {
        bail!("container {name} of pod {key} is not running (it is {})", container["state"]);
    }
    let id = container["containerId"].as_str().unwrap_or_default().to_string();
    let file = args.state_dir.join("runner").join(kvol_runner::runner::STATUS_FILE);
    let status: kvol_runner::runner::StatusFile = serde_json::from_slice(&std::fs::read(&file)?)?;
    if status.endpoint.is_empty() {
        bail!(
            "{} names no container runtime endpoint: is the agent older than kvol pod exec?",
            file.display()
        );
    }
    let cri = kvol_cri::CriClient::new(&status.endpoint, Default::default())
        .with_context(|| format!("cannot reach the container runtime at {}", status.endpoint))?;
    let request =
        kvol_cri::ExecSyncRequest { container_id: id, cmd: args.command.clone(), timeout: args.timeout };
    let answer = cri
        .exec_sync(request)
        .await
        .map_err(|e| anyhow::anyhow!("exec in container {name} of pod {key}: {}", e.runtime_message()))?;
    std::io::stdout().write_all(&answer.stdout)?;
    std::io::stderr().write_all(&answer.stderr)?;
    Ok(ExitCode::from(u8::try_from(answer.exit_code).unwrap_or(1)))
}
