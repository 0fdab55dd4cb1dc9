//! `kvol pod`: the runtime API (`kvol.runtime.v1alpha1`) from a shell — wait for a pod's volumes or their teardown, a container's mounts as CRI or OCI entries, hand a pod over and take it back, watch.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use kvol_runtime_api::proto::{
    AdmitPodRequest, ContainerMountsRequest, MountPropagation, PodVolumeStatus, ReleasePodRequest,
    WaitRequest, WatchRequest,
};
use serde_json::{Value, json};

#[derive(Debug, clap::Subcommand)]
pub enum PodCommand {
    /// Wait until every volume of the pod is published (exit 0), or say which are not and why
    /// when the timeout passes (exit 1); with --gone, until none is left on the node. An agent
    /// still starting is waited for within the same timeout.
    Wait(WaitArgs),
    /// A container's mounts and devices, as the runtime gets them (subPaths bound on the way).
    Mounts(MountsArgs),
    /// Hand kvol a pod this runner owns (a v1 Pod, YAML or JSON; `-` reads stdin); prints its uid.
    Admit(AdmitArgs),
    /// Take a handed-over pod back: its volumes are torn down.
    Release(UidArgs),
    /// Print each change of the pod's volumes (every pod's without a uid) as a JSON line.
    Watch(WatchArgs),
    /// A container's log (pods run with `kvol agent --container-runtime-endpoint`).
    Logs(crate::pod_logs_cmd::LogsArgs),
    /// Run a command in a container and wait for it (CRI ExecSync: its output once it ends, no
    /// terminal or stdin); exits with its exit code.
    Exec(crate::pod_exec_cmd::ExecArgs),
}

#[derive(Debug, clap::Args)]
pub struct Socket {
    /// The agent's state directory (its `--state-dir`, or its `--root`); the socket is
    /// `<state-dir>/runtime.sock`.
    #[arg(long, visible_alias = "root", default_value = crate::components_common::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The socket itself, when it is elsewhere.
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

impl Socket {
    fn path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| self.state_dir.join(kvol_runtime_api::SOCKET_NAME))
    }
}

#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    pub uid: String,
    /// Seconds to wait at most.
    #[arg(long, default_value_t = 60)]
    pub timeout: u32,
    /// Wait for the teardown instead.
    #[arg(long)]
    pub gone: bool,
    #[command(flatten)]
    pub socket: Socket,
}

/// How `kvol pod mounts` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MountsFormat {
    /// CRI v1 Mount and Device messages as JSON.
    Cri,
    /// Entries of an OCI runtime's config.json: `mounts`, `linux.devices`, `linux.resources.devices`.
    Oci,
}

#[derive(Debug, clap::Args)]
pub struct MountsArgs {
    pub uid: String,
    pub container: String,
    #[arg(long, value_enum, default_value = "cri")]
    pub format: MountsFormat,
    #[command(flatten)]
    pub socket: Socket,
}

#[derive(Debug, clap::Args)]
pub struct AdmitArgs {
    pub file: PathBuf,
    #[command(flatten)]
    pub socket: Socket,
}

#[derive(Debug, clap::Args)]
pub struct UidArgs {
    pub uid: String,
    #[command(flatten)]
    pub socket: Socket,
}

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    pub uid: Option<String>,
    #[command(flatten)]
    pub socket: Socket,
}

pub fn run(command: &PodCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        match command {
            PodCommand::Wait(args) => wait(args).await,
            PodCommand::Mounts(args) => mounts(args).await,
            PodCommand::Admit(args) => admit(args).await,
            PodCommand::Release(args) => {
                let mut client = kvol_runtime_api::connect(&args.socket.path()).await?;
                client.release_pod(ReleasePodRequest { pod_uid: args.uid.clone() }).await.map_err(status)?;
                println!("released {}", args.uid);
                Ok(ExitCode::SUCCESS)
            }
            PodCommand::Watch(args) => watch(args).await,
            PodCommand::Logs(args) => crate::pod_logs_cmd::run(args),
            PodCommand::Exec(args) => crate::pod_exec_cmd::run(args).await,
        }
    })
}

fn status(s: kvol_runtime_api::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}

fn volumes_json(s: &PodVolumeStatus) -> Value {
    let volumes: Vec<Value> = s
        .volumes
        .iter()
        .map(|v| json!({"name": v.name, "phase": v.phase, "plugin": v.plugin, "reason": v.reason, "hostPath": v.host_path}))
        .collect();
    json!({"podUid": s.pod_uid, "pod": s.pod, "ready": s.ready, "message": s.message, "volumes": volumes})
}

