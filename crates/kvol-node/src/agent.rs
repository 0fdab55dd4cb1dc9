//! The agent: wires sources, plugins (compiled-in, Flexvolume, CSI), the journal, the reconciler and the executor into kvol's main loop.
//!
//! Start-up: open the journal, stop the Flexvolume driver calls a dead predecessor left
//! running, rebuild the actual state from the journal, the mount table and the pod volume
//! directories (clearing empty orphans); register the compiled-in plugins; install the example
//! Flexvolume drivers and start the prober; start the CSI registration watcher and (by default) the
//! bundled CSI driver; watch the manifests directory. Then loop: desired state from the
//! objects, a resolution per volume, a plan, operations submitted; again whenever the objects
//! change, an operation ends, a retry falls due or the resync timer fires. SIGTERM stops the
//! loop and lets running operations finish; nothing is unmounted (volumes outlive the agent).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use crate::components::{ComponentConfigWatch, Components, ConfigWatch};
use crate::supervisor::{ProcessSpec, SupervisorSettings};
use k8s_openapi::api::core::v1::Secret;
use kvol_api::FeatureGates;
use kvol_csi::registration::{RegistrationWatcher, WatcherConfig};
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, NodeObjects, Timeouts};
use kvol_flex::prober::{FlexProber, ProberConfig};
use kvol_plugin::migration::{NodeMigration, NodeStatus, resolve};
use kvol_plugin::{
    Mounter, NodeInfo, NodePaths, PluginHost, PluginRegistry, SecretStore, Snapshot, SystemMounter,
};
use tokio::sync::Notify;

use crate::desired::desired_state;
use crate::executor::{ExecSnapshot, Executor};
use crate::metrics::Metrics;
use crate::model::{DesiredState, DesiredVolume, ObjectSet, unique_volume_name};
use crate::reconciler::{Resolution, Resolutions, plan, republish};
use crate::source::{ManifestsSource, ObjectSource};
use crate::status::{NodeVolumeStatus, Phase, StatusReport, VolumeStatus, write_status};
use crate::store::Store;

/// The bundled CSI driver's name.
pub const BUNDLED_DRIVER: &str = "hostpath.csi.kvol.io";

/// The example Flexvolume drivers the embedded default installs: directory name and script.
const EXAMPLE_FLEX_DRIVERS: [(&str, &[u8]); 2] = [
    ("kvol~tmpfs", include_bytes!("../../../examples/flexvolume/kvol~tmpfs/tmpfs")),
    ("kvol~loop", include_bytes!("../../../examples/flexvolume/kvol~loop/loop")),
];

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
    pub components: Option<crate::components::ComponentsSetup>,
    /// kvol's config file, watched while the agent runs: a valid change of its storage section
    /// is applied at once (components started and stopped); an invalid one keeps what runs
    /// and says why. Other sections apply at the next start.
    pub config_file: Option<PathBuf>,
    /// Install the example Flexvolume drivers into `volume_plugin_dir` at start.
    pub example_flex_drivers: bool,
    /// Serve Prometheus metrics here (`None`: no endpoint).
    pub metrics_address: Option<SocketAddr>,
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
    pub node_storage: Option<Arc<dyn crate::node_storage::NodeStorageSink>>,
    /// Cluster mode: the VolumeAttachments CSI plugins wait for instead of attaching
    /// themselves; `None` (standalone): node-driven attach.
    pub attachments: Option<Arc<dyn kvol_csi::AttachmentSource>>,
    /// Cluster mode: told the failing pod volumes after every pass, for the pods' Events.
    pub pod_events: Option<Arc<dyn crate::pod_events::PodEventSink>>,
    /// Cluster mode: mints the service-account tokens CSIDrivers ask for (`tokenRequests`);
    /// `None` (standalone): a driver that asks for them cannot publish.
    pub tokens: Option<Arc<dyn kvol_csi::TokenSource>>,
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
            state_dir,
            node_name: node_name.into(),
            gates: FeatureGates::default(),
            components: None,
            config_file: None,
            example_flex_drivers: true,
            metrics_address: None,
            resync: Duration::from_secs(10),
            republish: Duration::from_secs(60),
            volume_stats_period: Duration::from_secs(60),
            csi_call_timeout: kvol_csi::client::DEFAULT_CALL_TIMEOUT,
            allowed_host_paths: None,
            provision_claims: true,
            node_storage: None,
            attachments: None,
            pod_events: None,
            tokens: None,
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

/// Secrets as the current objects hold them, for plugins.
#[derive(Default)]
struct ObjectSecrets(RwLock<BTreeMap<String, Secret>>);

impl std::fmt::Debug for ObjectSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets = self.0.read().unwrap_or_else(|e| e.into_inner());
        f.debug_tuple("ObjectSecrets").field(&kvol_plugin::host::RedactedSecrets(&secrets)).finish()
    }
}

impl SecretStore for ObjectSecrets {
    fn get(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).get(&format!("{namespace}/{name}")).cloned()
    }
}

