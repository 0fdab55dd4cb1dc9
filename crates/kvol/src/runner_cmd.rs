//! `kvol agent --container-runtime-endpoint`: the pod runner (`kvol-runner`) beside the agent, fed the agent's objects and reaching volumes through the agent's runtime API socket.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;
use kvol_api::ObjectSet;
use kvol_api::projection::NodeResources;
use kvol_node::AgentConfig;
use kvol_runner::{Runner, RunnerConfig};
use tokio::sync::watch;

/// The runner, set up before the agent starts; [`RunnerSetup::start`] runs it.
#[derive(Debug)]
pub struct RunnerSetup {
    config: RunnerConfig,
    objects: watch::Receiver<Arc<ObjectSet>>,
    taints: watch::Sender<Vec<Taint>>,
}

/// Sets `config` up to feed a runner on the CRI `endpoint`: the agent's objects tapped, the
/// runner's files in `<state dir>/runner`, pods' logs in `/var/log/pods` (or
/// `<root>/logs/pods` under `--root`).
pub fn prepare(
    endpoint: &str,
    embedded: bool,
    (max_pods, allocatable): (u32, NodeResources),
    config: &mut AgentConfig,
) -> anyhow::Result<RunnerSetup> {
    let Some(socket) = config.runtime_socket.clone() else {
        anyhow::bail!("--container-runtime-endpoint needs the runtime api (drop --no-runtime-api)");
    };
    let _ = std::fs::remove_file(config.state_dir.join("runner").join(VOLUMES_ONLY_FILE));
    let (tap, objects) = watch::channel(Arc::new(ObjectSet::default()));
    config.objects_tap = Some(tap);
    let (taints, node_taints) = watch::channel(Vec::new());
    let log_root = if embedded { config.state_dir.join("logs/pods") } else { PathBuf::from("/var/log/pods") };
    let runner = RunnerConfig {
        endpoint: endpoint.to_string(),
        runtime_socket: socket,
        state_dir: config.state_dir.join("runner"),
        log_root,
        node_name: config.node_name.clone(),
        host_ip: crate::node_facts::host_ip(),
        resolv_conf: PathBuf::from("/etc/resolv.conf"),
        node: allocatable,
        node_labels: kvol_cluster::node_registration::well_known_labels(
            &config.node_name,
            crate::node_facts::go_arch(std::env::consts::ARCH),
        ),
        max_pods,
        node_taints,
        poll: Duration::from_secs(1),
    };
    Ok(RunnerSetup { config: runner, objects, taints })
}

/// A running runner: the sender stops it; its pods' API status reports, and the node's taints
/// it admits pods by, for cluster mode.
#[derive(Debug)]
pub struct StartedRunner {
    pub stop: watch::Sender<bool>,
    pub reports: Option<tokio::sync::mpsc::UnboundedReceiver<kvol_api::pod::PodReport>>,
    pub taints: watch::Sender<Vec<Taint>>,
}

/// The file that says why this agent runs no pods though a runtime was asked for.
pub const VOLUMES_ONLY_FILE: &str = "volumes-only";

/// Records why the agent stays volumes-only (`kvol status` says it); a runner started later
/// clears it.
pub fn record_volumes_only(state_dir: &std::path::Path, why: &str) {
    let dir = state_dir.join("runner");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(VOLUMES_ONLY_FILE), why);
}

impl RunnerSetup {
    /// The runner's own directory (its `pods.json`).
    pub fn runner_dir(&self) -> PathBuf {
        self.config.state_dir.clone()
    }

    /// Where the pods' log directories go.
    pub fn log_root(&self) -> PathBuf {
        self.config.log_root.clone()
    }

    /// Starts the runner (inside the agent's tokio runtime); the sender stops it (containers
    /// are left running, for the next agent to adopt).
    pub fn start(self) -> anyhow::Result<StartedRunner> {
        let runner = Runner::new(self.config)?;
        let reports = runner.reports();
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(runner.run(self.objects, stop_rx));
        Ok(StartedRunner { stop: stop_tx, reports: Some(reports), taints: self.taints })
    }
}
