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

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kvol_claims::ClaimsController;
use kvol_components_runtime::ComponentRuntime;
use kvol_components_runtime::components::ComponentStates;
use kvol_csi::registration::{RegistrationWatcher, WatcherConfig};
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, NodeObjects, Timeouts};
use kvol_flex::prober::{FlexProber, ProberConfig};
use kvol_plugin::migration::NodeMigration;
use kvol_plugin::{
    Mounter, NodeInfo, NodePaths, PluginHost, PluginRegistry, SecretStore, Snapshot, SystemMounter,
};
use tokio::sync::Notify;

use crate::actual::repair::{adopt_leftovers, reconstruct_at_start, repair_drift};
use crate::actual::store::Store;
use crate::config::AgentConfig;
use crate::desired::pods::{NodeContext, desired_state_on};
use crate::desired::resolve_all;
use crate::executor::Executor;
use crate::model::{DesiredState, ObjectSet};
use crate::reconciler::{Resolutions, expansions, plan, republish, waits_for_in_use};
use crate::report::metrics::Metrics;
use crate::report::node_storage::may_report;
use crate::report::status::{Phase, SnapshotStatus, StatusReport, write_status};
use crate::report::status_report::{
    REPORT_REFRESH, STATUS_REFRESH, StatusWrite, status_report, status_write,
};
use crate::sources::{ManifestsSource, ObjectSource};

/// The example Flexvolume drivers the embedded default installs: directory name and script.
const EXAMPLE_FLEX_DRIVERS: [(&str, &[u8]); 2] = [
    ("kvol~tmpfs", include_bytes!("../../../examples/flexvolume/kvol~tmpfs/tmpfs")),
    ("kvol~loop", include_bytes!("../../../examples/flexvolume/kvol~loop/loop")),
];

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
            Err(crate::actual::store::StoreError::InUse { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other.map_err(|e| e.to_string()),
        }
    }
}