/// How long start-up waits for the store's lock, which a process the previous agent started
/// can hold for a moment after that agent was killed (a child between fork and exec).
const STORE_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Opens the journal store, waiting a little for a lock a dying predecessor's child still holds.
async fn open_store(path: &std::path::Path) -> Result<Store, String> {
    let deadline = Instant::now() + STORE_LOCK_WAIT;
    loop {
        match Store::open(path) {
            Err(crate::store::StoreError::InUse { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other.map_err(|e| e.to_string()),
        }
    }
}

/// How long start-up waits for the Flexvolume drivers on disk to load before the first plan.
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(15);

/// Runs the agent on its manifests directory until `shutdown` completes.
pub async fn run_agent(
    config: AgentConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    run(config, None, shutdown).await
}

/// Runs the agent on the objects `source` gives (`config.manifests_dir` is not read) until
/// `shutdown` completes: the seam a cluster source, or code embedding kvol, plugs into.
pub async fn run_agent_with_source(
    config: AgentConfig,
    source: Box<dyn ObjectSource>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    run(config, Some(source), shutdown).await
}

async fn run(
    config: AgentConfig,
    source: Option<Box<dyn ObjectSource>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    let started = SystemTime::now();
    let registration_dir = config.registration_dir();
    for dir in [&config.state_dir, &config.root_dir, &config.volume_plugin_dir, &registration_dir] {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // The mount table holds resolved paths: keep one spelling of every path under the root.
    let mut config = config;
    for dir in [&mut config.state_dir, &mut config.root_dir, &mut config.volume_plugin_dir] {
        *dir = std::fs::canonicalize(&*dir).map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    }
    let mounter: Arc<dyn Mounter> = Arc::new(SystemMounter);
    let secrets = Arc::new(ObjectSecrets::default());
    let host = PluginHost::new(
        NodePaths::new(&config.root_dir),
        NodeInfo::named(&config.node_name),
        Arc::clone(&mounter),
    )
    .with_secrets(secrets.clone())
    .with_allowed_host_paths(config.allowed_host_paths.clone());

    // The journal, and the actual state rebuilt from it and the node.
    let store_path = config.state_dir.join("state.redb");
    let store = Arc::new(open_store(&store_path).await?);
    let loaded = store.load().map_err(|e| e.to_string())?;
    // Driver calls the previous agent left running are stopped first, so the mount table read
    // next is final and no call of the old agent races one of this agent on a volume.
    let leftovers = kvol_flex::leftovers::find(&config.volume_plugin_dir);
    for call in &leftovers {
        tracing::warn!(pid = call.pid, command = %call.command_line, "killing a flexvolume driver call the previous agent left running");
    }
    for call in kvol_flex::leftovers::stop(&leftovers, Duration::from_secs(5)) {
        tracing::warn!(pid = call.pid, command = %call.command_line, "a leftover flexvolume driver call is still there after SIGKILL");
    }
    let seen = crate::rebuild::observe(&host.paths, mounter.as_ref()).map_err(|e| e.to_string())?;
    let rebuilt = crate::rebuild::rebuild(&loaded.actual, &loaded.incomplete, &seen);
    for note in &rebuilt.notes {
        tracing::info!(%note, "rebuilt state");
    }
    // Plugins.
    let (compiled, _) = kvol_plugin::catalog::compiled_in(&host, &config.gates);
    let registry = Arc::new(PluginRegistry::new(compiled).map_err(|e| e.to_string())?);
    let metrics = Metrics::new();
    if config.example_flex_drivers {
        install_example_flex_drivers(&config)?;
    }
    let prober =
        FlexProber::start(ProberConfig::new(&config.volume_plugin_dir), host.clone(), Arc::clone(&registry))
            .map_err(|e| e.to_string())?;
    // The drivers already on disk load before the first plan, so the first plan does not see
    // their volumes as unresolved. Bounded: a driver's `init` has its own deadline.
    let mut flex_progress = prober.progress();
    let first_probe = flex_progress.wait_for(|p| p.rescans >= 1 && !p.busy);
    if tokio::time::timeout(FIRST_PROBE_WAIT, first_probe).await.is_err() {
        tracing::warn!(dir = %config.volume_plugin_dir.display(), waited_s = FIRST_PROBE_WAIT.as_secs(), "flexvolume drivers still loading; starting without them");
    }
    // Reconstruction, once the plugins on disk are known: what the node has and no record
    // accounts for becomes an uncertain record, torn down (or published again) through its
    // plugin; what no plugin can be named for is cleared when empty, else reported.
    let (actual, orphans_left) = reconstruct_at_start(&rebuilt, &seen, &registry);
    store.replace_actual(&actual).map_err(|e| e.to_string())?;
    tracing::info!(
        published = actual.published.len(),
        staged = actual.staged.len(),
        attached = actual.attached.len(),
        interrupted = loaded.incomplete.len(),
        reconstructed = actual.published.values().filter(|p| p.uncertain).count(),
        "actual state rebuilt"
    );
    let objects = MemoryObjects::new();
    let handler = Arc::new(
        CsiRegistrationHandler::new(
            Arc::clone(&registry),
            Arc::new(objects.clone()),
            host.clone(),
            &config.gates,
            Timeouts::with_call(config.csi_call_timeout),
        )
        .with_observer(metrics.clone())
        .with_attachments(config.attachments.clone())
        .with_tokens(config.tokens.clone()),
    );
    let watcher = RegistrationWatcher::start(WatcherConfig::new(config.registration_dir()), handler.clone())
        .map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut components = Components::new(SupervisorSettings::default());
    let mut running_setup = config.components.clone();
    let mut snapshots_on = false;
    if let Some(setup) = &running_setup {
        let (specs, snapshots) = planned_processes(setup)?;
        components.apply(specs).await;
        snapshots_on = snapshots;
    }
    let mut config_watch = match (&running_setup, &config.config_file) {
        (Some(_), Some(path)) => Some(ConfigWatch::start(path).map_err(|e| e.to_string())?),
        _ => None,
    };
    let mut component_config_watch = running_setup.as_ref().and_then(|setup| {
        let dir = &setup.paths.config_dir;
        match ComponentConfigWatch::start(dir) {
            Ok(watch) => Some(watch),
            Err(e) => {
                tracing::info!(dir = %dir.display(), error = %e, "components' config files not watched");
                None
            }
        }
    });
    let metrics_address = match config.metrics_address {
        Some(address) => {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| format!("cannot listen for metrics on {address}: {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            let mut stop = stop_rx.clone();
            let m = metrics.clone();
            tokio::spawn(async move {
                let _ = crate::metrics::serve_metrics(listener, m, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            });
            tracing::info!(address = %bound, "serving metrics");
            Some(bound.to_string())
        }
        None => None,
    };

    let stats_volumes = (!config.volume_stats_period.is_zero()).then(|| {
        let (sender, receiver) = tokio::sync::watch::channel(Arc::new(Vec::new()));
        tokio::spawn(crate::volume_stats::run_collector(
            config.volume_stats_period,
            receiver,
            Arc::clone(&registry),
            metrics.clone(),
            stop_rx.clone(),
        ));
        sender
    });

    let source = match source {
        Some(source) => source,
        None => {
            let memory: Arc<dyn crate::source::ManifestMemory> = store.clone();
            let source = ManifestsSource::start_with_memory(config.manifests_dir.clone(), Some(memory));
            Box::new(source.map_err(|e| e.to_string())?)
        }
    };
    let mut objects_rx = source.subscribe();
    let wake = Arc::new(Notify::new());
    let executor = Executor::new(
        host.clone(),
        Arc::clone(&registry),
        Arc::clone(&store),
        metrics.clone(),
        actual,
        Arc::clone(&wake),
    );

    let provisioned_dir = config.state_dir.join("provisioned");
    let (records, problems) = crate::provision::load(&provisioned_dir);
    for problem in problems {
        tracing::warn!(%problem, "provisioned volumes");
    }
    let provisioned = Arc::new(std::sync::Mutex::new(Provisioned { records, version: 0 }));
    let snapshots_dir = config.state_dir.join("snapshots");
    let (snapshot_records, problems) = crate::snapshots::load(&snapshots_dir);
    for problem in problems {
        tracing::warn!(%problem, "snapshots");
    }
    let snapshots = Arc::new(std::sync::Mutex::new(SnapshotBook {
        records: snapshot_records,
        dir: snapshots_dir,
        ..SnapshotBook::default()
    }));

    let mut shutdown = std::pin::pin!(shutdown);
    let mut agent = Loop {
        config: &config,
        snapshots_on,
        config_problem: None,
        component_config_problems: components.config_problems(),
        components: components.states(),
        host: &host,
        mounter: mounter.as_ref(),
        registry: &registry,
        executor: &executor,
        handler: &handler,
        objects: &objects,
        metrics: &metrics,
        secrets: &secrets,
        source: source.as_ref(),
        provisioning: Provisioning {
            done: provisioned,
            calls: CallSlots::default(),
            dir: provisioned_dir,
            channels: ControllerChannels::default(),
            snapshots,
            snapshot_calls: CallSlots::default(),
        },
        wake: &wake,
        started,
        metrics_address,
        orphans_left,
        last_resync: Instant::now(),
        last_status: None,
        last_report: None,
        cached_resolutions: None,
        status_deferred: None,
        cached_view: None,
        stats_volumes,
        last_claimed: None,
    };
    loop {
        agent.pass();
        // Sleep until something changes: objects, an operation ending, a retry due, a plugin
        // change (polled: the registry has no notification), the resync, or shutdown.
        tokio::select! {
            _ = &mut shutdown => break,
            changed = objects_rx.changed() => { if changed.is_err() { break; } }
            Some(path) = next_component_config(&mut component_config_watch) => {
                components.config_changed(&path).await;
                agent.component_config_problems = components.config_problems();
            }
            Some(outcome) = next_config(&mut config_watch) => {
                agent.config_problem =
                    reload_components(outcome, &mut running_setup, &mut components, &mut agent.snapshots_on).await;
                agent.component_config_problems = components.config_problems();
            }
            _ = wake.notified() => {}
            _ = tokio::time::sleep(agent.nap()) => {}
        }
    }
    drop(agent);

    tracing::info!("shutting down: volumes stay mounted");
    let still_running = executor.close(Duration::from_secs(30)).await;
    if still_running > 0 {
        tracing::warn!(
            still_running,
            "operations still running at shutdown; the journal finishes them on restart"
        );
    }
    let _ = stop_tx.send(true);
    components.stop_all().await;
    watcher.shutdown().await;
    prober.shutdown().await;
    source.shutdown();
    Ok(())
}

/// The volumes the agent provisioned, by claim key; `version` counts changes, so a pass can
/// tell whether its view of the objects is still current.
struct Provisioned {
    records: BTreeMap<String, Arc<k8s_openapi::api::core::v1::PersistentVolume>>,
    version: u64,
}

/// The source's objects with the provisioned volumes laid over them, and what they want.
struct ObjectsView {
    source: Arc<ObjectSet>,
    provisioned_version: u64,
    objects: ObjectSet,
    desired: DesiredState,
}

/// What provisioning keeps between passes: the claims done (with the PV each got), the ones
/// under way or failed (claim → empty, or the error), and where the records live.
struct Provisioning {
    done: Arc<std::sync::Mutex<Provisioned>>,
    /// Provisioning and reclaiming calls, by claim.
    calls: CallSlots,
    dir: PathBuf,
    channels: ControllerChannels,
    /// The snapshots taken (the `snapshot-controller` component, when it runs).
    snapshots: Arc<std::sync::Mutex<SnapshotBook>>,
    /// Snapshot calls, by VolumeSnapshot.
    snapshot_calls: CallSlots,
}

/// The pause after a failed controller call (provisioning, reclaiming, a snapshot) before the
/// same key is tried again.
const RETRY_PAUSE: Duration = Duration::from_secs(5);

/// How long a provisioned record's write and fsync may take before the provisioning counts as
/// failed (and is tried again after the pause, unless the write is still stuck).
const RECORD_WRITE_DEADLINE: Duration = Duration::from_secs(30);

/// Controller calls by key (a claim, a VolumeSnapshot): empty while one runs, else its last
/// error, kept through [`RETRY_PAUSE`]. At most one call per key runs, and none starts during
/// a failure's pause.
#[derive(Clone, Debug, Default)]
struct CallSlots(Arc<std::sync::Mutex<BTreeMap<String, String>>>);

impl CallSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a call for `key` as running, unless one runs or its last failure is in its pause.
    fn begin(&self, key: &str) -> bool {
        let mut calls = self.lock();
        if calls.contains_key(key) {
            return false;
        }
        calls.insert(key.to_string(), String::new());
        true
    }

    fn succeeded(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Shows `error` as `key`'s (the agent is woken so the status says it now), keeps it
    /// through the retry pause, then forgets it so a later pass tries again.
    async fn failed(&self, key: &str, error: String, wake: &Notify) {
        self.lock().insert(key.to_string(), error);
        wake.notify_one();
        tokio::time::sleep(RETRY_PAUSE).await;
        self.lock().remove(key);
    }

    /// The keys whose last call failed, with the error.
    fn failures(&self) -> Vec<(String, String)> {
        self.lock().iter().filter(|(_, e)| !e.is_empty()).map(|(k, e)| (k.clone(), e.clone())).collect()
    }
}

/// The snapshots the agent took, by VolumeSnapshot key, and the ones under way or failed.
#[derive(Debug, Default)]
struct SnapshotBook {
    records: BTreeMap<String, crate::snapshots::SnapshotRecord>,
    /// Counts changes of `records`, for the status.
    version: u64,
    /// Why each VolumeSnapshot not taken is waiting, from the last pass.
    pending: Vec<crate::snapshots::SnapshotPending>,
    dir: PathBuf,
}

/// One gRPC channel per driver endpoint for provisioning, connected on first use and kept (a
/// channel reconnects by itself after the driver restarts): a claim costs its CreateVolume,
/// not a new connection.
#[derive(Clone, Debug, Default)]
struct ControllerChannels(Arc<std::sync::Mutex<BTreeMap<String, tonic::transport::Channel>>>);

impl ControllerChannels {
    fn get(&self, endpoint: &str) -> Result<tonic::transport::Channel, String> {
        let mut channels = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{endpoint}"))
            .map_err(|e| format!("csi driver endpoint {endpoint}: {e}"))?
            .connect_lazy();
        channels.insert(endpoint.to_string(), channel.clone());
        Ok(channel)
    }
}

/// The agent's loop: each [`Loop::pass`] takes the same named steps, from the objects to the
/// status file; the parts it works with were set up by [`run`].
struct Loop<'a> {
    config: &'a AgentConfig,
    /// Whether the agent takes VolumeSnapshots (the `snapshot-controller` component runs).
    snapshots_on: bool,
    /// Why the last change of the config file was not applied, until one is.
    config_problem: Option<String>,
    /// Components' own config files that were not put in place, and why.
    component_config_problems: Vec<String>,
    /// The supervised component processes, for the status report.
    components: crate::components::ComponentStates,
    host: &'a PluginHost,
    mounter: &'a dyn Mounter,
    registry: &'a Arc<PluginRegistry>,
    executor: &'a Arc<Executor>,
    handler: &'a Arc<CsiRegistrationHandler>,
    objects: &'a MemoryObjects,
    metrics: &'a Arc<Metrics>,
    secrets: &'a ObjectSecrets,
    source: &'a dyn ObjectSource,
    provisioning: Provisioning,
    wake: &'a Arc<Notify>,
    started: SystemTime,
    metrics_address: Option<String>,
    /// Pod volume directories no plugin could be named for, with why, while they last.
    orphans_left: Vec<(PathBuf, String)>,
    last_resync: Instant,
    last_status: Option<(StatusReport, Instant)>,
    /// What the last status report was made from, and when.
    last_report: Option<(ReportInputs, Instant)>,
    /// The last resolutions and what they were made from.
    cached_resolutions: Option<(ResolveKey, Arc<Resolutions>)>,
    /// A changed status held back by [`status_write`]: when a pass must write it.
    status_deferred: Option<Instant>,
    cached_view: Option<ObjectsView>,
    /// The volumes of claims, for the stats collector (`None`: stats are off).
    stats_volumes: Option<tokio::sync::watch::Sender<Arc<Vec<crate::volume_stats::ClaimedVolume>>>>,
    /// The actual state's version and the objects the volumes of claims were last found from.
    last_claimed: Option<(u64, Arc<ObjectSet>, u64)>,
}

impl Loop<'_> {
    /// One pass: objects → desired state → resolutions → (resync) → plan → operations → status.
    fn pass(&mut self) {
        let pass_started = Instant::now();
        let view = self.objects_view();
        if self.config.provision_claims {
            start_provisioning(self.config, &view.objects, self.handler, &self.provisioning, self.wake);
            start_reclaiming(&view.source, self.executor, self.handler, &self.provisioning, self.wake);
            if self.snapshots_on {
                start_snapshotting(&view.objects, self.handler, &self.provisioning, self.wake);
            }
        }
        let viewed = pass_started.elapsed();
        let snapshot = self.registry.snapshot();
        let resolutions = self.resolve(&snapshot, &view);
        let resolved = pass_started.elapsed();
        if self.last_resync.elapsed() >= self.config.resync {
            self.last_resync = Instant::now();
            self.resync(&view.desired);
        }
        self.submit(&view.desired, &resolutions);
        let submitted = pass_started.elapsed();
        let problems = self.problems(&view.objects);
        let inputs = ReportInputs {
            executor: self.executor.version(),
            source: Arc::clone(&view.source),
            provisioned: view.provisioned_version,
            plugins: snapshot.generation(),
            problems,
            components: self.components.snapshot(),
            snapshots: self.provisioning.snapshots.lock().unwrap_or_else(|p| p.into_inner()).version,
        };
        let changed = self.last_report.as_ref().is_none_or(|(last, _)| *last != inputs);
        let since = self.last_report.as_ref().map(|(_, at)| at.elapsed());
        let written = match status_write(changed, since, REPORT_REFRESH, self.executor.is_idle()) {
            StatusWrite::Now => {
                let written = self.report(inputs.problems.clone(), &view.desired, &resolutions, &snapshot);
                self.last_report = Some((inputs, Instant::now()));
                written
            }
            StatusWrite::After(wait) => {
                self.status_deferred = Some(Instant::now() + wait);
                false
            }
            StatusWrite::NotYet => false,
        };
        self.offer_claimed_volumes(&view);
        tracing::debug!(
            elapsed_us = pass_started.elapsed().as_micros() as u64,
            view_us = viewed.as_micros() as u64,
            resolve_us = (resolved - viewed).as_micros() as u64,
            submit_us = (submitted - resolved).as_micros() as u64,
            volumes = view.desired.volumes.len(),
            status_written = written,
            "reconcile pass"
        );
        self.cached_view = Some(view);
    }

    /// The objects with the provisioned volumes laid over them, and the desired state, made
    /// again only when the source or the provisioned records changed: most passes follow an
    /// operation, not a change of objects.
    fn objects_view(&mut self) -> ObjectsView {
        let from_source = self.source.current();
        let done = self.provisioning.done.lock().unwrap_or_else(|p| p.into_inner());
        match self.cached_view.take() {
            Some(v) if Arc::ptr_eq(&v.source, &from_source) && v.provisioned_version == done.version => v,
            _ => {
                let mut set = (*from_source).clone();
                crate::provision::overlay(&mut set, &done.records);
                let desired = desired_state(&set, &self.config.node_name);
                secrets_from(self.secrets, &set);
                // The whole set: a CSIDriver removed from the source stops applying at once.
                self.objects.set_csi_drivers(set.csi_drivers.values().cloned());
                ObjectsView { source: from_source, provisioned_version: done.version, objects: set, desired }
            }
        }
    }

    /// How each wanted volume is served, with the node's migration as its CSINode says; made
    /// again only when the objects, the plugins or the node's migration changed.
    fn resolve(&mut self, snapshot: &Snapshot, view: &ObjectsView) -> Arc<Resolutions> {
        let config = self.config;
        let own = NodeMigration::of_own_node(
            &config.node_name,
            &config.gates,
            self.handler.drivers().iter().map(|d| d.name.as_str()),
        );
        let node = self.objects.csi_node(&config.node_name).map(|c| NodeMigration::from_csinode(&c));
        let migration = node.unwrap_or(own);
        let key = ResolveKey {
            source: Arc::clone(&view.source),
            provisioned: view.provisioned_version,
            plugins: snapshot.generation(),
            migration,
        };
        if let Some((last, resolutions)) = &self.cached_resolutions
            && *last == key
        {
            return Arc::clone(resolutions);
        }
        let resolutions =
            Arc::new(resolve_all(snapshot, &config.gates, &key.migration, &self.host.paths, &view.desired));
        self.cached_resolutions = Some((key, Arc::clone(&resolutions)));
        resolutions
    }

    /// Now and then: published records checked against the mount table, and directories of
    /// pods gone that no record accounts for adopted for teardown.
    fn resync(&mut self, desired: &DesiredState) {
        repair_drift(self.executor, self.mounter);
        let listed = adopt_leftovers(&self.host.paths, self.executor, desired, self.registry);
        // An orphan gone from the listing is no longer a problem.
        self.orphans_left.retain(|(path, _)| listed.iter().any(|d| &d.path == path));
    }

    /// The plan's operations and the republishes due, submitted to the executor.
    fn submit(&self, desired: &DesiredState, resolutions: &Resolutions) {
        let exec = self.executor.snapshot();
        for op in plan(desired, resolutions, &exec.actual, &exec.busy()) {
            self.executor.submit(op);
        }
        let due = republish(
            desired,
            resolutions,
            &exec.actual,
            &exec.published_at,
            Instant::now(),
            self.config.republish,
        );
        for op in due {
            self.executor.submit(op);
        }
    }

    /// The problems status shows: the source's, orphans left, failed provisionings.
    /// The snapshots taken, as the status shows them.
    fn snapshot_statuses(&self) -> Vec<crate::status::SnapshotStatus> {
        let book = self.provisioning.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        book.records
            .iter()
            .map(|(key, r)| crate::status::SnapshotStatus {
                name: key.clone(),
                driver: r.driver.clone(),
                snapshot_handle: r.snapshot_handle.clone(),
                source_claim: r.source_claim.clone(),
                size_bytes: r.size_bytes,
                ready_to_use: r.ready_to_use,
                content: r.content.clone(),
            })
            .collect()
    }

    fn problems(&mut self, objects: &ObjectSet) -> Vec<String> {
        let mut problems: Vec<String> = objects.problems.iter().map(ToString::to_string).collect();
        if !self.orphans_left.is_empty() {
            // Now a published volume's directory: no longer a problem.
            let exec = self.executor.snapshot();
            self.orphans_left
                .retain(|(path, _)| !exec.actual.published.values().any(|p| p.target.starts_with(path)));
            problems.extend(self.orphans_left.iter().map(|(_, reason)| reason.clone()));
        }
        problems.extend(self.provisioning.calls.failures().into_iter().map(|(claim, reason)| {
            crate::model::SourceProblem {
                origin: format!("provisioning of claim {claim}"),
                document: None,
                reason,
            }
            .to_string()
        }));
        problems.extend(self.config_problem.clone());
        problems.extend(self.component_config_problems.iter().cloned());
        problems.extend(self.snapshot_problems(objects));
        problems
    }

    /// Why VolumeSnapshots are not taken (or not acted on at all), and why claims restored
    /// from one wait.
    fn snapshot_problems(&self, objects: &ObjectSet) -> Vec<String> {
        let book = self.provisioning.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        let mut problems = Vec::new();
        if !self.snapshots_on {
            if !objects.volume_snapshots.is_empty() {
                problems.push(format!(
                    "{} VolumeSnapshot(s) not acted on: the snapshot-controller component is off (storage.optionalCsiComponents)",
                    objects.volume_snapshots.len()
                ));
            }
            return problems;
        }
        problems.extend(book.pending.iter().map(|p| format!("snapshot {}: {}", p.key, p.reason)));
        problems.extend(
            self.provisioning
                .snapshot_calls
                .failures()
                .into_iter()
                .map(|(k, e)| format!("snapshot {k}: {e}")),
        );
        let done = self.provisioning.done.lock().unwrap_or_else(|p| p.into_inner());
        for (key, claim) in &objects.claims {
            let restoring = claim.spec.as_ref().is_some_and(|s| s.data_source.is_some());
            if restoring
                && !done.records.contains_key(key)
                && let Err(reason) = crate::snapshots::restore_source(key, claim, &book.records)
            {
                problems.push(reason);
            }
        }
        problems
    }

    /// The status report, the volume gauges, and the status file — written when something
    /// other than the clock changed, or every 5 s so `updated` stays fresh: a busy pass should
    /// not cost a file write. Returns whether the file was written.
    fn report(
        &mut self,
        problems: Vec<String>,
        desired: &DesiredState,
        resolutions: &Resolutions,
        snapshot: &Snapshot,
    ) -> bool {
        let exec = self.executor.snapshot();
        let mut report = status_report(
            self.config,
            problems,
            desired,
            resolutions,
            &exec,
            self.started,
            &self.metrics_address,
            snapshot,
        );
        report.csi_node = self.objects.csi_node(&self.config.node_name);
        report.components = self.components.snapshot();
        report.snapshots = self.snapshot_statuses();
        if let Some(sink) = &self.config.node_storage {
            sink.report(&crate::node_storage::NodeStorage {
                csi_node: report.csi_node.clone(),
                node_ids: self.handler.node_id_annotation(),
                volumes_in_use: crate::node_storage::volumes_in_use(resolutions, &exec.actual),
                topology_labels: self.handler.topology_labels(),
            });
        }
        if let Some(sink) = &self.config.pod_events {
            sink.report(&crate::pod_events::volume_failures(desired, resolutions, &exec));
        }
        let count = |phase: Phase| report.volumes.iter().filter(|v| v.phase == phase).count() as i64;
        self.metrics.set_volumes(count(Phase::Published), count(Phase::Pending), count(Phase::Failed));
        self.metrics.set_total_volumes(&crate::metrics::total_volumes(
            desired,
            resolutions,
            &exec.actual.published,
        ));
        let mut comparable = report.clone();
        comparable.updated_unix_ms = 0;
        let last = self.last_status.as_ref();
        let changed = last.is_none_or(|(previous, _)| *previous != comparable);
        self.status_deferred = None;
        match status_write(changed, last.map(|(_, at)| at.elapsed()), STATUS_REFRESH, exec.running.is_empty())
        {
            StatusWrite::Now => match write_status(&self.config.state_dir, &report) {
                Ok(()) => {
                    self.last_status = Some((comparable, Instant::now()));
                    return true;
                }
                Err(e) => tracing::warn!(error = %e, "cannot write the status file"),
            },
            StatusWrite::After(wait) => self.status_deferred = Some(Instant::now() + wait),
            StatusWrite::NotYet => {}
        }
        false
    }

    /// Tells the stats collector which published volumes come from claims, when the published
    /// volumes or the objects changed since it was last told.
    fn offer_claimed_volumes(&mut self, view: &ObjectsView) {
        let Some(sender) = &self.stats_volumes else { return };
        let (actual, version) = self.executor.actual();
        let unchanged = self.last_claimed.as_ref().is_some_and(|(a, o, v)| {
            *a == version && Arc::ptr_eq(o, &view.source) && *v == view.provisioned_version
        });
        if unchanged {
            return;
        }
        let claimed = crate::volume_stats::claimed_volumes(&view.objects.pods, &actual.published);
        drop(actual);
        sender.send_if_modified(|current| {
            let changed = **current != claimed;
            if changed {
                *current = Arc::new(claimed);
            }
            changed
        });
        self.last_claimed = Some((version, Arc::clone(&view.source), view.provisioned_version));
    }

    /// How long to sleep when nothing wakes the loop: until the next retry is due, at most
    /// 250 ms (plugin changes are polled), at least 5 ms.
    fn nap(&self) -> Duration {
        let retry_in = self
            .executor
            .next_retry()
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(1));
        let nap = retry_in.min(Duration::from_millis(250)).max(Duration::from_millis(5));
        match self.status_deferred {
            Some(at) => nap.min(at.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))),
            None => nap,
        }
    }
}

