//! How the agent runs: its directories, the node, the gates, the periods and deadlines, and the cluster's seams (none standalone).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvol_api::FeatureGates;
use kvol_plugin::NodePaths;

/// The bundled CSI driver's name.
pub const BUNDLED_DRIVER: &str = "hostpath.csi.kvol.io";

/// How the agent runs: [`AgentConfig::kubelet_layout`] takes kubelet's directories,
/// [`AgentConfig::embedded`] puts everything under one scratch root.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// kvol's own files: the journal (`state.redb`), `status.json`, the bundled driver's
    /// volumes (`csi-hostpath/`), provisioned records (`provisioned/`).
    pub state_dir: PathBuf,
    pub node_name: String,
    pub gates: FeatureGates,
    /// Pods and the objects their volumes need.
    pub manifests_dir: PathBuf,
    /// Kubelet's `--root-dir`: `pods/`, `plugins/` and `plugins_registry/` directly below it.
    pub root_dir: PathBuf,
    /// Kubelet's `--volume-plugin-dir`: the Flexvolume drivers.
    pub volume_plugin_dir: PathBuf,
    /// The storage components to run as supervised processes (standalone): the config's
    /// storage section decided against the component definitions. `None`: none run. Each
    /// meets the agent only through plugin registration, the bundled driver among them.
    pub components: Option<kvol_components_runtime::components::ComponentsSetup>,
    /// The longest back-off before a component process that keeps crashing is started again
    /// (from 500 ms, doubling; 30 s by default).
    pub component_restart_backoff_max: Duration,
    /// kvol's config file, watched while the agent runs: a valid change of its storage section
    /// is applied at once (components started and stopped); an invalid one keeps what runs
    /// and says why. Other sections apply at the next start.
    pub config_file: Option<PathBuf>,
    /// Install the example Flexvolume drivers into `volume_plugin_dir` at start.
    pub example_flex_drivers: bool,
    /// Serve Prometheus metrics here (`None`: no endpoint).
    pub metrics_address: Option<SocketAddr>,
    /// The node's allocatable (a container's unset limit in the downward API reads as it);
    /// `None`: its capacity, measured ([`crate::agent::measured_capacity`]).
    pub allocatable: Option<kvol_api::projection::NodeResources>,
    /// How often published volumes are checked against the mount table.
    pub resync: Duration,
    /// How often a volume whose CSI driver `requiresRepublish` is published again (kubelet
    /// does it on each pod sync, about once a minute).
    pub republish: Duration,
    /// How often the volumes of claims are measured for `kubelet_volume_stats_*` (kubelet's
    /// `--volume-stats-agg-period`, one minute); zero: never.
    pub volume_stats_period: Duration,
    /// The deadline of every call to a CSI driver (kubelet's `csiTimeout`, two minutes); a
    /// call cut short by it leaves its volume uncertain.
    pub csi_call_timeout: Duration,
    /// Where hostPath volumes may point (`--allowed-host-paths`); `None`: anywhere.
    pub allowed_host_paths: Option<Vec<PathBuf>>,
    /// Provision claims whose StorageClass names a driver on this node (standalone only: in a
    /// cluster the external provisioner does it).
    pub provision_claims: bool,
    /// Told the node's storage (CSINode, node-ID annotation, volumes in use) after every pass:
    /// the API writer in cluster mode; `None` in standalone mode.
    pub node_storage: Option<Arc<dyn crate::report::node_storage::NodeStorageSink>>,
    /// Cluster mode: the VolumeAttachments CSI plugins wait for instead of attaching
    /// themselves; `None` (standalone): node-driven attach.
    pub attachments: Option<Arc<dyn kvol_csi::AttachmentSource>>,
    /// Cluster mode: told the failing pod volumes after every pass, for the pods' Events.
    pub pod_events: Option<Arc<dyn crate::report::pod_events::PodEventSink>>,
    /// Cluster mode: told the claims whose filesystem the node grew, for their status.
    pub claim_status: Option<Arc<dyn crate::report::claim_status::ClaimStatusSink>>,
    /// Cluster mode: mints the service-account tokens CSIDrivers ask for (`tokenRequests`);
    /// `None` (standalone): a driver that asks for them cannot publish.
    pub tokens: Option<Arc<dyn kvol_csi::TokenSource>>,
    /// Serve the runtime API (`kvol.runtime.v1alpha1`) on this unix socket, owner-only
    /// (`<state dir>/runtime.sock` by default); `None`: no API.
    pub runtime_socket: Option<PathBuf>,
    /// Sent every object set the source gives (the first one too), for a pod runner beside
    /// the agent; `None`: nobody listens.
    pub objects_tap: Option<tokio::sync::watch::Sender<Arc<kvol_api::ObjectSet>>>,
}

impl AgentConfig {
    /// Kubelet's directories (`--root-dir`, `--volume-plugin-dir`) and kvol's own state
    /// directory; manifests in `<state dir>/manifests`; the bundled driver and example drivers on.
    pub fn kubelet_layout(
        root_dir: impl Into<PathBuf>,
        volume_plugin_dir: impl Into<PathBuf>,
        state_dir: impl Into<PathBuf>,
        node_name: impl Into<String>,
    ) -> AgentConfig {
        let state_dir = state_dir.into();
        AgentConfig {
            manifests_dir: state_dir.join("manifests"),
            root_dir: root_dir.into(),
            volume_plugin_dir: volume_plugin_dir.into(),
            node_name: node_name.into(),
            gates: FeatureGates::default(),
            components: None,
            component_restart_backoff_max: kvol_api::Backoff::default().max,
            config_file: None,
            example_flex_drivers: true,
            metrics_address: None,
            allocatable: None,
            resync: Duration::from_secs(10),
            republish: Duration::from_secs(60),
            volume_stats_period: Duration::from_secs(60),
            csi_call_timeout: kvol_csi::client::DEFAULT_CALL_TIMEOUT,
            allowed_host_paths: None,
            provision_claims: true,
            node_storage: None,
            attachments: None,
            pod_events: None,
            claim_status: None,
            tokens: None,
            runtime_socket: Some(state_dir.join(kvol_runtime_api::SOCKET_NAME)),
            objects_tap: None,
            state_dir,
        }
    }

    /// Everything under one scratch `root` (`kvol agent --root`): kvol's state in `root`,
    /// kubelet's tree in `root/kubelet`, Flexvolume drivers in `root/flexvolume`.
    pub fn embedded(root: impl Into<PathBuf>, node_name: impl Into<String>) -> AgentConfig {
        let root = root.into();
        AgentConfig::kubelet_layout(root.join("kubelet"), root.join("flexvolume"), root, node_name)
    }

    /// `<root dir>/plugins_registry`: where CSI drivers register (kubelet's plugin watcher).
    pub fn registration_dir(&self) -> PathBuf {
        NodePaths::new(&self.root_dir).registration_dir()
    }
}

/// Where the bundled driver keeps its volumes: for tests and the benchmark.
pub fn bundled_volume_dir(config: &AgentConfig, volume_id: &str) -> PathBuf {
    config.state_dir.join("csi-hostpath").join("volumes").join(volume_id)
}