/// Waits for the pod within `--timeout`, the agent's socket included: a wait started beside an
/// agent that is still starting (a unit, a script) waits for it, and says so once.
async fn wait(args: &WaitArgs) -> anyhow::Result<ExitCode> {
    let socket = args.socket.path();
    let deadline = std::time::Instant::now() + Duration::from_secs(args.timeout.into());
    let waiting = || eprintln!("waiting for the kvol agent's runtime api at {}", socket.display());
    let mut client =
        kvol_runtime_api::connect_within(&socket, Duration::from_secs(args.timeout.into()), waiting).await?;
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    let timeout_ms = u32::try_from(left.as_millis()).unwrap_or(u32::MAX);
    let request = WaitRequest { pod_uid: args.uid.clone(), timeout_ms };
    let answer = if args.gone {
        client.wait_for_volumes_gone(request).await
    } else {
        client.wait_for_volumes(request).await
    }
    .map_err(status)?
    .into_inner();
    println!("{}", serde_json::to_string_pretty(&volumes_json(&answer))?);
    if !answer.ready {
        eprintln!("{}", answer.message);
    }
    Ok(if answer.ready { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn mounts(args: &MountsArgs) -> anyhow::Result<ExitCode> {
    let mut client = kvol_runtime_api::connect(&args.socket.path()).await?;
    let request = ContainerMountsRequest { pod_uid: args.uid.clone(), container: args.container.clone() };
    let answer = client.container_mounts(request).await.map_err(status)?.into_inner();
    let out = match args.format {
        MountsFormat::Cri => {
            let mounts: Vec<Value> = answer
                .mounts
                .iter()
                .map(|m| {
                    let propagation = MountPropagation::try_from(m.propagation)
                        .unwrap_or(MountPropagation::PropagationPrivate)
                        .as_str_name();
                    json!({"container_path": m.container_path, "host_path": m.host_path, "readonly": m.readonly,
                           "selinux_relabel": m.selinux_relabel, "propagation": propagation})
                })
                .collect();
            let devices: Vec<Value> = answer
                .devices
                .iter()
                .map(|d| json!({"container_path": d.container_path, "host_path": d.host_path, "permissions": d.permissions}))
                .collect();
            json!({"mounts": mounts, "devices": devices})
        }
        MountsFormat::Oci => {
            let mounts: Vec<Value> = answer.mounts.iter().map(kvol_runtime_api::oci::mount).collect();
            let (mut devices, mut rules) = (Vec::new(), Vec::new());
            for d in &answer.devices {
                let meta = std::fs::metadata(&d.host_path)
                    .with_context(|| format!("cannot inspect device {}", d.host_path))?;
                let kind = if meta.file_type().is_block_device() { 'b' } else { 'c' };
                let rdev = meta.rdev();
                let (major, minor) = (rustix::fs::major(rdev) as u64, rustix::fs::minor(rdev) as u64);
                devices.push(kvol_runtime_api::oci::device(d, kind, major, minor));
                rules.push(kvol_runtime_api::oci::device_rule(d, kind, major, minor));
            }
            json!({"mounts": mounts, "linux": {"devices": devices, "resources": {"devices": rules}}})
        }
    };
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

async fn admit(args: &AdmitArgs) -> anyhow::Result<ExitCode> {
    let text = if args.file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?
    };
    let mut client = kvol_runtime_api::connect(&args.socket.path()).await?;
    let answer = client.admit_pod(AdmitPodRequest { pod_json: text.into_bytes() }).await.map_err(status)?;
    println!("{}", answer.into_inner().pod_uid);
    Ok(ExitCode::SUCCESS)
}

async fn watch(args: &WatchArgs) -> anyhow::Result<ExitCode> {
    let mut client = kvol_runtime_api::connect(&args.socket.path()).await?;
    let request = WatchRequest { pod_uid: args.uid.clone().unwrap_or_default() };
    let mut stream = client.watch_volumes(request).await.map_err(status)?.into_inner();
    while let Some(change) = stream.message().await.map_err(status)? {
        println!("{}", serde_json::to_string(&volumes_json(&change))?);
    }
    Ok(ExitCode::SUCCESS)
}