/// The status report is made, and its file written, at most once per this while it keeps
/// changing (a burst of operations ending would otherwise make and write it on every pass);
/// the last change is made and written once the gap is over.
pub const STATUS_MIN_GAP: Duration = Duration::from_millis(5);

/// An unchanged status file is written again this often, so its `updated` stays fresh.
pub const STATUS_REFRESH: Duration = Duration::from_secs(5);

/// A report whose inputs did not change is made again this often, so the ages of running
/// operations it shows stay fresh.
pub const REPORT_REFRESH: Duration = Duration::from_secs(1);

/// What a status report is made from, as far as telling a change goes: the executor's
/// version, the objects, the plugins, the problems.
#[derive(Debug)]
struct ReportInputs {
    executor: u64,
    source: Arc<ObjectSet>,
    provisioned: u64,
    plugins: u64,
    problems: Vec<String>,
    /// A component restarted or turned healthy is news for the status.
    components: Vec<crate::components::ComponentStatus>,
    /// Snapshots taken or deleted.
    snapshots: u64,
}

impl PartialEq for ReportInputs {
    /// The objects by identity: a new set from the source is a change, and comparing two sets'
    /// contents on every pass would cost what this saves.
    fn eq(&self, other: &ReportInputs) -> bool {
        self.executor == other.executor
            && Arc::ptr_eq(&self.source, &other.source)
            && self.provisioned == other.provisioned
            && self.plugins == other.plugins
            && self.problems == other.problems
            && self.components == other.components
            && self.snapshots == other.snapshots
    }
}