/// How long start-up waits for the Flexvolume drivers on disk to load before the first plan.
/// A driver still undecided then (its `init` still running: hung, or slow) holds up only the
/// volumes that may be its own, never the others.
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(1);

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
    let node = NodeInfo {
        allocatable: measured_allocatable(&config.root_dir),
        ..NodeInfo::named(&config.node_name)
    };
    let host = PluginHost::new(NodePaths::new(&config.root_dir), node, Arc::clone(&mounter))
        .with_secrets(secrets.clone())
        .with_allowed_host_paths(config.allowed_host_paths.clone())
        .with_tokens(config.tokens.clone());

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
    let seen = crate::actual::observe::observe(&host.paths, mounter.as_ref()).map_err(|e| e.to_string())?;
    let rebuilt = crate::actual::rebuild::rebuild(&loaded.actual, &loaded.incomplete, &seen);
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
        tracing::warn!(dir = %config.volume_plugin_dir.display(), waited_s = FIRST_PROBE_WAIT.as_secs(), "flexvolume drivers still loading; starting without them (their volumes wait, no other does)");
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
    // The drivers registered before this start: the cluster is not told the node's storage
    // until they are back or gone (see `may_report`).
    let sockets_at_start = kvol_csi::registration::sockets_under(&registration_dir);
    let watcher = RegistrationWatcher::start(WatcherConfig::new(config.registration_dir()), handler.clone())
        .map_err(|e| e.to_string())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut components =
        ComponentRuntime::start(config.components.clone(), config.config_file.as_deref()).await?;
    let metrics_address = match config.metrics_address {
        Some(address) => {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .map_err(|e| format!("cannot listen for metrics on {address}: {e}"))?;
            let bound = listener.local_addr().map_err(|e| e.to_string())?;
            let mut stop = stop_rx.clone();
            let m = metrics.clone();
            tokio::spawn(async move {
                let _ = crate::report::metrics::serve_metrics(listener, m, async move {
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
        tokio::spawn(crate::report::volume_stats::run_collector(
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
            let memory: Arc<dyn crate::sources::ManifestMemory> = store.clone();
            let source = ManifestsSource::start_with_memory(config.manifests_dir.clone(), Some(memory));
            Box::new(source.map_err(|e| e.to_string())?)
        }
    };
    let mut objects_rx = source.subscribe();
    if let Some(tap) = config.objects_tap.clone() {
        crate::sources::forward(source.subscribe(), tap);
    }
    let wake = Arc::new(Notify::new());
    // The runtime API: a runner's pods in, the node's view out.
    let (runner, runner_problems) = crate::runtime::runner_pods::RunnerPods::open(
        &config.state_dir.join(crate::runtime::runner_pods::RUNNER_PODS_DIR),
    )?;
    for problem in &runner_problems {
        tracing::warn!(%problem, "runner pod not restored");
    }
    let runner = Arc::new(runner);
    let mut runner_rx = runner.subscribe();
    let (view_tx, view_rx) =
        tokio::sync::watch::channel(Arc::new(crate::runtime::view::RuntimeView::default()));
    if let Some(socket) = &config.runtime_socket {
        let service = crate::runtime::server::RuntimeService::new(
            view_rx,
            Arc::clone(&runner),
            config.root_dir.join("pods"),
        );
        let mut stop = stop_rx.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let socket = socket.clone();
        // Bound before the loop starts, so a runner can connect once the agent is up.
        let serving = crate::runtime::server::bind(&socket)?;
        tokio::spawn(async move {
            if let Err(e) = crate::runtime::server::serve(serving, service, stopped).await {
                tracing::warn!(socket = %socket.display(), error = %e, "runtime api stopped");
            }
        });
    }
    let executor = Executor::new(
        host.clone(),
        Arc::clone(&registry),
        Arc::clone(&store),
        metrics.clone(),
        actual,
        Arc::clone(&wake),
    );

    // The standalone control plane; in a cluster, the cluster's controllers do its jobs.
    let claims = config.provision_claims.then(|| {
        ClaimsController::start(&config.state_dir, &config.node_name, &config.gates, Arc::clone(&wake))
    });

    let mut shutdown = std::pin::pin!(shutdown);
    let mut agent = Loop {
        config: &config,
        snapshots_on: components.snapshots_on(),
        component_problems: components.problems(),
        components: components.states(),
        host: &host,
        mounter: mounter.as_ref(),
        registry: &registry,
        executor: &executor,
        handler: &handler,
        registration: &watcher,
        flex_prober: &prober,
        undecided_flex: undecided_flex_drivers(&config.volume_plugin_dir, &prober),
        sockets_at_start,
        node_storage_open: false,
        objects: &objects,
        metrics: &metrics,
        secrets: &secrets,
        source: source.as_ref(),
        claims: claims.as_ref(),

        started,
        metrics_address,
        orphans_left,
        pod_dirs_left: Vec::new(),
        last_resync: Instant::now(),
        last_status: None,
        last_report: None,
        cached_resolutions: None,
        status_deferred: None,
        cached_view: None,
        stats_volumes,
        last_claimed: None,
        runner: &runner,
        runtime_view: view_tx,
        last_view: None,
    };
    loop {
        agent.pass();
        // Sleep until something changes: objects, an operation ending, a retry due, a plugin
        // change (polled: the registry has no notification), the resync, or shutdown.
        tokio::select! {
            _ = &mut shutdown => break,
            changed = objects_rx.changed() => { if changed.is_err() { break; } }
            _ = runner_rx.changed() => {}
            change = components.next_change() => {
                components.apply(change).await;
                agent.snapshots_on = components.snapshots_on();
                agent.component_problems = components.problems();
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

/// The source's objects with the provisioned volumes laid over them, and what they want.
struct ObjectsView {
    source: Arc<ObjectSet>,
    /// The versions of what is laid over the source's set: the provisioned volumes, the
    /// runner's pods.
    overlays: Overlays,
    objects: ObjectSet,
    desired: DesiredState,
}

/// The agent's loop: each [`Loop::pass`] takes the same named steps, from the objects to the
/// status file; the parts it works with were set up by [`run`].
struct Loop<'a> {
    config: &'a AgentConfig,
    /// Whether the agent takes VolumeSnapshots (the `snapshot-controller` component runs).
    snapshots_on: bool,
    /// Why the config file's last change or components' own files were not applied.
    component_problems: Vec<String>,
    /// The supervised component processes, for the status report.
    components: ComponentStates,
    host: &'a PluginHost,
    mounter: &'a dyn Mounter,
    registry: &'a Arc<PluginRegistry>,
    executor: &'a Arc<Executor>,
    handler: &'a Arc<CsiRegistrationHandler>,
    registration: &'a RegistrationWatcher,
    flex_prober: &'a FlexProber,
    /// Flexvolume drivers on disk at start whose first probe has not ended: the teardown of a
    /// volume of theirs waits for it (their volumes resolve only once they load).
    undecided_flex: BTreeSet<String>,
    /// The registration sockets there at start, and whether the cluster may be told the
    /// node's storage yet (once it may, it always may).
    sockets_at_start: Vec<PathBuf>,
    node_storage_open: bool,
    objects: &'a MemoryObjects,
    metrics: &'a Arc<Metrics>,
    secrets: &'a ObjectSecrets,
    source: &'a dyn ObjectSource,
    /// The standalone control plane (`None` in a cluster).
    claims: Option<&'a ClaimsController>,
    started: SystemTime,
    metrics_address: Option<String>,
    /// Pod volume directories no plugin could be named for, with why, while they last.
    orphans_left: Vec<(PathBuf, String)>,
    /// Directories of pods no longer wanted that could not be removed, with why.
    pod_dirs_left: Vec<(PathBuf, String)>,
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
    stats_volumes: Option<tokio::sync::watch::Sender<Arc<Vec<crate::report::volume_stats::ClaimedVolume>>>>,
    /// The actual state's version and the objects the volumes of claims were last found from.
    last_claimed: Option<(u64, Arc<ObjectSet>, Overlays)>,
    /// The pods a runner handed over the runtime API.
    runner: &'a Arc<crate::runtime::runner_pods::RunnerPods>,
    /// The node as the runtime API answers from it, and what it was last made from.
    runtime_view: tokio::sync::watch::Sender<Arc<crate::runtime::view::RuntimeView>>,
    last_view: Option<(u64, Arc<ObjectSet>, Overlays)>,
}

impl Loop<'_> {
    /// One pass: objects → desired state → resolutions → (resync) → plan → operations → status.
    fn pass(&mut self) {
        let pass_started = Instant::now();
        let view = self.objects_view();
        if let Some(claims) = self.claims {
            let in_use = || self.executor.volumes_in_use();
            claims.pass(&view.objects, &view.source, &self.handler.drivers(), in_use, self.snapshots_on);
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
        self.offer_runtime_view(&view, &resolutions);
        let submitted = pass_started.elapsed();
        let problems = self.problems(&view.objects);
        let inputs = ReportInputs {
            executor: self.executor.version(),
            source: Arc::clone(&view.source),
            provisioned: view.overlays,
            plugins: snapshot.generation(),
            problems,
            components: self.components.snapshot(),
            snapshots: self.claims.map_or(0, ClaimsController::snapshots_version),
        };
        let changed = self.last_report.as_ref().is_none_or(|(last, _)| *last != inputs);
        let since = self.last_report.as_ref().map(|(_, at)| at.elapsed());
        let written = match status_write(changed, since, REPORT_REFRESH, self.executor.is_idle()) {
            StatusWrite::Now => {
                let written = self.report(
                    inputs.problems.clone(),
                    &view.objects,
                    &view.desired,
                    &resolutions,
                    &snapshot,
                );
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
        let provisioned = self.claims.map_or(0, ClaimsController::provisioned_version);
        let runner = self.runner.version();
        match self.cached_view.take() {
            Some(v) if Arc::ptr_eq(&v.source, &from_source) && v.overlays == (provisioned, runner) => v,
            _ => {
                let mut set = (*from_source).clone();
                self.runner.overlay(&mut set);
                let provisioned = self.claims.map_or(0, |claims| claims.overlay(&mut set));
                let node = NodeContext {
                    node_name: self.config.node_name.clone(),
                    allocatable: self.host.node.allocatable,
                    mints_tokens: self.host.tokens.is_some(),
                };
                let desired = desired_state_on(&set, &node);
                secrets_from(self.secrets, &set);
                // The whole set: a CSIDriver removed from the source stops applying at once.
                self.objects.set_csi_drivers(set.csi_drivers.values().cloned());
                ObjectsView { source: from_source, overlays: (provisioned, runner), objects: set, desired }
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
            provisioned: view.overlays,
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
        let (listed, pod_dirs_left) =
            adopt_leftovers(&self.host.paths, self.executor, desired, self.registry);
        // An orphan gone from the listing is no longer a problem.
        self.orphans_left.retain(|(path, _)| listed.iter().any(|d| &d.path == path));
        // Said once, shown while it lasts.
        for (path, reason) in pod_dirs_left.iter().filter(|left| !self.pod_dirs_left.contains(left)) {
            tracing::warn!(path = %path.display(), %reason, "pod directory left");
        }
        self.pod_dirs_left = pod_dirs_left;
    }

    /// The node as the runtime API answers from it, made again when the objects, the runner's
    /// pods or the executor's state changed.
    fn offer_runtime_view(&mut self, view: &ObjectsView, resolutions: &Resolutions) {
        let exec = self.executor.snapshot();
        let inputs = (self.executor.version(), Arc::clone(&view.source), view.overlays);
        let same = self
            .last_view
            .as_ref()
            .is_some_and(|(v, s, o)| *v == inputs.0 && Arc::ptr_eq(s, &inputs.1) && *o == inputs.2);
        if same {
            return;
        }
        let volumes = crate::report::status_report::volume_statuses(&view.desired, resolutions, &exec);
        let made = crate::runtime::view::make(&view.objects, volumes, &exec.actual);
        self.runtime_view.send_if_modified(|current| {
            if **current == made {
                return false;
            }
            *current = Arc::new(made);
            true
        });
        self.last_view = Some(inputs);
    }

    /// The plan's operations and the republishes due, submitted to the executor.
    fn submit(&mut self, desired: &DesiredState, resolutions: &Resolutions) {
        if !self.undecided_flex.is_empty() {
            let decided: BTreeSet<String> = self.flex_prober.status().into_iter().map(|d| d.name).collect();
            self.undecided_flex.retain(|name| !decided.contains(name));
        }
        let exec = self.executor.snapshot();
        // In a cluster, an attachable volume is mounted only once the API lists it in use.
        let reported = self.config.node_storage.as_ref().and_then(|sink| sink.reported_in_use());
        for op in plan(desired, resolutions, &exec.actual, &exec.busy()) {
            if reported.as_ref().is_some_and(|reported| waits_for_in_use(&op, resolutions, reported)) {
                continue;
            }
            if !self.undecided_flex.is_empty() && self.undecided_flex.contains(op.plugin()) {
                continue;
            }
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
        for op in due.into_iter().chain(expansions(desired, resolutions, &exec.actual)) {
            self.executor.submit(op);
        }
    }

    /// The snapshots taken, as the status shows them.
    fn snapshot_statuses(&self) -> Vec<SnapshotStatus> {
        let Some(claims) = self.claims else { return Vec::new() };
        claims
            .snapshot_records()
            .into_iter()
            .map(|(key, r)| SnapshotStatus {
                name: key,
                driver: r.driver,
                snapshot_handle: r.snapshot_handle,
                source_claim: r.source_claim,
                size_bytes: r.size_bytes,
                ready_to_use: r.ready_to_use,
                content: r.content,
            })
            .collect()
    }

    /// The problems status shows: the source's, orphans left, failed provisionings, the
    /// components', the snapshots'.
    fn problems(&mut self, objects: &ObjectSet) -> Vec<String> {
        let mut problems: Vec<String> = objects.problems.iter().map(ToString::to_string).collect();
        if !self.orphans_left.is_empty() {
            // Now a published volume's directory: no longer a problem.
            let exec = self.executor.snapshot();
            self.orphans_left
                .retain(|(path, _)| !exec.actual.published.values().any(|p| p.target.starts_with(path)));
            problems.extend(self.orphans_left.iter().map(|(_, reason)| reason.clone()));
        }
        problems.extend(self.pod_dirs_left.iter().map(|(_, reason)| reason.clone()));
        problems.extend(crate::report::claim_status::deferred_expansions(&self.executor.snapshot().actual));
        let claims = self.claims;
        problems.extend(claims.map(|c| c.expansion_problems(objects)).unwrap_or_default());
        let failures = claims.map(ClaimsController::provisioning_failures).unwrap_or_default();
        problems.extend(failures.into_iter().map(|(claim, reason)| {
            crate::model::SourceProblem {
                origin: format!("provisioning of claim {claim}"),
                document: None,
                reason,
            }
            .to_string()
        }));
        problems.extend(self.component_problems.iter().cloned());
        if let Some(claims) = claims {
            problems.extend(claims.snapshot_problems(objects, self.snapshots_on));
        }
        problems
    }

    /// The status report, the volume gauges, and the status file — written when something
    /// other than the clock changed, or every 5 s so `updated` stays fresh: a busy pass should
    /// not cost a file write. Returns whether the file was written.
    fn report(
        &mut self,
        problems: Vec<String>,
        objects: &ObjectSet,
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
        let resize_statuses: BTreeMap<String, String> = self
            .claims
            .map(|c| c.claim_statuses())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(key, kept)| Some((key, kept.resize_status?)))
            .collect();
        report.claims = crate::report::claim_status::claim_sizes(objects, &resize_statuses);
        if let Some(sink) = self.config.node_storage.as_ref().filter(|_| self.may_report_node_storage()) {
            sink.report(&crate::report::node_storage::NodeStorage {
                csi_node: report.csi_node.clone(),
                node_ids: self.handler.node_id_annotation(),
                volumes_in_use: crate::report::node_storage::volumes_in_use(resolutions, &exec.actual),
                topology_labels: self.handler.topology_labels(),
            });
        }
        let resized = crate::report::claim_status::resized_claims(objects, &exec.actual);
        if let Some(sink) = &self.config.claim_status {
            sink.report(&resized);
        }
        if let Some(claims) = self.claims.filter(|_| !resized.is_empty()) {
            let grown: Vec<(String, u64)> =
                resized.iter().map(|r| (format!("{}/{}", r.namespace, r.name), r.capacity_bytes)).collect();
            claims.node_resized(&grown);
        }
        if let Some(sink) = &self.config.pod_events {
            sink.report(&crate::report::pod_events::volume_failures(desired, resolutions, &exec));
        }
        let count = |phase: Phase| report.volumes.iter().filter(|v| v.phase == phase).count() as i64;
        // An uncertain volume that failed is failing; one being published again is neither.
        let failing_uncertain =
            report.volumes.iter().filter(|v| v.phase == Phase::Uncertain && v.last_error.is_some()).count()
                as i64;
        self.metrics.set_volumes(
            count(Phase::Published),
            count(Phase::Pending),
            count(Phase::Failed) + failing_uncertain,
        );
        self.metrics.set_total_volumes(&crate::report::metrics::total_volumes(
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

    /// Whether the cluster may be told the node's storage: once the drivers registered before
    /// this start are back or gone, or after a while (see `may_report`); then for good.
    fn may_report_node_storage(&mut self) -> bool {
        if !self.node_storage_open {
            let registered: Vec<PathBuf> =
                self.registration.registered().into_iter().map(|p| p.socket).collect();
            let since_start = self.started.elapsed().unwrap_or_default();
            self.node_storage_open =
                may_report(&self.sockets_at_start, &registered, |p| p.exists(), since_start);
            if self.node_storage_open {
                tracing::info!(registered = registered.len(), "telling the cluster the node's storage");
            }
        }
        self.node_storage_open
    }

    /// Tells the stats collector which published volumes come from claims, when the published
    /// volumes or the objects changed since it was last told.
    fn offer_claimed_volumes(&mut self, view: &ObjectsView) {
        let Some(sender) = &self.stats_volumes else { return };
        let (actual, version) = self.executor.actual();
        let unchanged = self
            .last_claimed
            .as_ref()
            .is_some_and(|(a, o, v)| *a == version && Arc::ptr_eq(o, &view.source) && *v == view.overlays);
        if unchanged {
            return;
        }
        let claimed = crate::report::volume_stats::claimed_volumes(&view.objects.pods, &actual.published);
        drop(actual);
        sender.send_if_modified(|current| {
            let changed = **current != claimed;
            if changed {
                *current = Arc::new(claimed);
            }
            changed
        });
        self.last_claimed = Some((version, Arc::clone(&view.source), view.overlays));
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

/// What a status report is made from, as far as telling a change goes: the executor's
/// version, the objects, the plugins, the problems.
#[derive(Debug)]
struct ReportInputs {
    executor: u64,
    source: Arc<ObjectSet>,
    provisioned: Overlays,
    plugins: u64,
    problems: Vec<String>,
    /// A component restarted or turned healthy is news for the status.
    components: Vec<kvol_components_runtime::ComponentStatus>,
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

/// The versions of the provisioned volumes and of the runner's pods, laid over a source's set.
type Overlays = (u64, u64);

/// What resolutions are made from, as far as telling a change goes.
#[derive(Debug)]
struct ResolveKey {
    source: Arc<ObjectSet>,
    provisioned: Overlays,
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

/// The Flexvolume drivers in `dir` (as `vendor/driver`) that `prober` has not decided on yet.
fn undecided_flex_drivers(dir: &std::path::Path, prober: &FlexProber) -> BTreeSet<String> {
    let decided: BTreeSet<String> = prober.status().into_iter().map(|d| d.name).collect();
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeSet::new() };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(kvol_flex::naming::driver_name))
        .filter(|name| !decided.contains(name))
        .collect()
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

fn secrets_from(secrets: &ObjectSecrets, objects: &ObjectSet) {
    let mut map = secrets.0.write().unwrap_or_else(|p| p.into_inner());
    if *map != objects.secrets {
        *map = objects.secrets.clone();
    }
}

/// The node's own resources, as kubelet's allocatable is without reservations: its CPUs, its
/// memory (`MemTotal`), and the filesystem of the kubelet root; zero where they cannot be read.
fn measured_allocatable(root_dir: &std::path::Path) -> kvol_api::projection::NodeResources {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
    let memory_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    let storage = kvol_plugin::plugin::VolumeStats::of_filesystem(root_dir)
        .ok()
        .and_then(|stats| stats.capacity_bytes)
        .unwrap_or(0);
    kvol_api::projection::NodeResources {
        cpu_millis: cpus * 1000,
        memory_bytes: memory_kib.unwrap_or(0).saturating_mul(1024),
        ephemeral_storage_bytes: storage,
    }
}