/// What resolutions are made from, as far as telling a change goes.
#[derive(Debug)]
struct ResolveKey {
    source: Arc<ObjectSet>,
    provisioned: u64,
    plugins: u64,
    migration: NodeMigration,
}

impl PartialEq for ResolveKey {
    /// The objects by identity, as [`ReportInputs`] compares them.
    fn eq(&self, other: &ResolveKey) -> bool {
        Arc::ptr_eq(&self.source, &other.source)
            && self.provisioned == other.provisioned
            && self.plugins == other.plugins
            && self.migration == other.migration
    }
}

/// Whether to make (or write) the status now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    Now,
    /// Changed, but made less than [`STATUS_MIN_GAP`] ago: by a pass after this long.
    After(Duration),
    NotYet,
}

/// When to make or write the status: `changed` says whether it (or what it is made from)
/// differs from the last time, `since_last` how long ago that was (`None`: never); unchanged,
/// it is done again after `refresh`.
///
/// `settled` (no operation running) writes a change at once: the gap only thins out the
/// reports of a burst, never delays the one that shows where it ended.
pub fn status_write(
    changed: bool,
    since_last: Option<Duration>,
    refresh: Duration,
    settled: bool,
) -> StatusWrite {
    match since_last {
        None => StatusWrite::Now,
        Some(age) if age >= refresh => StatusWrite::Now,
        Some(_) if changed && settled => StatusWrite::Now,
        Some(age) if changed && age >= STATUS_MIN_GAP => StatusWrite::Now,
        Some(age) if changed => StatusWrite::After(STATUS_MIN_GAP - age),
        Some(_) => StatusWrite::NotYet,
    }
}

/// Starts provisioning each claim that needs it (one task per claim at a time); a failure is kept
/// as the claim's problem and retried on a later pass.
fn start_provisioning(
    config: &AgentConfig,
    objects: &ObjectSet,
    handler: &Arc<CsiRegistrationHandler>,
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let Provisioning { done: provisioned, calls, dir, channels, snapshots, .. } = state;
    let drivers = handler.drivers();
    let names: Vec<String> = drivers.iter().map(|d| d.name.clone()).collect();
    let requests = {
        let done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
        let snapshots = snapshots.lock().unwrap_or_else(|p| p.into_inner());
        crate::provision::claims_to_provision(
            objects,
            &config.node_name,
            &done.records,
            &snapshots.records,
            &names,
            &config.gates,
        )
    };
    for request in requests {
        let Some(endpoint) = drivers.iter().find(|d| d.name == request.driver).map(|d| d.endpoint.clone())
        else {
            continue;
        };
        if !calls.begin(&request.claim_key) {
            continue;
        }
        let (provisioned, calls, dir, wake, channels) =
            (Arc::clone(provisioned), calls.clone(), dir.to_path_buf(), Arc::clone(wake), channels.clone());
        tokio::spawn(async move {
            let claim = request.claim_key.clone();
            let channel = channels.get(&endpoint);
            let outcome = match async { provision_one(&request, channel?).await }.await {
                // The record's fsync runs on a blocking thread: on a runtime thread it would
                // stall every other task (a burst of claims queued their fsyncs one by one).
                Ok(pv) => {
                    let record = crate::provision::record_path(&dir, &claim);
                    let saved = kvol_plugin::blocking::shared()
                        .run(&record.clone(), RECORD_WRITE_DEADLINE, move || {
                            crate::provision::save_record(&record, &pv).map(|()| pv)
                        })
                        .await;
                    saved.unwrap_or_else(|e| Err(format!("cannot save the provisioned record: {e}")))
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(pv) => {
                    tracing::info!(claim = %claim, driver = %request.driver, volume = ?pv.metadata.name, "claim provisioned");
                    {
                        let mut provisioned = provisioned.lock().unwrap_or_else(|p| p.into_inner());
                        provisioned.records.insert(claim.clone(), Arc::new(pv));
                        provisioned.version += 1;
                    }
                    calls.succeeded(&claim);
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, driver = %request.driver, error = %e, "provisioning failed");
                    calls.failed(&claim, e, &wake).await;
                }
            }
            wake.notify_one();
        });
    }
}

/// Deletes, through their drivers, the provisioned volumes whose claims are gone (one task per
/// claim at a time), then forgets their records; a failure is kept as the claim's problem and
/// retried on a later pass.
fn start_reclaiming(
    source: &ObjectSet,
    executor: &Executor,
    handler: &Arc<CsiRegistrationHandler>,
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let Provisioning { done: provisioned, calls, dir, channels, .. } = state;
    let requests = {
        let done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
        if done.records.keys().all(|claim| source.claims.contains_key(claim)) {
            return;
        }
        let (actual, _) = executor.actual();
        let in_use: Vec<&str> = actual
            .attached
            .keys()
            .chain(actual.staged.keys())
            .map(String::as_str)
            .chain(actual.published.values().map(|p| p.unique_name.as_str()))
            .collect();
        crate::provision::volumes_to_reclaim(source, &done.records, &in_use)
    };
    let drivers = handler.drivers();
    for request in requests {
        let Some(endpoint) = drivers.iter().find(|d| d.name == request.driver).map(|d| d.endpoint.clone())
        else {
            continue;
        };
        if !calls.begin(&request.claim_key) {
            continue;
        }
        let (provisioned, calls, dir, wake, channel) = (
            Arc::clone(provisioned),
            calls.clone(),
            dir.to_path_buf(),
            Arc::clone(wake),
            channels.get(&endpoint),
        );
        tokio::spawn(async move {
            let claim = request.claim_key.clone();
            let outcome = async { delete_one(&request, channel?).await }
                .await
                .and_then(|()| crate::provision::remove(&dir, &claim));
            match outcome {
                Ok(()) => {
                    tracing::info!(claim = %claim, driver = %request.driver, volume = %request.pv_name, "claim deleted: its volume deleted");
                    let mut provisioned = provisioned.lock().unwrap_or_else(|p| p.into_inner());
                    provisioned.records.remove(&claim);
                    provisioned.version += 1;
                    drop(provisioned);
                    calls.succeeded(&claim);
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, driver = %request.driver, error = %e, "deleting a deleted claim's volume failed");
                    calls.failed(&claim, e, &wake).await;
                }
            }
            wake.notify_one();
        });
    }
}

/// Takes the VolumeSnapshots not yet taken and deletes, through their drivers, the snapshots
/// whose manifests are gone (one call per snapshot at a time); records are written before a
/// snapshot counts as taken and removed after it is deleted. A failure is kept as the
/// snapshot's problem and retried after a pause.
fn start_snapshotting(
    objects: &ObjectSet,
    handler: &Arc<CsiRegistrationHandler>,
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let drivers = handler.drivers();
    let names: Vec<String> = drivers.iter().map(|d| d.name.clone()).collect();
    let (take, delete) = {
        let mut book = state.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        let (take, pending) = crate::snapshots::snapshots_to_take(objects, &book.records, &names);
        book.pending = pending;
        let delete: Vec<(String, crate::snapshots::SnapshotRecord)> =
            crate::snapshots::snapshots_to_delete(objects, &book.records)
                .into_iter()
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect();
        (take, delete)
    };
    let endpoint = |driver: &str| drivers.iter().find(|d| d.name == driver).map(|d| d.endpoint.clone());
    for work in take {
        let Some(endpoint) = endpoint(work.driver()) else { continue };
        let key = work.key().to_string();
        spawn_snapshot_call(state, wake, &key, state.channels.get(&endpoint), move |channel| async move {
            match &work {
                crate::snapshots::SnapshotWork::Take(request) => snapshot_one(request, channel).await,
                crate::snapshots::SnapshotWork::Adopt(adoption) => {
                    adopt_snapshot_one(adoption, channel).await
                }
            }
        });
    }
    for (key, record) in delete {
        let Some(endpoint) = endpoint(&record.driver) else { continue };
        spawn_snapshot_call(state, wake, &key, state.channels.get(&endpoint), move |channel| async move {
            delete_snapshot_one(&record, channel).await.map(|()| None)
        });
    }
}

/// Runs one snapshot call for `key` unless one runs already; `Some(record)` is recorded,
/// `None` forgets the key's record.
fn spawn_snapshot_call<F, Fut>(
    state: &Provisioning,
    wake: &Arc<Notify>,
    key: &str,
    channel: Result<tonic::transport::Channel, String>,
    call: F,
) where
    F: FnOnce(tonic::transport::Channel) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Option<crate::snapshots::SnapshotRecord>, String>> + Send,
{
    if !state.snapshot_calls.begin(key) {
        return;
    }
    let (book, calls, wake, key) =
        (Arc::clone(&state.snapshots), state.snapshot_calls.clone(), Arc::clone(wake), key.to_string());
    tokio::spawn(async move {
        let outcome = match channel {
            Ok(channel) => call(channel).await,
            Err(e) => Err(e),
        };
        let dir = book.lock().unwrap_or_else(|p| p.into_inner()).dir.clone();
        let outcome = outcome.and_then(|record| {
            match &record {
                Some(record) => crate::snapshots::save(&dir, &key, record)?,
                None => crate::snapshots::remove(&dir, &key)?,
            }
            Ok(record)
        });
        match outcome {
            Ok(record) => {
                tracing::info!(snapshot = %key, taken = record.is_some(), "snapshot recorded");
                let mut book = book.lock().unwrap_or_else(|p| p.into_inner());
                match record {
                    Some(record) => drop(book.records.insert(key.clone(), record)),
                    None => drop(book.records.remove(&key)),
                }
                book.version += 1;
                drop(book);
                calls.succeeded(&key);
            }
            Err(e) => {
                tracing::warn!(snapshot = %key, error = %e, "snapshot call failed");
                calls.failed(&key, e, &wake).await;
            }
        }
        wake.notify_one();
    });
}

async fn snapshot_one(
    request: &crate::snapshots::SnapshotRequest,
    channel: tonic::transport::Channel,
) -> Result<Option<crate::snapshots::SnapshotRecord>, String> {
    let create = kvol_csi::proto::csi::CreateSnapshotRequest {
        source_volume_id: request.source_volume_handle.clone(),
        name: request.name.clone(),
        parameters: request.parameters.clone().into_iter().collect(),
        ..Default::default()
    };
    let what = format!("csi driver {}: CreateSnapshot of {}", request.driver, request.key);
    let answer = controller_call(what.clone(), controller(channel).create_snapshot(create)).await?;
    let snapshot = answer.snapshot.ok_or_else(|| format!("{what} returned no snapshot"))?;
    Ok(Some(crate::snapshots::SnapshotRecord {
        driver: request.driver.clone(),
        snapshot_handle: snapshot.snapshot_id,
        source_volume_handle: request.source_volume_handle.clone(),
        source_claim: request.source_claim.clone(),
        size_bytes: snapshot.size_bytes,
        ready_to_use: snapshot.ready_to_use,
        deletion_policy: request.deletion_policy.clone(),
        created_unix_seconds: snapshot.creation_time.map_or(0, |t| t.seconds),
        content: None,
    }))
}

/// Brings in a pre-provisioned content's snapshot: ListSnapshots of its handle when the driver
/// can list (a snapshot the driver does not know is an error, retried), else taken as ready
/// with no size, as the external-snapshotter does.
async fn adopt_snapshot_one(
    adoption: &crate::snapshots::ContentAdoption,
    channel: tonic::transport::Channel,
) -> Result<Option<crate::snapshots::SnapshotRecord>, String> {
    use kvol_csi::proto::csi::controller_service_capability::{Type, rpc::Type as Rpc};
    let mut client = controller(channel);
    let what = format!("csi driver {}: ControllerGetCapabilities", adoption.driver);
    let capabilities = controller_call(
        what,
        client.controller_get_capabilities(kvol_csi::proto::csi::ControllerGetCapabilitiesRequest {}),
    )
    .await?;
    let lists = capabilities
        .capabilities
        .iter()
        .any(|c| matches!(c.r#type, Some(Type::Rpc(ref rpc)) if rpc.r#type == Rpc::ListSnapshots as i32));
    let mut record = crate::snapshots::SnapshotRecord {
        driver: adoption.driver.clone(),
        snapshot_handle: adoption.snapshot_handle.clone(),
        source_volume_handle: String::new(),
        source_claim: String::new(),
        size_bytes: 0,
        ready_to_use: true,
        deletion_policy: adoption.deletion_policy.clone(),
        created_unix_seconds: 0,
        content: Some(adoption.content.clone()),
    };
    if !lists {
        return Ok(Some(record));
    }
    let list = kvol_csi::proto::csi::ListSnapshotsRequest {
        snapshot_id: adoption.snapshot_handle.clone(),
        ..Default::default()
    };
    let what = format!("csi driver {}: ListSnapshots of {}", adoption.driver, adoption.snapshot_handle);
    let answer = controller_call(what.clone(), client.list_snapshots(list)).await?;
    let snapshot = answer
        .entries
        .into_iter()
        .filter_map(|entry| entry.snapshot)
        .find(|snapshot| snapshot.snapshot_id == adoption.snapshot_handle)
        .ok_or_else(|| {
            format!("{what}: the driver has no such snapshot (VolumeSnapshotContent {})", adoption.content)
        })?;
    record.source_volume_handle = snapshot.source_volume_id;
    record.size_bytes = snapshot.size_bytes;
    record.ready_to_use = snapshot.ready_to_use;
    record.created_unix_seconds = snapshot.creation_time.map_or(0, |t| t.seconds);
    Ok(Some(record))
}

async fn delete_snapshot_one(
    record: &crate::snapshots::SnapshotRecord,
    channel: tonic::transport::Channel,
) -> Result<(), String> {
    let delete = kvol_csi::proto::csi::DeleteSnapshotRequest {
        snapshot_id: record.snapshot_handle.clone(),
        ..Default::default()
    };
    let what = format!("csi driver {}: DeleteSnapshot of {}", record.driver, record.snapshot_handle);
    controller_call(what, controller(channel).delete_snapshot(delete)).await.map(drop)
}

async fn delete_one(
    request: &crate::provision::ReclaimRequest,
    channel: tonic::transport::Channel,
) -> Result<(), String> {
    let delete = kvol_csi::proto::csi::DeleteVolumeRequest {
        volume_id: request.volume_handle.clone(),
        ..Default::default()
    };
    let what = format!("csi driver {}: DeleteVolume of {}", request.driver, request.pv_name);
    controller_call(what, controller(channel).delete_volume(delete)).await.map(drop)
}

/// The deadline of the agent's own controller calls (provisioning, reclaiming, snapshots).
const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// One controller call within [`CONTROLLER_CALL_TIMEOUT`]; an error says what `what` (driver,
/// call and object) ran into: no answer in time, or the driver's code and message.
async fn controller_call<T>(
    what: String,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    tokio::time::timeout(CONTROLLER_CALL_TIMEOUT, call)
        .await
        .map_err(|_| format!("{what} did not answer within 2m"))?
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{what} failed ({:?}): {}", s.code(), s.message()))
}

fn controller(
    channel: tonic::transport::Channel,
) -> kvol_csi::proto::csi::controller_client::ControllerClient<tonic::transport::Channel> {
    kvol_csi::proto::csi::controller_client::ControllerClient::new(channel)
}

async fn provision_one(
    request: &crate::provision::ProvisionRequest,
    channel: tonic::transport::Channel,
) -> Result<k8s_openapi::api::core::v1::PersistentVolume, String> {
    let create = crate::provision::create_request(request)?;
    let what = format!("csi driver {}: CreateVolume", request.driver);
    let response = controller_call(what.clone(), controller(channel).create_volume(create)).await?;
    let volume = response.volume.ok_or_else(|| format!("{what} returned no volume"))?;
    crate::provision::bound_pv(request, &volume)
}

/// Copies the example drivers' scripts into the Flexvolume directory with the atomic
/// installer (unchanged ones are left alone).
fn install_example_flex_drivers(config: &AgentConfig) -> Result<(), String> {
    let scratch = config.state_dir.join(".flex-install");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    for (dir_name, script) in EXAMPLE_FLEX_DRIVERS {
        let source = scratch.join(dir_name);
        std::fs::write(&source, script).map_err(|e| format!("cannot write {}: {e}", source.display()))?;
        std::fs::set_permissions(&source, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("cannot chmod {}: {e}", source.display()))?;
        kvol_flex::install::install(&source, &config.volume_plugin_dir, dir_name)
            .map_err(|e| e.to_string())?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// The next component config file that changed; never, without a watch.
async fn next_component_config(watch: &mut Option<ComponentConfigWatch>) -> Option<PathBuf> {
    let Some(watch) = watch else { return std::future::pending().await };
    watch.changes.recv().await
}

/// The next outcome of the config watch; never, without one.
async fn next_config(watch: &mut Option<ConfigWatch>) -> Option<Result<kvol_api::StorageSection, String>> {
    let Some(watch) = watch else { return std::future::pending().await };
    watch.changes.changed().await.ok()?;
    watch.changes.borrow_and_update().clone()
}

/// Applies a changed storage section: the components its decision asks for are started and
/// the others stopped. An unreadable file or an invalid section changes nothing; the reason
/// is returned for the status.
async fn reload_components(
    outcome: Result<kvol_api::StorageSection, String>,
    setup: &mut Option<crate::components::ComponentsSetup>,
    components: &mut Components,
    snapshots_on: &mut bool,
) -> Option<String> {
    let Some(running) = setup else { return None };
    let storage = match outcome {
        Ok(storage) => storage,
        Err(reason) => {
            tracing::warn!(%reason, "config change not applied; the running components stay");
            return Some(format!("config change not applied: {reason}"));
        }
    };
    if storage == running.storage {
        return None;
    }
    let candidate = crate::components::ComponentsSetup { storage, ..running.clone() };
    match planned_processes(&candidate) {
        Ok((specs, snapshots)) => {
            tracing::info!("storage section changed; applying");
            components.apply(specs).await;
            *snapshots_on = snapshots;
            *running = candidate;
            None
        }
        Err(reason) => {
            tracing::warn!(%reason, "config change not applied; the running components stay");
            Some(format!("config change not applied: {reason}"))
        }
    }
}

/// The component processes the setup's decision asks for; an invalid storage section stops
/// the agent with every problem listed.
fn planned_processes(setup: &crate::components::ComponentsSetup) -> Result<(Vec<ProcessSpec>, bool), String> {
    match setup.plan() {
        Ok((decision, specs)) => {
            for warning in &decision.warnings {
                tracing::warn!(%warning, "storage components");
            }
            Ok((specs, crate::components::runs_snapshots(&decision, &setup.catalogue)))
        }
        Err(problems) => {
            let listed: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
            Err(format!("invalid storage section: {}", listed.join("; ")))
        }
    }
}

fn secrets_from(secrets: &ObjectSecrets, objects: &ObjectSet) {
    let mut map = secrets.0.write().unwrap_or_else(|p| p.into_inner());
    if *map != objects.secrets {
        *map = objects.secrets.clone();
    }
}

/// Resolves every wanted volume that has a spec: plugin, unique name, staging path, target.
pub fn resolve_all(
    snapshot: &Snapshot,
    gates: &FeatureGates,
    node: &NodeMigration,
    paths: &NodePaths,
    desired: &DesiredState,
) -> Resolutions {
    desired
        .volumes
        .iter()
        .filter_map(|(key, volume)| {
            let spec = volume.spec.as_ref()?;
            Some((key.clone(), resolve_one(snapshot, gates, node, paths, volume, spec)))
        })
        .collect()
}

fn resolve_one(
    snapshot: &Snapshot,
    gates: &FeatureGates,
    node: &NodeMigration,
    paths: &NodePaths,
    volume: &DesiredVolume,
    spec: &kvol_plugin::VolumeSpec,
) -> Result<Resolution, String> {
    let resolved = resolve(snapshot, gates, spec, NodeStatus::Known(node)).map_err(|e| e.to_string())?;
    let plugin = resolved.plugin;
    let spec = resolved.spec.into_owned();
    let staging_path = match plugin.device_mounter() {
        Some(stager) if plugin.can_device_mount(&spec) => {
            Some(stager.device_mount_path(&spec).map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let attach = plugin.can_attach(&spec);
    // Upstream's unique names: node-wide for a volume that is attached or staged, per pod for
    // one that is only published; always with the plugin, so two plugins never share one.
    let node_wide = attach || staging_path.is_some();
    let volume_name = if node_wide {
        plugin.volume_name(&spec).map_err(|e| e.to_string())?
    } else {
        spec.name().to_string()
    };
    let unique_name =
        unique_volume_name(plugin.pod_dir_plugin_name(), &volume_name, node_wide, &volume.pod.uid);
    Ok(Resolution {
        plugin: plugin.name().to_string(),
        unique_name,
        attach,
        republish: plugin.requires_remount(&spec),
        staging_path,
        target: kvol_plugin::block::publish_target(
            paths,
            plugin.as_ref(),
            &spec,
            &volume.pod.uid,
            &volume.key.volume,
        )
        .map_err(|e| e.to_string())?,
        spec,
    })
}

/// Reconstructs, from the rebuilt state and the node, the records of what no record accounts
/// for; returns the actual state to start from and the orphans left (with why).
fn reconstruct_at_start(
    rebuilt: &crate::rebuild::Rebuilt,
    seen: &crate::rebuild::NodeObservation,
    registry: &PluginRegistry,
) -> (crate::model::ActualState, Vec<(PathBuf, String)>) {
    let snapshot = registry.snapshot();
    let node_wide = |plugin: &str, spec: &kvol_plugin::VolumeSpec| node_wide(&snapshot, plugin, spec);
    let found = crate::reconstruct::reconstruct(&rebuilt.orphans, seen, &rebuilt.actual, &node_wide);
    let mut actual = rebuilt.actual.clone();
    for record in found.published {
        tracing::info!(volume = %record.key, plugin = %record.plugin, target = %record.target.display(), "reconstructed a published volume no record accounted for: recorded uncertain");
        actual.published.insert(record.key.clone(), record);
    }
    for record in found.staged {
        tracing::info!(volume = %record.unique_name, staging_path = %record.staging_path.display(), "reconstructed a staged volume no record accounted for: recorded uncertain");
        actual.staged.insert(record.unique_name.clone(), record);
    }
    let mut left = Vec::new();
    for (orphan, why) in found.unattributed {
        match crate::rebuild::clear_orphan(&orphan, &seen.mount_points) {
            None => {
                tracing::info!(path = %orphan.path.display(), "removed an empty orphan pod volume directory")
            }
            Some(reason) => {
                let reason = format!("{reason} ({why})");
                tracing::warn!(path = %orphan.path.display(), %reason, "orphan pod volume directory");
                left.push((orphan.path.clone(), reason));
            }
        }
    }
    (actual, left)
}

/// Whether `plugin` attaches or stages `spec` (its unique name is then node-wide); `None` when
/// no such plugin is registered.
fn node_wide(snapshot: &Snapshot, plugin: &str, spec: &kvol_plugin::VolumeSpec) -> Option<bool> {
    let plugin = snapshot.find_by_name(plugin).ok()?;
    Some(plugin.can_attach(spec) || (plugin.device_mounter().is_some() && plugin.can_device_mount(spec)))
}

/// While the agent runs: pod volume directories of pods no longer wanted that no record
/// accounts for (a driver that finished a publish after the agent gave up on it, a teardown
/// that left its directory) are adopted as uncertain records, so the reconciler tears them
/// down through their plugin. Directories of wanted pods are left to the reconciler.
fn adopt_leftovers(
    paths: &NodePaths,
    executor: &Arc<Executor>,
    desired: &DesiredState,
    registry: &PluginRegistry,
) -> Vec<crate::rebuild::PodVolumeDir> {
    let Ok(dirs) = crate::rebuild::pod_volume_dirs(paths) else { return Vec::new() };
    let exec = executor.snapshot();
    let wanted_pods: std::collections::BTreeSet<&str> =
        desired.volumes.keys().map(|k| k.pod_uid.as_str()).collect();
    let snapshot = registry.snapshot();
    let node_wide = |plugin: &str, spec: &kvol_plugin::VolumeSpec| node_wide(&snapshot, plugin, spec);
    for dir in &dirs {
        let recorded = exec.actual.published.values().any(|p| p.target == dir.path);
        if recorded || wanted_pods.contains(dir.pod_uid.as_str()) {
            continue;
        }
        // Only a CSI volume's directory is read (its mount is one level down); any other may
        // itself be a mount whose filesystem does not answer.
        let vol_data = (dir.plugin_dir == "kubernetes.io~csi")
            .then(|| kvol_csi::paths::load_vol_data(&dir.path).map_err(|e| e.to_string()).transpose())
            .flatten();
        match crate::reconstruct::attribute(dir, &vol_data, &node_wide) {
            Ok(record) => match executor.adopt_published(record) {
                Ok(true) => {
                    tracing::info!(path = %dir.path.display(), "adopted a pod volume directory no record accounted for, to tear it down")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(path = %dir.path.display(), error = %e, "cannot adopt a pod volume directory")
                }
            },
            Err(reason) => {
                tracing::debug!(path = %dir.path.display(), %reason, "pod volume directory left alone")
            }
        }
    }
    crate::rebuild::clear_empty_pod_dirs(paths, &wanted_pods, &exec.actual);
    dirs
}

/// Forgets publications whose mount is gone, so they are published again. Disk emptyDirs are
/// plain directories: their directory must exist.
fn repair_drift(executor: &Arc<Executor>, mounter: &dyn Mounter) {
    let Ok(mounts) = mounter.mount_points() else { return };
    let exec = executor.snapshot();
    for (key, volume) in &exec.actual.published {
        if exec.running.contains_key(&format!("pod:{key}")) {
            continue;
        }
        let checked = kvol_plugin::block::mount_check_path(&volume.target);
        let mounted = mounts.iter().any(|m| m.target.starts_with(&checked));
        let fine = mounted || (volume.plugin == "kubernetes.io/empty-dir" && volume.target.is_dir());
        if !fine {
            tracing::warn!(volume = %key, target = %volume.target.display(), "published volume's mount is gone; publishing it again");
            if let Err(e) = executor.forget_published(key) {
                tracing::warn!(volume = %key, error = %e, "cannot record the lost mount");
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn status_report(
    config: &AgentConfig,
    problems: Vec<String>,
    desired: &DesiredState,
    resolutions: &Resolutions,
    exec: &ExecSnapshot,
    started: SystemTime,
    metrics_address: &Option<String>,
    snapshot: &Snapshot,
) -> StatusReport {
    let now = SystemTime::now();
    let ms = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut volumes = Vec::new();
    let mut keys: Vec<_> = desired.volumes.keys().cloned().collect();
    for key in exec.actual.published.keys() {
        if !desired.volumes.contains_key(key) {
            keys.push(key.clone());
        }
    }
    for key in keys {
        let want = desired.volumes.get(&key);
        let published = exec.actual.published.get(&key);
        let resolution = resolutions.get(&key);
        let ok = resolution.and_then(|r| r.as_ref().ok());
        let unique = ok.map(|r| r.unique_name.clone()).or_else(|| published.map(|p| p.unique_name.clone()));
        let pod_lock = format!("pod:{key}");
        let volume_lock = unique.as_ref().map(|u| format!("volume:{u}"));
        let running =
            exec.running.get(&pod_lock).or_else(|| volume_lock.as_ref().and_then(|l| exec.running.get(l)));
        let failure =
            exec.failures.get(&pod_lock).or_else(|| volume_lock.as_ref().and_then(|l| exec.failures.get(l)));
        let staged = unique.as_ref().and_then(|u| exec.actual.staged.get(u));
        let attached = unique.as_ref().and_then(|u| exec.actual.attached.get(u));
        let phase = if let Some(r) = running {
            match r.operation {
                "volume_attach" => Phase::Attaching,
                "mount_device" => Phase::Staging,
                "volume_mount" => Phase::Publishing,
                _ => Phase::TearingDown,
            }
        } else if want.is_none() {
            Phase::TearingDown
        } else if published.is_some() {
            Phase::Published
        } else if failure.is_some() || matches!(resolution, Some(Err(_))) {
            Phase::Failed
        } else if staged.is_some() {
            Phase::Staged
        } else if attached.is_some() {
            Phase::Attached
        } else {
            Phase::Pending
        };
        let last_error =
            failure.map(describe_failure).or_else(|| resolution.and_then(|r| r.as_ref().err().cloned()));
        let spec = published.map(|p| &p.spec).or(ok.map(|r| &r.spec));
        volumes.push(VolumeStatus {
            pod: want
                .map(|w| w.pod_name.clone())
                .or_else(|| published.map(|p| p.pod_name.clone()))
                .unwrap_or_default(),
            pod_uid: key.pod_uid.clone(),
            volume: key.volume.clone(),
            plugin: published.map(|p| p.plugin.clone()).or_else(|| ok.map(|r| r.plugin.clone())),
            phase,
            migrated: spec.is_some_and(|s| s.migrated.is_some()),
            device_path: published
                .and_then(|p| p.device_path.clone())
                .or_else(|| attached.and_then(|a| a.device_path.clone())),
            staging_path: staged
                .map(|s| s.staging_path.clone())
                .or_else(|| ok.and_then(|r| r.staging_path.clone())),
            target: published.map(|p| p.target.clone()).or_else(|| ok.map(|r| r.target.clone())),
            last_error,
            pending_reason: want.and_then(|w| w.pending.clone()).or_else(|| {
                want.filter(|w| w.terminating && published.is_none())
                    .map(|_| "the pod is being deleted: nothing new is set up for it".to_string())
            }),
            progress: running
                .map(|r| format!("{} running for {:.1} s", r.operation, r.started.elapsed().as_secs_f64())),
        });
    }
    let mut unique_names: Vec<&String> =
        exec.actual.attached.keys().chain(exec.actual.staged.keys()).collect();
    unique_names.sort();
    unique_names.dedup();
    let node_volumes = unique_names
        .into_iter()
        .map(|unique| {
            let attached = exec.actual.attached.get(unique);
            let staged = exec.actual.staged.get(unique);
            let lock = format!("volume:{unique}");
            let running = exec.running.get(&lock);
            let failure = exec.failures.get(&lock);
            let phase = match (running.map(|r| r.operation), failure) {
                (Some("volume_attach"), _) => Phase::Attaching,
                (Some("mount_device"), _) => Phase::Staging,
                (Some(_), _) => Phase::TearingDown,
                (None, Some(_)) => Phase::Failed,
                (None, None) if staged.is_some() => Phase::Staged,
                (None, None) => Phase::Attached,
            };
            NodeVolumeStatus {
                unique_name: unique.clone(),
                plugin: staged
                    .map(|s| s.plugin.clone())
                    .or_else(|| attached.map(|a| a.plugin.clone()))
                    .unwrap_or_default(),
                phase,
                attached: attached.is_some(),
                device_path: staged
                    .and_then(|s| s.device_path.clone())
                    .or_else(|| attached.and_then(|a| a.device_path.clone())),
                staging_path: staged.map(|s| s.staging_path.clone()),
                last_error: failure.map(describe_failure),
                progress: running.map(|r| {
                    format!("{} running for {:.1} s", r.operation, r.started.elapsed().as_secs_f64())
                }),
            }
        })
        .collect();
    StatusReport {
        csi_node: None,
        components: Vec::new(),
        snapshots: Vec::new(),
        node_volumes,
        node: config.node_name.clone(),
        pid: std::process::id(),
        started_unix_ms: ms(started),
        updated_unix_ms: ms(now),
        metrics_address: metrics_address.clone(),
        volumes,
        problems,
        plugins: snapshot.plugins().iter().map(|r| r.plugin.name().to_string()).collect(),
    }
}

/// A failure as status shows it: the operation, how often, the driver's words, and the backoff
/// before the next try (fixed per failure, so the status file does not change every pass).
fn describe_failure(f: &crate::executor::Failure) -> String {
    let backoff = crate::executor::BACKOFF.delay(f.count);
    format!(
        "{} failed {} time(s): {}; tried again {:.1} s after the failure",
        f.operation,
        f.count,
        f.last_error,
        backoff.as_secs_f64()
    )
}

/// Where the bundled driver keeps its volumes: for tests and the benchmark.
pub fn bundled_volume_dir(config: &AgentConfig, volume_id: &str) -> PathBuf {
    config.state_dir.join("csi-hostpath").join("volumes").join(volume_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_is_written_at_once_unless_it_was_just_written() {
        let ms = Duration::from_millis;
        // (what, changed, written how long ago, operations running, decision)
        let rows = [
            ("never written", false, None, true, StatusWrite::Now),
            ("never written, changed", true, None, true, StatusWrite::Now),
            ("changed, written long ago", true, Some(ms(6)), true, StatusWrite::Now),
            ("changed, written exactly the gap ago", true, Some(STATUS_MIN_GAP), true, StatusWrite::Now),
            (
                "changed mid-burst, written 2 ms ago",
                true,
                Some(ms(2)),
                true,
                StatusWrite::After(STATUS_MIN_GAP - ms(2)),
            ),
            ("changed and settled, written 2 ms ago", true, Some(ms(2)), false, StatusWrite::Now),
            ("unchanged, written 2 ms ago", false, Some(ms(2)), false, StatusWrite::NotYet),
            ("unchanged, written 4 s ago", false, Some(Duration::from_secs(4)), true, StatusWrite::NotYet),
            ("unchanged, stale", false, Some(STATUS_REFRESH), true, StatusWrite::Now),
        ];
        for (name, changed, since_last, running, want) in rows {
            assert_eq!(status_write(changed, since_last, STATUS_REFRESH, !running), want, "{name}");
        }
        assert_eq!(status_write(false, Some(REPORT_REFRESH), REPORT_REFRESH, true), StatusWrite::Now);
    }
}
